/*
 * pcietrace injection library: NVTX ranges and kernel-launch counts of an unmodified application.
 *
 * Loaded twice into the application under one path, hence one copy of the state below:
 *  - by NVTX (NVTX_INJECTION64_PATH): InitializeInjectionNvtx2 fills NVTX's callback tables, so
 *    every push/pop/start/end (core and domain APIs) lands here;
 *  - by the CUDA driver (CUDA_INJECTION64_PATH): InitializeInjection subscribes to CUPTI driver-API
 *    callbacks for cuLaunchKernel*, cuLaunchCooperativeKernel (eager) and cuGraphLaunch* (graph), counted
 *    per thread and per process. libcupti is opened with dlopen (path in PCIETRACE_CUPTI), so no CUDA or
 *    NVTX headers are needed to build this file;
 *  - or, cheaper, by LD_PRELOAD with PCIETRACE_COUNT=interpose: launches are counted by trampolines
 *    handed out through an interposed dlsym/cuGetProcAddress (pt_inject_launch.c).
 * A second copy loaded from another path (another object) records nothing and only forwards (pt_inject_copies.c).
 *
 * Output: PCIETRACE_TRACE_DIR/trace-<pid>.bin (pt_abi.h gives its layout), one binary record per event, written
 * through a MAP_SHARED mapping, so what was written survives a crash of the application. A record holds:
 *   t_ns tid event domain id depth eager_thread graph_thread eager_process graph_process dev devmask
 *   captured_thread captured_process call_ns_thread call_ns_process wait_ns_thread wait_ns_process message
 * Records are copied, not formatted: at emit_nvtx density (a range per PyTorch op) every NVTX push and pop writes
 * one in the program's own thread, and formatting text was most of an edge's cost.
 * t_ns is CLOCK_MONOTONIC, the clock pcietrace's counter sampler uses. ``dev`` is the CUDA ordinal current
 * on the thread at the event (-1: none; at a nested range edge in interpose mode, as its thread last asked the
 * driver, < 1 ms before and since its last context call: edge_device), ``devmask`` the ordinals the thread
 * launched on since its previous event (bit i = ordinal i); a "cudevice" event (id = ordinal, message = PCI bus
 * id) names each ordinal once.
 * ``captured_*`` count the launches (kernel or graph) made into a stream that was being captured into a graph
 * (cuStreamBeginCapture ... cuStreamEndCapture): they add a node to a graph and run nothing, so they are in
 * neither the eager nor the graph counts.
 * ``call_ns_*`` add up the ns spent inside eager launch calls (a call whose queue is full waits there for the
 * GPU), ``wait_ns_*`` those inside cuCtxSynchronize, cuStreamSynchronize and cuEventSynchronize: how long the
 * host waited for the GPU. Both are timed by the trampolines and direct calls of interpose mode only (by the
 * TSC where the kernel's clocksource is it, turned into ns at each event); other modes write -1 (not timed).
 *
 * Range edges (pt_inject_edges.c; the page's words are named in pt_abi.h): with PCIETRACE_EDGE_FILE, every
 * push/pop/start/end bumps a shared 32-bit sequence number (PT_EDGE_SEQ); a range that opens in a process with
 * none open in it (and any edge of a domain that does not hold the fast rate) also bumps PT_EDGE_WAKES and wakes
 * the sampler processes waiting on that word (a shared futex), so they read the counters right after it; nested
 * and closing edges wake nobody (see edge_signal). PT_EDGE_OPEN_RANGES counts the threads with a push range open
 * and the start ranges open, right now over every traced process (raised at push/start, lowered at pop/end,
 * before the wake-up; a nested push or pop touches no shared word), so the samplers read often only while one
 * is open; PT_EDGE_COUNTING says this library keeps that count (set when it maps the page), so that an older
 * library, which does not, never makes the samplers slow down inside ranges.
 * With PCIETRACE_EXACT_EDGES=1 the library also reads the counters itself through NVML at every edge (a "ctr"
 * event: id = NVML index, message = "read_ns tx rx"), before a push and after a pop.
 *
 * The library is built from units behind pt_inject.h (which lists them); this one holds the state they share,
 * the trace file and its lines, the clocks, fork, load and exit.
 */
#include "pt_inject.h"

#include <errno.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>

/* The interface version pcietrace's Python side checks (pt_abi.h), as a number and as a string it can find in
 * the file without loading it. */
EXPORT const unsigned pcietrace_inject_abi = PT_ABI_VERSION;
EXPORT const char pcietrace_inject_abi_tag[] = PT_ABI_TAG;

/* ---- state ---- */
static _Atomic(char *) g_buf;                /* the trace's mapping, published once it is whole (NULL: none) */
static int g_fd = -1;                        /* the trace file, kept open to allocate its space ahead of the writers */
static uint64_t g_file_bytes;                /* its size */
static atomic_int g_open_failed;             /* no trace could be made: not tried again at every event */
static pthread_mutex_t g_grow_lock = PTHREAD_MUTEX_INITIALIZER;  /* one writer allocates at a time */
static atomic_int g_full;                    /* an event did not fit: the "tracefull" event was written */
static _Atomic uint32_t g_grow_seq;         /* bumped to wake the grower (a futex word) */
static atomic_int g_grow_asked;              /* a wake-up is pending: later writers need not ask again */
static atomic_int g_grower_on;               /* the grower runs (else the writers grow the parts themselves) */
struct pt_hot g_hot __attribute__((aligned(64))) = {.capture_begun = !CAPTURE_GATE};
__thread struct pt_thread_hot t_hot __attribute__((aligned(64)));
atomic_ulong g_captured, g_range_id;
static pthread_mutex_t g_open_lock = PTHREAD_MUTEX_INITIALIZER;
__thread unsigned long t_captured;
__thread int t_depth;
__thread unsigned t_untimed;
static __thread long t_tid;

/* A forked child writes its own trace: its launch totals start at 0, it names its devices again there, and its
 * thread is its own. */
static void child_after_fork(void)
{
    atomic_store(&g_buf, NULL);
    t_tid = 0;  /* the forking thread has a new id in the child */
    t_hot.devmask = 0;  /* the parent's launches since its last event: its next event reports them, not ours */
    t_hot.eager = t_hot.graph = t_captured = 0;  /* the child's own counts (else its first event held the parent's) */
    t_unrecorded = 0;  /* (the parent's to count) */
    t_depth = 0;  /* the parent's open ranges are not in the child's trace: its own start at the top */
    g_fd = -1;  /* (the parent's descriptor stays open here: harmless, and the parent's to close) */
    atomic_store(&g_open_failed, 0);
    atomic_store(&g_full, 0);
    atomic_store(&g_grower_on, 0);  /* (threads do not survive fork: the child's trace starts its own) */
    atomic_store(&g_grow_asked, 0);
    pthread_mutex_init(&g_grow_lock, NULL);  /* a parent's thread may have held it at fork() */
    pthread_mutex_init(&g_open_lock, NULL);  /* (as this one, opening the parent's trace at fork(): the child's first event waited forever) */
    atomic_store(&g_hot.eager, 0); atomic_store(&g_hot.graph, 0); atomic_store(&g_captured, 0);
    atomic_store(&g_hot.announced, 0);
    atomic_store(&g_hot.one_gpu, 0);  /* (a child of a process that had begun CUDA cannot use it: asked again) */
    edges_after_fork();
    device_forget();
}

static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;
static void atfork_register(void) { pthread_atfork(NULL, NULL, child_after_fork); }

/* ---- the trace file (pt_abi.h) ----
 * Sparse, and as large as PCIETRACE_TRACE_BYTES allows (64 GiB by default, halved until the file system takes it),
 * so that it grows with the run instead of filling up. Its space is allocated and its pages mapped a chunk ahead
 * of the writers (part_grow): a page first written through the mapping would trap into the kernel once per 4 kB,
 * and a page the disk has no room for would kill the program with SIGBUS; allocated ahead, a full disk ends the
 * trace with a "tracefull" event instead. A thread of the library's own (the grower) does that AHEAD of the writers,
 * so the program's threads do not: allocating and zeroing fresh page-cache pages was ~2/3 of an edge's cost at
 * emit_nvtx density (perf), paid in the program's thread once every ~10 edges. A writer that comes
 * within half the distance kept ahead (ahead_of) of the ready end wakes it; one that comes within a quarter CHUNK
 * (less while the part is young; the grower behind, or none) grows the part itself. */
enum { TRACE_MIN = 1 << 16, START = 256 << 10, CHUNK = 4 << 20, AHEAD = 8 * CHUNK };
struct part { uint64_t at, cap, reserve; _Atomic uint64_t ready; _Atomic uint64_t *taken; };
static struct part g_events, g_strings;

/* How far ahead of ``taken`` bytes a part is kept: as far as the writers have come, from START up to AHEAD. A
 * process that writes a few events (a forked worker's range) is not given chunks of fresh pages it never uses: 200
 * forked children, a range each, took 20x as long under attach, most of it the kernel zeroing 16 MB a child. */
static inline uint64_t ahead_of(uint64_t taken) { return taken < START ? START : taken < AHEAD ? taken : AHEAD; }

/* Allocate and map [ready, want + margin) of a part, at most a CHUNK at a time; returns whether ``want`` is ready. */
static int part_grow(char *buf, struct part *p, uint64_t want, uint64_t margin)
{
    pthread_mutex_lock(&g_grow_lock);
    uint64_t ready = atomic_load(&p->ready);
    while (ready < want + margin && ready < p->cap) {
        uint64_t n = want + margin - ready < CHUNK ? (want + margin - ready + 4095) & ~(uint64_t)4095 : CHUNK;
        if (n > p->cap - ready) n = p->cap - ready;
        int rc = posix_fallocate(g_fd, (off_t)(p->at + ready), (off_t)n);
        if (rc && rc != EOPNOTSUPP && rc != EINVAL) break;  /* no room (ENOSPC...): the trace ends here */
        /* the pages mapped now, in one call (MADV_POPULATE_WRITE, Linux 5.14+; older kernels fault them in) */
        uintptr_t page = (uintptr_t)(buf + p->at + ready) & ~(uintptr_t)4095;
        madvise((void *)page, (size_t)((uintptr_t)(buf + p->at + ready + n) - page), 23 /* MADV_POPULATE_WRITE */);
        ready += n;
        atomic_store(&p->ready, ready);
    }
    pthread_mutex_unlock(&g_grow_lock);
    return want <= ready;
}

/* Wake the grower, once until it has looked (later writers past the mark need not ask again). */
static void grower_wake(void)
{
    if (atomic_exchange_explicit(&g_grow_asked, 1, memory_order_relaxed)) return;
    atomic_fetch_add_explicit(&g_grow_seq, 1, memory_order_release);
    syscall(SYS_futex, (void *)&g_grow_seq, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* ``n`` to ``most`` bytes of a part (``*len`` of them: ``most`` where that much is left): their offset, or -1
 * where not even ``n`` are left (or the disk is full). The space past the writers is allocated by the grower, or
 * by whichever writer comes within a chunk of its end; not by one that may not take the lock (``may_grow`` 0: a
 * signal handler's event inside its thread's own, which may hold it), for which -1 may also mean "not ready yet". */
static int64_t part_take(char *buf, struct part *p, uint64_t n, uint64_t most, uint64_t *len, int may_grow)
{
    uint64_t limit = p->cap - p->reserve, at = atomic_load_explicit(p->taken, memory_order_relaxed), k;
    do {
        if (at + n > limit) return -1;
        k = limit - at < most ? limit - at : most;
    } while (!atomic_compare_exchange_weak_explicit(p->taken, &at, at + k, memory_order_relaxed, memory_order_relaxed));
    *len = k;
    uint64_t ready = atomic_load_explicit(&p->ready, memory_order_acquire);
    if (__builtin_expect(at + k + ahead_of(at) / 2 > ready, 0) && atomic_load_explicit(&g_grower_on, memory_order_relaxed))
        grower_wake();
    uint64_t margin = ahead_of(at) < CHUNK ? ahead_of(at) : CHUNK;  /* (the grower behind, or none: grown here) */
    if (at + k + margin / 4 > ready && !(may_grow && part_grow(buf, p, at + k, margin))
        && at + k > atomic_load(&p->ready)) return -1;
    return (int64_t)at;
}

/* The grower: keeps both parts allocated and mapped AHEAD past what the writers took, woken by them (or every
 * 100 ms). Its own thread, every signal blocked there: the program's handlers run on the program's threads. */
static void *grower(void *arg)
{
    char *buf = arg;
    const struct timespec every = {0, 100000000};
    for (;;) {
        uint32_t seen = atomic_load_explicit(&g_grow_seq, memory_order_acquire);
        atomic_store_explicit(&g_grow_asked, 0, memory_order_relaxed);
        struct part *parts[2] = {&g_events, &g_strings};
        for (int i = 0; i < 2; ++i) {
            uint64_t taken = atomic_load_explicit(parts[i]->taken, memory_order_relaxed);
            if (taken + ahead_of(taken) > atomic_load(&parts[i]->ready) && atomic_load(&parts[i]->ready) < parts[i]->cap)
                part_grow(buf, parts[i], taken, ahead_of(taken));
        }
        syscall(SYS_futex, (void *)&g_grow_seq, FUTEX_WAIT_PRIVATE, seen, &every, NULL, 0);
    }
    return NULL;
}

static void grower_start(char *buf)
{
    sigset_t all, was;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &was);
    pthread_attr_t attr;
    pthread_t th;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 << 10);
    if (pthread_create(&th, &attr, grower, buf) == 0) {
        pthread_setname_np(th, "pcietrace-grow");
        atomic_store(&g_grower_on, 1);
    }
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &was, NULL);
}

/* The trace's mapping, opened by the first event of the process (NULL: no trace, or another copy writes it). */
static __thread int t_opening;  /* the thread holds the open lock: a signal handler's event on it is left out */
static char *trace_open(void)
{
    char *buf = atomic_load_explicit(&g_buf, memory_order_acquire);
    if (buf) return buf;
    if (t_opening || atomic_load_explicit(&g_open_failed, memory_order_relaxed) || passive()) return NULL;  /* (passive: the recording copy writes this process's trace) */
    t_opening = 1;
    atomic_signal_fence(memory_order_seq_cst);
    pthread_once(&g_atfork_once, atfork_register);
    pthread_mutex_lock(&g_open_lock);
    buf = atomic_load_explicit(&g_buf, memory_order_relaxed);
    const char *dir = getenv("PCIETRACE_TRACE_DIR");
    char path[4096];
    if (!buf && !atomic_load(&g_open_failed) && dir && snprintf(path, sizeof path, "%s/trace-%d.bin", dir, (int)getpid()) < (int)sizeof path) {
        const char *cap = getenv("PCIETRACE_TRACE_BYTES");
        uint64_t want = cap ? strtoull(cap, NULL, 10) : (uint64_t)64 << 30;
        if (want < TRACE_MIN) want = TRACE_MIN;
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        void *m = MAP_FAILED;  /* (a file system or an address space that refuses the size: half of it, and so on) */
        for (; fd >= 0 && want >= TRACE_MIN && m == MAP_FAILED; want /= 2)
            if (ftruncate(fd, (off_t)want) == 0 && (m = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) != MAP_FAILED) break;
        /* the header and the space kept for the "tracefull" event, allocated now (the rest as the writers go) */
        uint64_t ev = (want - PT_TRACE_HEADER_BYTES) / 2 / sizeof(struct pt_event) * sizeof(struct pt_event);
        if (m != MAP_FAILED && posix_fallocate(fd, 0, PT_TRACE_HEADER_BYTES) == 0) {
            struct pt_trace_header *h = m;
            snprintf(h->line, sizeof h->line, "%s %d\n", PT_TRACE_MAGIC, PT_TRACE_VERSION);
            h->events_at = PT_TRACE_HEADER_BYTES;
            h->events_cap = ev;
            h->strings_at = PT_TRACE_HEADER_BYTES + ev;
            h->strings_cap = want - h->strings_at;
            g_events = (struct part){h->events_at, ev, sizeof(struct pt_event), 0, (_Atomic uint64_t *)&h->events_taken};
            g_strings = (struct part){h->strings_at, h->strings_cap, PT_TRACE_RESERVE, 0, (_Atomic uint64_t *)&h->strings_taken};
            posix_fallocate(fd, (off_t)(h->strings_at - sizeof(struct pt_event)), sizeof(struct pt_event));
            posix_fallocate(fd, (off_t)(want - PT_TRACE_RESERVE), PT_TRACE_RESERVE);
            g_fd = fd;
            g_file_bytes = want;
            buf = m;
            part_grow(buf, &g_events, 0, START);
            part_grow(buf, &g_strings, 0, START);
            atomic_store_explicit(&g_buf, buf, memory_order_release);
            grower_start(buf);
        } else {
            if (m != MAP_FAILED) munmap(m, want);
            if (fd >= 0) close(fd);
        }
    }
    if (!buf) atomic_store(&g_open_failed, 1);
    pthread_mutex_unlock(&g_open_lock);
    atomic_signal_fence(memory_order_seq_cst);
    t_opening = 0;
    return buf;
}

unsigned long long mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

/* ---- the clock that times launch and synchronize calls ----
 * Two clock_gettime per launch call were most of the library's ~80-95 ns per launch (one read ~34 ns on the
 * lent VMs, rdtsc ~13: bench/interposer_cost.py). Where the kernel keeps time by the TSC (clocksource "tsc": it
 * found the TSC invariant and in step across CPUs), calls are timed in TSC ticks, turned into ns at each line
 * by one ratio fixed at the first timed call: CLOCK_MONOTONIC's advance over the TSC's since the library loaded,
 * over at least CALIBRATE_NS (a CUDA context takes far longer to create; a first timed call that comes sooner
 * waits), so a range with no timed call says 0 and any other is off by ~1e-6 of itself (a read's jitter over
 * the window), plus any change in NTP's slewing of CLOCK_MONOTONIC since. The first timed call writes a
 * "callclock" line: "tsc NS_PER_TICK WINDOW_NS" or "monotonic". Elsewhere, or with
 * PCIETRACE_CALL_CLOCK=monotonic, calls are timed in ns. */
#define CALIBRATE_NS 10000000ull
struct now { unsigned long long ns, tsc; };  /* CLOCK_MONOTONIC and the TSC (0 where there is none) together */
static struct now g_loaded;                  /* both clocks when the library loaded */
static _Atomic double g_ns_per_tick = 1.0;   /* set once, before any tick is counted */
pthread_once_t g_call_clock_once = PTHREAD_ONCE_INIT;

/* Both clocks at one instant: the TSC read on either side of CLOCK_MONOTONIC, the narrowest of a few tries (an
 * interrupt between the reads would otherwise enter the ratio), its midpoint taken. */
static struct now now_pair(void)
{
    struct now best = {mono_ns(), 0};
#if defined(__x86_64__)
    unsigned long long span = ~0ull;
    for (int i = 0; i < 5; ++i) {
        unsigned long long a = __rdtsc(), ns = mono_ns(), b = __rdtsc();
        if (b >= a && b - a < span) { span = b - a; best = (struct now){ns, a + (b - a) / 2}; }
    }
#endif
    return best;
}

void call_clock_init(void)
{
#if defined(__x86_64__)
    const char *want = getenv("PCIETRACE_CALL_CLOCK");
    char src[16] = "";
    int fd = open("/sys/devices/system/clocksource/clocksource0/current_clocksource", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, src, sizeof src - 1);
        close(fd);
        src[n > 0 ? n : 0] = 0;
    }
    if ((!want || strcmp(want, "monotonic")) && !strcmp(src, "tsc\n") && g_loaded.tsc) {
        while (mono_ns() - g_loaded.ns < CALIBRATE_NS) {}
        struct now n = now_pair();
        if (n.tsc > g_loaded.tsc && n.ns > g_loaded.ns) {
            double r = (double)(n.ns - g_loaded.ns) / (double)(n.tsc - g_loaded.tsc);
            atomic_store_explicit(&g_ns_per_tick, r, memory_order_relaxed);
            atomic_store_explicit(&g_hot.ticks_tsc, 1, memory_order_release);
            atomic_store_explicit(&g_hot.call_clock_set, 1, memory_order_release);
            char m[64];
            snprintf(m, sizeof m, "tsc %.9g %llu", r, n.ns - g_loaded.ns);
            emit("callclock", NULL, 0, m);
            return;
        }
    }
#endif
    atomic_store_explicit(&g_hot.call_clock_set, 1, memory_order_release);
    emit("callclock", NULL, 0, "monotonic");
}

/* ---- an event record ---- */
/* A message's and a domain's longest parts are cut (UTF-8 may be cut inside a character: read back with U+FFFD) */
enum { MESSAGE_MAX = 1023, DOMAIN_MAX = 255, EVENT_MAX = 63 };

/* The record's counts: depth, the launch counts, the device and the thread's device mask, the captured counts, and
 * the four call-timing fields (-1 each where launch and synchronize calls are not timed). */
static void put_counts(struct pt_event *e, int dev, uint64_t mask)
{
    e->depth = t_depth;
    e->eager_thread = t_hot.eager; e->graph_thread = t_hot.graph;
    e->eager_process = atomic_load(&g_hot.eager); e->graph_process = atomic_load(&g_hot.graph);
    e->dev = (int16_t)dev; e->devmask = mask;
    e->captured_thread = t_captured; e->captured_process = atomic_load(&g_captured);
    if (!interposing()) { e->call_ns_thread = e->call_ns_process = e->wait_ns_thread = e->wait_ns_process = -1; return; }
    unsigned long long sums[4] = {t_hot.call_ticks, atomic_load(&g_hot.call_ticks), t_hot.wait_ticks,
                                  atomic_load(&g_hot.wait_ticks)};
    /* asked after the sums (acquire; the adds release): a sum holding ticks finds the TSC clock set */
    int tsc = atomic_load_explicit(&g_hot.ticks_tsc, memory_order_acquire);
    double r = atomic_load_explicit(&g_ns_per_tick, memory_order_relaxed);
    int64_t *out[4] = {&e->call_ns_thread, &e->call_ns_process, &e->wait_ns_thread, &e->wait_ns_process};
    for (int i = 0; i < 4; ++i) *out[i] = (int64_t)(tsc ? (unsigned long long)(sums[i] * r) : sums[i]);
}

/* One event record at ``slot`` with its strings at ``str_at`` of the strings part; committed last. */
static void put_event(char *buf, int64_t slot, int64_t str_at, unsigned long long t_ns, const char *event,
                      size_t ne, const char *domain, size_t nd, unsigned long long id, int dev, uint64_t mask,
                      const char *message, size_t nm)
{
    char *s = buf + g_strings.at + str_at;  /* copied as they are (tabs and newlines too: the reader cleans them) */
    memcpy(s, event, ne);
    memcpy(s + ne, domain, nd);
    memcpy(s + ne + nd, message, nm);
    struct pt_event *e = (struct pt_event *)(buf + g_events.at + slot);
    e->t_ns = t_ns; e->id = id; e->tid = (int32_t)t_tid; e->str_at = (uint64_t)str_at;
    put_counts(e, dev, mask);
    e->event_bytes = (uint8_t)ne; e->domain_bytes = (uint8_t)nd; e->message_bytes = (uint16_t)nm;
    __atomic_store_n(&e->commit, 1, __ATOMIC_RELEASE);
}

/* Each thread takes the trace's space a block at a time and fills it itself: the two shared counters (on the
 * header's line) took a locked add each per event, and threads writing at once (PyTorch's autograd thread beside
 * the main one) passed that line between their cores at every edge. A block's records the thread never wrote stay
 * zero (their commit byte unset): the reader passes over them. */
enum { BLOCK_EVENTS = 32, BLOCK_STRINGS = 8 << 10 };
/* ``taking``: the thread is between reading and moving its block's ends (and may hold the grow lock), where a
 * signal handler's event (an NVTX push in a C handler) would take the same bytes: that one takes its own from
 * the shared counters instead, without the lock, and is left out where its space is not ready */
struct block { char *buf; int64_t ev, ev_end, str, str_end; int taking; };
static __thread struct block t_block;  /* (``buf``: the trace it is of; a forked child's differs) */

/* ``n`` bytes at [*at, *end) of the thread's block of part ``p``, or of a new block taken there (smaller where
 * less is left): their offset, or -1 where the part (or the disk) is full */
static inline int64_t block_take(char *buf, struct part *p, int64_t *at, int64_t *end, uint64_t n, uint64_t block)
{
    int64_t got = *at;
    if (__builtin_expect(got + (int64_t)n > *end, 0)) {
        uint64_t len, most = p->cap / 64 / n * n;  /* (in a small trace a 64th of the part at most) */
        if (most > block) most = block;
        if ((got = part_take(buf, p, n, most > n ? most : n, &len, 1)) < 0) return -1;
        *end = got + (int64_t)len;
    }
    *at = got + (int64_t)n;
    return got;
}

/* One event's record and strings in the trace ``buf`` (of the calling thread, t_tid known), or the "tracefull"
 * event where they do not fit. */
static void emit_record(char *buf, unsigned long long t_ns, const char *event, size_t ne, const char *domain,
                        size_t nd, unsigned long long id, const char *message, size_t nm, int dev, uint64_t mask)
{
    struct block *b = &t_block;
    int64_t str_at, slot;
    uint64_t len;
    /* once the trace is full, no event of a thread with space left in its block comes after the "tracefull" one */
    if (__builtin_expect(atomic_load_explicit(&g_full, memory_order_relaxed), 0)) return;
    if (__builtin_expect(b->taking, 0)) {  /* (an event of a signal handler, inside the thread's own take) */
        str_at = part_take(buf, &g_strings, ne + nd + nm, ne + nd + nm, &len, 0);
        slot = str_at < 0 ? -1 : part_take(buf, &g_events, sizeof(struct pt_event), sizeof(struct pt_event), &len, 0);
        if (slot >= 0) put_event(buf, slot, str_at, t_ns, event, ne, domain, nd, id, dev, mask, message, nm);
        return;  /* (not said full: its space may only not be ready) */
    }
    b->taking = 1;
    atomic_signal_fence(memory_order_seq_cst);
    if (__builtin_expect(b->buf != buf, 0)) *b = (struct block){buf, 0, 0, 0, 0, 1};
    str_at = block_take(buf, &g_strings, &b->str, &b->str_end, ne + nd + nm, BLOCK_STRINGS);
    slot = str_at < 0 ? -1 : block_take(buf, &g_events, &b->ev, &b->ev_end, sizeof(struct pt_event),
                                        BLOCK_EVENTS * sizeof(struct pt_event));
    atomic_signal_fence(memory_order_seq_cst);
    b->taking = 0;
    if (slot >= 0) {
        put_event(buf, slot, str_at, t_ns, event, ne, domain, nd, id, dev, mask, message, nm);
        return;
    }
    if (atomic_exchange(&g_full, 1)) return;
    /* the first event that does not fit: say so, at its time, in the space kept for that at the end */
    static const char full[] = "tracefull", lost[] = "later events lost";
    put_event(buf, (int64_t)(g_events.cap - sizeof(struct pt_event)), (int64_t)(g_strings.cap - PT_TRACE_RESERVE),
              t_ns, full, sizeof full - 1, "default", 7, g_file_bytes, dev, 0, lost, sizeof lost - 1);
}

/* One event at time t_ns; dev = the CUDA ordinal to record (emit: the thread's current one). */
void emit_line(unsigned long long t_ns, const char *event, const char *domain, unsigned long long id,
               const char *message, int dev)
{
    char *buf = trace_open();
    if (!buf) return;
    if (!t_tid) t_tid = (long)syscall(SYS_gettid);
    /* A "kernel" event is CUPTI's, written by whichever thread flushed its buffer and stamped with the kernel's
     * GPU time: the thread's launches since its previous event wait for its next event of its own. */
    uint64_t mask = 0;
    if (strcmp(event, "kernel")) { mask = t_hot.devmask; t_hot.devmask = 0; }
    if (!domain) domain = "default";
    if (!message) message = "";
    size_t ne = strnlen(event, EVENT_MAX), nd = strnlen(domain, DOMAIN_MAX), nm = strnlen(message, MESSAGE_MAX);
    emit_record(buf, t_ns, event, ne, domain, nd, id, message, nm, dev, mask);
}

/* ---- the events' clock ----
 * CLOCK_MONOTONIC (the samplers' clock), read cheaply: once the call clock runs on the TSC, a thread reads
 * CLOCK_MONOTONIC once per ANCHOR_NS and extrapolates by the TSC in between (rdtsc ~13 ns against ~34 for a
 * clock_gettime on the lent VMs: at emit_nvtx density, ~230,000 edges a second, the difference is ~0.5 % of the
 * program's time). Off by the ratio's error (~1e-6) plus NTP's slewing (at most 500 ppm) over one anchor: < 0.5 us.
 * A thread's events never go back in time (a new anchor may land a little behind the extrapolation). Where no
 * launch has started the call clock yet, the first event 10 ms after load does (no wait then). */
enum { ANCHOR_NS = 1000000 };
static __thread unsigned long long t_anchor_ns, t_anchor_tsc, t_last_ns;
static atomic_int g_clock_asked;

static unsigned long long event_ns(void)
{
#if defined(__x86_64__)
    if (atomic_load_explicit(&g_hot.ticks_tsc, memory_order_acquire)) {
        unsigned long long tsc = __rdtsc(), ns;
        double r = atomic_load_explicit(&g_ns_per_tick, memory_order_relaxed);
        double since = (double)(tsc - t_anchor_tsc) * r;
        if (t_anchor_tsc && tsc >= t_anchor_tsc && since < ANCHOR_NS) {
            ns = t_anchor_ns + (unsigned long long)since;
        } else {  /* (the narrowest of a few pairs: an interrupt inside one anchor would skew its ms by microseconds) */
            struct now n = now_pair();
            ns = t_anchor_ns = n.ns;
            t_anchor_tsc = n.tsc;
        }
        if (ns < t_last_ns) ns = t_last_ns;
        return t_last_ns = ns;
    }
#endif
    unsigned long long ns = mono_ns();
    /* (once, and not from inside the set-up: its own "callclock" event comes back here, with the flag set; a
     * second pthread_once from inside the first waits for itself) */
    if (ns - g_loaded.ns >= CALIBRATE_NS && !atomic_load_explicit(&g_hot.call_clock_set, memory_order_acquire)
        && !atomic_load_explicit(&g_clock_asked, memory_order_relaxed) && !atomic_exchange(&g_clock_asked, 1))
        pthread_once(&g_call_clock_once, call_clock_init);
    return ns;
}

void emit(const char *event, const char *domain, unsigned long long id, const char *message)
{
    trace_open();  /* (before the time is taken: a process's first push is not late by its trace's set-up, tens of ms) */
    unsigned long long t = event_ns();
    emit_line(t, event, domain, id, message, edge_device(t, 0));
}

/* emit's work less what a nested edge knows already (its event's name and length, not a CUPTI line, a trace open
 * once the thread has written to it): ~10 % of a nested pair where the caches are cold (bench/edge_handler.c) */
void emit_nested(const char *event, size_t ne, const char *domain, const char *message)
{
    char *buf = atomic_load_explicit(&g_buf, memory_order_acquire);
    if (__builtin_expect(!buf, 0)) buf = trace_open();  /* (a forked child's first: its set-up before the time, as emit) */
    unsigned long long t = event_ns();
    int dev = edge_device(t, 1);
    if (__builtin_expect(!buf || !t_tid, 0)) { emit_line(t, event, domain, 0, message, dev); return; }
    uint64_t mask = t_hot.devmask;
    t_hot.devmask = 0;
    size_t nd = 7;
    if (domain) nd = strnlen(domain, DOMAIN_MAX); else domain = "default";
    if (!message) message = "";
    emit_record(buf, t, event, ne, domain, nd, 0, message, strnlen(message, MESSAGE_MAX), dev, mask);
}

/* ---- what the edges cost the program ----
 * One range edge in PT_EDGE_TIMED_EVERY of each thread's is timed from the handler's entry to its return, and the
 * time added to the trace's header (atomically: threads add at once), where attach reads it, after a crash too.
 * Two clock reads and two atomic adds on one edge in 61: ~1 ns an edge. The time inside the library is what an
 * edge costs the program less what the program's own code loses after it (the caches the library took). */
struct edge_clock edge_clock_start(void)
{
    int tsc = atomic_load_explicit(&g_hot.ticks_tsc, memory_order_acquire);
#if defined(__x86_64__)
    if (tsc) return (struct edge_clock){__rdtsc(), 1};
#endif
    return (struct edge_clock){mono_ns(), 0};
}

void edge_timed(struct edge_clock started)
{
    unsigned long long ns;  /* (the clock the edge started on: calibration may have switched it since) */
#if defined(__x86_64__)
    if (started.tsc)
        ns = (unsigned long long)((double)(__rdtsc() - started.at) * atomic_load_explicit(&g_ns_per_tick, memory_order_relaxed));
    else
#endif
        ns = mono_ns() - started.at;
    struct pt_trace_header *h = (struct pt_trace_header *)atomic_load_explicit(&g_buf, memory_order_acquire);
    if (!h) return;
    __atomic_fetch_add(&h->timed_edges, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&h->timed_ns, ns, __ATOMIC_RELAXED);
}

__thread unsigned long long t_unrecorded;

void unrecorded_add(void)
{
    struct pt_trace_header *h = (struct pt_trace_header *)atomic_load_explicit(&g_buf, memory_order_acquire);
    if (!h) return;  /* (no trace yet: a range left out lies inside a recorded one, which opened it) */
    unsigned long long n = __atomic_exchange_n(&t_unrecorded, 0, __ATOMIC_RELAXED);  /* (a handler's edge may add) */
    __atomic_fetch_add(&h->unrecorded_ranges, n, __ATOMIC_RELAXED);
}


/* Loaded at process start (LD_PRELOAD): map the edge page now, so the samplers know from the start that open
 * ranges are counted here (else they read fast until the first NVTX call). A passive copy leaves it to the first. */
__attribute__((constructor)) static void at_load(void) { g_loaded = now_pair(); if (!passive()) edges_open(); }

/* Final counters at normal exit (a crash skips this; the report then ends at the last event). */
__attribute__((destructor)) static void at_exit(void)
{
    unrecorded_flush();
    if (atomic_load(&g_buf)) {
        event_ns();  /* (a program whose events all came in its first 10 ms sets its call clock here: that line first) */
        emit("exit", NULL, 0, "");
    }
    open_ranges_exit();
}
