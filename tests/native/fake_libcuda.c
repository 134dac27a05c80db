/*
 * A fake libcuda.so.1 for CPU tests of pcietrace's native loops (tests/test_native.py): it exports only
 * cuGetProcAddress_v2 and hands out stand-ins that count calls and return what the test asks for.
 * Build: cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o libcuda.so.1 fake_libcuda.c
 * Control (set from Python through ctypes): fake_fail_at (the launch call number that fails, 0 = never),
 * fake_fail_code, fake_flag_mode (1: a "kernel" launch stores its value to both flags at once, as pt_flag
 * does; 0: never, to test the timeout), fake_launch_ns (busy time per launch call), fake_device (the ordinal
 * cuCtxGetDevice reports, for the injection library's device tracking; bus id 0000:00:(06 + ordinal).0;
 * cuCtxSetCurrent, from cuGetProcAddress or by name, sets it to its context handle less 1, as if each ordinal had
 * one context); fake_device_asked counts the cuCtxGetDevice calls, and cuDeviceGetCount reports fake_device_count
 * GPUs (2 unless set).
 * Stream capture (cuStreamIsCapturing, for the injection library's captured launches): the stream handle
 * fake_capturing_stream is capturing (ACTIVE), fake_invalidated_stream's capture is INVALIDATED, a query of
 * fake_failing_stream fails (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT), CU_STREAM_PER_THREAD (0x2) is capturing
 * while fake_per_thread_capturing is set; every other handle is not capturing. fake_capture_queries counts
 * the queries. Capture begins change nothing: they count themselves in fake_capture_begins and keep their
 * arguments in fake_begin_args (the one-argument begins a mode of -1 or -2). As the real driver does, each
 * variant is its own function: cuStreamBeginCapture before version 10010 (stream) and after (_v2: stream, mode),
 * cuStreamBeginCaptureToGraph (six arguments), cuStreamBeginCaptureToCig (stream, params), each also per-thread
 * (flag 2); and 16 more begins under fake names, "cuStreamBeginCapture_stub0" ... "_stub15". Synchronize calls spend fake_sync_ns (see sync_on). cuLaunchKernelEx takes its stream from the CUlaunchConfig (hStream at byte 32);
 * "cuLaunchKernel" fetched with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (or "cuLaunchKernel_ptsz") is a
 * separate function, as in the real driver. cuLaunchCooperativeKernel is cuLaunchKernel without ``extra``.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

long long fake_launches, fake_graph_launches, fake_syncs, fake_queries, fake_h2d, fake_d2h;
long long fake_fail_at, fake_launch_ns;
long long fake_busy_ns;  /* ns spent busy in launch and synchronize calls, by CLOCK_MONOTONIC: the call timing's truth */
int fake_fail_code = 719, fake_flag_mode;
unsigned long long fake_last_nbytes;

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int spend(void)
{
    long long t = now_ns(), e;
    while ((e = now_ns()) - t < fake_launch_ns) {
    }
    fake_busy_ns += e - t;
    long long n = fake_launches + fake_graph_launches;
    return (fake_fail_at && n == fake_fail_at) ? fake_fail_code : 0;
}

static int launch_kernel(void *f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, unsigned g, unsigned sh,
                         void *stream, void **params, void **extra)
{
    (void)f, (void)a, (void)b, (void)c, (void)d, (void)e, (void)g, (void)sh, (void)stream, (void)extra;
    ++fake_launches;
    if (fake_flag_mode && params && params[0] && params[1]) {  /* pt_flag(flags, value, spin): store value */
        volatile uint32_t *flags = *(volatile uint32_t **)params[0];
        uint32_t v = *(uint32_t *)params[1];
        if (flags) { flags[0] = v; flags[1] = v; }
    }
    return spend();
}

static int graph_launch(void *exe, void *stream) { (void)exe, (void)stream; ++fake_graph_launches; return spend(); }
static int launch_kernel_ptsz(void *f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, unsigned g,
                              unsigned sh, void *stream, void **params, void **extra)
{
    return launch_kernel(f, a, b, c, d, e, g, sh, stream, params, extra);
}
static int launch_cooperative(void *f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, unsigned g,
                              unsigned sh, void *stream, void **params)
{
    return launch_kernel(f, a, b, c, d, e, g, sh, stream, params, NULL);
}
/* handed out as cuLaunchCooperativeKernelMultiDevice (another signature): the library must leave it unwrapped */
int fake_multi_device_launch(void *list, unsigned n, unsigned flags) { (void)list, (void)n, (void)flags; return 0; }
static int launch_kernel_ex(const void *config, void *f, void **params, void **extra)
{
    (void)config, (void)f, (void)params, (void)extra;
    ++fake_launches;
    return spend();
}

/* The same stand-ins under their own names, for code linked against libcuda that calls them directly (PLT). */
int cuLaunchKernel(void *f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, unsigned g, unsigned sh,
                   void *stream, void **params, void **extra)
{
    return launch_kernel(f, a, b, c, d, e, g, sh, stream, params, extra);
}
int cuLaunchKernel_ptsz(void *f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, unsigned g, unsigned sh,
                        void *stream, void **params, void **extra)
{
    return launch_kernel(f, a, b, c, d, e, g, sh, stream, params, extra);
}
int cuLaunchKernelEx(const void *config, void *f, void **params, void **extra) { return launch_kernel_ex(config, f, params, extra); }
int cuLaunchCooperativeKernel(void *f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, unsigned g,
                              unsigned sh, void *stream, void **params)
{
    return launch_cooperative(f, a, b, c, d, e, g, sh, stream, params);
}
int cuGraphLaunch(void *exe, void *stream) { return graph_launch(exe, stream); }

unsigned long long fake_capturing_stream, fake_invalidated_stream, fake_failing_stream;
int fake_per_thread_capturing;
long long fake_capture_queries;
int cuStreamIsCapturing(void *stream, int *status)
{
    unsigned long long s = (unsigned long long)(uintptr_t)stream;
    ++fake_capture_queries;
    if (fake_failing_stream && s == fake_failing_stream) return 906;  /* CUDA_ERROR_STREAM_CAPTURE_IMPLICIT */
    *status = (fake_capturing_stream && s == fake_capturing_stream) || (s == 2 && fake_per_thread_capturing) ? 1
              : (fake_invalidated_stream && s == fake_invalidated_stream) ? 2 : 0;
    return 0;
}
long long fake_capture_begins;
unsigned long long fake_begin_args[6];
static int begin_capture(void *s, int mode)
{
    ++fake_capture_begins;
    fake_begin_args[0] = (unsigned long long)(uintptr_t)s, fake_begin_args[1] = (unsigned long long)mode;
    return 0;
}
static int begin_capture_to_graph(void *s, void *g, const void *deps, const void *data, size_t n, int mode)
{
    const unsigned long long a[6] = {(uintptr_t)s, (uintptr_t)g, (uintptr_t)deps, (uintptr_t)data, n, (unsigned long long)mode};
    ++fake_capture_begins;
    memcpy(fake_begin_args, a, sizeof a);
    return 0;
}
int cuStreamBeginCapture_v2(void *s, int mode) { return begin_capture(s, mode); }
static int begin_v1(void *s) { return begin_capture(s, -1); }
static int begin_v1_ptsz(void *s) { return begin_capture(s, -2); }
static int begin_v2_ptsz(void *s, int mode) { fake_begin_args[2] = 2; return begin_capture(s, mode); }
static int begin_to_graph_ptsz(void *s, void *g, const void *deps, const void *data, size_t n, int mode)
{
    int r = begin_capture_to_graph(s, g, deps, data, n, mode);
    fake_begin_args[5] |= 0x100;  /* (a body of its own: a distinct function) */
    return r;
}
static int begin_to_cig(void *s, void *params) { fake_begin_args[2] = (uintptr_t)params; return begin_capture(s, 3); }
static int begin_to_cig_ptsz(void *s, void *params) { fake_begin_args[2] = (uintptr_t)params; return begin_capture(s, 4); }
#define STUB(k) static int begin_stub##k(void *s, int mode) { (void)mode; return begin_capture(s, 100 + k); }
STUB(0) STUB(1) STUB(2) STUB(3) STUB(4) STUB(5) STUB(6) STUB(7) STUB(8) STUB(9) STUB(10) STUB(11) STUB(12) STUB(13)
STUB(14) STUB(15)
static void *const begin_stubs[16] = {(void *)begin_stub0, (void *)begin_stub1, (void *)begin_stub2, (void *)begin_stub3,
    (void *)begin_stub4, (void *)begin_stub5, (void *)begin_stub6, (void *)begin_stub7, (void *)begin_stub8,
    (void *)begin_stub9, (void *)begin_stub10, (void *)begin_stub11, (void *)begin_stub12, (void *)begin_stub13,
    (void *)begin_stub14, (void *)begin_stub15};
/* the begin cuGetProcAddress hands out for ``sym`` at ``version`` with ``flags`` (NULL: not a begin) */
static void *begin_for(const char *sym, int version, unsigned long long flags)
{
    int pt = (flags & 2) != 0;
    if (!strcmp(sym, "cuStreamBeginCapture"))
        return version < 10010 ? (pt ? (void *)begin_v1_ptsz : (void *)begin_v1) : (pt ? (void *)begin_v2_ptsz : (void *)begin_capture);
    if (!strcmp(sym, "cuStreamBeginCaptureToGraph")) return pt ? (void *)begin_to_graph_ptsz : (void *)begin_capture_to_graph;
    if (!strcmp(sym, "cuStreamBeginCaptureToCig")) return pt ? (void *)begin_to_cig_ptsz : (void *)begin_to_cig;
    if (!strncmp(sym, "cuStreamBeginCapture_stub", 25)) {
        int k = atoi(sym + 25);
        return k >= 0 && k < 16 ? begin_stubs[k] : NULL;
    }
    return NULL;
}
/* synchronize calls: each spends fake_sync_ns (busy) and keeps its handle in fake_sync_handle; cuCtxSynchronize
 * from cuGetProcAddress at version 13000 or later is the one that takes the context (cuCtxSynchronize_v2) */
long long fake_sync_ns;
unsigned long long fake_sync_handle;
static int sync_on(void *h)
{
    long long t = now_ns(), e;
    while ((e = now_ns()) - t < fake_sync_ns) {
    }
    fake_busy_ns += e - t;
    ++fake_syncs;
    fake_sync_handle = (unsigned long long)(uintptr_t)h;
    return 0;
}
static int stream_sync(void *s) { return sync_on(s); }
static int ctx_sync(void) { return sync_on((void *)0xC0); }
static int ctx_sync_v2(void *ctx) { return sync_on(ctx); }
/* the same under their own names, for code linked against libcuda */
int cuStreamSynchronize(void *s) { return sync_on(s); }
int cuEventSynchronize(void *e) { return sync_on(e); }
int cuCtxSynchronize(void) { return ctx_sync(); }
static int stream_query(void *s) { (void)s; return (++fake_queries % 3) ? 600 : 0; }  /* NOT_READY twice, then done */
static int h2d(unsigned long long dst, const void *src, size_t n, void *s) { (void)dst, (void)src, (void)s; ++fake_h2d; fake_last_nbytes = n; return 0; }
static int d2h(void *dst, unsigned long long src, size_t n, void *s) { (void)dst, (void)src, (void)s; ++fake_d2h; fake_last_nbytes = n; return 0; }
extern int fake_device;
static int ctx_set_current(void *ctx) { fake_device = (int)(uintptr_t)ctx - 1; return 0; }
/* the same under its own name, for code linked against libcuda */
int cuCtxSetCurrent(void *ctx) { return ctx_set_current(ctx); }
static int error_name(int code, const char **name) { *name = code == 719 ? "CUDA_ERROR_LAUNCH_FAILED" : "CUDA_ERROR_FAKE"; return 0; }

/* set: cuGetProcAddress hands out cuGraphLaunch's exported address (taken through the GOT, as PIC code takes a
 * symbol that may be interposed: a preloaded definition of the name, where there is one) */
int fake_getproc_exported;
int cuGetProcAddress_v2(const char *sym, void **fn, int version, unsigned long long flags, int *status)
{
    if (!strcmp(sym, "cuCtxSynchronize")) {
        *fn = version >= 13000 ? (void *)ctx_sync_v2 : (void *)ctx_sync;
        return 0;
    }
    if (fake_getproc_exported && !strcmp(sym, "cuGraphLaunch")) {
        *fn = (void *)cuGraphLaunch;
        return 0;
    }
    if ((*fn = begin_for(sym, version, flags))) return 0;
    if ((flags & 2 && !strcmp(sym, "cuLaunchKernel")) || !strcmp(sym, "cuLaunchKernel_ptsz")) {
        *fn = (void *)launch_kernel_ptsz;
        return 0;
    }
    static const struct { const char *name; void *fn; } table[] = {
        {"cuLaunchKernel", (void *)launch_kernel}, {"cuGraphLaunch", (void *)graph_launch},
        {"cuStreamSynchronize", (void *)stream_sync}, {"cuEventSynchronize", (void *)stream_sync},
        {"cuStreamQuery", (void *)stream_query},
        {"cuLaunchKernelEx", (void *)launch_kernel_ex}, {"cuLaunchCooperativeKernel", (void *)launch_cooperative},
        {"cuLaunchCooperativeKernelMultiDevice", (void *)fake_multi_device_launch}, {"cuStreamIsCapturing", (void *)cuStreamIsCapturing},
        {"cuMemcpyHtoDAsync", (void *)h2d}, {"cuMemcpyDtoHAsync", (void *)d2h}, {"cuGetErrorName", (void *)error_name},
        {"cuCtxSetCurrent", (void *)ctx_set_current},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; ++i)
        if (strcmp(sym, table[i].name) == 0) { *fn = table[i].fn; if (status) *status = 1; return 0; }
    *fn = NULL;
    return 500;  /* CUDA_ERROR_NOT_FOUND */
}

int fake_device, fake_device_asked, fake_device_count = 2;
int cuCtxGetDevice(int *dev) { ++fake_device_asked; *dev = fake_device; return 0; }
int cuDeviceGetCount(int *n) { *n = fake_device_count; return 0; }
int cuDeviceGetPCIBusId(char *bus, int len, int dev) { snprintf(bus, (size_t)len, "0000:00:%02x.0", 6 + dev); return 0; }
