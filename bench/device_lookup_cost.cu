// Benchmark (GPU machine; not a test): what the driver calls that could name a launch's device cost per call, with
// the caches warm and with KIB KiB of a buffer touched between calls (as a large program's own work evicts the
// driver's lines between launches; that time is left out). The injection library asks cuCtxGetDevice at a launch
// unless the process sees one GPU (pt_inject_launch.c, launch_device). Three rounds of each; "none" is the loop.
//   nvcc -O2 -o /tmp/lookup bench/device_lookup_cost.cu -lcuda
//   taskset -c 3 /tmp/lookup 1000000 0; taskset -c 3 /tmp/lookup 20000 2048      (CALLS KIB)
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static volatile char *buf;
static size_t kib;
static void touch(void) { for (size_t i = 0; i < kib * 1024; i += 64) buf[i]++; }

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1000000;
    kib = argc > 2 ? (size_t)atoi(argv[2]) : 0;
    buf = (volatile char *)malloc(kib * 1024 + 64);
    CUdevice d;
    CUcontext c;
    if (cuInit(0) || cuDeviceGet(&d, 0) || cuDevicePrimaryCtxRetain(&c, d) || cuCtxSetCurrent(c)) {
        fprintf(stderr, "no CUDA device\n");
        return 1;
    }
    const char *names[] = {"none", "cuCtxGetDevice", "cuCtxGetCurrent", "cuCtxGetId"};
    for (int round = 0; round < 3; round++)
        for (int k = 0; k < 4; k++) {
            CUdevice dd;
            CUcontext cc;
            unsigned long long id;
            long long t0 = now_ns(), touched = 0;
            for (int i = 0; i < n; i++) {
                if (kib) {
                    long long a = now_ns();
                    touch();
                    touched += now_ns() - a;
                }
                if (k == 1) cuCtxGetDevice(&dd);
                else if (k == 2) cuCtxGetCurrent(&cc);
                else if (k == 3) cuCtxGetId(c, &id);
            }
            printf("{\"round\": %d, \"call\": \"%s\", \"kib\": %zu, \"ns\": %.1f}\n", round, names[k], kib,
                   (double)(now_ns() - t0 - touched) / n);
        }
    return 0;
}
