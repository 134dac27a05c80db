/*
 * `pcietrace graphs`: the timed loops of the five ways of running N short kernels whose parameters change
 * between iterations (eager, recapture, exec_update, node_update, recognize). Python compiles the kernel
 * and hands over raw handles (CUfunction, CUstream); one pt_graphs_t per strategy keeps its graphs across
 * calls, so a cache filled in one call is hit in the next. Each iteration is timed on CLOCK_MONOTONIC and
 * ends with a stream synchronize. Every CUresult is checked; the first failure stops the loop and names
 * the call.
 *
 * ABI (CUDA 12, asked for with PT_CUDA_API_VERSION through cuGetProcAddress): cuGraphAddKernelNode and
 * cuGraphExecKernelNodeSetParams resolve to their _v2 forms taking CUDA_KERNEL_NODE_PARAMS_v2,
 * cuGraphExecUpdate to _v2 taking CUgraphExecUpdateResultInfo_v1, cuStreamBeginCapture to _v2 (mode).
 */
#include "pt_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef void *CUkernel;

/* CUDA_KERNEL_NODE_PARAMS_v2 (cuda.h, CUDA 12.0+). */
typedef struct {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
    CUkernel kern;  /* NULL: func is used */
    CUcontext ctx;  /* ignored when func is set */
} pt_kernel_node_params;

/* CUgraphExecUpdateResultInfo_v1 (cuda.h, CUDA 12.0+); result is a C enum (int). */
typedef struct {
    int result;
    CUgraphNode errorNode;
    CUgraphNode errorFromNode;
} pt_update_info;

#define CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE 910
#define CU_STREAM_CAPTURE_MODE_THREAD_LOCAL 1

enum { PT_EAGER = 0, PT_RECAPTURE = 1, PT_EXEC_UPDATE = 2, PT_NODE_UPDATE = 3, PT_RECOGNIZE = 4 };

/* One iteration's record; field order and types mirror pcietrace.device.graphs.ITERATION_DTYPE. */
typedef struct {
    int64_t t_start_ns;    /* before the iteration's first call */
    int64_t prep_ns;       /* capture + instantiate / update / node updates (0 for eager and cache hits) */
    int64_t submit_ns;     /* from the start until the work is submitted (launch call returned) */
    int64_t wall_ns;       /* from the start until the stream synchronize returned */
    int64_t cpu_ns;        /* the thread's CPU time until submitted (the synchronize's spin excluded) */
    int32_t param_set;
    int32_t captures, instantiations, updates, node_updates, cache_hits, update_failures, evictions, graph_launches,
        eager_launches;
} pt_iter;

typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
typedef CUresult (*stream_t)(CUstream);
typedef CUresult (*begin_capture_t)(CUstream, int);
typedef CUresult (*end_capture_t)(CUstream, CUgraph *);
typedef CUresult (*instantiate_t)(CUgraphExec *, CUgraph, unsigned long long);
typedef CUresult (*graph_launch_t)(CUgraphExec, CUstream);
typedef CUresult (*graph_destroy_t)(CUgraph);
typedef CUresult (*exec_destroy_t)(CUgraphExec);
typedef CUresult (*exec_update_t)(CUgraphExec, CUgraph, pt_update_info *);
typedef CUresult (*graph_create_t)(CUgraph *, unsigned int);
typedef CUresult (*add_kernel_node_t)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, const pt_kernel_node_params *);
typedef CUresult (*exec_node_set_t)(CUgraphExec, CUgraphNode, const pt_kernel_node_params *);
typedef CUresult (*error_name_t)(CUresult, const char **);

static struct {
    launch_t launch;
    stream_t sync;
    begin_capture_t begin_capture;
    end_capture_t end_capture;
    instantiate_t instantiate;
    graph_launch_t graph_launch;
    graph_destroy_t graph_destroy;
    exec_destroy_t exec_destroy;
    exec_update_t exec_update;
    graph_create_t graph_create;
    add_kernel_node_t add_kernel_node;
    exec_node_set_t exec_node_set;
    error_name_t error_name;
} cu;

typedef struct {
    int strategy, kernels, param_sets, cache_cap;
    CUfunction func;
    CUstream stream;
    const uint64_t *durations_ns;  /* param_sets x kernels, owned by Python (kept alive there) */
    uint64_t arg_ns, arg_elapsed;  /* the kernel's two arguments (pt_spin(ns, elapsed)) */
    void *args[2];
    CUgraphExec exec;              /* exec_update, node_update */
    CUgraph tmpl;                  /* node_update: the template graph */
    CUgraphNode *nodes;            /* node_update: its nodes in order */
    int applied;                   /* node_update: parameter set the executable graph holds now */
    CUgraphExec *cache;            /* recognize: one executable graph per parameter set */
    int *fifo, fifo_head, fifo_len;
    char err[256];
} pt_graphs_t;

static int resolve(void)
{
    if (cu.launch) return 0;
#define GET(field, name) if (!(cu.field = pt_cu(name))) return -1
    GET(error_name, "cuGetErrorName");
    GET(sync, "cuStreamSynchronize");
    GET(begin_capture, "cuStreamBeginCapture");
    GET(end_capture, "cuStreamEndCapture");
    GET(instantiate, "cuGraphInstantiateWithFlags");
    GET(graph_launch, "cuGraphLaunch");
    GET(graph_destroy, "cuGraphDestroy");
    GET(exec_destroy, "cuGraphExecDestroy");
    GET(exec_update, "cuGraphExecUpdate");
    GET(graph_create, "cuGraphCreate");
    GET(add_kernel_node, "cuGraphAddKernelNode");
    GET(exec_node_set, "cuGraphExecKernelNodeSetParams");
    GET(launch, "cuLaunchKernel");  /* last: cu.launch != NULL means all resolved */
#undef GET
    return 0;
}

static CUresult fail(pt_graphs_t *g, const char *call, CUresult r)
{
    const char *name = "?";
    if (cu.error_name) cu.error_name(r, &name);
    snprintf(g->err, sizeof g->err, "%s|%s", call, name ? name : "?");
    return r;
}

#define CK(call, expr) do { CUresult r_ = (expr); if (r_) return fail(g, call, r_); } while (0)

static int64_t cpu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static const uint64_t *set_of(const pt_graphs_t *g, int p) { return g->durations_ns + (size_t)p * g->kernels; }

static CUresult launch_all(pt_graphs_t *g, int p, const char *call)
{
    const uint64_t *d = set_of(g, p);
    for (int i = 0; i < g->kernels; ++i) {
        g->arg_ns = d[i];  /* the driver copies the arguments at the call (launch or capture) */
        CK(call, cu.launch(g->func, 1, 1, 1, 1, 1, 1, 0, g->stream, g->args, NULL));
    }
    return 0;
}

/* Stream capture of parameter set p into *graph; on failure the capture is ended, so the stream stays usable. */
static CUresult capture(pt_graphs_t *g, int p, CUgraph *graph)
{
    *graph = NULL;
    CK("cuStreamBeginCapture", cu.begin_capture(g->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    CUresult r = launch_all(g, p, "cuLaunchKernel (capture)");
    CUgraph got = NULL;
    CUresult e = cu.end_capture(g->stream, &got);
    if (r) {
        if (got) cu.graph_destroy(got);
        return r;
    }
    if (e) return fail(g, "cuStreamEndCapture", e);
    *graph = got;
    return 0;
}

static CUresult build_template(pt_graphs_t *g)
{
    CK("cuGraphCreate", cu.graph_create(&g->tmpl, 0));
    g->nodes = calloc((size_t)g->kernels, sizeof *g->nodes);
    if (!g->nodes) return fail(g, "calloc", 2);
    pt_kernel_node_params np = {0};
    np.func = g->func;
    np.gridDimX = np.gridDimY = np.gridDimZ = np.blockDimX = np.blockDimY = np.blockDimZ = 1;
    np.kernelParams = g->args;
    const uint64_t *d = set_of(g, 0);
    for (int i = 0; i < g->kernels; ++i) {
        g->arg_ns = d[i];  /* parameters are copied into the node */
        CK("cuGraphAddKernelNode", cu.add_kernel_node(&g->nodes[i], g->tmpl, i ? &g->nodes[i - 1] : NULL, i ? 1 : 0, &np));
    }
    g->applied = 0;
    return 0;
}

/* Recognize: the executable graph of parameter set p, instantiated on a miss; the oldest is destroyed
   when more than cache_cap are held (only "all-new" orders get there). */
static CUresult recognize(pt_graphs_t *g, int p, pt_iter *it, CUgraphExec *exec)
{
    if (g->cache[p]) {
        it->cache_hits = 1;
        *exec = g->cache[p];
        return 0;
    }
    CUgraph graph;
    CUresult r = capture(g, p, &graph);
    if (r) return r;
    it->captures = 1;
    r = cu.instantiate(&g->cache[p], graph, 0);
    cu.graph_destroy(graph);
    if (r) return fail(g, "cuGraphInstantiateWithFlags", r);
    it->instantiations = 1;
    if (g->fifo_len == g->cache_cap) {
        int old = g->fifo[g->fifo_head];
        g->fifo_head = (g->fifo_head + 1) % g->cache_cap;
        g->fifo_len--;
        CK("cuGraphExecDestroy", cu.exec_destroy(g->cache[old]));
        g->cache[old] = NULL;
        it->evictions = 1;
    }
    g->fifo[(g->fifo_head + g->fifo_len++) % g->cache_cap] = p;
    *exec = g->cache[p];
    return 0;
}

static CUresult exec_update(pt_graphs_t *g, int p, pt_iter *it)
{
    CUgraph graph;
    CUresult r = capture(g, p, &graph);
    if (r) return r;
    it->captures = 1;
    if (g->exec) {
        pt_update_info info = {0};
        r = cu.exec_update(g->exec, graph, &info);
        if (r == 0) {
            it->updates = 1;
        } else if (r == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE) {  /* re-instantiate, as the strategy says */
            it->update_failures = 1;
            r = cu.exec_destroy(g->exec);
            g->exec = NULL;
            if (r) { cu.graph_destroy(graph); return fail(g, "cuGraphExecDestroy", r); }
        } else {
            cu.graph_destroy(graph);
            return fail(g, "cuGraphExecUpdate", r);
        }
    }
    if (!g->exec) {
        r = cu.instantiate(&g->exec, graph, 0);
        if (r) { cu.graph_destroy(graph); return fail(g, "cuGraphInstantiateWithFlags", r); }
        it->instantiations = 1;
    }
    CK("cuGraphDestroy", cu.graph_destroy(graph));
    return 0;
}

static CUresult node_update(pt_graphs_t *g, int p, pt_iter *it)
{
    if (!g->exec) {
        CK("cuGraphInstantiateWithFlags", cu.instantiate(&g->exec, g->tmpl, 0));
        it->instantiations = 1;
    }
    if (p == g->applied) return 0;
    const uint64_t *now = set_of(g, g->applied), *want = set_of(g, p);
    pt_kernel_node_params np = {0};
    np.func = g->func;
    np.gridDimX = np.gridDimY = np.gridDimZ = np.blockDimX = np.blockDimY = np.blockDimZ = 1;
    np.kernelParams = g->args;
    for (int i = 0; i < g->kernels; ++i) {
        if (now[i] == want[i]) continue;  /* only the nodes whose parameters changed */
        g->arg_ns = want[i];
        CK("cuGraphExecKernelNodeSetParams", cu.exec_node_set(g->exec, g->nodes[i], &np));
        it->node_updates++;
    }
    g->applied = p;
    return 0;
}

static CUresult iteration(pt_graphs_t *g, int p, int sync, pt_iter *it)
{
    CUresult r = 0;
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    int64_t cpu0 = cpu_now_ns();
    it->t_start_ns = pt_now_ns();
    it->param_set = p;
    switch (g->strategy) {
    case PT_EAGER:
        break;
    case PT_RECAPTURE:
        if ((r = capture(g, p, &graph))) return r;
        it->captures = 1;
        r = cu.instantiate(&exec, graph, 0);
        if (r) { cu.graph_destroy(graph); return fail(g, "cuGraphInstantiateWithFlags", r); }
        it->instantiations = 1;
        break;
    case PT_EXEC_UPDATE:
        if ((r = exec_update(g, p, it))) return r;
        exec = g->exec;
        break;
    case PT_NODE_UPDATE:
        if ((r = node_update(g, p, it))) return r;
        exec = g->exec;
        break;
    case PT_RECOGNIZE:
        if ((r = recognize(g, p, it, &exec))) return r;
        break;
    }
    int64_t t_prep = pt_now_ns();
    it->prep_ns = it->cache_hits || g->strategy == PT_EAGER ? 0 : t_prep - it->t_start_ns;
    if (g->strategy == PT_EAGER) {
        if ((r = launch_all(g, p, "cuLaunchKernel"))) return r;
        it->eager_launches = g->kernels;
    } else {
        r = cu.graph_launch(exec, g->stream);
        if (r) {
            if (graph) { cu.graph_destroy(graph); cu.exec_destroy(exec); }
            return fail(g, "cuGraphLaunch", r);
        }
        it->graph_launches = 1;
    }
    int64_t t_sub = pt_now_ns();
    int64_t cpu1 = cpu_now_ns();
    if (graph) {  /* recapture: this iteration's graphs are thrown away (freed after the launch completes) */
        CK("cuGraphExecDestroy", cu.exec_destroy(exec));
        CK("cuGraphDestroy", cu.graph_destroy(graph));
    }
    if (sync) {
        CK("cuStreamSynchronize", cu.sync(g->stream));
        it->wall_ns = pt_now_ns() - it->t_start_ns;
    }
    it->submit_ns = t_sub - it->t_start_ns;
    it->cpu_ns = cpu1 - cpu0;
    return 0;
}

/* A strategy's state for `kernels` kernels per iteration and `param_sets` parameter sets (durations_ns:
   param_sets x kernels, row-major, kept alive by the caller). cache_cap bounds recognize's cache.
   Returns NULL (and the reason in err) when the driver lacks an entry point or the template fails. */
EXPORT pt_graphs_t *pt_graphs_create(int strategy, uint64_t func, uint64_t stream, int kernels, int param_sets,
                                     const uint64_t *durations_ns, int cache_cap, char *err, int errlen)
{
    if (resolve()) {
        snprintf(err, (size_t)errlen, "pt_cu|driver lacks a CUDA 12 graph entry point");
        return NULL;
    }
    if (strategy < PT_EAGER || strategy > PT_RECOGNIZE || kernels < 1 || param_sets < 1 || cache_cap < 1) {
        snprintf(err, (size_t)errlen, "pt_graphs_create|invalid arguments");
        return NULL;
    }
    pt_graphs_t *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->strategy = strategy;
    g->kernels = kernels;
    g->param_sets = param_sets;
    g->cache_cap = cache_cap;
    g->func = (CUfunction)(uintptr_t)func;
    g->stream = (CUstream)(uintptr_t)stream;
    g->durations_ns = durations_ns;
    g->args[0] = &g->arg_ns;
    g->args[1] = &g->arg_elapsed;  /* elapsed = 0: the kernel records nothing */
    if (strategy == PT_RECOGNIZE) {
        g->cache = calloc((size_t)param_sets, sizeof *g->cache);
        g->fifo = calloc((size_t)cache_cap, sizeof *g->fifo);
        if (!g->cache || !g->fifo) {
            snprintf(err, (size_t)errlen, "calloc|out of memory");
            free(g->cache); free(g->fifo); free(g);
            return NULL;
        }
    }
    if (strategy == PT_NODE_UPDATE && build_template(g)) {
        snprintf(err, (size_t)errlen, "%s", g->err);
        if (g->tmpl) cu.graph_destroy(g->tmpl);
        free(g->nodes); free(g);
        return NULL;
    }
    return g;
}

/* Runs `iterations` iterations (order: parameter set per iteration), filling out[]. sync = 1: every
   iteration ends with a stream synchronize and wall_ns is its own; sync = 0: iterations are pipelined (the
   host prepares the next while the GPU runs the last; the driver's queue blocks it when full), wall_ns
   is the time to the next iteration's start, and the last one's ends at the final synchronize.
   Returns 0, or the first failing CUresult with "call|ERROR_NAME" in err; out[] then holds the
   iterations completed before it. */
EXPORT int pt_graphs_run(pt_graphs_t *g, const int32_t *order, int iterations, int sync, pt_iter *out, char *err,
                         int errlen)
{
    memset(out, 0, (size_t)iterations * sizeof *out);
    for (int i = 0; i < iterations; ++i) {
        if (order[i] < 0 || order[i] >= g->param_sets) {
            snprintf(err, (size_t)errlen, "pt_graphs_run|parameter set out of range");
            return 1;
        }
        CUresult r = iteration(g, order[i], sync, &out[i]);
        if (r) {
            snprintf(err, (size_t)errlen, "%s", g->err);
            return r;
        }
        if (!sync && i) out[i - 1].wall_ns = out[i].t_start_ns - out[i - 1].t_start_ns;
    }
    if (!sync && iterations) {
        CUresult r = cu.sync(g->stream);
        if (r) {
            fail(g, "cuStreamSynchronize", r);
            snprintf(err, (size_t)errlen, "%s", g->err);
            return r;
        }
        out[iterations - 1].wall_ns = pt_now_ns() - out[iterations - 1].t_start_ns;
    }
    return 0;
}

/* Frees every graph the strategy holds (after a synchronize, so none is in flight). */
EXPORT int pt_graphs_destroy(pt_graphs_t *g)
{
    if (!g) return 0;
    CUresult r = cu.sync ? cu.sync(g->stream) : 0;
    if (g->cache)
        for (int p = 0; p < g->param_sets; ++p)
            if (g->cache[p]) cu.exec_destroy(g->cache[p]);
    if (g->exec) cu.exec_destroy(g->exec);
    if (g->tmpl) cu.graph_destroy(g->tmpl);
    free(g->cache); free(g->fifo); free(g->nodes); free(g);
    return r;
}

EXPORT int pt_graphs_iter_size(void) { return (int)sizeof(pt_iter); }
