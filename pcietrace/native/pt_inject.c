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
 * Output: PCIETRACE_TRACE_DIR/trace-<pid>.tsv, a file mapped MAP_SHARED, so what was written survives a crash of
 * the application: a first line naming its format (pt_abi.h: PT_TRACE_MAGIC and PT_TRACE_VERSION), then one
 * tab-separated line per event:
 *   t_ns tid event domain id depth eager_thread graph_thread eager_process graph_process dev devmask
 *   captured_thread captured_process call_ns_thread call_ns_process wait_ns_thread wait_ns_process message
 * t_ns is CLOCK_MONOTONIC, the clock pcietrace's counter sampler uses. ``dev`` is the CUDA ordinal current
 * on the thread at the event (-1: none), ``devmask`` the ordinals the thread launched on since its previous
 * event (bit i = ordinal i); a "cudevice" event (id = ordinal, message = PCI bus id) names each ordinal once.
 * ``captured_*`` count the launches (kernel or graph) made into a stream that was being captured into a graph
 * (cuStreamBeginCapture ... cuStreamEndCapture): they add a node to a graph and run nothing, so they are in
 * neither the eager nor the graph counts.
 * ``call_ns_*`` add up the ns spent inside eager launch calls (a call whose queue is full waits there for the
 * GPU), ``wait_ns_*`` those inside cuCtxSynchronize, cuStreamSynchronize and cuEventSynchronize: how long the
 * host waited for the GPU. Both are timed by the trampolines and direct calls of interpose mode only (by the
 * TSC where the kernel's clocksource is it, turned into ns at each line); other modes write -1 (not timed).
 *
 * Range edges (pt_inject_edges.c; the page's words are named in pt_abi.h): with PCIETRACE_EDGE_FILE, every
 * push/pop/start/end bumps a shared 32-bit sequence number (PT_EDGE_SEQ); a range that opens while none is open
 * (and any edge of a domain that does not hold the fast rate) also wakes the sampler processes waiting on it (a
 * shared futex), so they read the counters right after it; nested and closing edges wake nobody (see
 * edge_signal). PT_EDGE_OPEN_RANGES counts the ranges open right now over every traced process and thread
 * (raised at push/start, lowered at pop/end, before the wake-up), so the samplers read fast only while one is
 * open; PT_EDGE_COUNTING says this library keeps that count (set when it maps the page), so that an older
 * library, which does not, never makes the samplers slow down inside ranges.
 * With PCIETRACE_EXACT_EDGES=1 the library also reads the counters itself through NVML at every edge (a "ctr"
 * event: id = NVML index, message = "read_ns tx rx"), before a push and after a pop.
 *
 * The library is built from units behind pt_inject.h (which lists them); this one holds the state they share,
 * the trace file and its lines, the clocks, fork, load and exit.
 */
#include "pt_inject.h"

#include <sys/mman.h>
#include <sys/syscall.h>

/* The interface version pcietrace's Python side checks (pt_abi.h), as a number and as a string it can find in
 * the file without loading it. */
EXPORT const unsigned pcietrace_inject_abi = PT_ABI_VERSION;
EXPORT const char pcietrace_inject_abi_tag[] = PT_ABI_TAG;

/* ---- state ---- */
static _Atomic(char *) g_buf;                /* the trace's mapping, published once it is whole (NULL: none) */
static size_t g_cap;
static atomic_size_t g_pos;
static atomic_int g_full;                    /* a line did not fit: the "tracefull" line was written */
enum { TRACE_RESERVE = PT_TRACE_RESERVE, TRACE_MIN = 1 << 16 };  /* room kept at the end of the file for that line */
atomic_ulong g_eager, g_graph, g_captured, g_range_id;
static pthread_mutex_t g_open_lock = PTHREAD_MUTEX_INITIALIZER;
__thread unsigned long t_eager, t_graph, t_captured;
__thread unsigned long long t_call_ticks, t_wait_ticks;
atomic_ullong g_call_ticks, g_wait_ticks;
__thread int t_depth;
static __thread long t_tid;
__thread uint64_t t_devmask;
atomic_ullong g_announced;

/* A forked child writes its own trace: its launch totals start at 0, it names its devices again there, and its
 * thread is its own. */
static void child_after_fork(void)
{
    atomic_store(&g_buf, NULL);
    t_tid = 0;  /* the forking thread has a new id in the child */
    t_devmask = 0;  /* the parent's launches since its last event: its next event reports them, not ours */
    t_eager = t_graph = t_captured = 0;  /* the child's own counts (else its first event held the parent's too) */
    atomic_store(&g_pos, 0); atomic_store(&g_full, 0);
    atomic_store(&g_eager, 0); atomic_store(&g_graph, 0); atomic_store(&g_captured, 0); atomic_store(&g_announced, 0);
    edges_after_fork();
}

static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;
static void atfork_register(void) { pthread_atfork(NULL, NULL, child_after_fork); }

/* The trace's mapping, opened by the first event of the process (NULL: no trace, or another copy writes it). Its
 * first line names the format (pt_abi.h). */
static char *trace_open(void)
{
    char *buf = atomic_load_explicit(&g_buf, memory_order_acquire);
    if (buf) return buf;
    if (passive()) return NULL;  /* the recording copy writes this process's trace */
    pthread_once(&g_atfork_once, atfork_register);
    pthread_mutex_lock(&g_open_lock);
    buf = atomic_load_explicit(&g_buf, memory_order_relaxed);
    if (!buf) {
        const char *dir = getenv("PCIETRACE_TRACE_DIR");
        const char *cap = getenv("PCIETRACE_TRACE_BYTES");
        char path[4096];
        size_t want = cap ? strtoull(cap, NULL, 10) : (size_t)256 << 20;
        if (want < TRACE_MIN) want = TRACE_MIN;
        if (dir && snprintf(path, sizeof path, "%s/trace-%d.tsv", dir, (int)getpid()) < (int)sizeof path) {
            int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
            if (fd >= 0 && ftruncate(fd, (off_t)want) == 0) {
                void *m = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (m != MAP_FAILED) {
                    int n = snprintf(m, want, "%s %d\n", PT_TRACE_MAGIC, PT_TRACE_VERSION);
                    g_cap = want;
                    atomic_store(&g_pos, n > 0 ? (size_t)n : 0);
                    buf = m;
                    atomic_store_explicit(&g_buf, buf, memory_order_release);
                }
            }
            if (fd >= 0) close(fd);  /* the mapping stays valid */
        }
    }
    pthread_mutex_unlock(&g_open_lock);
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
_Atomic int g_ticks_tsc;
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
            atomic_store_explicit(&g_ticks_tsc, 1, memory_order_release);
            char m[64];
            snprintf(m, sizeof m, "tsc %.9g %llu", r, n.ns - g_loaded.ns);
            emit("callclock", NULL, 0, m);
            return;
        }
    }
#endif
    emit("callclock", NULL, 0, "monotonic");
}

/* ---- a trace line, field by field: snprintf was ~2/3 of a range edge's cost (~0.4 of 0.62 us, perf over
 * bench/edge_cost.cu), and every NVTX push and pop writes a line in the program's own thread ---- */
struct line { char *p, *end; int ok; };  /* ok = 0 once something did not fit: the line is dropped */
/* A line's longest parts are cut so that every line fits its buffer (1,023 + 255 + 16 numbers and the event:
 * under 1,700 bytes): a push dropped for its length left its pop to close the enclosing range. */
enum { LINE_BYTES = 2048, MESSAGE_MAX = 1023, DOMAIN_MAX = 255 };

/* ``s``, at most ``max`` bytes of it; ``clean``: tabs and newlines become spaces (a message stays one field) */
static void put_s(struct line *o, const char *s, size_t max, int clean)
{
    size_t n = strnlen(s, max);  /* copied whole, then cleaned in place: a per-byte loop was most of a dense edge */
    if ((size_t)(o->end - o->p) < n) { o->ok = 0; return; }
    memcpy(o->p, s, n);
    if (clean)  /* (memchr scans a word at a time: names rarely hold a tab or newline) */
        for (char *c = o->p, *end = o->p + n; (c = memchr(c, '\t', (size_t)(end - c))); ) *c = ' ';
    if (clean)
        for (char *c = o->p, *end = o->p + n; (c = memchr(c, '\n', (size_t)(end - c))); ) *c = ' ';
    o->p += n;
}

/* two digits per division: a line has ~20 numbers, and at emit_nvtx density (a range per op) every edge writes one */
static const char DIGIT_PAIRS[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

static void put_u(struct line *o, unsigned long long v)
{
    char d[20];
    int k = 20;
    while (v >= 100) { const char *p = DIGIT_PAIRS + 2 * (v % 100); v /= 100; d[--k] = p[1]; d[--k] = p[0]; }
    if (v >= 10) { const char *p = DIGIT_PAIRS + 2 * v; d[--k] = p[1]; d[--k] = p[0]; }
    else d[--k] = (char)('0' + v);
    if (o->end - o->p < 20 - k) { o->ok = 0; return; }
    memcpy(o->p, d + k, (size_t)(20 - k));
    o->p += 20 - k;
}

static void put_i(struct line *o, long long v)
{
    if (v < 0) put_s(o, "-", 1, 0);
    put_u(o, v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v);
}

#define TAB(o) put_s(o, "\t", 1, 0)

/* The fields every line has after its first four (time, thread, event, domain) and id: depth, the launch
 * counts, the device and the thread's device mask, the captured counts, and the four call-timing fields (-1
 * each where launch and synchronize calls are not timed). */
static void put_counts(struct line *o, int dev, uint64_t mask)
{
    put_i(o, t_depth); TAB(o); put_u(o, t_eager); TAB(o); put_u(o, t_graph); TAB(o);
    put_u(o, atomic_load(&g_eager)); TAB(o); put_u(o, atomic_load(&g_graph)); TAB(o); put_i(o, dev); TAB(o);
    put_u(o, mask); TAB(o); put_u(o, t_captured); TAB(o); put_u(o, atomic_load(&g_captured)); TAB(o);
    if (!interposing()) put_s(o, "-1\t-1\t-1\t-1", 16, 0);
    else {
        unsigned long long sums[4] = {t_call_ticks, atomic_load(&g_call_ticks), t_wait_ticks, atomic_load(&g_wait_ticks)};
        /* asked after the sums (acquire; the adds release): a sum holding ticks finds the TSC clock set */
        int tsc = atomic_load_explicit(&g_ticks_tsc, memory_order_acquire);
        double r = atomic_load_explicit(&g_ns_per_tick, memory_order_relaxed);
        for (int i = 0; i < 4; ++i) { if (i) TAB(o); put_u(o, tsc ? (unsigned long long)(sums[i] * r) : sums[i]); }
    }
    TAB(o);
}

/* A whole line: time, thread, event, domain, id, the counts, the message. */
static void put_line(struct line *o, unsigned long long t_ns, const char *event, const char *domain,
                     unsigned long long id, int dev, uint64_t mask, const char *message)
{
    put_u(o, t_ns); TAB(o); put_i(o, t_tid); TAB(o); put_s(o, event, 64, 0); TAB(o);
    put_s(o, domain ? domain : "default", DOMAIN_MAX, 1); TAB(o); put_u(o, id); TAB(o);
    put_counts(o, dev, mask);
    put_s(o, message ? message : "", MESSAGE_MAX, 1);
    put_s(o, "\n", 1, 0);
}

/* One trace line at time t_ns; dev = the CUDA ordinal to record (emit: the thread's current one). */
void emit_line(unsigned long long t_ns, const char *event, const char *domain, unsigned long long id,
               const char *message, int dev)
{
    char *trace = trace_open();
    if (!trace) return;
    if (!t_tid) t_tid = (long)syscall(SYS_gettid);
    char buf[LINE_BYTES];
    /* A "kernel" line is CUPTI's, written by whichever thread flushed its buffer and stamped with the kernel's
     * GPU time: the thread's launches since its previous event wait for its next event of its own. */
    uint64_t mask = 0;
    if (strcmp(event, "kernel")) { mask = t_devmask; t_devmask = 0; }
    struct line o = {buf, buf + sizeof buf, 1};
    put_line(&o, t_ns, event, domain, id, dev, mask, message);
    if (!o.ok) return;
    size_t n = (size_t)(o.p - buf);
    size_t at = atomic_fetch_add(&g_pos, n);
    if (at + n <= g_cap - TRACE_RESERVE) { memcpy(trace + at, buf, n); return; }
    if (atomic_exchange(&g_full, 1)) return;
    /* the first line that does not fit: say so, at its time, in the space kept for that at the end */
    o = (struct line){buf, buf + TRACE_RESERVE, 1};
    put_line(&o, t_ns, "tracefull", NULL, g_cap, dev, 0, "later events lost");
    if (o.ok) memcpy(trace + g_cap - TRACE_RESERVE, buf, (size_t)(o.p - buf));
}

void emit(const char *event, const char *domain, unsigned long long id, const char *message)
{
    emit_line(mono_ns(), event, domain, id, message, current_device(0));
}


/* Loaded at process start (LD_PRELOAD): map the edge page now, so the samplers know from the start that open
 * ranges are counted here (else they read fast until the first NVTX call). A passive copy leaves it to the first. */
__attribute__((constructor)) static void at_load(void) { g_loaded = now_pair(); if (!passive()) edges_open(); }

/* Final counters at normal exit (a crash skips this; the report then ends at the last event). */
__attribute__((destructor)) static void at_exit(void)
{
    if (atomic_load(&g_buf)) emit("exit", NULL, 0, "");
    open_ranges_exit();
}
