/* A launch loop for bench/interposer_cost.py: fetches cuLaunchKernel from libcuda.so.1 (the fake driver of
 * tests/native) through cuGetProcAddress, as the CUDA runtime does, and prints the ns per call of N calls, REPS
 * times, one figure per line. Under attach's LD_PRELOAD the fetched entry point is the injection library's
 * trampoline. With PRESSURE_KB, that much of a buffer is touched between launches (its time left out: the loop's
 * figure is the launches' alone), as a large program's own work evicts the library's lines between its launches.
 * Usage: interposer_loop N REPS [PRESSURE_KB] */
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
    if (argc != 3 && argc != 4) { fprintf(stderr, "usage: %s N REPS [PRESSURE_KB]\n", argv[0]); return 2; }
    size_t pressure = argc == 4 ? (size_t)atol(argv[3]) * 1024 : 0;
    volatile unsigned char *buf = pressure ? calloc(pressure, 1) : NULL;
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    getproc_fn getproc = cuda ? (getproc_fn)dlsym(cuda, "cuGetProcAddress_v2") : NULL;
    void *fn = NULL;
    int found = 0;
    if (!getproc || getproc("cuLaunchKernel", &fn, 12000, 0, &found) || !fn) { fprintf(stderr, "no cuLaunchKernel\n"); return 1; }
    launch_fn launch = (launch_fn)fn;
    long n = atol(argv[1]), reps = atol(argv[2]);
    for (long r = 0; r < reps; ++r) {
        long long spent = 0, t0 = now_ns();
        for (long i = 0; i < n; ++i) {
            if (pressure) {  /* (a line in 64 bytes written: the caches hold the buffer, not the library) */
                long long a = now_ns();
                for (size_t k = 0; k < pressure; k += 64) buf[k] += 1;
                spent += now_ns() - a;
            }
            launch(NULL, 1, 1, 1, 1, 1, 1, 0, (void *)0x100, NULL, NULL);
        }
        printf("%.2f\n", (double)(now_ns() - t0 - spent) / n);
    }
    return 0;
}
