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
 *    handed out through an interposed dlsym/cuGetProcAddress (see below).
 * A second copy loaded from another path (another object) records nothing and only forwards: see "two copies".
 *
 * Output: one tab-separated line per event, appended to PCIETRACE_TRACE_DIR/trace-<pid>.tsv, a
 * file mapped MAP_SHARED, so what was written survives a crash of the application:
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
 * Range edges: with PCIETRACE_EDGE_FILE, every push/pop/start/end bumps a shared 32-bit sequence number; a
 * range that opens while none is open (and any edge of a domain that does not hold the fast rate) also wakes
 * the sampler processes waiting on it (a shared futex), so they read the counters right after it; nested and
 * closing edges wake nobody (see edge_signal). The next 32-bit word counts the ranges open right now over every traced process and thread (raised
 * at push/start, lowered at pop/end, before the wake-up), so the samplers read fast only while one is open;
 * word 3 says this library keeps that count (set when it maps the page), so that an older library, which
 * does not, never makes the samplers slow down inside ranges.
 * With PCIETRACE_EXACT_EDGES=1 the library also reads the counters itself through NVML at every edge (a "ctr"
 * event: id = NVML index, message = "read_ns tx rx"), before a push and after a pop.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <link.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#define EXPORT __attribute__((visibility("default")))

/* ---- NVTX injection ABI (values from nvToolsExt's nvtxDetail/nvtxTypes.h) ---- */
typedef void (*NvtxFunctionPointer)(void);
typedef NvtxFunctionPointer **NvtxFunctionTable;
typedef struct { size_t struct_size; int (*GetModuleFunctionTable)(int module, NvtxFunctionTable *table, unsigned int *size); } NvtxExportTableCallbacks;
typedef const void *(*NvtxGetExportTableFunc_t)(uint32_t exportTableId);
enum { NVTX_ETID_CALLBACKS = 1, NVTX_CB_MODULE_CORE = 1, NVTX_CB_MODULE_CORE2 = 5 };
enum { CORE_MarkEx = 1, CORE_MarkA = 2, CORE_MarkW = 3, CORE_RangeStartEx = 4, CORE_RangeStartA = 5, CORE_RangeStartW = 6,
       CORE_RangeEnd = 7, CORE_RangePushEx = 8, CORE_RangePushA = 9, CORE_RangePushW = 10, CORE_RangePop = 11 };
enum { CORE2_DomainMarkEx = 1, CORE2_DomainRangeStartEx = 2, CORE2_DomainRangeEnd = 3, CORE2_DomainRangePushEx = 4,
       CORE2_DomainRangePop = 5, CORE2_DomainRegisterStringA = 10, CORE2_DomainRegisterStringW = 11,
       CORE2_DomainCreateA = 12, CORE2_DomainCreateW = 13 };
/* nvtxEventAttributes_v2: message type at byte 32, message (char*, wchar_t* or string handle) at 40 */
typedef struct { uint16_t version, size; uint32_t category; int32_t colorType; uint32_t color; int32_t payloadType;
                 int32_t reserved0; uint64_t payload; int32_t messageType; int32_t pad; const void *message; } EventAttributes;
enum { MSG_ASCII = 1, MSG_UNICODE = 2, MSG_REGISTERED = 3 };

/* ---- CUPTI (values from cupti_callbacks.h / cupti_driver_cbid.h) ---- */
typedef void (*CuptiCallback)(void *userdata, int domain, uint32_t cbid, const void *cbdata);
/* CUpti_CallbackData's first fields: callbackSite (enum) at 0, functionName at 8, functionParams at 16 */
typedef struct { int callbackSite; const char *functionName; const void *functionParams; } CuptiCallbackDataHead;
enum { CUPTI_CB_DOMAIN_DRIVER_API = 1, CUPTI_API_ENTER = 0 };
static const uint32_t LAUNCH_CBIDS[] = {307 /* cuLaunchKernel */, 442 /* _ptsz */, 514 /* cuGraphLaunch */,
                                       515 /* _ptsz */, 652 /* cuLaunchKernelEx */, 653 /* _ptsz */,
                                       477 /* cuLaunchCooperativeKernel */, 478 /* _ptsz */};

/* ---- state ---- */
static char *g_buf;
static size_t g_cap;
static atomic_size_t g_pos;
static atomic_int g_full;                    /* a line did not fit: the "tracefull" line was written */
enum { TRACE_RESERVE = 256, TRACE_MIN = 1 << 16 };  /* room kept at the end of the file for that line */
static atomic_ulong g_eager, g_graph, g_captured, g_range_id;
static pthread_mutex_t g_open_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread unsigned long t_eager, t_graph, t_captured;
/* time inside eager launch calls / synchronize calls, in call-clock ticks (call_ticks(); ns at each line) */
static __thread unsigned long long t_call_ticks, t_wait_ticks;
static atomic_ullong g_call_ticks, g_wait_ticks;
static __thread int t_depth;
static __thread long t_tid;
static __thread uint64_t t_devmask;          /* ordinals launched on since this thread's previous event */
static atomic_ullong g_announced;            /* ordinals already named by a "cudevice" event */
static void emit(const char *event, const char *domain, unsigned long long id, const char *message);

/* ---- which GPU: the driver's current context, looked up only where libcuda is already loaded ---- */
static int (*p_ctx_get_device)(int *);
static int (*p_device_bus_id)(char *, int, int);
static void *real_dlsym_fn(void *handle, const char *name);

/* The CUDA driver's handle if the process has loaded it (in any scope), else NULL: never loads it. */
static void *libcuda(void) { return dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD); }

static unsigned long long mono_ns(void);
/* A process without the driver asks again at most every 10 ms: dlopen's search cost 5-23 us per range edge
 * (bench/edge_cost.cu), and a context takes far longer than that to create after the driver loads, so no
 * device is missed. A launch (``retry_now``) comes through the driver: it asks at once. */
#define NO_DRIVER_RETRY_NS 10000000ull
static _Atomic unsigned long long g_no_driver_until_ns;

static int current_device(int retry_now)
{
    if (!p_ctx_get_device) {
        if (!retry_now && mono_ns() < atomic_load_explicit(&g_no_driver_until_ns, memory_order_relaxed)) return -1;
        void *lib = libcuda();
        if (!lib) {
            atomic_store_explicit(&g_no_driver_until_ns, mono_ns() + NO_DRIVER_RETRY_NS, memory_order_relaxed);
            return -1;
        }
        p_device_bus_id = (int (*)(char *, int, int))real_dlsym_fn(lib, "cuDeviceGetPCIBusId");
        p_ctx_get_device = (int (*)(int *))real_dlsym_fn(lib, "cuCtxGetDevice");
        if (!p_ctx_get_device) return -1;
    }
    int dev = -1;
    return p_ctx_get_device(&dev) == 0 ? dev : -1;
}

/* Name an ordinal (its PCI bus id) the first time it is seen, so Python can map it to an NVML index. */
static void announce(int dev)
{
    if (dev < 0 || dev > 63) return;
    unsigned long long bit = 1ull << dev;
    if (atomic_fetch_or(&g_announced, bit) & bit) return;
    char bus[64] = "?";
    if (p_device_bus_id && p_device_bus_id(bus, (int)sizeof bus, dev) != 0) strcpy(bus, "?");
    emit("cudevice", NULL, (unsigned long long)dev, bus);
}

static inline void note_launch_device(void)
{
    int dev = current_device(1);
    if (dev >= 0 && dev < 64) {
        if (!(atomic_load_explicit(&g_announced, memory_order_relaxed) & (1ull << dev))) announce(dev);
        t_devmask |= 1ull << dev;  /* after announce(): its event resets the thread's mask */
    }
}

static void open_ranges_forget(void);
static pthread_mutex_t g_read_lock = PTHREAD_MUTEX_INITIALIZER;  /* the library's own counter reads take turns */
/* A forked child writes its own trace: its launch totals start at 0, it names its devices again there, and its
 * thread is its own. */
static void child_after_fork(void)
{
    g_buf = NULL;
    t_tid = 0;  /* the forking thread has a new id in the child */
    t_devmask = 0;  /* the parent's launches since its last event: its next event reports them, not ours */
    t_eager = t_graph = t_captured = 0;  /* the child's own counts (else its first event held the parent's too) */
    atomic_store(&g_pos, 0); atomic_store(&g_full, 0);
    atomic_store(&g_eager, 0); atomic_store(&g_graph, 0); atomic_store(&g_captured, 0); atomic_store(&g_announced, 0);
    open_ranges_forget();
    pthread_mutex_init(&g_read_lock, NULL);  /* a parent's thread may have held it at fork(): it has no thread here */
}

/* ---- two copies in one process: the first loaded records, a later one only forwards ----
 * Two paths are two objects (attach from one install wrapping a program that runs attach from another, or the
 * library added to LD_PRELOAD by hand beside attach's): each would count every launch that passes through both
 * (direct calls go from one's definition to the next) and truncate the other's trace. Every copy exports
 * pcietrace_inject_copy; the copy that records is the first object, in load order (dl_iterate_phdr: preloads,
 * then each dlopen), that defines it. Not a lookup in the global scope (RTLD_DEFAULT): copies that NVTX's or
 * CUDA's loader opened RTLD_LOCAL are not there, and two such would each find only themselves. The same path
 * loaded twice is one object, which finds itself. A copy built before the marker (4aa36b5) is known by its
 * file name (_pt_inject*, setup.py's) and NVTX's entry point; it records, knowing nothing of later copies. The
 * passive copy says so in the recording copy's trace (a "copy" event, message = its path), where that copy
 * exports pcietrace_inject_copy_loaded. */
static const char k_marker[] = "pcietrace injection library";
/* exported as an alias: this copy's own code refers to k_marker, which no other copy's definition interposes */
EXPORT extern const char pcietrace_inject_copy[sizeof k_marker] __attribute__((alias("k_marker")));
static int g_passive = -1;  /* another copy, loaded before, records: this one forwards (-1: not known yet) */
static void *g_first;       /* that copy's handle */
static pthread_once_t g_copies_once = PTHREAD_ONCE_INIT;

/* Called by a later, passive copy (``path``: its file): the trace says a second copy forwarded to this one. */
EXPORT void pcietrace_inject_copy_loaded(const char *path) { emit("copy", NULL, 0, path); }

struct earlier { uintptr_t self; char **names; size_t n, cap; };

/* dl_iterate_phdr's visit: the name of each object loaded before this one; stops at this one. */
static int note_earlier(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct earlier *e = data;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t at = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && e->self >= at && e->self - at < ph->p_memsz) return 1;
    }
    if (!*info->dlpi_name) return 0;  /* the program itself: a copy is never that */
    if (e->n == e->cap) {
        char **more = realloc(e->names, (e->cap = e->cap ? 2 * e->cap : 64) * sizeof *more);
        if (!more) return 1;
        e->names = more;
    }
    if ((e->names[e->n] = strdup(info->dlpi_name))) ++e->n;  /* copied: an object may be unloaded meanwhile */
    return 0;
}

/* Whether ``name`` (an earlier object's path) is a copy built before the marker: setup.py's file name and
 * NVTX's entry point, defined there. */
static int unmarked_copy(const char *name, void *h)
{
    const char *base = strrchr(name, '/');
    Dl_info there;
    void *entry = real_dlsym_fn(h, "InitializeInjectionNvtx2");
    return !strncmp(base ? base + 1 : name, "_pt_inject", 10) && entry && dladdr(entry, &there) &&
           !strcmp(there.dli_fname, name);
}

static void copies_resolve(void)
{
    struct earlier e = {(uintptr_t)(void *)copies_resolve, NULL, 0, 0};
    dl_iterate_phdr(note_earlier, &e);
    /* dlopen and dlsym outside the visit: dl_iterate_phdr holds the loader's list lock */
    const char *marker = NULL;
    char *unmarked = NULL;  /* the first copy built before the marker, if no marked copy came before */
    for (size_t i = 0; i < e.n; ++i) {
        void *h = marker ? NULL : dlopen(e.names[i], RTLD_LAZY | RTLD_NOLOAD);
        if (h) {
            marker = real_dlsym_fn(h, "pcietrace_inject_copy");
            if (!marker && !unmarked && unmarked_copy(e.names[i], h)) unmarked = strdup(e.names[i]);
            dlclose(h);
        }
        free(e.names[i]);
    }
    Dl_info there;  /* (found in that object or one it depends on: the copy is the object that defines it) */
    int later = (marker && marker != k_marker) || (!marker && unmarked);
    if (marker && later && dladdr(marker, &there)) g_first = dlopen(there.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    else if (later && unmarked) g_first = dlopen(unmarked, RTLD_LAZY | RTLD_NOLOAD);
    free(unmarked);
    free(e.names);
    dlerror();  /* the objects probed in vain are no error of the program's */
    __atomic_store_n(&g_passive, later, __ATOMIC_RELEASE);
    void (*loaded)(const char *) = g_first ? (void (*)(const char *))real_dlsym_fn(g_first, "pcietrace_inject_copy_loaded") : NULL;
    if (loaded && dladdr(k_marker, &there)) loaded(there.dli_fname);
    dlerror();
}

/* Whether another copy of this library, loaded before this one, records: this one then forwards only. */
static inline int passive(void)
{
    int known = __atomic_load_n(&g_passive, __ATOMIC_ACQUIRE);  /* (a direct call asks at every launch) */
    if (__builtin_expect(known >= 0, 1)) return known;
    pthread_once(&g_copies_once, copies_resolve);
    return g_passive;
}

/* The recording copy's ``name`` (a passive copy hands NVTX's and CUDA's initialisation to it). */
static void *first_copy(const char *name) { return passive() && g_first ? real_dlsym_fn(g_first, name) : NULL; }

static int trace_open(void)
{
    if (g_buf) return 1;
    if (passive()) return 0;  /* the recording copy writes this process's trace */
    pthread_mutex_lock(&g_open_lock);
    if (!g_buf) {
        const char *dir = getenv("PCIETRACE_TRACE_DIR");
        const char *cap = getenv("PCIETRACE_TRACE_BYTES");
        char path[4096];
        size_t want = cap ? strtoull(cap, NULL, 10) : (size_t)256 << 20;
        if (want < TRACE_MIN) want = TRACE_MIN;
        if (dir && snprintf(path, sizeof path, "%s/trace-%d.tsv", dir, (int)getpid()) < (int)sizeof path) {
            int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
            if (fd >= 0 && ftruncate(fd, (off_t)want) == 0) {
                void *m = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (m != MAP_FAILED) { g_cap = want; atomic_store(&g_pos, 0); g_buf = m; }
            }
            if (fd >= 0) close(fd);  /* the mapping stays valid */
        }
        static int atfork_done;
        if (!atfork_done) { pthread_atfork(NULL, NULL, child_after_fork); atfork_done = 1; }
    }
    pthread_mutex_unlock(&g_open_lock);
    return g_buf != NULL;
}

static unsigned long long mono_ns(void)
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
static _Atomic int g_ticks_tsc;              /* call ticks are TSC ticks */
static pthread_once_t g_call_clock_once = PTHREAD_ONCE_INIT;

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

static void call_clock_init(void)
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

static inline unsigned long long call_ticks(void)
{
#if defined(__x86_64__)
    if (atomic_load_explicit(&g_ticks_tsc, memory_order_relaxed)) return __rdtsc();
#endif
    return mono_ns();
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

static int interposing(void);
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

/* The trace's pages are faulted in a chunk ahead of the lines, one madvise per chunk: a page first touched by a
 * line cost a fault of its own, a fifth of a dense range edge's time on a VM (perf over a loop of nested edges).
 * Kernels before MADV_POPULATE_WRITE (5.14) refuse it: lines then fault pages in as before. */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
enum { PREFAULT_BYTES = 1 << 20 };

static void prefault(size_t at, size_t n)
{
    size_t chunk = (at + n) / PREFAULT_BYTES;
    if (at && chunk == at / PREFAULT_BYTES) return;  /* only the line that enters a chunk (or the first) asks */
    for (size_t c = at ? chunk + 1 : 0; c <= chunk + 1; ++c) {
        size_t start = c * PREFAULT_BYTES;
        if (start < g_cap) madvise(g_buf + start, g_cap - start < PREFAULT_BYTES ? g_cap - start : PREFAULT_BYTES,
                                   MADV_POPULATE_WRITE);
    }
}

/* One trace line at time t_ns; dev = the CUDA ordinal to record (emit: the thread's current one). */
static void emit_line(unsigned long long t_ns, const char *event, const char *domain, unsigned long long id,
                      const char *message, int dev)
{
    if (!trace_open()) return;
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
    if (at + n <= g_cap - TRACE_RESERVE) { prefault(at, n); memcpy(g_buf + at, buf, n); return; }
    if (atomic_exchange(&g_full, 1)) return;
    /* the first line that does not fit: say so, at its time, in the space kept for that at the end */
    o = (struct line){buf, buf + TRACE_RESERVE, 1};
    put_line(&o, t_ns, "tracefull", NULL, g_cap, dev, 0, "later events lost");
    if (o.ok) memcpy(g_buf + g_cap - TRACE_RESERVE, buf, (size_t)(o.p - buf));
}

static void emit(const char *event, const char *domain, unsigned long long id, const char *message)
{
    emit_line(mono_ns(), event, domain, id, message, current_device(0));
}

/* A wide (wchar_t: UTF-32 on Linux) NVTX message as UTF-8 in ``tmp``, whatever the program's locale (a C++
 * program that never calls setlocale runs in "C", where wcstombs fails on anything beyond ASCII); truncated at
 * a character boundary, a code point that is not one written as U+FFFD. */
static const char *narrow(const wchar_t *w, char *tmp, size_t tmpsize)
{
    if (!w) return "";
    size_t n = 0;
    for (; *w; ++w) {
        uint32_t c = (uint32_t)*w;
        if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) c = 0xFFFD;
        int len = c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
        if (n + (size_t)len >= tmpsize) break;
        if (len == 1) { tmp[n++] = (char)c; continue; }
        static const unsigned char lead[] = {0, 0, 0xC0, 0xE0, 0xF0};
        for (int i = len - 1; i > 0; --i, c >>= 6) tmp[n + (size_t)i] = (char)(0x80 | (c & 0x3F));
        tmp[n] = (char)(lead[len] | c);
        n += (size_t)len;
    }
    tmp[n] = 0;
    return tmp;
}

static const char *message_of(const EventAttributes *a, char *tmp, size_t tmpsize)
{
    if (!a || !a->message) return "";
    switch (a->messageType) {
    case MSG_ASCII: case MSG_REGISTERED: return (const char *)a->message;  /* our string handles are char* */
    case MSG_UNICODE: return narrow((const wchar_t *)a->message, tmp, tmpsize);
    default: return "";
    }
}

/* ---- NVTX handlers: domain handles and registered strings are strdup'ed names ---- */
/* ---- range edges: wake the samplers; optionally read the counters here (PCIETRACE_EXACT_EDGES) ---- */
static atomic_uint *g_edge_seq;
static int g_edge_wake = 1;  /* PCIETRACE_EDGE_WAKE=0: count edges but leave the samplers to their own pace */
static pthread_once_t g_edges_once = PTHREAD_ONCE_INIT;

static void edges_map(void)
{
    const char *path = getenv("PCIETRACE_EDGE_FILE");
    if (!path || !*path) return;
    const char *wake = getenv("PCIETRACE_EDGE_WAKE");
    g_edge_wake = !(wake && !strcmp(wake, "0"));
    int fd = open(path, O_RDWR);
    if (fd < 0) return;
    void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return;
    g_edge_seq = (atomic_uint *)m;
    atomic_store(&g_edge_seq[3], 1);  /* "open ranges are counted" (word 1) */
}

/* once, and every thread waits for it: a flag set before the mapping let a second thread skip its edge */
static void edges_open(void) { pthread_once(&g_edges_once, edges_map); }

/* Every edge bumps the sequence; only an edge that can change a sampler's pace also wakes it (a system call
 * each): a range opening while none was open, an edge of a domain that does not hold the fast rate, the
 * process leaving. Nested edges and closing ones wake nobody: while a range is open the samplers read at
 * their own fixed pace, so at emit_nvtx density (thousands of nested edges per step) the edges cost no
 * system call and no extra read. */
static void edge_signal(int wake)
{
    edges_open();
    if (!g_edge_seq) return;
    atomic_fetch_add(g_edge_seq, 1);
    if (wake && g_edge_wake) syscall(SYS_futex, (void *)g_edge_seq, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);  /* shared: no FUTEX_PRIVATE_FLAG */
}

/* ---- ranges open now (word 1 of the edge page) ----
 * Only ranges this process counted are uncounted: a pop is counted only where the thread's own counted depth
 * is above 0, an end only for an id whose start was counted (kept in a small table; a start that finds the
 * table full is simply not counted, and neither is its end). The shared word is lowered with a CAS loop that
 * stops at 0, so even a range counted by a parent before fork() and closed in both processes cannot drive it
 * negative. Ranges still open when the process exits normally are uncounted then (at_exit); one killed
 * inside a range keeps the samplers fast for the rest of the run: the safe direction. */
#define OPEN_IDS 256
static _Atomic unsigned long long g_open_ids[OPEN_IDS];
static __thread int t_counted;               /* this thread's push ranges counted in the shared word */
static atomic_int g_counted;                 /* this process's ranges counted in the shared word */

static void open_ranges_forget(void)
{
    t_counted = 0;  /* after fork: the parent's ranges are the parent's to close */
    atomic_store(&g_counted, 0);
    for (int i = 0; i < OPEN_IDS; ++i) atomic_store(&g_open_ids[i], 0);
}

/* returns whether no range was open before (the samplers may be idle: this edge wakes them) */
static int open_ranges_add(void)
{
    edges_open();
    if (!g_edge_seq) return 0;
    atomic_fetch_add(&g_counted, 1);
    return atomic_fetch_add(&g_edge_seq[1], 1) == 0;
}

static void open_ranges_sub_n(unsigned k)
{
    unsigned n = atomic_load(&g_edge_seq[1]);
    while (n > 0 && !atomic_compare_exchange_weak(&g_edge_seq[1], &n, n > k ? n - k : 0)) {}
}

static void open_ranges_sub(void)
{
    edges_open();
    if (!g_edge_seq) return;
    atomic_fetch_sub(&g_counted, 1);
    open_ranges_sub_n(1);
}

/* At normal exit: this process's ranges are closed for good (the samplers may go idle), and the samplers
 * are woken to see it. */
static void open_ranges_exit(void)
{
    int k = atomic_exchange(&g_counted, 0);
    if (!g_edge_seq || k <= 0) return;
    open_ranges_sub_n((unsigned)k);
    edge_signal(1);
}

/* Ranges of the domains in PCIETRACE_SLOW_DOMAINS (comma-separated, e.g. NCCL) do not hold the samplers at
 * the fast rate: NVML reads during NCCL's communicator set-up (inside NCCL's own range) doubled it. */
static int holds_fast(const char *domain)
{
    static const char *list;
    static int looked;
    if (!looked) { list = getenv("PCIETRACE_SLOW_DOMAINS"); looked = 1; }  /* racing threads read the same value */
    if (!domain) domain = "default";  /* the core (domain-less) API, named as in the trace */
    size_t n = strlen(domain);
    for (const char *p = list; p && *p && n;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && !strncmp(p, domain, n)) return 0;
        p = end ? end + 1 : p + len;
    }
    return 1;
}

static int open_push(void) { ++t_counted; return open_ranges_add(); }
static void close_pop(void) { if (t_counted > 0) { --t_counted; open_ranges_sub(); } }

static int open_start(unsigned long long id)
{
    edges_open();
    for (int i = 0; g_edge_seq && i < OPEN_IDS; ++i) {
        unsigned long long empty = 0;  /* a plain load first: a CAS per occupied slot would be a locked op each */
        if (!atomic_load_explicit(&g_open_ids[i], memory_order_relaxed)
            && atomic_compare_exchange_strong(&g_open_ids[i], &empty, id)) return open_ranges_add();
    }
    return 1;  /* not counted (table full): wake, as for a domain that does not hold the fast rate */
}

static void close_end(unsigned long long id)
{
    edges_open();
    for (int i = 0; g_edge_seq && id && i < OPEN_IDS; ++i) {
        unsigned long long want = id;
        if (atomic_load_explicit(&g_open_ids[i], memory_order_relaxed) == id
            && atomic_compare_exchange_strong(&g_open_ids[i], &want, 0)) { open_ranges_sub(); return; }
    }
}

/* nvmlFieldValue_t (nvml.h): fieldId, scopeId, timestamp, latencyUsec, valueType, nvmlReturn, value (8 B) */
typedef struct { unsigned fieldId, scopeId; long long timestamp, latencyUsec; int valueType, nvmlReturn;
                 union { unsigned uiVal; unsigned long long ullVal; } value; } NvmlField;
static int (*nvml_fields)(void *, int, NvmlField *);
static int (*nvml_by_bus)(const char *, void **);
static int (*nvml_by_index)(unsigned, void **);
static int (*nvml_index_of)(void *, unsigned *);
static int g_exact = -1;
static char g_nvml_indices[256];
static pthread_mutex_t g_nvml_lock = PTHREAD_MUTEX_INITIALIZER;

static int exact_on(void)
{
    if (g_exact >= 0) return g_exact;
    pthread_mutex_lock(&g_nvml_lock);
    if (g_exact < 0) {
        const char *e = getenv("PCIETRACE_EXACT_EDGES");
        void *lib = (e && !strcmp(e, "1")) ? dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL) : NULL;
        int (*init)(void) = lib ? (int (*)(void))real_dlsym_fn(lib, "nvmlInit_v2") : NULL;
        if (init && init() == 0) {
            nvml_fields = (int (*)(void *, int, NvmlField *))real_dlsym_fn(lib, "nvmlDeviceGetFieldValues");
            nvml_by_bus = (int (*)(const char *, void **))real_dlsym_fn(lib, "nvmlDeviceGetHandleByPciBusId_v2");
            nvml_by_index = (int (*)(unsigned, void **))real_dlsym_fn(lib, "nvmlDeviceGetHandleByIndex_v2");
            nvml_index_of = (int (*)(void *, unsigned *))real_dlsym_fn(lib, "nvmlDeviceGetIndex");
            const char *idx = getenv("PCIETRACE_NVML_INDICES");
            snprintf(g_nvml_indices, sizeof g_nvml_indices, "%s", idx ? idx : "");
        }
        g_exact = nvml_fields && nvml_by_bus && nvml_by_index && nvml_index_of;
        if (e && !strcmp(e, "1") && !g_exact) emit("exact", NULL, 0, "NVML not available: exact edges off");
    }
    pthread_mutex_unlock(&g_nvml_lock);
    return g_exact;
}

/* NVML serializes a process's reads: threads at their edges at once take turns. Taking the turn here, before
 * the clock starts, keeps the wait out of a read's time, so its midpoint stays where its values were taken
 * (the C++ blind app's 4 worker threads: reads of 1-4 ms, values taken near their ends). */
static void read_one(void *h)
{
    NvmlField f[2];
    memset(f, 0, sizeof f);
    f[0].fieldId = 197; f[1].fieldId = 198;  /* PCIE_COUNT_TX_BYTES, PCIE_COUNT_RX_BYTES */
    unsigned idx = 0;
    struct timespec a, b;
    pthread_mutex_lock(&g_read_lock);
    clock_gettime(CLOCK_MONOTONIC, &a);
    int rc = nvml_fields(h, 2, f);
    clock_gettime(CLOCK_MONOTONIC, &b);
    pthread_mutex_unlock(&g_read_lock);
    if (rc || f[0].nvmlReturn || f[1].nvmlReturn || nvml_index_of(h, &idx)) return;
    long long t0 = (long long)a.tv_sec * 1000000000LL + a.tv_nsec, t1 = (long long)b.tv_sec * 1000000000LL + b.tv_nsec;
    char m[96];
    int wide = f[0].valueType == 2 || f[0].valueType == 3;  /* UNSIGNED_LONG, UNSIGNED_LONG_LONG: 8 bytes on LP64 */
    snprintf(m, sizeof m, "%lld %lld %llu %llu", (t0 + t1) / 2, t1 - t0,
             wide ? f[0].value.ullVal : f[0].value.uiVal, wide ? f[1].value.ullVal : f[1].value.uiVal);
    emit("ctr", NULL, idx, m);
}

/* Read the counters of the thread's current GPU, or of every sampled GPU where the thread has none. */
static void exact_read(void)
{
    if (!exact_on()) return;
    int dev = current_device(0);
    void *h = NULL;
    char bus[64];
    if (dev >= 0 && p_device_bus_id && p_device_bus_id(bus, (int)sizeof bus, dev) == 0 && nvml_by_bus(bus, &h) == 0) {
        read_one(h);
        return;
    }
    for (const char *p = g_nvml_indices; *p;) {
        char *end;
        unsigned long i = strtoul(p, &end, 10);
        if (end == p) break;
        if (nvml_by_index((unsigned)i, &h) == 0) read_one(h);
        p = *end ? end + 1 : end;
    }
}

static void edge_open_range(void) { exact_read(); }
/* (exact edges: the library's own read first, then the samplers', rather than both at once); a closing edge
 * wakes only where its domain does not hold the fast rate (a sampler at the fast rate reads on its own) */
static void edge_close_range(int wake) { exact_read(); edge_signal(wake); }

static int push_(const char *domain, const char *msg) { edge_open_range(); emit("push", domain, 0, msg); edge_signal(holds_fast(domain) ? open_push() : 1); return t_depth++; }
static int pop_(const char *domain) { if (t_depth > 0) --t_depth; emit("pop", domain, 0, ""); int fast = holds_fast(domain); if (fast) close_pop(); edge_close_range(!fast); return t_depth; }
static uint64_t start_(const char *domain, const char *msg) { unsigned long long id = atomic_fetch_add(&g_range_id, 1) + 1; edge_open_range(); emit("start", domain, id, msg); edge_signal(holds_fast(domain) ? open_start(id) : 1); return id; }
static void end_(const char *domain, uint64_t id) { emit("end", domain, id, ""); close_end(id); edge_close_range(!holds_fast(domain)); }

static int RangePushA(const char *m) { return push_(NULL, m); }
static int RangePushEx(const EventAttributes *a) { char t[1024]; return push_(NULL, message_of(a, t, sizeof t)); }
static int RangePop(void) { return pop_(NULL); }
static uint64_t RangeStartA(const char *m) { return start_(NULL, m); }
static uint64_t RangeStartEx(const EventAttributes *a) { char t[1024]; return start_(NULL, message_of(a, t, sizeof t)); }
static void RangeEnd(uint64_t id) { end_(NULL, id); }
static int RangePushW(const wchar_t *m) { char t[1024]; return push_(NULL, narrow(m, t, sizeof t)); }
static uint64_t RangeStartW(const wchar_t *m) { char t[1024]; return start_(NULL, narrow(m, t, sizeof t)); }
static void MarkA(const char *m) { emit("mark", NULL, 0, m); }
static void MarkW(const wchar_t *m) { char t[1024]; emit("mark", NULL, 0, narrow(m, t, sizeof t)); }
static void MarkEx(const EventAttributes *a) { char t[1024]; emit("mark", NULL, 0, message_of(a, t, sizeof t)); }
static int DomainRangePushEx(const char *d, const EventAttributes *a) { char t[1024]; return push_(d, message_of(a, t, sizeof t)); }
static int DomainRangePop(const char *d) { return pop_(d); }
static uint64_t DomainRangeStartEx(const char *d, const EventAttributes *a) { char t[1024]; return start_(d, message_of(a, t, sizeof t)); }
static void DomainRangeEnd(const char *d, uint64_t id) { end_(d, id); }
static void DomainMarkEx(const char *d, const EventAttributes *a) { char t[1024]; emit("mark", d, 0, message_of(a, t, sizeof t)); }
static const char *DomainRegisterStringA(const char *d, const char *s) { (void)d; return strdup(s ? s : ""); }
static const char *DomainRegisterStringW(const char *d, const wchar_t *s) { char t[1024]; (void)d; return strdup(narrow(s, t, sizeof t)); }
static const char *DomainCreateA(const char *name) { return strdup(name ? name : "(unnamed)"); }
static const char *DomainCreateW(const wchar_t *name) { char t[1024]; return name ? strdup(narrow(name, t, sizeof t)) : DomainCreateA(NULL); }

static void install(NvtxFunctionTable table, unsigned int size, unsigned int id, void *fn)
{
    if (table && id < size && table[id]) *table[id] = (NvtxFunctionPointer)fn;
}

EXPORT int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t getExportTable)
{
    int (*first)(NvtxGetExportTableFunc_t) = (int (*)(NvtxGetExportTableFunc_t))first_copy("InitializeInjectionNvtx2");
    if (passive()) return first ? first(getExportTable) : 0;  /* NVTX picked a later copy: the first fills the tables */
    const NvtxExportTableCallbacks *cb = (const NvtxExportTableCallbacks *)getExportTable(NVTX_ETID_CALLBACKS);
    NvtxFunctionTable t = NULL;
    unsigned int n = 0;
    if (!cb || !cb->GetModuleFunctionTable) return 0;
    if (cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &t, &n)) {
        install(t, n, CORE_MarkEx, (void *)MarkEx); install(t, n, CORE_MarkA, (void *)MarkA);
        install(t, n, CORE_RangeStartEx, (void *)RangeStartEx); install(t, n, CORE_RangeStartA, (void *)RangeStartA);
        install(t, n, CORE_RangeEnd, (void *)RangeEnd); install(t, n, CORE_RangePushEx, (void *)RangePushEx);
        install(t, n, CORE_RangePushA, (void *)RangePushA); install(t, n, CORE_RangePop, (void *)RangePop);
        install(t, n, CORE_MarkW, (void *)MarkW); install(t, n, CORE_RangeStartW, (void *)RangeStartW);
        install(t, n, CORE_RangePushW, (void *)RangePushW);
    }
    if (cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &t, &n)) {
        install(t, n, CORE2_DomainMarkEx, (void *)DomainMarkEx); install(t, n, CORE2_DomainRangeStartEx, (void *)DomainRangeStartEx);
        install(t, n, CORE2_DomainRangeEnd, (void *)DomainRangeEnd); install(t, n, CORE2_DomainRangePushEx, (void *)DomainRangePushEx);
        install(t, n, CORE2_DomainRangePop, (void *)DomainRangePop);
        install(t, n, CORE2_DomainRegisterStringA, (void *)DomainRegisterStringA);
        install(t, n, CORE2_DomainCreateA, (void *)DomainCreateA);
        install(t, n, CORE2_DomainRegisterStringW, (void *)DomainRegisterStringW);
        install(t, n, CORE2_DomainCreateW, (void *)DomainCreateW);
    }
    emit("nvtx", NULL, 0, "injection initialised");
    return 1;
}

/* ---- launch counting by interposition (PCIETRACE_COUNT=interpose, library in LD_PRELOAD) ----
 * The CUDA runtime and cuda.bindings look up the driver's cuGetProcAddress with dlsym and fetch every
 * entry point through it. Our dlsym hands out wrappers of cuGetProcAddress(_v2) that return counting
 * trampolines (which also time the calls, as do those of cuStreamSynchronize, cuEventSynchronize and
 * cuCtxSynchronize) for cuLaunchKernel*, cuLaunchKernelEx*, cuLaunchCooperativeKernel* and cuGraphLaunch*:
 * ~0.07 us per launch on an H100 host (a driver query of the current device, two reads of the call clock,
 * below; and, once the process has begun a stream capture, whether the launch's stream is capturing;
 * bench/interposer_cost.py), where CUPTI's callback dispatch costs ~0.6-0.9 us.
 * Several real entry points (per-thread-stream variants, versions) each get their own trampoline slot. */
typedef int CUres;
typedef CUres (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **);
typedef CUres (*launchex_fn)(const void *, void *, void **, void **);
/* cudaLaunchCooperativeKernel's driver call: cuLaunchKernel's arguments without ``extra`` */
typedef CUres (*coop_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **);
typedef CUres (*graph_fn)(void *, void *);
typedef CUres (*getproc1_fn)(const char *, void **, int, unsigned long long);
typedef CUres (*getproc2_fn)(const char *, void **, int, unsigned long long, void *);
#define SLOTS 4
static void *real_launch[SLOTS], *real_launchex[SLOTS], *real_coop[SLOTS], *real_graph[SLOTS];
/* per slot: the entry point is a per-thread-default-stream variant (_ptsz, or fetched with that flag), so its
 * NULL stream means CU_STREAM_PER_THREAD, not the legacy stream */
static int ptsz_launch[SLOTS], ptsz_launchex[SLOTS], ptsz_coop[SLOTS], ptsz_graph[SLOTS];
static getproc1_fn real_getproc1;
static pthread_mutex_t g_slot_lock = PTHREAD_MUTEX_INITIALIZER;

static inline void count_eager(void) { ++t_eager; atomic_fetch_add_explicit(&g_eager, 1, memory_order_relaxed); note_launch_device(); }
static inline void count_graph(void) { ++t_graph; atomic_fetch_add_explicit(&g_graph, 1, memory_order_relaxed); note_launch_device(); }
static inline void count_captured(void) { ++t_captured; atomic_fetch_add_explicit(&g_captured, 1, memory_order_relaxed); note_launch_device(); }

/* ---- launches into a stream being captured (a graph node, nothing runs) ----
 * cuStreamIsCapturing, fetched once from the real driver (legacy-stream flavour: its NULL is the legacy
 * stream). It accepts CU_STREAM_LEGACY and CU_STREAM_PER_THREAD; on the legacy stream while another stream
 * captures in global mode it fails with CUDA_ERROR_STREAM_CAPTURE_IMPLICIT without invalidating the capture.
 * Any failure, or no such entry point, counts the launch as before (eager or graph): never dropped. */
typedef CUres (*is_capturing_fn)(void *, int *);
enum { CU_STREAM_CAPTURE_STATUS_ACTIVE = 1, CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2,
       CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2,
       LAUNCH_CONFIG_STREAM_OFFSET = 32 /* CUlaunchConfig: 7 unsigned ints, then CUstream hStream (8-aligned) */ };
#define CU_STREAM_PER_THREAD ((void *)0x2)
static is_capturing_fn p_is_capturing;
static pthread_once_t g_capture_once = PTHREAD_ONCE_INIT;
static getproc2_fn real_getproc2;

static void capture_query_resolve(void)
{
    void *fn = NULL;
    int found = 0;
    if (real_getproc2 && real_getproc2("cuStreamIsCapturing", &fn, 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &found) != 0)
        fn = NULL;
    if (!fn) {
        void *lib = libcuda();
        if (lib) fn = real_dlsym_fn(lib, "cuStreamIsCapturing");
    }
    p_is_capturing = (is_capturing_fn)fn;
}

/* Until the process first begins a stream capture no launch can be captured, so the interposer skips the query
 * (cuStreamIsCapturing: 25-54 ns per launch on the H100). Every capture begins in a cuStreamBeginCapture* entry
 * point, which the library hands out and defines (begin trampolines, below) as it does the launch entry points.
 * Set for good: a capture may go on in another thread or stream, and graph capture usually happens once. The
 * begin trampolines forward six pointer-sized arguments whatever the variant's own (one, two or six): passing
 * more integer-register arguments than a callee takes is harmless on x86-64 and AArch64 only; elsewhere there
 * are no begin trampolines and every launch queries, as before. CUPTI's callbacks (on_driver_api) always query:
 * no begin passes through there. */
#if defined(__x86_64__) || defined(__aarch64__)
#define CAPTURE_GATE 1
static atomic_int g_capture_begun;
#else
#define CAPTURE_GATE 0
static atomic_int g_capture_begun = 1;
#endif
static inline void capture_begins(void) { atomic_store_explicit(&g_capture_begun, 1, memory_order_release); }

/* Whether a launch into ``stream`` (of a per-thread-default-stream entry point: ``per_thread``) only adds a
 * node to a graph being captured: its stream's capture is active, or invalidated (the launch then fails). */
static inline int captured(void *stream, int per_thread)
{
    pthread_once(&g_capture_once, capture_query_resolve);
    if (!p_is_capturing) return 0;
    int status = 0;
    if (p_is_capturing(!stream && per_thread ? CU_STREAM_PER_THREAD : stream, &status) != 0) return 0;
    return status == CU_STREAM_CAPTURE_STATUS_ACTIVE || status == CU_STREAM_CAPTURE_STATUS_INVALIDATED;
}

/* A launch into ``stream``: captured into a graph being built, else eager (kernel) or graph (``graph``).
 * Returns whether it was an eager launch (the one whose call time is added up). */
static inline int count_launch(void *stream, int per_thread, int graph)
{
    if (atomic_load_explicit(&g_capture_begun, memory_order_acquire) && captured(stream, per_thread)) count_captured();
    else if (graph) count_graph(); else { count_eager(); return 1; }
    return 0;
}

static inline void add_ticks(unsigned long long *thread, atomic_ullong *process, unsigned long long t0)
{
    unsigned long long t1 = call_ticks(), d = t1 > t0 ? t1 - t0 : 0;  /* (a TSC found out of step later: never < 0) */
    *thread += d;
    atomic_fetch_add_explicit(process, d, memory_order_release);
}

/* Return ``call`` (a driver call returning CUres); where ``timed``, its time is added to the thread's and the
 * process's sums ``sum`` (call_ticks: eager launch calls; wait_ticks: synchronize calls). */
#define TIMED(timed, sum, call) do { if (!(timed)) return call; pthread_once(&g_call_clock_once, call_clock_init); \
    unsigned long long t0_ = call_ticks(); CUres r_ = call; add_ticks(&t_##sum, &g_##sum, t0_); return r_; } while (0)
#define TIMED_LAUNCH(eager, call) TIMED(eager, call_ticks, call)
#define TIMED_WAIT(timed, call) TIMED(timed, wait_ticks, call)

static inline void *launch_config_stream(const void *cfg)
{
    return cfg ? *(void *const *)((const char *)cfg + LAUNCH_CONFIG_STREAM_OFFSET) : NULL;
}

#define LAUNCH_SLOT(i) static CUres launch_##i(void *f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, \
    unsigned g, unsigned sh, void *st, void **p, void **x) \
    { TIMED_LAUNCH(count_launch(st, ptsz_launch[i], 0), ((launch_fn)real_launch[i])(f, a, b, c, d, e, g, sh, st, p, x)); }
#define LAUNCHEX_SLOT(i) static CUres launchex_##i(const void *cfg, void *f, void **p, void **x) \
    { TIMED_LAUNCH(count_launch(launch_config_stream(cfg), ptsz_launchex[i], 0), \
                   ((launchex_fn)real_launchex[i])(cfg, f, p, x)); }
#define COOP_SLOT(i) static CUres coop_##i(void *f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, \
    unsigned g, unsigned sh, void *st, void **p) \
    { TIMED_LAUNCH(count_launch(st, ptsz_coop[i], 0), ((coop_fn)real_coop[i])(f, a, b, c, d, e, g, sh, st, p)); }
#define GRAPH_SLOT(i) static CUres graph_##i(void *ge, void *st) \
    { count_launch(st, ptsz_graph[i], 1); return ((graph_fn)real_graph[i])(ge, st); }
/* synchronize calls: cuCtxSynchronize(void), cuStreamSynchronize(stream) (and _ptsz), cuEventSynchronize(event) */
typedef CUres (*sync0_fn)(void);
typedef CUres (*sync1_fn)(void *);
static void *real_sync0[SLOTS], *real_sync1[SLOTS];
#define SYNC0_SLOT(i) static CUres sync0_##i(void) { TIMED_WAIT(1, ((sync0_fn)real_sync0[i])()); }
#define SYNC1_SLOT(i) static CUres sync1_##i(void *h) { TIMED_WAIT(1, ((sync1_fn)real_sync1[i])(h)); }
/* capture begins: cuStreamBeginCapture (stream), its _v2 (stream, mode), cuStreamBeginCaptureToGraph (six),
 * cuStreamBeginCaptureToCig, and their _ptsz variants (see g_capture_begun). The CUDA 13 runtime fetches six at
 * start-up (cuStreamBeginCapture at versions 10000 and 10010, ToGraph at 12030, each with and without the
 * per-thread flag) and cuda.bindings a seventh; a begin handed out unwrapped (no slot left) sets the flag. */
typedef CUres (*begin_fn)(void *, void *, void *, void *, void *, void *);
#define BEGIN_SLOTS 12
static void *real_begin[BEGIN_SLOTS];
#define BEGIN_SLOT(i) static CUres begin_##i(void *a, void *b, void *c, void *d, void *e, void *f) \
    { capture_begins(); return ((begin_fn)real_begin[i])(a, b, c, d, e, f); }
LAUNCH_SLOT(0) LAUNCH_SLOT(1) LAUNCH_SLOT(2) LAUNCH_SLOT(3)
LAUNCHEX_SLOT(0) LAUNCHEX_SLOT(1) LAUNCHEX_SLOT(2) LAUNCHEX_SLOT(3)
COOP_SLOT(0) COOP_SLOT(1) COOP_SLOT(2) COOP_SLOT(3)
GRAPH_SLOT(0) GRAPH_SLOT(1) GRAPH_SLOT(2) GRAPH_SLOT(3)
SYNC0_SLOT(0) SYNC0_SLOT(1) SYNC0_SLOT(2) SYNC0_SLOT(3)
SYNC1_SLOT(0) SYNC1_SLOT(1) SYNC1_SLOT(2) SYNC1_SLOT(3)
#if CAPTURE_GATE
BEGIN_SLOT(0) BEGIN_SLOT(1) BEGIN_SLOT(2) BEGIN_SLOT(3) BEGIN_SLOT(4) BEGIN_SLOT(5)
BEGIN_SLOT(6) BEGIN_SLOT(7) BEGIN_SLOT(8) BEGIN_SLOT(9) BEGIN_SLOT(10) BEGIN_SLOT(11)
static void *const begin_slots[BEGIN_SLOTS] = {(void *)begin_0, (void *)begin_1, (void *)begin_2, (void *)begin_3,
    (void *)begin_4, (void *)begin_5, (void *)begin_6, (void *)begin_7, (void *)begin_8, (void *)begin_9,
    (void *)begin_10, (void *)begin_11};
#endif
static void *const launch_slots[SLOTS] = {(void *)launch_0, (void *)launch_1, (void *)launch_2, (void *)launch_3};
static void *const launchex_slots[SLOTS] = {(void *)launchex_0, (void *)launchex_1, (void *)launchex_2, (void *)launchex_3};
static void *const coop_slots[SLOTS] = {(void *)coop_0, (void *)coop_1, (void *)coop_2, (void *)coop_3};
static void *const graph_slots[SLOTS] = {(void *)graph_0, (void *)graph_1, (void *)graph_2, (void *)graph_3};
static void *const sync0_slots[SLOTS] = {(void *)sync0_0, (void *)sync0_1, (void *)sync0_2, (void *)sync0_3};
static void *const sync1_slots[SLOTS] = {(void *)sync1_0, (void *)sync1_1, (void *)sync1_2, (void *)sync1_3};

/* A trampoline of ``slots`` (``n`` of them) for ``real``: its own if it has one, else the next free one. */
static void *slot_for(void **reals, int *ptsz, void *const *slots, int n, void *real, int per_thread)
{
    static int announced;
    void *out = real;  /* all slots taken: hand out the real function (uncounted) rather than fail */
    pthread_mutex_lock(&g_slot_lock);
    for (int i = 0; i < n; ++i) {
        if (reals[i] == real || !reals[i]) {
            if (!reals[i] && ptsz) ptsz[i] = per_thread;  /* (set before the trampoline is handed out) */
            reals[i] = real; out = slots[i]; break;
        }
    }
    int first = !announced;
    announced = 1;
    pthread_mutex_unlock(&g_slot_lock);
    if (first) emit("interpose", NULL, 0, "launch counting on (interposed driver entry points)");
    if (out == real && reals == real_begin) {  /* a begin not seen: query every launch from now on */
        capture_begins();
        emit("interpose", NULL, 0, "more capture-begin entry points than slots: every launch's capture queried");
    } else if (out == real) {
        emit("interpose", NULL, 0, "more driver entry points than slots: some launches uncounted or calls untimed");
    }
    return out;
}

static int prefix(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

static CUres getproc1(const char *sym, void **pfn, int ver, unsigned long long flags);
static CUres getproc2(const char *sym, void **pfn, int ver, unsigned long long flags, void *status);

static int suffix(const char *s, const char *x) { size_t n = strlen(s), m = strlen(x); return n >= m && !strcmp(s + n - m, x); }

/* cuLaunchCooperativeKernel and its _ptsz variant only: cuLaunchCooperativeKernelMultiDevice (deprecated) takes
 * a list of launches, not a stream, so it is left alone (uncounted) rather than read with the wrong layout. */
static int cooperative(const char *s) { return !strcmp(s, "cuLaunchCooperativeKernel") || !strcmp(s, "cuLaunchCooperativeKernel_ptsz"); }
/* The synchronize calls that take one handle, by exact name (cuCtxSynchronize_v2 takes the context). */
static int one_arg_sync(const char *s)
{
    return !strcmp(s, "cuStreamSynchronize") || !strcmp(s, "cuStreamSynchronize_ptsz") || !strcmp(s, "cuEventSynchronize")
        || !strcmp(s, "cuCtxSynchronize_v2");
}

/* ``flags``: cuGetProcAddress's (0 from dlsym): the per-thread flag, like a _ptsz name, picks the variant whose
 * NULL stream is the thread's default stream. */
static int ours(void *p);
static void *wrap_entry(const char *sym, void *real, unsigned long long flags, int ver)
{
    /* our own direct-call definition (interposed) counts already; a passive copy wraps nothing */
    if (!real || !sym || ours(real) || passive()) return real;
    if (!strcmp(sym, "cuGetProcAddress_v2")) { real_getproc2 = (getproc2_fn)real; return (void *)getproc2; }
    if (!strcmp(sym, "cuGetProcAddress")) { real_getproc1 = (getproc1_fn)real; return (void *)getproc1; }
    int pt = suffix(sym, "_ptsz") || (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    if (prefix(sym, "cuLaunchKernelEx")) return slot_for(real_launchex, ptsz_launchex, launchex_slots, SLOTS, real, pt);
    if (prefix(sym, "cuLaunchKernel")) return slot_for(real_launch, ptsz_launch, launch_slots, SLOTS, real, pt);
    if (prefix(sym, "cuGraphLaunch")) return slot_for(real_graph, ptsz_graph, graph_slots, SLOTS, real, pt);
    if (cooperative(sym)) return slot_for(real_coop, ptsz_coop, coop_slots, SLOTS, real, pt);
    /* cuGetProcAddress("cuCtxSynchronize") at version 13000 or later hands out cuCtxSynchronize_v2, which takes the
     * context (cudaTypedefs.h: PFN_cuCtxSynchronize_v13000); dlsym's name is the ABI itself (``ver`` < 0) */
    /* (ptsz NULL: a synchronize call's stream flavour changes nothing here) */
    if (!strcmp(sym, "cuCtxSynchronize") && ver < 13000) return slot_for(real_sync0, NULL, sync0_slots, SLOTS, real, pt);
    if (!strcmp(sym, "cuCtxSynchronize")) return slot_for(real_sync1, NULL, sync1_slots, SLOTS, real, pt);
    if (one_arg_sync(sym)) return slot_for(real_sync1, NULL, sync1_slots, SLOTS, real, pt);
#if CAPTURE_GATE
    if (prefix(sym, "cuStreamBeginCapture")) return slot_for(real_begin, NULL, begin_slots, BEGIN_SLOTS, real, pt);
#endif
    return real;
}

/* cuGetProcAddress's result ``r``, with the entry point it found in ``*pfn`` wrapped */
static CUres wrapped(CUres r, const char *sym, void **pfn, unsigned long long flags, int ver)
{
    if (r == 0 && pfn) *pfn = wrap_entry(sym, *pfn, flags, ver);
    return r;
}

static CUres getproc1(const char *sym, void **pfn, int ver, unsigned long long flags)
{
    return wrapped(real_getproc1(sym, pfn, ver, flags), sym, pfn, flags, ver);
}

static CUres getproc2(const char *sym, void **pfn, int ver, unsigned long long flags, void *status)
{
    return wrapped(real_getproc2(sym, pfn, ver, flags, status), sym, pfn, flags, ver);
}

static int interposing(void)
{
    static int on = -1;
    if (on < 0) { const char *m = getenv("PCIETRACE_COUNT"); on = m && !strcmp(m, "interpose"); }
    return on;
}

/* glibc's own dlsym (ours below interposes it for the program). */
static void *real_dlsym_fn(void *handle, const char *name)
{
    static void *(*real_dlsym)(void *, const char *);
    if (!real_dlsym) {
        real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (!real_dlsym) real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    }
    return real_dlsym(handle, name);
}

/* Whether ``p`` is defined in this library (one of the direct-call entry points below: already counting). */
static int ours(void *p)
{
    Dl_info here, there;
    return dladdr((void *)ours, &here) && dladdr(p, &there) && here.dli_fbase == there.dli_fbase;
}

static void *g_libc;  /* libc's handle, for not_found */
/* NULL with dlerror() set, as for a name nothing defines (ctypes, for one, reads dlerror() whenever dlsym returns
 * NULL): the name asked of libc, which defines no cu* name. Not RTLD_NEXT, whose "next" counts from the code
 * that called dlsym (ours is a tail call): from a program's own code, the next object is this library (or
 * another copy), and its own definition was handed back. */
static void *not_found(const char *name)
{
    void *libc = __atomic_load_n(&g_libc, __ATOMIC_RELAXED);
    if (!libc) __atomic_store_n(&g_libc, libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD), __ATOMIC_RELAXED);
    return real_dlsym_fn(libc ? libc : RTLD_NEXT, name);
}

EXPORT void *dlsym(void *handle, const char *name)
{
    void *p = real_dlsym_fn(handle, name);
    if (!p || name[0] != 'c' || name[1] != 'u' || !interposing() || passive()) return p;
    /* our own direct-call definition counts already; without a driver loaded the name is not there (a program
     * probing for the driver by a launch entry point must not find it in this library) */
    if (ours(p)) return libcuda() ? p : not_found(name);
    return wrap_entry(name, p, 0, -1);
}

/* ---- direct calls: a program or library linked against libcuda (-lcuda; CuPy) calls the launch entry points
 * through its PLT, never through dlsym. Preloaded, this library defines them first: each counts as the
 * trampolines do and calls libcuda's own (the next definition). Outside interpose mode it only forwards. */
enum { CUDA_ERROR_NOT_FOUND = 500 };
static void *next_entry(void **cache, const char *name)
{
    void *f = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
    if (f) return f;
    f = real_dlsym_fn(RTLD_NEXT, name);
    /* RTLD_NEXT searches the global scope only: a caller dlopened RTLD_LOCAL (a Python extension linked against
     * libcuda) brings libcuda into its own local scope, where only libcuda's handle finds it */
    if (!f) { void *lib = libcuda(); if (lib) f = real_dlsym_fn(lib, name); }
    if (f && ours(f)) f = NULL;  /* never forward to ourselves */
    if (f) __atomic_store_n(cache, f, __ATOMIC_RELEASE);
    return f;
}
/* Whether the launch was eager and counted here (its call is then timed). */
static inline int count_direct(void *stream, int per_thread, int graph)
{
    return interposing() && !passive() && count_launch(stream, per_thread, graph);  /* (a passive copy: the first counts) */
}
#define DIRECT_LAUNCH(sym, pt) EXPORT CUres sym(void *f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, \
    unsigned g, unsigned sh, void *st, void **p, void **x) \
    { static void *real; launch_fn fn = (launch_fn)next_entry(&real, #sym); if (!fn) return CUDA_ERROR_NOT_FOUND; \
      TIMED_LAUNCH(count_direct(st, pt, 0), fn(f, a, b, c, d, e, g, sh, st, p, x)); }
#define DIRECT_LAUNCHEX(sym, pt) EXPORT CUres sym(const void *cfg, void *f, void **p, void **x) \
    { static void *real; launchex_fn fn = (launchex_fn)next_entry(&real, #sym); if (!fn) return CUDA_ERROR_NOT_FOUND; \
      TIMED_LAUNCH(count_direct(launch_config_stream(cfg), pt, 0), fn(cfg, f, p, x)); }
#define DIRECT_COOP(sym, pt) EXPORT CUres sym(void *f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, \
    unsigned g, unsigned sh, void *st, void **p) \
    { static void *real; coop_fn fn = (coop_fn)next_entry(&real, #sym); if (!fn) return CUDA_ERROR_NOT_FOUND; \
      TIMED_LAUNCH(count_direct(st, pt, 0), fn(f, a, b, c, d, e, g, sh, st, p)); }
#define DIRECT_GRAPH(sym, pt) EXPORT CUres sym(void *ge, void *st) \
    { static void *real; graph_fn fn = (graph_fn)next_entry(&real, #sym); if (!fn) return CUDA_ERROR_NOT_FOUND; \
      count_direct(st, pt, 1); return fn(ge, st); }
DIRECT_LAUNCH(cuLaunchKernel, 0) DIRECT_LAUNCH(cuLaunchKernel_ptsz, 1)
DIRECT_LAUNCHEX(cuLaunchKernelEx, 0) DIRECT_LAUNCHEX(cuLaunchKernelEx_ptsz, 1)
DIRECT_COOP(cuLaunchCooperativeKernel, 0) DIRECT_COOP(cuLaunchCooperativeKernel_ptsz, 1)
DIRECT_GRAPH(cuGraphLaunch, 0) DIRECT_GRAPH(cuGraphLaunch_ptsz, 1)
#define DIRECT_SYNC0(sym) EXPORT CUres sym(void) \
    { static void *real; sync0_fn fn = (sync0_fn)next_entry(&real, #sym); if (!fn) return CUDA_ERROR_NOT_FOUND; \
      TIMED_WAIT(interposing() && !passive(), fn()); }
#define DIRECT_SYNC1(sym) EXPORT CUres sym(void *h) \
    { static void *real; sync1_fn fn = (sync1_fn)next_entry(&real, #sym); if (!fn) return CUDA_ERROR_NOT_FOUND; \
      TIMED_WAIT(interposing() && !passive(), fn(h)); }
DIRECT_SYNC0(cuCtxSynchronize) DIRECT_SYNC1(cuStreamSynchronize) DIRECT_SYNC1(cuStreamSynchronize_ptsz)
DIRECT_SYNC1(cuEventSynchronize) DIRECT_SYNC1(cuCtxSynchronize_v2)
#if CAPTURE_GATE
#define DIRECT_BEGIN(sym) EXPORT CUres sym(void *a, void *b, void *c, void *d, void *e, void *f) \
    { static void *real; begin_fn fn = (begin_fn)next_entry(&real, #sym); if (!fn) return CUDA_ERROR_NOT_FOUND; \
      capture_begins(); return fn(a, b, c, d, e, f); }
DIRECT_BEGIN(cuStreamBeginCapture) DIRECT_BEGIN(cuStreamBeginCapture_ptsz) DIRECT_BEGIN(cuStreamBeginCapture_v2)
DIRECT_BEGIN(cuStreamBeginCapture_v2_ptsz) DIRECT_BEGIN(cuStreamBeginCaptureToGraph)
DIRECT_BEGIN(cuStreamBeginCaptureToGraph_ptsz) DIRECT_BEGIN(cuStreamBeginCaptureToCig)
DIRECT_BEGIN(cuStreamBeginCaptureToCig_ptsz)
#endif
/* ... and may fetch entry points with cuGetProcAddress itself, through its PLT: what it gets is wrapped as the
 * runtime's fetches are (counting launches, timing calls, seeing capture begins) */
EXPORT CUres cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, void *status)
{
    static void *real;
    getproc2_fn fn = (getproc2_fn)next_entry(&real, "cuGetProcAddress_v2");
    if (!fn) return CUDA_ERROR_NOT_FOUND;
    CUres r = fn(sym, pfn, ver, flags, status);
    return interposing() ? wrapped(r, sym, pfn, flags, ver) : r;
}
EXPORT CUres cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags)
{
    static void *real;
    getproc1_fn fn = (getproc1_fn)next_entry(&real, "cuGetProcAddress");
    if (!fn) return CUDA_ERROR_NOT_FOUND;
    CUres r = fn(sym, pfn, ver, flags);
    return interposing() ? wrapped(r, sym, pfn, flags, ver) : r;
}

/* Loaded at process start (LD_PRELOAD): map the edge page now, so the samplers know from the start that open
 * ranges are counted here (else they read fast until the first NVTX call). A passive copy leaves it to the first. */
__attribute__((constructor)) static void at_load(void) { g_loaded = now_pair(); if (!passive()) edges_open(); }

/* Final counters at normal exit (a crash skips this; the report then ends at the last event). */
__attribute__((destructor)) static void at_exit(void)
{
    if (g_buf) emit("exit", NULL, 0, "");
    open_ranges_exit();
}

/* ---- CUDA injection: count launches through CUPTI callbacks ---- */
static void on_driver_api(void *userdata, int domain, uint32_t cbid, const void *cbdata)
{
    (void)userdata; (void)cbid;
    const CuptiCallbackDataHead *d = (const CuptiCallbackDataHead *)cbdata;
    if (domain != CUPTI_CB_DOMAIN_DRIVER_API || !d || d->callbackSite != CUPTI_API_ENTER || !d->functionName) return;
    /* classify by name, so an id that means something else in another CUPTI version never miscounts; the stream
     * from the parameter structs of generated_cuda_meta.h, which repeat the arguments: cuGraphLaunch_params
     * {hGraphExec, hStream}, cuLaunchKernel_params and cuLaunchCooperativeKernel_params {f, 7 unsigned ints,
     * hStream at 40, ...}, cuLaunchKernelEx_params {config, ...} */
    const char *name = d->functionName;
    const char *const *params = (const char *const *)d->functionParams;
    int pt = suffix(name, "_ptsz");
    if (!strncmp(name, "cuGraphLaunch", 13)) {
        if (params && captured((void *)params[1], pt)) count_captured(); else count_graph();
    } else if (!strncmp(name, "cuLaunchKernelEx", 16)) {
        if (params && captured(launch_config_stream(params[0]), pt)) count_captured(); else count_eager();
    } else if (!strncmp(name, "cuLaunchKernel", 14) || cooperative(name)) {
        if (params && captured(*(void *const *)((const char *)params + 40), pt)) count_captured(); else count_eager();
    }
}

/* ---- GPU time (PCIETRACE_GPU_TIME=1): CUPTI concurrent-kernel activity records ----
 * One "kernel" event per kernel that ran: t_ns = its start, id = its CUDA ordinal, message = its end (ns), both
 * on CLOCK_MONOTONIC (CUPTI's timestamp callback; where this CUPTI lacks one, its CLOCK_REALTIME stamps are
 * shifted by the clocks' offset at each buffer); a kernel CUPTI could not time (start = end = 0) is written 0 0.
 * Records are read by offset, as CUpti_ActivityKernel4..11 all lay them out (cupti_activity.h): kind (u32) at 0,
 * start at 16, end at 24, deviceId (u32) at 40. */
enum { CUPTI_KIND_CONCURRENT_KERNEL = 10, CUPTI_FLUSH_FORCED = 1, GPU_TIME_BUFFER = 4 << 20 };
static int (*p_next_record)(uint8_t *, size_t, void **);
static int (*p_flush_all)(uint32_t);
static int (*p_dropped)(void *, uint32_t, size_t *);
static int g_cupti_realtime;  /* CUPTI stamps on CLOCK_REALTIME (no timestamp callback) */

static void gpu_time_request(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(8, GPU_TIME_BUFFER);
    *size = *buffer ? GPU_TIME_BUFFER : 0;
    *max_records = 0;
}

static void gpu_time_complete(void *ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid)
{
    (void)size;
    size_t dropped = 0;  /* records CUPTI had no buffer room for: busy times are low by them, say so */
    if (p_dropped && p_dropped(ctx, stream, &dropped) == 0 && dropped) emit("gputime", NULL, dropped, "dropped");
    long long shift = 0;
    if (g_cupti_realtime) {
        struct timespec rt;
        clock_gettime(CLOCK_REALTIME, &rt);
        shift = (long long)rt.tv_sec * 1000000000LL + rt.tv_nsec - (long long)mono_ns();
    }
    void *rec = NULL;
    while (buffer && p_next_record(buffer, valid, &rec) == 0) {
        const uint8_t *r = (const uint8_t *)rec;
        uint32_t kind, dev;
        uint64_t start, end;
        memcpy(&kind, r, 4);
        if (kind != CUPTI_KIND_CONCURRENT_KERNEL) continue;
        memcpy(&start, r + 16, 8); memcpy(&end, r + 24, 8); memcpy(&dev, r + 40, 4);
        long long s = start || end ? shift : 0;  /* both 0: CUPTI could not time this kernel; kept as 0 0 */
        char m[32];
        snprintf(m, sizeof m, "%lld", (long long)end - s);
        emit_line((unsigned long long)((long long)start - s), "kernel", NULL, dev, m, (int)dev);
    }
    free(buffer);
}

static uint64_t gpu_time_clock(void) { return mono_ns(); }
static void gpu_time_flush(void) { if (p_flush_all) p_flush_all(CUPTI_FLUSH_FORCED); }

static void gpu_time_on(void *lib)
{
    int (*reg)(void *, void *) = (int (*)(void *, void *))dlsym(lib, "cuptiActivityRegisterCallbacks");
    int (*enable)(int) = (int (*)(int))dlsym(lib, "cuptiActivityEnable");
    int (*clock_cb)(uint64_t (*)(void)) = (int (*)(uint64_t (*)(void)))dlsym(lib, "cuptiActivityRegisterTimestampCallback");
    p_next_record = (int (*)(uint8_t *, size_t, void **))dlsym(lib, "cuptiActivityGetNextRecord");
    p_flush_all = (int (*)(uint32_t))dlsym(lib, "cuptiActivityFlushAll");
    p_dropped = (int (*)(void *, uint32_t, size_t *))dlsym(lib, "cuptiActivityGetNumDroppedRecords");
    if (!reg || !enable || !p_next_record || !p_flush_all) { emit("gputime", NULL, 0, "off: CUPTI activity API missing"); return; }
    g_cupti_realtime = !clock_cb || clock_cb(gpu_time_clock) != 0;  /* before enabling, as CUPTI asks */
    int rc = reg((void *)gpu_time_request, (void *)gpu_time_complete);
    if (rc == 0) rc = enable(CUPTI_KIND_CONCURRENT_KERNEL);
    char m[96];
    if (rc) snprintf(m, sizeof m, "off: CUPTI activity error %d", rc);
    else snprintf(m, sizeof m, "on (CUPTI kernel activity, %s clock)", g_cupti_realtime ? "realtime" : "monotonic");
    emit("gputime", NULL, 0, m);
    if (!rc) atexit(gpu_time_flush);  /* records still buffered reach the trace before the process ends */
}

EXPORT int InitializeInjection(void)
{
    int (*first)(void) = (int (*)(void))first_copy("InitializeInjection");
    if (passive()) return first ? first() : 1;  /* the driver picked a later copy: the first subscribes */
    const char *path = getenv("PCIETRACE_CUPTI");
    const char *gpu_time = getenv("PCIETRACE_GPU_TIME");
    void *lib = dlopen(path && *path ? path : "libcupti.so", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) { emit("cupti", NULL, 0, dlerror()); return 1; }
    if (gpu_time && !strcmp(gpu_time, "1")) gpu_time_on(lib);
    if (interposing()) return 1;  /* launches are counted by the trampolines: no callbacks on top */
    const char *count = getenv("PCIETRACE_COUNT");
    if (count && !strcmp(count, "none")) return 1;  /* here for --gpu-time only: launches are not counted */
    int (*subscribe)(void **, CuptiCallback, void *) = (int (*)(void **, CuptiCallback, void *))dlsym(lib, "cuptiSubscribe");
    int (*enable)(uint32_t, void *, int, uint32_t) = (int (*)(uint32_t, void *, int, uint32_t))dlsym(lib, "cuptiEnableCallback");
    void *sub = NULL;
    int rc = subscribe ? subscribe(&sub, on_driver_api, NULL) : -1;
    if (rc) { char m[64]; snprintf(m, sizeof m, "cuptiSubscribe failed (%d)", rc); emit("cupti", NULL, 0, m); return 1; }
    /* Enable every driver callback named cuLaunchKernel*, cuGraphLaunch* or cuLaunchCooperativeKernel(_ptsz) (ids differ between CUPTI
       versions); fall back to the known ids where CUPTI cannot name its callbacks. */
    int (*name_of)(int, uint32_t, const char **) = (int (*)(int, uint32_t, const char **))dlsym(lib, "cuptiGetCallbackName");
    int enabled = 0;
    for (uint32_t id = 1; name_of && id < 4096; ++id) {
        const char *name = NULL;
        if (name_of(CUPTI_CB_DOMAIN_DRIVER_API, id, &name) || !name) continue;
        if (!strncmp(name, "cuLaunchKernel", 14) || !strncmp(name, "cuGraphLaunch", 13) || cooperative(name))
            enabled += enable(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, id) == 0;
    }
    for (size_t i = 0; !enabled && i < sizeof LAUNCH_CBIDS / sizeof LAUNCH_CBIDS[0]; ++i)
        enable(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, LAUNCH_CBIDS[i]);
    char m[96];
    snprintf(m, sizeof m, "launch counting on (%d callbacks by name)", enabled);
    emit("cupti", NULL, 0, m);
    return 1;
}
