/* The injection library (pt_inject.h lists its units): range edges. They wake the samplers (the edge page,
 * pt_abi.h), keep the count of ranges open now, and optionally read the counters here (PCIETRACE_EXACT_EDGES). */
#include "pt_inject.h"

#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>

enum { WAKE_GAP_NS = 100000 };  /* below a counter read's own time (0.25-0.9 ms): see edge_signal */
static atomic_uint *g_edge_seq;  /* the edge page's words (set once, in edges_map, before edges_open returns) */
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
    void *m = mmap(NULL, PT_EDGE_PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return;
    g_edge_seq = (atomic_uint *)m;
    atomic_store(&g_edge_seq[PT_EDGE_COUNTING], 1);  /* "open ranges are counted" (PT_EDGE_OPEN_RANGES) */
}

/* once, and every thread waits for it: a flag set before the mapping let a second thread skip its edge */
void edges_open(void) { pthread_once(&g_edges_once, edges_map); }

/* Every edge bumps the sequence; only an edge where a sampler should read also wakes it (PT_EDGE_WAKES, and a
 * system call at most every WAKE_GAP_NS): a range opening in a process with none open in it, an edge of a domain
 * that does not hold the fast rate, the process leaving. Nested edges and closing ones wake nobody: inside a
 * range the samplers read at their own pace, so at emit_nvtx density (thousands of nested edges per step) the
 * edges cost no system call and no extra read. */
void edge_signal(int wake)
{
    edges_open();
    if (!g_edge_seq) return;
    atomic_fetch_add(&g_edge_seq[PT_EDGE_SEQ], 1);
    if (!wake || !g_edge_wake) return;
    /* At most one system call per WAKE_GAP_NS per process (a range per op with no enclosing range wakes at every
     * op): a sampler woken less than that ago is still reading or resting, and it looks at the word before it
     * waits again, so it sees this bump then. The time is taken before the bump: a call made late (this thread
     * preempted between the two) still counts from before any sampler could have seen the bump. */
    static _Atomic unsigned long long last_ns;
    unsigned long long now = mono_ns(), last = atomic_load_explicit(&last_ns, memory_order_relaxed);
    /* a word of its own: a sampler reading at its quiet pace inside a range sleeps until a waking edge, which
     * the nested edges (bumping PT_EDGE_SEQ) would otherwise cut short at every try */
    atomic_fetch_add(&g_edge_seq[PT_EDGE_WAKES], 1);
    if (last && now - last < WAKE_GAP_NS) return;
    atomic_store_explicit(&last_ns, now, memory_order_relaxed);
    syscall(SYS_futex, (void *)&g_edge_seq[PT_EDGE_WAKES], FUTEX_WAKE, INT_MAX, NULL, NULL, 0);  /* shared: no FUTEX_PRIVATE_FLAG */
}

/* ---- ranges open now (PT_EDGE_OPEN_RANGES of the edge page) ----
 * Only ranges this process counted are uncounted: a pop is counted only where the thread's own counted depth
 * falls to 0, an end only for an id whose start was counted (kept in a small table; a start that finds the
 * table full is simply not counted, and neither is its end). The shared word is lowered with a CAS loop that
 * stops at 0, so even a range counted by a parent before fork() and closed in both processes cannot drive it
 * negative. Ranges still open when the process exits normally are uncounted then (at_exit); one killed
 * inside a range keeps the samplers fast for the rest of the run: the safe direction. */
#define OPEN_IDS 256
static _Atomic unsigned long long g_open_ids[OPEN_IDS];
__thread int t_counted;                      /* this thread's push ranges counted in the shared word */
static atomic_int g_counted;                 /* this process's ranges counted in the shared word */

static pthread_mutex_t g_read_lock = PTHREAD_MUTEX_INITIALIZER;  /* the library's own counter reads take turns */

static void open_ranges_forget(void)
{
    t_counted = 0;  /* after fork: the parent's ranges are the parent's to close */
    atomic_store(&g_counted, 0);
    for (int i = 0; i < OPEN_IDS; ++i) atomic_store(&g_open_ids[i], 0);
}

/* returns whether this process had no range open (the samplers, idle or at their quiet pace, are woken):
 * whatever other processes have open (under torchrun another rank nearly always has one: a copy right after a
 * launch-only range was then read in one 2 ms interval with both ranges' edges), but not where another thread
 * of this process has one (PyTorch's autograd thread opens each backward op's range on its own, inside the
 * main thread's step) */
static int open_ranges_add(void)
{
    edges_open();
    if (!g_edge_seq) return 0;
    atomic_fetch_add(&g_edge_seq[PT_EDGE_OPEN_RANGES], 1);
    return atomic_fetch_add(&g_counted, 1) == 0;
}

static void open_ranges_sub_n(unsigned k)
{
    unsigned n = atomic_load(&g_edge_seq[PT_EDGE_OPEN_RANGES]);
    while (n > 0 && !atomic_compare_exchange_weak(&g_edge_seq[PT_EDGE_OPEN_RANGES], &n, n > k ? n - k : 0)) {}
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
void open_ranges_exit(void)
{
    int k = atomic_exchange(&g_counted, 0);
    if (!g_edge_seq || k <= 0) return;
    open_ranges_sub_n((unsigned)k);
    edge_signal(1);
}

/* Ranges of the domains in PCIETRACE_SLOW_DOMAINS (comma-separated, e.g. NCCL) do not hold the samplers at
 * the fast rate: NVML reads during NCCL's communicator set-up (inside NCCL's own range) doubled it. */
static const char *g_slow_domains;
static pthread_once_t g_slow_once = PTHREAD_ONCE_INIT;
static void slow_domains_read(void) { g_slow_domains = getenv("PCIETRACE_SLOW_DOMAINS"); }

__thread const char *t_fast_domain;  /* the thread's last domain and its answer (a handle's name does not move) */
__thread int t_fast = -1;

static int holds_fast_(const char *domain);
int holds_fast_ask(const char *domain)
{
    t_fast = holds_fast_(domain);
    t_fast_domain = domain;
    return t_fast;
}

static int holds_fast_(const char *domain)
{
    pthread_once(&g_slow_once, slow_domains_read);
    const char *list = g_slow_domains;
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

/* (nested_push and nested_pop: pt_inject.h) */
int open_push(void) { return t_counted++ ? 0 : open_ranges_add(); }
void close_pop(void) { if (t_counted > 0 && !--t_counted) open_ranges_sub(); }

int open_start(unsigned long long id)
{
    edges_open();
    for (int i = 0; g_edge_seq && i < OPEN_IDS; ++i) {
        unsigned long long empty = 0;  /* a plain load first: a CAS per occupied slot would be a locked op each */
        if (!atomic_load_explicit(&g_open_ids[i], memory_order_relaxed)
            && atomic_compare_exchange_strong(&g_open_ids[i], &empty, id)) return open_ranges_add();
    }
    return 1;  /* not counted (table full): wake, as for a domain that does not hold the fast rate */
}

void close_end(unsigned long long id)
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
_Atomic int g_exact = -1;  /* whether the library reads the counters itself (-1: not known yet) */
static char g_nvml_indices[256];
static pthread_once_t g_exact_once = PTHREAD_ONCE_INIT;

static void exact_resolve(void)
{
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
    int on = nvml_fields && nvml_by_bus && nvml_by_index && nvml_index_of;  /* every symbol found, or none used */
    atomic_store_explicit(&g_exact, on, memory_order_release);
    if (e && !strcmp(e, "1") && !on) emit("exact", NULL, 0, "NVML not available: exact edges off");
}

static int exact_on(void)
{
    int on = atomic_load_explicit(&g_exact, memory_order_acquire);
    if (__builtin_expect(on >= 0, 1)) return on;
    pthread_once(&g_exact_once, exact_resolve);
    return atomic_load_explicit(&g_exact, memory_order_acquire);
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
void exact_read(void)
{
    if (!exact_on()) return;
    int dev = current_device(0);
    void *h = NULL;
    char bus[64];
    if (dev >= 0 && device_bus_id(bus, (int)sizeof bus, dev) == 0 && nvml_by_bus(bus, &h) == 0) {
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

/* (exact edges: the library's own read first, then the samplers', rather than both at once); a closing edge
 * wakes only where its domain does not hold the fast rate (a sampler at the fast rate reads on its own) */
void edge_close_range(int wake) { exact_read(); edge_signal(wake); }

/* In a forked child: the parent's ranges are the parent's to close, and a parent's thread may have held the read
 * lock at fork() (it has no thread here). */
void edges_after_fork(void)
{
    open_ranges_forget();
    pthread_mutex_init(&g_read_lock, NULL);
}
