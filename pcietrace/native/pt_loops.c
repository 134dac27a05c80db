/*
 * pcietrace's native timing loops: what a C/C++ program pays per launch, copy and round trip.
 *
 * Python sets everything up (NVRTC module, kernels with prebuilt parameter blocks, graphs, buffers,
 * the stream, the current context) and passes raw handles; these loops only launch and timestamp on
 * CLOCK_MONOTONIC (pt_now_ns, the clock of the counter sampler and of every Python-side timestamp).
 * Every call returns a CUresult (0 = success) or one of the PT_ERR_* codes below; per-repeat timings
 * go into caller-provided int64 arrays.
 *
 * A "launch" is one call of one of two kinds: PT_EAGER (cuLaunchKernel of `handle` = CUfunction with
 * the kernel parameter array `params`, grid 1 x block 1) or PT_GRAPH (cuGraphLaunch of `handle` =
 * CUgraphExec; `params` unused).
 */
#include <pthread.h>
#include <stddef.h>

#include "pt_cuda.h"

#define EXPORT __attribute__((visibility("default")))

enum { PT_EAGER = 0, PT_GRAPH = 1 };
#define PT_ERR_NO_ENTRY (-1)   /* a driver entry point could not be resolved (no driver, or too old) */
#define PT_ERR_TIMEOUT (-2)    /* a kernel's store never reached host memory within the timeout */
#define PT_ERR_ARG (-3)        /* bad argument (unknown kind, null output array, ...) */
#define CUDA_ERROR_NOT_READY 600

typedef CUresult (*launch_kernel_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    unsigned, CUstream, void **, void **);
typedef CUresult (*graph_launch_t)(CUgraphExec, CUstream);
typedef CUresult (*stream_t)(CUstream);
typedef CUresult (*copy_h2d_t)(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult (*copy_d2h_t)(void *, CUdeviceptr, size_t, CUstream);
typedef CUresult (*error_name_t)(CUresult, const char **);

static struct {
    launch_kernel_t launch_kernel;
    graph_launch_t graph_launch;
    stream_t stream_sync, stream_query;
    copy_h2d_t copy_h2d;
    copy_d2h_t copy_d2h;
    error_name_t error_name;
    int ok;
} cu;

static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

static void cu_resolve(void)
{
    cu.launch_kernel = (launch_kernel_t)pt_cu("cuLaunchKernel");
    cu.graph_launch = (graph_launch_t)pt_cu("cuGraphLaunch");
    cu.stream_sync = (stream_t)pt_cu("cuStreamSynchronize");
    cu.stream_query = (stream_t)pt_cu("cuStreamQuery");
    cu.copy_h2d = (copy_h2d_t)pt_cu("cuMemcpyHtoDAsync");
    cu.copy_d2h = (copy_d2h_t)pt_cu("cuMemcpyDtoHAsync");
    cu.error_name = (error_name_t)pt_cu("cuGetErrorName");
    cu.ok = cu.launch_kernel && cu.graph_launch && cu.stream_sync && cu.stream_query && cu.copy_h2d &&
            cu.copy_d2h && cu.error_name;
}

/* Resolve the entry points once per process; PT_ERR_NO_ENTRY if any is missing. */
EXPORT int pt_loops_init(void)
{
    pthread_once(&cu_once, cu_resolve);
    return cu.ok ? 0 : PT_ERR_NO_ENTRY;
}

/* The driver's name for a CUresult (e.g. "CUDA_ERROR_LAUNCH_FAILED"), or NULL if unknown. */
EXPORT const char *pt_error_name(int code)
{
    const char *name = NULL;
    if (pt_loops_init() != 0 || cu.error_name(code, &name) != 0) return NULL;
    return name;
}

static inline CUresult launch(int kind, void *handle, CUstream stream, void **params)
{
    if (kind == PT_GRAPH) return cu.graph_launch((CUgraphExec)handle, stream);
    return cu.launch_kernel((CUfunction)handle, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL);
}

static inline int64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

#define CHECK_INIT(kind)                                                     \
    do {                                                                     \
        if (pt_loops_init() != 0) return PT_ERR_NO_ENTRY;                    \
        if ((kind) != PT_EAGER && (kind) != PT_GRAPH) return PT_ERR_ARG;     \
    } while (0)

/*
 * Launch for `duration_ns`: as fast as possible (period_ns == 0; the clock is read every 8 calls, a
 * ~20 ns vDSO read against ~2-5 us per call) or one call every `period_ns` (average rate kept, never
 * more than 4 periods of catch-up, like the Python generator). No synchronize.
 * out[0] = calls, out[1] = t_start (before the first call), out[2] = t_end (after the last call),
 * out[3] = this thread's CPU time over the loop (ns).
 */
EXPORT int pt_launch_for(int kind, void *handle, CUstream stream, void **params, int64_t period_ns,
                         int64_t duration_ns, int64_t *out)
{
    CHECK_INIT(kind);
    if (!out || duration_ns < 0 || period_ns < 0) return PT_ERR_ARG;
    int64_t calls = 0;
    CUresult rc = 0;
    int64_t cpu0 = thread_cpu_ns();
    int64_t t0 = pt_now_ns(), now = t0, deadline = t0 + duration_ns;
    if (period_ns == 0) {
        while (now < deadline) {
            for (int i = 0; i < 8; ++i) {
                if ((rc = launch(kind, handle, stream, params)) != 0) goto done;
                ++calls;
            }
            now = pt_now_ns();
        }
    } else {
        int64_t next = t0;
        for (;;) {
            now = pt_now_ns();
            if (now >= deadline) break;
            if (now < next) continue;
            if ((rc = launch(kind, handle, stream, params)) != 0) goto done;
            ++calls;
            next += period_ns;
            if (next < now - 4 * period_ns) next = now - 4 * period_ns;
        }
    }
done:
    out[0] = calls;
    out[1] = t0;
    out[2] = pt_now_ns();
    out[3] = thread_cpu_ns() - cpu0;
    return rc;
}

/*
 * `n` launch calls back to back, then (if `sync`) a stream synchronize.
 * out[0] = t before the first call, out[1] = t after the last call, out[2] = t after the synchronize
 * (= out[1] without sync), out[3] = this thread's CPU time over the calls (ns).
 */
EXPORT int pt_launch_n(int kind, void *handle, CUstream stream, void **params, int64_t n, int sync, int64_t *out)
{
    CHECK_INIT(kind);
    if (!out || n < 0) return PT_ERR_ARG;
    CUresult rc = 0;
    int64_t cpu0 = thread_cpu_ns();
    int64_t t0 = pt_now_ns();
    for (int64_t i = 0; i < n; ++i)
        if ((rc = launch(kind, handle, stream, params)) != 0) break;
    int64_t t1 = pt_now_ns();
    int64_t cpu1 = thread_cpu_ns();
    if (rc == 0 && sync) rc = cu.stream_sync(stream);
    out[0] = t0;
    out[1] = t1;
    out[2] = sync ? pt_now_ns() : t1;
    out[3] = cpu1 - cpu0;
    return rc;
}

/* Per repeat: one launch call + stream synchronize, host-timed; out_ns[i] = ns of repeat i. */
EXPORT int pt_launch_sync_each(int kind, void *handle, CUstream stream, void **params, int64_t repeats,
                               int64_t *out_ns)
{
    CHECK_INIT(kind);
    if (!out_ns || repeats < 0) return PT_ERR_ARG;
    for (int64_t i = 0; i < repeats; ++i) {
        int64_t t0 = pt_now_ns();
        CUresult rc = launch(kind, handle, stream, params);
        if (rc == 0) rc = cu.stream_sync(stream);
        out_ns[i] = pt_now_ns() - t0;
        if (rc != 0) return rc;
    }
    return 0;
}

/* Per repeat: one async copy of `nbytes` (h2d != 0: host `host` -> device `dev`; else the reverse) +
 * stream synchronize, host-timed; out_ns[i] = ns of repeat i. */
EXPORT int pt_copy_sync_each(int h2d, CUdeviceptr dev, void *host, int64_t nbytes, CUstream stream,
                             int64_t repeats, int64_t *out_ns)
{
    if (pt_loops_init() != 0) return PT_ERR_NO_ENTRY;
    if (!out_ns || !host || nbytes < 0 || repeats < 0) return PT_ERR_ARG;
    for (int64_t i = 0; i < repeats; ++i) {
        int64_t t0 = pt_now_ns();
        CUresult rc = h2d ? cu.copy_h2d(dev, host, (size_t)nbytes, stream)
                          : cu.copy_d2h(host, dev, (size_t)nbytes, stream);
        if (rc == 0) rc = cu.stream_sync(stream);
        out_ns[i] = pt_now_ns() - t0;
        if (rc != 0) return rc;
    }
    return 0;
}

/*
 * The pt_flag kernel (first instruction stores `value` to flags[0], last stores it to flags[1], both
 * in host-mapped memory), per repeat: first_ns[i] = launch call -> host sees flags[0] (launch to first
 * instruction, including that store's one-way trip); end_ns[i] = host sees flags[1] -> cuStreamQuery
 * reports the stream done (kernel end -> host notices).
 * `value_arg` points at the kernel's `value` argument storage (the parameter block holds pointers to
 * the values; the driver copies them at launch), so each repeat stores a fresh value first_value + i.
 * A store not seen within `timeout_ns` synchronizes and returns PT_ERR_TIMEOUT (never hangs).
 */
EXPORT int pt_flag_each(CUfunction func, CUstream stream, void **params, uint64_t *value_arg,
                        volatile uint32_t *flags, uint32_t first_value, int64_t repeats, int64_t timeout_ns,
                        int64_t *first_ns, int64_t *end_ns)
{
    if (pt_loops_init() != 0) return PT_ERR_NO_ENTRY;
    if (!value_arg || !flags || !first_ns || !end_ns || repeats < 0) return PT_ERR_ARG;
    for (int64_t i = 0; i < repeats; ++i) {
        uint32_t v = first_value + (uint32_t)i;
        *value_arg = v;
        int64_t t0 = pt_now_ns();
        CUresult rc = launch(PT_EAGER, func, stream, params);
        if (rc != 0) return rc;
        int64_t t1;
        while (flags[0] != v) {
            if (pt_now_ns() - t0 > timeout_ns) goto timeout;
        }
        t1 = pt_now_ns();
        while (flags[1] != v) {
            if (pt_now_ns() - t0 > timeout_ns) goto timeout;
        }
        int64_t t2 = pt_now_ns();
        while ((rc = cu.stream_query(stream)) == CUDA_ERROR_NOT_READY) {
        }
        int64_t t3 = pt_now_ns();
        if (rc != 0) return rc;
        first_ns[i] = t1 - t0;
        end_ns[i] = t3 - t2;
        continue;
timeout:
        rc = cu.stream_sync(stream);
        return rc != 0 ? rc : PT_ERR_TIMEOUT;
    }
    return 0;
}
