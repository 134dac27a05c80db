/*
 * A FAKE libcuda.so.1 for testing pcietrace/native/pt_graphs.c without a GPU: just the entry points that
 * file asks cuGetProcAddress_v2 for, with the CUDA 12 ABI. Kernels do not run; each "executed" kernel's
 * first argument (pt_spin's duration) is appended to a log, so a test can check that every iteration ran
 * exactly the parameter set it asked for, and live graph objects are counted, so it can check for leaks.
 * FAKE_CUDA_FAIL="cuGraphInstantiateWithFlags:3" makes the 3rd call of that entry point fail with 999.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef struct { int n, cap; uint64_t *ns; } fgraph;
typedef struct { fgraph *g; int idx; } fnode;
typedef struct { int n; uint64_t *ns; } fexec;
typedef struct {
    void *func;
    unsigned gx, gy, gz, bx, by, bz, shmem;
    void **kernelParams, **extra;
    void *kern, *ctx;
} params_v2;
typedef struct { int result; void *errorNode, *errorFromNode; } update_info;

static fgraph *capturing;
static uint64_t log_[1 << 22];
static long nlog;
static long live_graphs, live_execs, calls_instantiate, calls_update, calls_node_set, calls_capture;

static int should_fail(const char *name)
{
    static char fname[128];
    static int at = -1, count;
    if (at < 0) {
        const char *s = getenv("FAKE_CUDA_FAIL");
        const char *c = s ? strchr(s, ':') : NULL;
        at = c ? atoi(c + 1) : 0;
        if (c) memcpy(fname, s, (size_t)(c - s) < sizeof fname - 1 ? (size_t)(c - s) : sizeof fname - 1);
    }
    return at > 0 && !strcmp(name, fname) && ++count == at;
}

static void append(fgraph *g, uint64_t v)
{
    if (g->n == g->cap) {
        g->cap = g->cap ? 2 * g->cap : 64;
        g->ns = realloc(g->ns, (size_t)g->cap * sizeof *g->ns);
    }
    g->ns[g->n++] = v;
}

static void record(uint64_t v) { if (nlog < (long)(sizeof log_ / sizeof *log_)) log_[nlog++] = v; }

static CUresult launch(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned sh, void *stream, void **params, void **extra)
{
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)sh; (void)stream; (void)extra;
    if (should_fail("cuLaunchKernel")) return 999;
    uint64_t v = *(uint64_t *)params[0];
    if (capturing) append(capturing, v);
    else record(v);
    return 0;
}
static CUresult sync_(void *s) { (void)s; return 0; }
static CUresult begin(void *s, int mode)
{
    (void)s;
    if (mode != 1 || capturing) return 900;  /* thread-local capture expected, none in progress */
    capturing = calloc(1, sizeof *capturing);
    live_graphs++;
    calls_capture++;
    return 0;
}
static CUresult end(void *s, fgraph **out) { (void)s; *out = capturing; capturing = NULL; return *out ? 0 : 901; }
static CUresult instantiate(fexec **out, fgraph *g, unsigned long long flags)
{
    (void)flags;
    if (should_fail("cuGraphInstantiateWithFlags")) return 999;
    fexec *e = calloc(1, sizeof *e);
    e->n = g->n;
    e->ns = malloc((size_t)g->n * sizeof *e->ns);
    memcpy(e->ns, g->ns, (size_t)g->n * sizeof *e->ns);
    *out = e;
    live_execs++;
    calls_instantiate++;
    return 0;
}
static CUresult glaunch(fexec *e, void *s) { (void)s; for (int i = 0; i < e->n; ++i) record(e->ns[i]); return 0; }
static CUresult gdestroy(fgraph *g) { free(g->ns); free(g); live_graphs--; return 0; }
static CUresult edestroy(fexec *e) { free(e->ns); free(e); live_execs--; return 0; }
static CUresult update(fexec *e, fgraph *g, update_info *info)
{
    calls_update++;
    if (should_fail("cuGraphExecUpdate") || e->n != g->n) { info->result = 2; return 910; }
    memcpy(e->ns, g->ns, (size_t)g->n * sizeof *e->ns);
    info->result = 0;
    return 0;
}
static CUresult gcreate(fgraph **g, unsigned flags) { (void)flags; *g = calloc(1, sizeof **g); live_graphs++; return 0; }
static CUresult add_node(fnode **node, fgraph *g, fnode **deps, size_t ndeps, const params_v2 *p)
{
    if (ndeps != (g->n ? 1u : 0u) || (ndeps && deps[0]->idx != g->n - 1)) return 902;  /* a chain, in order */
    if (!p->func || p->kern || p->gx != 1 || p->bx != 1) return 903;
    append(g, *(uint64_t *)p->kernelParams[0]);
    *node = malloc(sizeof **node);
    (*node)->g = g;
    (*node)->idx = g->n - 1;
    return 0;
}
static CUresult node_set(fexec *e, fnode *node, const params_v2 *p)
{
    calls_node_set++;
    if (node->idx >= e->n || !p->func || p->kern) return 904;
    e->ns[node->idx] = *(uint64_t *)p->kernelParams[0];
    return 0;
}
static CUresult error_name(CUresult r, const char **s) { *s = r == 999 ? "FAKE_INJECTED_ERROR" : "FAKE_ERROR"; return 0; }

CUresult cuGetProcAddress_v2(const char *name, void **fn, int version, unsigned long long flags, int *status)
{
    (void)flags;
    static const struct { const char *name; void *fn; } table[] = {
        {"cuLaunchKernel", (void *)launch}, {"cuStreamSynchronize", (void *)sync_},
        {"cuStreamBeginCapture", (void *)begin}, {"cuStreamEndCapture", (void *)end},
        {"cuGraphInstantiateWithFlags", (void *)instantiate}, {"cuGraphLaunch", (void *)glaunch},
        {"cuGraphDestroy", (void *)gdestroy}, {"cuGraphExecDestroy", (void *)edestroy},
        {"cuGraphExecUpdate", (void *)update}, {"cuGraphCreate", (void *)gcreate},
        {"cuGraphAddKernelNode", (void *)add_node}, {"cuGraphExecKernelNodeSetParams", (void *)node_set},
        {"cuGetErrorName", (void *)error_name},
    };
    if (version < 12000) return 1;  /* the _v2 ABIs above are what CUDA 12 hands out */
    for (size_t i = 0; i < sizeof table / sizeof *table; ++i)
        if (!strcmp(name, table[i].name)) { *fn = table[i].fn; if (status) *status = 0; return 0; }
    *fn = NULL;
    return 500;
}

/* For the test: the executed-kernel log and the counters. */
long fake_log(uint64_t *out, long cap) { long n = nlog < cap ? nlog : cap; memcpy(out, log_, (size_t)n * 8); nlog = 0; return n; }
long fake_live_graphs(void) { return live_graphs; }
long fake_live_execs(void) { return live_execs; }
long fake_calls(int which)
{
    long v[] = {calls_capture, calls_instantiate, calls_update, calls_node_set};
    return which >= 0 && which < 4 ? v[which] : -1;
}
