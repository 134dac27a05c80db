/* What the injection library's NVTX push and pop handlers cost, called directly (no CUDA, no NVTX library, any
 * machine): ns per push+pop pair nested in an outer range, with ~150-byte names as emit_nvtx makes, best of 5
 * rounds. PRESSURE_KB > 0 touches that much of a buffer between pairs (its time left out), as a large program's
 * own work does to the caches between its edges. With ``cuda`` (a GPU machine), GPU 0's primary context is made
 * current first, so that each edge asks the driver for the current device as it does in a CUDA program (without
 * it, no driver is loaded and the library skips that call, but looks for the driver again every 10 ms with a
 * dlopen of 5-23 us: with PRESSURE_KB that adds ~200 ns to a pair's figure, so compare libraries with it, not
 * figures). Run with LD_PRELOAD=LIBRARY and PCIETRACE_COUNT=interpose, as attach loads it (the nested edges' device
 * is then kept: pt_inject_launch.c, edge_device). LIBRARY ``none``: handlers that do nothing, no library loaded;
 * with EDGE_TOTAL=1 the touching's time is counted in, so that LIBRARY's figure less ``none``'s is what the edges
 * cost the program, its own work slowed after them (its caches) included. Not a test.
 *   cc -O2 -o /tmp/edge_handler bench/edge_handler.c -ldl
 *   L=$(ls pcietrace/_pt_inject*.so); mkdir -p /tmp/tr && PCIETRACE_TRACE_DIR=/tmp/tr PCIETRACE_COUNT=interpose \
 *     LD_PRELOAD=$L /tmp/edge_handler $L PAIRS [PRESSURE_KB [cuda]] */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
typedef void (*Fp)(void);
static Fp slots[16][16];
static Fp *tables[16][16];
static int get_table(int module, Fp ***table, unsigned *size) {
    for (int i = 0; i < 16; ++i) tables[module][i] = &slots[module][i];
    *table = tables[module]; *size = 16; return 1;
}
struct cb { size_t sz; int (*get)(int, Fp ***, unsigned *); } CB = {sizeof(struct cb), get_table};
static const void *export_table(uint32_t id) { return id == 1 ? &CB : NULL; }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static volatile int sink;
static int push_none(const char *m) { sink += m[0]; return 0; }
static int pop_none(void) { return sink; }
int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s LIBRARY PAIRS [PRESSURE_KB]\n", argv[0]); return 2; }
    const char *lib = argv[1]; long n = atol(argv[2]); long kb = argc > 3 ? atol(argv[3]) : 0;
    if (n <= 0 || kb < 0) { fprintf(stderr, "PAIRS must be > 0 and PRESSURE_KB >= 0\n"); return 2; }
    if (argc > 4 && !strcmp(argv[4], "cuda")) {  /* (the driver's entry points by name: no CUDA headers needed) */
        void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
        int (*cuInit)(unsigned) = cu ? (int (*)(unsigned))dlsym(cu, "cuInit") : NULL;
        int (*get)(int *, int) = cu ? (int (*)(int *, int))dlsym(cu, "cuDeviceGet") : NULL;
        int (*retain)(void **, int) = cu ? (int (*)(void **, int))dlsym(cu, "cuDevicePrimaryCtxRetain") : NULL;
        int (*set)(void *) = cu ? (int (*)(void *))dlsym(cu, "cuCtxSetCurrent") : NULL;
        int dev = 0; void *ctx = NULL;
        if (!set || cuInit(0) || get(&dev, 0) || retain(&ctx, dev) || set(ctx)) { fprintf(stderr, "no CUDA context\n"); return 1; }
    }
    int (*push)(const char *) = push_none, (*pop)(void) = pop_none;
    if (strcmp(lib, "none")) {
        void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
        if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
        int (*init)(const void *(*)(uint32_t)) = (int (*)(const void *(*)(uint32_t)))dlsym(h, "InitializeInjectionNvtx2");
        init(export_table);
        /* (NVTX's core module, 1: RangePushA is its 9th entry, RangePop its 11th) */
        push = (int (*)(const char *))slots[1][9];
        pop = (int (*)(void))slots[1][11];
    }
    const char *total = getenv("EDGE_TOTAL");
    int counted_in = total && !strcmp(total, "1");
    char names[64][160];
    for (int i = 0; i < 64; ++i) snprintf(names[i], sizeof names[i], "aten::linear, seq = %d, op_id = %d, sizes = [[4, 256], [1024, 256], [1024]], input_op_ids = [(%d,0), (0,-1), (0,-1)]", 1000 + i, 6000 + i, 5990 + i);
    volatile char *buf = kb ? malloc(kb * 1024) : NULL;
    push("outer");
    double best = 1e9;
    for (int r = 0; r < 5; ++r) {
        double t0 = now(), pressure = 0;
        for (long i = 0; i < n; ++i) {
            push(names[i & 63]);
            pop();
            if (kb) { double a = now(); for (long j = 0; j < kb * 1024; j += 64) buf[j]++; pressure += now() - a; }
        }
        double ns = ((now() - t0) - (counted_in ? 0 : pressure)) / n * 1e9;
        if (ns < best) best = ns;
    }
    pop();
    printf("%.1f ns per push+pop pair%s (best of 5 rounds of %ld)\n", best, counted_in ? " and its work" : "", n);
    return 0;
}
