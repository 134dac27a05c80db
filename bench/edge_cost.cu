// Probe (GPU machine; not a test): what one NVTX range edge costs the program under attach. Times
// nvtxDomainRangePushEx and nvtxDomainRangePop one by one (CLOCK_MONOTONIC), each pair followed by ~0.3 ms of
// host spinning (the samplers go back to waiting between edges, as they do between a real program's ranges);
// prints the median and P90 ns per push and per pop. Run it plain, with only the injection library, and under
// attach (the library wakes the samplers at every edge: a shared futex). It loads the CUDA driver first
// (dlopen of libcuda.so.1, as any CUDA program has by its first range), unless its second argument is "nocuda":
// With a third argument "dense" it times emit_nvtx's pattern instead: PAIRS nested push/pop pairs back to back
// inside one outer range, each with a name of its own (~120 bytes, as PyTorch's ops with record_shapes), and
// prints the mean ns per pair (the name's formatting included: run it plain to subtract).
//   nvcc -O2 -o /tmp/edge bench/edge_cost.cu -ldl && /tmp/edge [PAIRS [nocuda|cuda [dense]]]
//   python3 -m pcietrace attach --no-calibrate -- /tmp/edge
#include <nvtx3/nvToolsExt.h>
#include <algorithm>
#include <cstring>
#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>
#include <time.h>
#include <vector>

static long long now_ns() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000LL + t.tv_nsec; }

int main(int argc, char** argv) {
    const int n = argc > 1 ? std::atoi(argv[1]) : 3000;
    if (n < 10) { std::fprintf(stderr, "PAIRS must be >= 10\n"); return 2; }
    if (!(argc > 2 && !std::strcmp(argv[2], "nocuda")) && !dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL)) {
        std::fprintf(stderr, "no libcuda.so.1: %s\n", dlerror()); return 1;
    }
    if (argc > 3 && !std::strcmp(argv[3], "dense")) {
        char name[256];
        nvtxRangePushA("outer");
        long long t0 = now_ns();
        for (int i = 0; i < n; ++i) {
            std::snprintf(name, sizeof name, "aten::linear, seq = %d, op_id = %d, sizes = [[4, 256], [1024, 256], "
                          "[1024]], input_op_ids = [(%d,0), (0,-1), (0,-1)]", i, i + 7, i + 3);
            nvtxRangePushA(name);
            nvtxRangePop();
        }
        long long t1 = now_ns();
        nvtxRangePop();
        std::printf("dense ns per push+pop pair: mean %.0f\n", (double)(t1 - t0) / n);
        return 0;
    }
    nvtxDomainHandle_t dom = nvtxDomainCreateA("edge");
    nvtxEventAttributes_t a = {}; a.version = NVTX_VERSION; a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII; a.message.ascii = "edge";
    std::vector<long long> push(n), pop(n);
    for (int i = 0; i < n; ++i) {
        long long t0 = now_ns(); nvtxDomainRangePushEx(dom, &a);
        long long t1 = now_ns(); nvtxDomainRangePop(dom);
        long long t2 = now_ns();
        push[i] = t1 - t0; pop[i] = t2 - t1;
        while (now_ns() - t2 < 300000) {}
    }
    for (auto* v : {&push, &pop}) {
        std::sort(v->begin() + n / 10, v->end());  // the first tenth is the warm-up: left out
        const long long* s = v->data() + n / 10; size_t m = n - n / 10;
        std::printf("%s ns per call: median %lld, P90 %lld, max %lld\n", v == &push ? "push" : "pop ", s[m / 2], s[m * 9 / 10], s[m - 1]);
    }
    return 0;
}
