/*
 * A program whose C signal handler opens and closes an NVTX range while its thread is in the loader looking for the
 * CUDA driver, for the injection library's test that such an edge does not enter the loader again (whose lock the
 * interrupted call holds: a hang). The program has no driver, so the library asks the loader for it at most every
 * 10 ms; this program's own ``dlopen`` (exported with -rdynamic, so the library's calls come here) raises SIGALRM
 * inside each of those asks and counts any ask made from inside another. Driven as NVTX drives it (nvtx_table.h).
 *   cc -O2 -rdynamic -o signal_loader signal_loader.c -ldl && PCIETRACE_TRACE_DIR=DIR ./signal_loader LIBRARY MS
 * Prints the driver asks, the asks made inside another, and the handler's ranges.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nvtx_table.h"

static int (*push)(const char *);
static int (*pop)(void);
static volatile sig_atomic_t handled, asks, inside, nested_asks;
static void on_alarm(int sig)
{
    (void)sig;
    if (!push) return;  /* (the library asks for the driver as it starts, before its table is read) */
    push("signal");
    pop();
    ++handled;
}

void *dlopen(const char *file, int mode)
{
    static void *(*real)(const char *, int);
    if (!real) real = (void *(*)(const char *, int))dlsym(RTLD_NEXT, "dlopen");
    if (!file || strcmp(file, "libcuda.so.1") != 0) return real(file, mode);
    ++asks;
    if (inside) { ++nested_asks; return NULL; }  /* (as the real one would hang: the loader's lock is held) */
    inside = 1;
    raise(SIGALRM);  /* a handler's range edge while this thread is in the loader */
    void *h = real(file, mode);
    inside = 0;
    return h;
}

static unsigned long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc < 3) { fprintf(stderr, "usage: %s LIBRARY MS\n", argv[0]); return 2; }
    struct sigaction sa = {0};
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    if (!load_injection(argv[1], &push, &pop)) return 1;
    unsigned long long end = now_ns() + 1000000ull * (unsigned long long)atol(argv[2]);
    while (now_ns() < end) { push("main"); pop(); }
    printf("%d %d %d\n", (int)asks, (int)nested_asks, (int)handled);
    return 0;
}
