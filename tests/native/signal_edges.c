/*
 * A program whose C signal handler opens and closes an NVTX range while its main loop does the same, for the
 * injection library's test that an event of a handler, landing inside the thread's own event, takes bytes of its
 * own (pt_inject.c, emit_record: the block's ``taking``). The library is driven as NVTX drives it (its
 * InitializeInjectionNvtx2 and a callback table of our own), so no NVTX header or GPU is needed.
 *   cc -O2 -o signal_edges signal_edges.c -ldl && PCIETRACE_TRACE_DIR=DIR ./signal_edges LIBRARY PAIRS
 * Prints the handler's ranges; the main loop's are PAIRS, named "main", the handler's "signal".
 */
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>

typedef void (*Fp)(void);
static Fp slots[16][16];
static Fp *tables[16][16];
static int get_table(int module, Fp ***table, unsigned *size)
{
    for (int i = 0; i < 16; ++i) tables[module][i] = &slots[module][i];
    *table = tables[module];
    *size = 16;
    return 1;
}
static struct { size_t size; int (*get)(int, Fp ***, unsigned *); } callbacks = {sizeof callbacks, get_table};
static const void *export_table(uint32_t id) { return id == 1 ? (const void *)&callbacks : NULL; }

static int (*push)(const char *);
static int (*pop)(void);
static volatile sig_atomic_t handled;
static void on_alarm(int sig) { (void)sig; push("signal"); pop(); ++handled; }

int main(int argc, char **argv)
{
    if (argc < 3) { fprintf(stderr, "usage: %s LIBRARY PAIRS\n", argv[0]); return 2; }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    int (*init)(const void *(*)(uint32_t)) = (int (*)(const void *(*)(uint32_t)))dlsym(lib, "InitializeInjectionNvtx2");
    if (!init || !init(export_table)) return 1;
    push = (int (*)(const char *))slots[1][9];  /* NVTX's core module: RangePushA, RangePop */
    pop = (int (*)(void))slots[1][11];
    struct sigaction sa = {0};
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval every = {{0, 20}, {0, 20}};  /* as often as the kernel delivers it */
    setitimer(ITIMER_REAL, &every, NULL);
    long n = atol(argv[2]);
    for (long i = 0; i < n; ++i) { push("main"); pop(); }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("%d\n", (int)handled);
    return 0;
}
