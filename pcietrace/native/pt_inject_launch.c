/* The injection library (pt_inject.h lists its units): the current device; launch counting and call timing by
 * interposition; launches into a stream being captured. */
#include "pt_inject.h"

/* ---- which GPU: the driver's current context, looked up only where libcuda is already loaded ---- */
typedef int (*ctx_get_device_fn)(int *);
typedef int (*device_bus_id_fn)(char *, int, int);
typedef int (*device_count_fn)(int *);
static _Atomic(ctx_get_device_fn) p_ctx_get_device;  /* set once the others are found (bus id and count first) */
static _Atomic(device_count_fn) p_device_count;
static _Atomic(device_bus_id_fn) p_device_bus_id;

/* The CUDA driver's handle if the process has loaded it (in any scope), else NULL: never loads it. */
void *libcuda(void) { return dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD); }

/* A process without the driver asks again at most every 10 ms: dlopen's search cost 5-23 us per range edge
 * (bench/edge_cost.cu), and a context takes far longer than that to create after the driver loads, so no
 * device is missed. A launch (``retry_now``) comes through the driver: it asks at once. */
#define NO_DRIVER_RETRY_NS 10000000ull
static _Atomic unsigned long long g_no_driver_until_ns;
/* This thread is in the loader (dlopen, dlsym) looking for the driver: a signal handler's range edge that lands
 * there must not enter it again, as the loader's lock is held by the call it interrupted (a hang, seen in 1 of
 * ~50 runs of tests/native/signal_edges.c with a CPU hog beside it). Its device is unknown instead. */
static __thread int t_in_loader;

static ctx_get_device_fn find_driver(int retry_now)
{
    if (!retry_now && mono_ns() < atomic_load_explicit(&g_no_driver_until_ns, memory_order_relaxed)) return NULL;
    void *lib = libcuda();
    if (!lib) {
        atomic_store_explicit(&g_no_driver_until_ns, mono_ns() + NO_DRIVER_RETRY_NS, memory_order_relaxed);
        return NULL;
    }
    /* racing threads find the same functions; each published only where found */
    device_bus_id_fn bus = (device_bus_id_fn)real_dlsym_fn(lib, "cuDeviceGetPCIBusId");
    if (bus) atomic_store_explicit(&p_device_bus_id, bus, memory_order_release);
    device_count_fn count = (device_count_fn)real_dlsym_fn(lib, "cuDeviceGetCount");
    if (count) atomic_store_explicit(&p_device_count, count, memory_order_release);
    ctx_get_device_fn get = (ctx_get_device_fn)real_dlsym_fn(lib, "cuCtxGetDevice");
    if (get) atomic_store_explicit(&p_ctx_get_device, get, memory_order_release);
    return get;
}

int current_device(int retry_now)
{
    ctx_get_device_fn get = atomic_load_explicit(&p_ctx_get_device, memory_order_acquire);
    if (!get) {
        if (t_in_loader) return -1;
        t_in_loader = 1;
        get = find_driver(retry_now);
        t_in_loader = 0;
        if (!get) return -1;
    }
    int dev = -1;
    return get(&dev) == 0 ? dev : -1;
}

/* ---- the device at a nested range edge ----
 * Asking the driver at every edge (cuCtxGetDevice, its code and data cold where the program's own work between
 * edges evicts the caches) was ~1/5 of a nested edge's time in the library in PyTorch's emit_nvtx app
 * (bench/edge_ab.py, 2x H200). A nested edge
 * (inside its thread's counted range) takes the device its thread's last asking edge found, if that was less than
 * DEVICE_FRESH_NS ago and no context call of the thread (cuCtxSetCurrent & co., whose trampolines below forget
 * it) came through the library since; other edges ask. Interpose mode on x86-64 and AArch64 only, where those
 * calls pass through the library; elsewhere every edge asks. A launch or copy always asks: it names the GPU
 * a range is charged, whatever the edges say. */
enum { DEVICE_FRESH_NS = 1000000 };
static __thread int t_dev;
static __thread unsigned long long t_dev_ns;  /* when t_dev was asked (0: not kept) */
static atomic_int g_ctx_unseen;               /* a context entry point went out unwrapped: nothing is kept */
static int device_kept(void);

void device_forget(void) { t_dev_ns = 0; }

int edge_device(unsigned long long t_ns, int nested)
{
    if (nested && t_dev_ns && t_ns - t_dev_ns < DEVICE_FRESH_NS) return t_dev;
    int dev = current_device(0);
    if (device_kept()) { t_dev = dev; t_dev_ns = t_ns | 1; }
    return dev;
}

/* cuDeviceGetPCIBusId of the driver current_device found (non-zero where there is none). */
int device_bus_id(char *bus, int size, int dev)
{
    device_bus_id_fn fn = atomic_load_explicit(&p_device_bus_id, memory_order_acquire);
    return fn ? fn(bus, size, dev) : -1;
}

/* Name an ordinal (its PCI bus id) the first time it is seen, so Python can map it to an NVML index. */
static void announce(int dev)
{
    if (dev < 0 || dev > 63) return;
    unsigned long long bit = 1ull << dev;
    if (atomic_fetch_or(&g_hot.announced, bit) & bit) return;
    char bus[64] = "?";
    if (device_bus_id(bus, (int)sizeof bus, dev) != 0) strcpy(bus, "?");
    emit("cudevice", NULL, (unsigned long long)dev, bus);
}

/* The device a launch or copy runs on. A process that sees one GPU (cuDeviceGetCount 1: CUDA_VISIBLE_DEVICES
 * naming one, or a one-GPU machine) runs every launch on ordinal 0, whatever its contexts, so the driver is asked
 * once, at the first launch that finds a context, and never again: exact, where keeping a thread's last answer is
 * not (a switch the library does not see). Its cuCtxGetDevice was ~20 ns with the caches warm and ~280 ns
 * with 2 MB touched between calls (1x H200), most of what counting costs a PyTorch launch. A process that
 * sees several GPUs asks at every launch. */
static int launch_device(void)
{
    /* (acquire: a thread that takes ordinal 0 from here sees the driver's functions the deciding one found) */
    int one = atomic_load_explicit(&g_hot.one_gpu, memory_order_acquire);
    if (one > 0) return 0;
    int dev = current_device(1);
    if (!one && dev >= 0) {  /* a context is current, so the driver is initialised: its count is fixed */
        device_count_fn count = atomic_load_explicit(&p_device_count, memory_order_acquire);
        int n = 0;
        atomic_store_explicit(&g_hot.one_gpu, count && count(&n) == 0 && n == 1 ? 1 : -1, memory_order_release);
    }
    return dev;
}

static inline void note_launch_device(void)
{
    int dev = launch_device();
    if (dev >= 0 && dev < 64) {
        if (!(atomic_load_explicit(&g_hot.announced, memory_order_relaxed) & (1ull << dev))) announce(dev);
        t_hot.devmask |= 1ull << dev;  /* after announce(): its event resets the thread's mask */
    }
}

/* A copy (cuMemcpy*) names the device current on its thread as a launch does, so that a range whose copy ran on
 * another GPU than the one current at its edges is charged that GPU too: PyTorch's ``x.to("cuda:1")`` on a
 * thread whose device is cuda:0 sets cuda:1 for the copy alone (2x H200: a 72 MB H2D range read as 0 B of GPU 0). */
void note_copy_device(void) { note_launch_device(); }

/* ---- launch counting by interposition (PCIETRACE_COUNT=interpose, library in LD_PRELOAD) ----
 * The CUDA runtime and cuda.bindings look up the driver's cuGetProcAddress with dlsym and fetch every
 * entry point through it. Our dlsym hands out wrappers of cuGetProcAddress(_v2) that return counting
 * trampolines (which also time the calls, as do those of cuStreamSynchronize, cuEventSynchronize and
 * cuCtxSynchronize) for cuLaunchKernel*, cuLaunchKernelEx*, cuLaunchCooperativeKernel* and cuGraphLaunch*:
 * ~0.07 us per launch on an H100 host with the caches warm (a driver query of the current device, two reads of the
 * call clock, below; and, once the process has begun a stream capture, whether the launch's stream is capturing;
 * bench/interposer_cost.py), where CUPTI's callback dispatch costs ~0.6-0.9 us. In a program whose own work
 * evicts the library's lines between launches it is the lines touched that cost: ~0.4 us a PyTorch launch on a
 * 2x H200 host (bench/launch_cost_torch.py), most of it the driver's cuCtxGetDevice, which a process that sees
 * one GPU no longer asks (launch_device; struct pt_hot in pt_inject.h keeps the library's own to two lines).
 * Several real entry points (per-thread-stream variants, versions) each get their own trampoline slot. */

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

void count_eager(void)
{
    ++t_hot.eager; atomic_fetch_add_explicit(&g_hot.eager, 1, memory_order_relaxed); note_launch_device();
}
void count_graph(void)
{
    ++t_hot.graph; atomic_fetch_add_explicit(&g_hot.graph, 1, memory_order_relaxed); note_launch_device();
}
void count_captured(void) { ++t_captured; atomic_fetch_add_explicit(&g_captured, 1, memory_order_relaxed); note_launch_device(); }

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
static inline void capture_begins(void) { atomic_store_explicit(&g_hot.capture_begun, 1, memory_order_release); }

/* Whether a launch into ``stream`` (of a per-thread-default-stream entry point: ``per_thread``) only adds a
 * node to a graph being captured: its stream's capture is active, or invalidated (the launch then fails). */
int captured(void *stream, int per_thread)
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
    if (atomic_load_explicit(&g_hot.capture_begun, memory_order_acquire) && captured(stream, per_thread))
        count_captured();
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
#define TIMED(timed, sum, call) do { if (!(timed)) return call; call_clock_start(); \
    unsigned long long t0_ = call_ticks(); CUres r_ = call; add_ticks(&t_hot.sum, &g_hot.sum, t0_); return r_; \
    } while (0)
#define TIMED_LAUNCH(eager, call) TIMED(eager, call_ticks, call)
#define TIMED_WAIT(timed, call) TIMED(timed, wait_ticks, call)

void *launch_config_stream(const void *cfg)
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
 * cuStreamBeginCaptureToCig, and their _ptsz variants (see g_hot.capture_begun). The CUDA 13 runtime fetches six at
 * start-up (cuStreamBeginCapture at versions 10000 and 10010, ToGraph at 12030, each with and without the
 * per-thread flag) and cuda.bindings a seventh; a begin handed out unwrapped (no slot left) sets the flag. */
typedef CUres (*begin_fn)(void *, void *, void *, void *, void *, void *);
#define BEGIN_SLOTS 12
static void *real_begin[BEGIN_SLOTS];
#define BEGIN_SLOT(i) static CUres begin_##i(void *a, void *b, void *c, void *d, void *e, void *f) \
    { capture_begins(); return ((begin_fn)real_begin[i])(a, b, c, d, e, f); }
/* copies: every cuMemcpy* entry point but the batched ones (cudaMemcpyBatchAsync's takes 8 or 9 arguments), with
 * six pointer-sized arguments forwarded as the begin trampolines do (every other one takes 1-6 integer or pointer
 * arguments); x86-64 and AArch64 only (CAPTURE_GATE). The runtime fetches each variant it may call (sync, async,
 * 2D, 3D, peer, arrays; legacy and per-thread streams) once, at start-up. */
#define COPY_SLOTS 96
static void *real_copy[COPY_SLOTS];
#define COPY_SLOT(i) static CUres copy_##i(void *a, void *b, void *c, void *d, void *e, void *f) \
    { note_copy_device(); return ((begin_fn)real_copy[i])(a, b, c, d, e, f); }
/* context calls: the thread's current context may change (cuCtxSetCurrent, cuCtxPushCurrent*, cuCtxPopCurrent*,
 * cuCtxCreate*, cuCtxDestroy*, cuCtxAttach, cuCtxDetach, cuDevicePrimaryCtxRelease*, cuDevicePrimaryCtxReset*;
 * 1-5 arguments, forwarded as six): the device a nested edge takes is asked again */
#define CTX_SLOTS 32
static void *real_ctx[CTX_SLOTS];
#define CTX_SLOT(i) static CUres ctx_##i(void *a, void *b, void *c, void *d, void *e, void *f) \
    { CUres r = ((begin_fn)real_ctx[i])(a, b, c, d, e, f); device_forget(); return r; }
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
COPY_SLOT(0) COPY_SLOT(1) COPY_SLOT(2) COPY_SLOT(3) COPY_SLOT(4) COPY_SLOT(5) COPY_SLOT(6) COPY_SLOT(7) COPY_SLOT(8)
COPY_SLOT(9) COPY_SLOT(10) COPY_SLOT(11) COPY_SLOT(12) COPY_SLOT(13) COPY_SLOT(14) COPY_SLOT(15) COPY_SLOT(16)
COPY_SLOT(17) COPY_SLOT(18) COPY_SLOT(19) COPY_SLOT(20) COPY_SLOT(21) COPY_SLOT(22) COPY_SLOT(23) COPY_SLOT(24)
COPY_SLOT(25) COPY_SLOT(26) COPY_SLOT(27) COPY_SLOT(28) COPY_SLOT(29) COPY_SLOT(30) COPY_SLOT(31) COPY_SLOT(32)
COPY_SLOT(33) COPY_SLOT(34) COPY_SLOT(35) COPY_SLOT(36) COPY_SLOT(37) COPY_SLOT(38) COPY_SLOT(39) COPY_SLOT(40)
COPY_SLOT(41) COPY_SLOT(42) COPY_SLOT(43) COPY_SLOT(44) COPY_SLOT(45) COPY_SLOT(46) COPY_SLOT(47) COPY_SLOT(48)
COPY_SLOT(49) COPY_SLOT(50) COPY_SLOT(51) COPY_SLOT(52) COPY_SLOT(53) COPY_SLOT(54) COPY_SLOT(55) COPY_SLOT(56)
COPY_SLOT(57) COPY_SLOT(58) COPY_SLOT(59) COPY_SLOT(60) COPY_SLOT(61) COPY_SLOT(62) COPY_SLOT(63) COPY_SLOT(64)
COPY_SLOT(65) COPY_SLOT(66) COPY_SLOT(67) COPY_SLOT(68) COPY_SLOT(69) COPY_SLOT(70) COPY_SLOT(71) COPY_SLOT(72)
COPY_SLOT(73) COPY_SLOT(74) COPY_SLOT(75) COPY_SLOT(76) COPY_SLOT(77) COPY_SLOT(78) COPY_SLOT(79) COPY_SLOT(80)
COPY_SLOT(81) COPY_SLOT(82) COPY_SLOT(83) COPY_SLOT(84) COPY_SLOT(85) COPY_SLOT(86) COPY_SLOT(87) COPY_SLOT(88)
COPY_SLOT(89) COPY_SLOT(90) COPY_SLOT(91) COPY_SLOT(92) COPY_SLOT(93) COPY_SLOT(94) COPY_SLOT(95)
CTX_SLOT(0) CTX_SLOT(1) CTX_SLOT(2) CTX_SLOT(3) CTX_SLOT(4) CTX_SLOT(5) CTX_SLOT(6) CTX_SLOT(7) CTX_SLOT(8) CTX_SLOT(9)
CTX_SLOT(10) CTX_SLOT(11) CTX_SLOT(12) CTX_SLOT(13) CTX_SLOT(14) CTX_SLOT(15) CTX_SLOT(16) CTX_SLOT(17) CTX_SLOT(18)
CTX_SLOT(19) CTX_SLOT(20) CTX_SLOT(21) CTX_SLOT(22) CTX_SLOT(23) CTX_SLOT(24) CTX_SLOT(25) CTX_SLOT(26) CTX_SLOT(27)
CTX_SLOT(28) CTX_SLOT(29) CTX_SLOT(30) CTX_SLOT(31)
static void *const ctx_slots[CTX_SLOTS] = {(void *)ctx_0, (void *)ctx_1, (void *)ctx_2, (void *)ctx_3, (void *)ctx_4,
    (void *)ctx_5, (void *)ctx_6, (void *)ctx_7, (void *)ctx_8, (void *)ctx_9, (void *)ctx_10, (void *)ctx_11,
    (void *)ctx_12, (void *)ctx_13, (void *)ctx_14, (void *)ctx_15, (void *)ctx_16, (void *)ctx_17, (void *)ctx_18,
    (void *)ctx_19, (void *)ctx_20, (void *)ctx_21, (void *)ctx_22, (void *)ctx_23, (void *)ctx_24, (void *)ctx_25,
    (void *)ctx_26, (void *)ctx_27, (void *)ctx_28, (void *)ctx_29, (void *)ctx_30, (void *)ctx_31};
static void *const copy_slots[COPY_SLOTS] = {(void *)copy_0, (void *)copy_1, (void *)copy_2, (void *)copy_3,
    (void *)copy_4, (void *)copy_5, (void *)copy_6, (void *)copy_7, (void *)copy_8, (void *)copy_9, (void *)copy_10,
    (void *)copy_11, (void *)copy_12, (void *)copy_13, (void *)copy_14, (void *)copy_15, (void *)copy_16,
    (void *)copy_17, (void *)copy_18, (void *)copy_19, (void *)copy_20, (void *)copy_21, (void *)copy_22,
    (void *)copy_23, (void *)copy_24, (void *)copy_25, (void *)copy_26, (void *)copy_27, (void *)copy_28,
    (void *)copy_29, (void *)copy_30, (void *)copy_31, (void *)copy_32, (void *)copy_33, (void *)copy_34,
    (void *)copy_35, (void *)copy_36, (void *)copy_37, (void *)copy_38, (void *)copy_39, (void *)copy_40,
    (void *)copy_41, (void *)copy_42, (void *)copy_43, (void *)copy_44, (void *)copy_45, (void *)copy_46,
    (void *)copy_47, (void *)copy_48, (void *)copy_49, (void *)copy_50, (void *)copy_51, (void *)copy_52,
    (void *)copy_53, (void *)copy_54, (void *)copy_55, (void *)copy_56, (void *)copy_57, (void *)copy_58,
    (void *)copy_59, (void *)copy_60, (void *)copy_61, (void *)copy_62, (void *)copy_63, (void *)copy_64,
    (void *)copy_65, (void *)copy_66, (void *)copy_67, (void *)copy_68, (void *)copy_69, (void *)copy_70,
    (void *)copy_71, (void *)copy_72, (void *)copy_73, (void *)copy_74, (void *)copy_75, (void *)copy_76,
    (void *)copy_77, (void *)copy_78, (void *)copy_79, (void *)copy_80, (void *)copy_81, (void *)copy_82,
    (void *)copy_83, (void *)copy_84, (void *)copy_85, (void *)copy_86, (void *)copy_87, (void *)copy_88,
    (void *)copy_89, (void *)copy_90, (void *)copy_91, (void *)copy_92, (void *)copy_93, (void *)copy_94,
    (void *)copy_95};
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
    } else if (out == real && reals == real_copy) {
        emit("interpose", NULL, 0, "more copy entry points than slots: some copies' devices not noted");
#if CAPTURE_GATE
    } else if (out == real && reals == real_ctx) {
        atomic_store(&g_ctx_unseen, 1);
        emit("interpose", NULL, 0, "more context entry points than slots: every range edge asks its device");
#endif
    } else if (out == real) {
        emit("interpose", NULL, 0, "more driver entry points than slots: some launches uncounted or calls untimed");
    }
    return out;
}

static int prefix(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

static CUres getproc1(const char *sym, void **pfn, int ver, unsigned long long flags);
static CUres getproc2(const char *sym, void **pfn, int ver, unsigned long long flags, void *status);

int suffix(const char *s, const char *x) { size_t n = strlen(s), m = strlen(x); return n >= m && !strcmp(s + n - m, x); }

/* cuLaunchCooperativeKernel and its _ptsz variant only: cuLaunchCooperativeKernelMultiDevice (deprecated) takes
 * a list of launches, not a stream, so it is left alone (uncounted) rather than read with the wrong layout. */
int cooperative(const char *s) { return !strcmp(s, "cuLaunchCooperativeKernel") || !strcmp(s, "cuLaunchCooperativeKernel_ptsz"); }
/* The copies whose device a range is charged (note_copy_device): cuMemcpy*, not the batched ones. */
int copy_entry(const char *s) { return prefix(s, "cuMemcpy") && !strstr(s, "Batch"); }
/* The calls that may change the thread's current context (CTX_SLOT). */
static int ctx_entry(const char *s)
{
    static const char *const names[] = {"cuCtxSetCurrent", "cuCtxPushCurrent", "cuCtxPopCurrent", "cuCtxCreate",
                                        "cuCtxDestroy", "cuCtxAttach", "cuCtxDetach", "cuDevicePrimaryCtxRelease",
                                        "cuDevicePrimaryCtxReset"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i) if (prefix(s, names[i])) return 1;
    return 0;
}
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
    if (copy_entry(sym)) return slot_for(real_copy, NULL, copy_slots, COPY_SLOTS, real, pt);
    if (ctx_entry(sym)) return slot_for(real_ctx, NULL, ctx_slots, CTX_SLOTS, real, pt);
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

/* Whether a nested edge may take its thread's last asked device (edge_device): context calls pass through here */
static int device_kept(void)
{
    return CAPTURE_GATE && interposing() && !passive() && !atomic_load_explicit(&g_ctx_unseen, memory_order_relaxed);
}

static _Atomic int g_interposing = -1;  /* racing first callers find the same answer */
int interposing(void)
{
    int on = atomic_load_explicit(&g_interposing, memory_order_relaxed);
    if (on < 0) {
        const char *m = getenv("PCIETRACE_COUNT");
        atomic_store_explicit(&g_interposing, on = m && !strcmp(m, "interpose"), memory_order_relaxed);
    }
    return on;
}

/* glibc's own dlsym (ours below interposes it for the program), found once: its version since glibc 2.34, else
 * the x86-64 baseline's, else AArch64's. Where none is found every lookup finds nothing (the library then
 * records NVTX ranges but counts no launch) rather than calling through a NULL pointer. */
typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn g_real_dlsym;
static pthread_once_t g_real_dlsym_once = PTHREAD_ONCE_INIT;
static void real_dlsym_resolve(void)
{
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    for (size_t i = 0; !g_real_dlsym && i < sizeof versions / sizeof versions[0]; ++i)
        g_real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
}

void *real_dlsym_fn(void *handle, const char *name)
{
    pthread_once(&g_real_dlsym_once, real_dlsym_resolve);
    return g_real_dlsym ? g_real_dlsym(handle, name) : NULL;
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
#define DIRECT_CTX(sym) EXPORT CUres sym(void *a, void *b, void *c, void *d, void *e, void *f) \
    { static void *real; begin_fn fn = (begin_fn)next_entry(&real, #sym); if (!fn) return CUDA_ERROR_NOT_FOUND; \
      CUres r = fn(a, b, c, d, e, f); device_forget(); return r; }
DIRECT_CTX(cuCtxSetCurrent) DIRECT_CTX(cuCtxPushCurrent) DIRECT_CTX(cuCtxPushCurrent_v2) DIRECT_CTX(cuCtxPopCurrent)
DIRECT_CTX(cuCtxPopCurrent_v2) DIRECT_CTX(cuCtxCreate) DIRECT_CTX(cuCtxCreate_v2) DIRECT_CTX(cuCtxCreate_v3)
DIRECT_CTX(cuCtxCreate_v4) DIRECT_CTX(cuCtxDestroy) DIRECT_CTX(cuCtxDestroy_v2) DIRECT_CTX(cuCtxAttach)
DIRECT_CTX(cuCtxDetach) DIRECT_CTX(cuDevicePrimaryCtxRelease) DIRECT_CTX(cuDevicePrimaryCtxRelease_v2)
DIRECT_CTX(cuDevicePrimaryCtxReset) DIRECT_CTX(cuDevicePrimaryCtxReset_v2)
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
