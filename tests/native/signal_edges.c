/*
 * A program whose C signal handler opens and closes an NVTX range while its main loop does the same, for the
 * injection library's test that an event of a handler, landing inside the thread's own event, takes bytes of its
 * own (pt_inject.c, emit_record: the block's ``taking``). The library is driven as NVTX drives it (nvtx_table.h).
 *   cc -O2 -o signal_edges signal_edges.c -ldl && PCIETRACE_TRACE_DIR=DIR ./signal_edges LIBRARY PAIRS
 * Prints the handler's ranges; the main loop's are PAIRS, named "main", the handler's "signal".
 */
#include <signal.h>
#include <stdlib.h>
#include <sys/time.h>

#include "nvtx_table.h"

static int (*push)(const char *);
static int (*pop)(void);
static volatile sig_atomic_t handled;
static void on_alarm(int sig) { (void)sig; push("signal"); pop(); ++handled; }

int main(int argc, char **argv)
{
    if (argc < 3) { fprintf(stderr, "usage: %s LIBRARY PAIRS\n", argv[0]); return 2; }
    if (!load_injection(argv[1], &push, &pop)) return 1;
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
