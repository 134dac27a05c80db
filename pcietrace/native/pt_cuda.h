/*
 * The CUDA driver API as pcietrace's native loops see it, without CUDA headers: handles are opaque
 * pointers passed in from Python (cuda.bindings objects -> int(handle)), and entry points are resolved
 * at run time through the driver's own cuGetProcAddress, the way the CUDA runtime does. Each loop file
 * declares the function types it calls and fetches them with pt_cu("cuLaunchKernel").
 */
#ifndef PT_CUDA_H
#define PT_CUDA_H
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <time.h>

typedef int CUresult;                  /* 0 = CUDA_SUCCESS, 600 = CUDA_ERROR_NOT_READY */
typedef void *CUstream, *CUfunction, *CUgraph, *CUgraphExec, *CUgraphNode, *CUevent, *CUcontext;
typedef unsigned long long CUdeviceptr;
#define PT_CUDA_API_VERSION 12000      /* ABI of the entry points we ask for (CUDA 12 and 13 drivers) */

/* Driver entry point by base name (e.g. "cuStreamBeginCapture" -> its CUDA 12 ABI), or NULL. */
static inline void *pt_cu(const char *name)
{
    typedef CUresult (*getproc_t)(const char *, void **, int, unsigned long long, int *);
    static getproc_t getproc;
    if (!getproc) {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
        if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
        if (!lib) return NULL;
        getproc = (getproc_t)dlsym(lib, "cuGetProcAddress_v2");
        if (!getproc) return NULL;
    }
    void *fn = NULL;
    int status = 0;
    return getproc(name, &fn, PT_CUDA_API_VERSION, 0, &status) == 0 ? fn : NULL;
}

/* CLOCK_MONOTONIC in ns: the clock of the counter sampler and of every Python-side timestamp. */
static inline int64_t pt_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
#endif
