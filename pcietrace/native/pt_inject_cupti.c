/* The injection library (pt_inject.h lists its units): CUDA's injection entry point, counting launches through
 * CUPTI callbacks, and GPU time from CUPTI's kernel records. */
#include "pt_inject.h"

/* ---- CUPTI (values from cupti_callbacks.h / cupti_driver_cbid.h) ---- */
typedef void (*CuptiCallback)(void *userdata, int domain, uint32_t cbid, const void *cbdata);
/* CUpti_CallbackData's first fields: callbackSite (enum) at 0, functionName at 8, functionParams at 16 */
typedef struct { int callbackSite; const char *functionName; const void *functionParams; } CuptiCallbackDataHead;
enum { CUPTI_CB_DOMAIN_DRIVER_API = 1, CUPTI_API_ENTER = 0 };
static const uint32_t LAUNCH_CBIDS[] = {307 /* cuLaunchKernel */, 442 /* _ptsz */, 514 /* cuGraphLaunch */,
                                       515 /* _ptsz */, 652 /* cuLaunchKernelEx */, 653 /* _ptsz */,
                                       477 /* cuLaunchCooperativeKernel */, 478 /* _ptsz */};

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
    } else if (copy_entry(name)) {
        note_copy_device();
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
/* CUPTI stamps on CLOCK_REALTIME (no timestamp callback); set before CUPTI is enabled */
static _Atomic int g_cupti_realtime;

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
    int (*reg)(void *, void *) = (int (*)(void *, void *))real_dlsym_fn(lib, "cuptiActivityRegisterCallbacks");
    int (*enable)(int) = (int (*)(int))real_dlsym_fn(lib, "cuptiActivityEnable");
    int (*clock_cb)(uint64_t (*)(void)) = (int (*)(uint64_t (*)(void)))real_dlsym_fn(lib, "cuptiActivityRegisterTimestampCallback");
    p_next_record = (int (*)(uint8_t *, size_t, void **))real_dlsym_fn(lib, "cuptiActivityGetNextRecord");
    p_flush_all = (int (*)(uint32_t))real_dlsym_fn(lib, "cuptiActivityFlushAll");
    p_dropped = (int (*)(void *, uint32_t, size_t *))real_dlsym_fn(lib, "cuptiActivityGetNumDroppedRecords");
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
    int (*subscribe)(void **, CuptiCallback, void *) = (int (*)(void **, CuptiCallback, void *))real_dlsym_fn(lib, "cuptiSubscribe");
    int (*enable)(uint32_t, void *, int, uint32_t) = (int (*)(uint32_t, void *, int, uint32_t))real_dlsym_fn(lib, "cuptiEnableCallback");
    void *sub = NULL;
    int rc = subscribe ? subscribe(&sub, on_driver_api, NULL) : -1;
    if (rc) { char m[64]; snprintf(m, sizeof m, "cuptiSubscribe failed (%d)", rc); emit("cupti", NULL, 0, m); return 1; }
    if (!enable) { emit("cupti", NULL, 0, "cuptiEnableCallback missing: launches not counted"); return 1; }
    /* Enable every driver callback named cuLaunchKernel*, cuGraphLaunch* or cuLaunchCooperativeKernel(_ptsz) (ids differ between CUPTI
       versions), and the copies' (their devices: note_copy_device); fall back to the known launch ids where CUPTI
       cannot name its callbacks. */
    int (*name_of)(int, uint32_t, const char **) = (int (*)(int, uint32_t, const char **))real_dlsym_fn(lib, "cuptiGetCallbackName");
    int enabled = 0;
    for (uint32_t id = 1; name_of && id < 4096; ++id) {
        const char *name = NULL;
        if (name_of(CUPTI_CB_DOMAIN_DRIVER_API, id, &name) || !name) continue;
        if (!strncmp(name, "cuLaunchKernel", 14) || !strncmp(name, "cuGraphLaunch", 13) || cooperative(name))
            enabled += enable(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, id) == 0;
        else if (copy_entry(name))
            enable(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, id);
    }
    for (size_t i = 0; !enabled && i < sizeof LAUNCH_CBIDS / sizeof LAUNCH_CBIDS[0]; ++i)
        enable(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, LAUNCH_CBIDS[i]);
    char m[96];
    snprintf(m, sizeof m, "launch counting on (%d callbacks by name)", enabled);
    emit("cupti", NULL, 0, m);
    return 1;
}
