/* A launch loop for bench/interposer_cost.py: fetches cuLaunchKernel from libcuda.so.1 (the fake driver of
 * tests/native) through cuGetProcAddress, as the CUDA runtime does, and prints the ns per call of N calls, REPS
 * times, one figure per line. Under attach's LD_PRELOAD the fetched entry point is the injection library's
 * trampoline. Usage: interposer_loop N REPS */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int (*getproc_fn)(const char *, void **, int, unsigned long long, int *);
typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                         void **, void **);

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc != 3) { fprintf(stderr, "usage: %s N REPS\n", argv[0]); return 2; }
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    getproc_fn getproc = cuda ? (getproc_fn)dlsym(cuda, "cuGetProcAddress_v2") : NULL;
    void *fn = NULL;
    int found = 0;
    if (!getproc || getproc("cuLaunchKernel", &fn, 12000, 0, &found) || !fn) { fprintf(stderr, "no cuLaunchKernel\n"); return 1; }
    launch_fn launch = (launch_fn)fn;
    long n = atol(argv[1]), reps = atol(argv[2]);
    for (long r = 0; r < reps; ++r) {
        long long t0 = now_ns();
        for (long i = 0; i < n; ++i) launch(NULL, 1, 1, 1, 1, 1, 1, 0, (void *)0x100, NULL, NULL);
        printf("%.2f\n", (double)(now_ns() - t0) / n);
    }
    return 0;
}
