/*
 * The injection library's internal header: what its units (pt_inject*.c, built together as one shared object)
 * share. Nothing here is exported: the library's interface is the EXPORT-marked entry points, and its contract
 * with pcietrace's Python side is pt_abi.h.
 *
 *   pt_inject.c         the state, the trace file and its lines, the clocks, fork, load and exit
 *   pt_inject_copies.c  two copies of the library in one process: the first records, a later one forwards
 *   pt_inject_nvtx.c    NVTX's injection entry point and range handlers
 *   pt_inject_edges.c   range edges: the edge page (wake-ups, ranges open now), the library's own counter reads
 *   pt_inject_launch.c  the current device; launch counting and call timing by interposition (dlsym,
 *                       cuGetProcAddress, direct calls), captured launches
 *   pt_inject_cupti.c   CUDA's injection entry point: launch counting by CUPTI callbacks, GPU time
 */
#pragma once
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "pt_abi.h"

#define EXPORT __attribute__((visibility("default")))

#pragma GCC visibility push(hidden)

typedef int CUres;

/* ---- pt_inject.c: the state every unit reads, the trace, the clocks ---- */
/* What every counted launch reads and adds to, each in one cache line, the process's and the thread's: a launch
 * costs the program the lines it touches that the program's own work evicted since the last
 * (bench/interposer_cost.py --pressure-kb) */
struct pt_hot {
    atomic_ulong eager, graph;                  /* the process's launches */
    atomic_ullong call_ticks, wait_ticks;       /* time inside eager launch calls / synchronize calls, in call-clock
                                                 * ticks (call_ticks(); ns at each line) */
    atomic_ullong announced;                    /* ordinals already named by a "cudevice" event */
    _Atomic int ticks_tsc;                      /* call ticks are TSC ticks */
    _Atomic int call_clock_set;                 /* call_clock_init has run: the call clock's kind is fixed */
    atomic_int capture_begun;                   /* the process began a stream capture (pt_inject_launch.c) */
    _Atomic int one_gpu;                        /* the process sees one GPU (1), more or unknown (-1), not asked
                                                 * yet (0): launch_device() in pt_inject_launch.c */
};
struct pt_thread_hot {
    unsigned long eager, graph;                 /* the thread's launches */
    unsigned long long call_ticks, wait_ticks;  /* as the process's */
    uint64_t devmask;                           /* ordinals launched or copied on since the thread's previous event */
};
_Static_assert(sizeof(struct pt_hot) <= 64 && sizeof(struct pt_thread_hot) <= 64, "one cache line each");
extern struct pt_hot g_hot;
extern __thread struct pt_thread_hot t_hot;
extern atomic_ulong g_captured, g_range_id;  /* this process's captured launches; start/end range ids */
extern __thread unsigned long t_captured;    /* this thread's captured launches */
extern __thread int t_depth;                 /* this thread's push/pop depth */
extern __thread unsigned t_untimed;          /* this thread's range edges since its last timed one */
extern pthread_once_t g_call_clock_once;
/* Launches into a stream being captured are told apart by a query only once the process begins a capture, which
 * passes through the begin trampolines on x86-64 and AArch64 (pt_inject_launch.c); elsewhere every launch asks */
#if defined(__x86_64__) || defined(__aarch64__)
#define CAPTURE_GATE 1
#else
#define CAPTURE_GATE 0
#endif
unsigned long long mono_ns(void);
void call_clock_init(void);                  /* (through pthread_once(&g_call_clock_once, ...)) */
void emit(const char *event, const char *domain, unsigned long long id, const char *message);
/* A push or pop inside its thread's counted range (its device: edge_device's nested case) */
void emit_nested(const char *event, size_t event_bytes, const char *domain, const char *message);
/* A range edge timed by the library (pt_abi.h: timed_edges, timed_ns): its start, by the call clock (ticks or ns) */
struct edge_clock { unsigned long long at; int tsc; };
struct edge_clock edge_clock_start(void);
void edge_timed(struct edge_clock started);  /* adds the edge's time to its trace's header */
extern __thread unsigned long long t_unrecorded;  /* push ranges this thread left unrecorded, not yet in the header */
void unrecorded_add(void);  /* adds them to the header (counted by pt_inject_nvtx.c's PCIETRACE_MAX_DEPTH) */
/* (inline: every recorded edge asks, and without --max-depth there is never a count) */
static inline void unrecorded_flush(void) { if (__builtin_expect(t_unrecorded != 0, 0)) unrecorded_add(); }
void emit_line(unsigned long long t_ns, const char *event, const char *domain, unsigned long long id,
               const char *message, int dev);

/* The call clock set before a call is timed: one flag read once it is (pthread_once's call into libc, its code
 * cold where the program's own work between launches evicts the caches, is left to the first calls) */
static inline void call_clock_start(void)
{
    if (__builtin_expect(!atomic_load_explicit(&g_hot.call_clock_set, memory_order_acquire), 0))
        pthread_once(&g_call_clock_once, call_clock_init);
}

/* The clock that times launch and synchronize calls: the TSC where call_clock_init chose it, else ns. */
static inline unsigned long long call_ticks(void)
{
#if defined(__x86_64__)
    if (atomic_load_explicit(&g_hot.ticks_tsc, memory_order_relaxed)) return __rdtsc();
#endif
    return mono_ns();
}

/* ---- pt_inject_copies.c ---- */
extern _Atomic int g_passive;  /* another copy, loaded before, records: this one forwards (-1: not known yet) */
int passive_resolve(void);
/* Whether another copy of this library, loaded before this one, records: this one then forwards only. */
static inline int passive(void)
{
    int known = atomic_load_explicit(&g_passive, memory_order_acquire);  /* (a direct call asks at every launch) */
    return __builtin_expect(known >= 0, 1) ? known : passive_resolve();
}
void *first_copy(const char *name);  /* the recording copy's ``name`` (NULL where this copy records) */

/* ---- pt_inject_edges.c ---- */
void edges_open(void);
void edges_after_fork(void);
void open_ranges_exit(void);
/* The edges' hot path is inline here: at emit_nvtx density a nested edge paid for every function and global it
 * touched (each a cold cache line where the program's work between edges evicts the caches). */
extern __thread int t_counted;                /* this thread's push ranges counted in the shared word */
extern __thread const char *t_fast_domain;    /* the thread's last domain and whether it holds the fast rate */
extern __thread int t_fast;
extern _Atomic int g_exact;                   /* whether the library reads the counters itself (-1: not known yet) */
int holds_fast_ask(const char *domain);
/* Whether ranges of ``domain`` hold the samplers at the fast rate (PCIETRACE_SLOW_DOMAINS); asked once per domain
 * change of the thread */
static inline int holds_fast(const char *domain)
{
    return __builtin_expect(t_fast >= 0 && domain == t_fast_domain, 1) ? t_fast : holds_fast_ask(domain);
}
/* A thread's push ranges count once in the shared word, for as long as its outermost counted one is open: the
 * samplers only ask whether any range is open, and a nested edge (most of them at emit_nvtx density) then costs
 * no locked instruction on the shared page. */
static inline int nested_push(void) { if (!t_counted) return 0; ++t_counted; return 1; }
static inline int nested_pop(void) { if (t_counted < 2) return 0; --t_counted; return 1; }
int open_push(void);
void close_pop(void);
int open_start(unsigned long long id);
void close_end(unsigned long long id);
void edge_signal(int wake);
void exact_read(void);
/* The library's own counter read at an edge (exact edges only), before a push and after a pop */
static inline void edge_read(void)
{
    if (__builtin_expect(atomic_load_explicit(&g_exact, memory_order_relaxed) == 0, 1)) return;
    exact_read();
}
void edge_close_range(int wake);

/* ---- pt_inject_launch.c ---- */
void *real_dlsym_fn(void *handle, const char *name);  /* glibc's own dlsym (NULL if it cannot be found) */
void *libcuda(void);
int current_device(int retry_now);
/* The CUDA ordinal for a range edge at ``t_ns`` (-1: none): ``nested`` (inside the thread's counted range) may
 * take the thread's last asked one; device_forget drops it (a context call; fork) */
int edge_device(unsigned long long t_ns, int nested);
void device_forget(void);
int device_bus_id(char *bus, int size, int dev);      /* cuDeviceGetPCIBusId where the driver is loaded */
int interposing(void);
int suffix(const char *s, const char *x);
int cooperative(const char *s);
void *launch_config_stream(const void *cfg);
int captured(void *stream, int per_thread);
void count_eager(void);
void count_graph(void);
void count_captured(void);
void note_copy_device(void);                  /* a copy's device, in the thread's device mask */
int copy_entry(const char *s);

#pragma GCC visibility pop
