// The C++ twin of truth_app.py: NVTX3 ranges of known traffic, each measured by the app itself through NVML
// (read right after the push and right before the pop), written as JSON lines to $TRUTH_OUT.
// Build: nvcc -O2 -o truth_app tests/apps/truth_app.cu -ldl      Run: ./truth_app [reps]
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nvtx3/nvToolsExt.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <unistd.h>

__global__ void k() {}

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); std::exit(1); } } while (0)

// NVML by dlopen (no header needed): nvmlFieldValue_t is fieldId, scopeId, timestamp, latencyUsec,
// valueType, nvmlReturn, value (8 bytes).
struct Field { unsigned fieldId, scopeId; long long ts, lat; int type, ret; unsigned long long value; };
static int (*fields)(void*, int, Field*);
static void* gpu;
static unsigned gpu_index;
static FILE* out;
static const size_t MiB = 1 << 20;

static long long now_ns() {
    timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000LL + t.tv_nsec;
}
static void read(unsigned* tx, unsigned* rx) {
    Field f[2] = {}; f[0].fieldId = 197; f[1].fieldId = 198;
    if (fields(gpu, 2, f) || f[0].ret || f[1].ret) { std::fprintf(stderr, "NVML read failed\n"); std::exit(1); }
    *tx = (unsigned)f[0].value; *rx = (unsigned)f[1].value;
}
static bool reads_on = true;  // TRUTH_READS=0: the same work without the truth's own reads (overhead runs)
// TRUTH_READS=outside: the reads sit outside the range, 6 ms (over attach's 5 ms idle sampling interval) before
// its push and after its pop; a range "gap_ref" with no work is read the same way (as in truth_app.py)
static bool reads_outside = false;
template <class F> static void range(const char* name, F fn) {
    nvtxDomainHandle_t dom = nvtxDomainCreateA("truth");
    nvtxEventAttributes_t a = {}; a.version = NVTX_VERSION; a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII; a.message.ascii = name;
    unsigned tx0, rx0, tx1, rx1;
    long long t0 = 0, t1 = 0;
    if (reads_outside) {
        t0 = now_ns(); read(&tx0, &rx0);
        std::this_thread::sleep_for(std::chrono::milliseconds(6));
    }
    nvtxDomainRangePushEx(dom, &a);
    if (!reads_on) {  // no reads: the range's duration alone (bench/attach_overhead_matrix.py), as truth_app.py writes it
        long long s0 = now_ns(); fn(); long long s1 = now_ns(); nvtxDomainRangePop(dom);
        std::fprintf(out, "{\"pid\": %d, \"rank\": 0, \"nvml_index\": %u, \"range\": \"%s\", \"dur_ns\": %lld, \"h2d\": null, \"d2h\": null}\n",
                     (int)getpid(), gpu_index, name, s1 - s0);
        return;
    }
    if (!reads_outside) { t0 = now_ns(); read(&tx0, &rx0); }
    fn();
    if (!reads_outside) { read(&tx1, &rx1); t1 = now_ns(); }
    nvtxDomainRangePop(dom);
    if (reads_outside) {
        std::this_thread::sleep_for(std::chrono::milliseconds(6));
        read(&tx1, &rx1); t1 = now_ns();
    }
    std::fprintf(out, "{\"pid\": %d, \"rank\": 0, \"nvml_index\": %u, \"range\": \"%s\", \"dur_ns\": %lld, \"h2d\": %u, \"d2h\": %u, \"reads\": \"%s\"}\n",
                 (int)getpid(), gpu_index, name, t1 - t0, rx1 - rx0, tx1 - tx0, reads_outside ? "outside" : "inside");
}

int main(int argc, char** argv) {
    int reps = argc > 1 ? std::atoi(argv[1]) : 5;
    const char* reads = std::getenv("TRUTH_READS");
    reads_on = !(reads && !std::strcmp(reads, "0"));
    reads_outside = reads && !std::strcmp(reads, "outside");
    void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    auto init = (int (*)())dlsym(nvml, "nvmlInit_v2");
    auto by_bus = (int (*)(const char*, void**))dlsym(nvml, "nvmlDeviceGetHandleByPciBusId_v2");
    auto index_of = (int (*)(void*, unsigned*))dlsym(nvml, "nvmlDeviceGetIndex");
    fields = (int (*)(void*, int, Field*))dlsym(nvml, "nvmlDeviceGetFieldValues");
    char bus[32];
    CK(cudaSetDevice(0)); CK(cudaDeviceGetPCIBusId(bus, sizeof bus, 0));
    if (!init || init() || by_bus(bus, &gpu) || index_of(gpu, &gpu_index)) { std::fprintf(stderr, "NVML unavailable\n"); return 1; }
    const char* path = std::getenv("TRUTH_OUT");
    out = std::fopen(path ? path : "truth.jsonl", "a");
    cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    char *host, *dev; CK(cudaMallocHost(&host, 256 * MiB)); CK(cudaMalloc(&dev, 256 * MiB));
    auto eager = [&] { for (int i = 0; i < 3000; ++i) k<<<1, 1, 0, s>>>(); CK(cudaStreamSynchronize(s)); };
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < 1000; ++i) k<<<1, 1, 0, s>>>();
    CK(cudaStreamEndCapture(s, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
    auto graph = [&] { CK(cudaGraphLaunch(ge, s)); CK(cudaStreamSynchronize(s)); };
    auto copy = [&](size_t n, cudaMemcpyKind kind) {
        CK(kind == cudaMemcpyHostToDevice ? cudaMemcpyAsync(dev, host, n, kind, s) : cudaMemcpyAsync(host, dev, n, kind, s));
        CK(cudaStreamSynchronize(s));
    };
    eager(); graph(); copy(256 * MiB, cudaMemcpyHostToDevice); copy(64 * MiB, cudaMemcpyDeviceToHost);  // warm
    long long t0 = now_ns();
    for (int r = 0; r < reps; ++r) {
        if (reads_outside) range("gap_ref", [] {});
        range("idle_20ms", [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
        range("eager_3000", eager);
        range("h2d_64MiB", [&] { copy(64 * MiB, cudaMemcpyHostToDevice); });
        range("h2d_256MiB", [&] { copy(256 * MiB, cudaMemcpyHostToDevice); });
        range("d2h_64MiB", [&] { copy(64 * MiB, cudaMemcpyDeviceToHost); });
        range("graph", graph);
    }
    std::fprintf(out, "{\"pid\": %d, \"rank\": 0, \"wall_ns\": %lld}\n", (int)getpid(), now_ns() - t0);
    std::fclose(out);
    return 0;
}
