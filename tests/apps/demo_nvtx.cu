// Demo application for `pcietrace attach` (it does not use pcietrace): NVTX3 ranges of known traffic,
// the C++ twin of demo_nvtx.py. Build: nvcc -O2 -o demo_nvtx tests/apps/demo_nvtx.cu -ldl
// Usage: demo_nvtx [--graphed] [N] [K] [COPY_MIB] [EXIT_CODE]
// --graphed: the same work and ranges, but the N kernels of eager_launches are captured into a graph beforehand
// (outside every range) and the range launches it once (see demo_nvtx.py).
#include <nvtx3/nvToolsExt.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

__global__ void empty() {}

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

static nvtxDomainHandle_t dom;
static void push(const char* m)
{
    nvtxEventAttributes_t a = {};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = m;
    nvtxDomainRangePushEx(dom, &a);
}
static void pop() { nvtxDomainRangePop(dom); }

static int capture(cudaStream_t s, int kernels, cudaGraphExec_t* exe)
{
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < kernels; ++i) empty<<<1, 1, 0, s>>>();
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(exe, g, 0));
    CK(cudaGraphUpload(*exe, s));
    return 0;
}

int main(int argc, char** argv)
{
    bool graphed = argc > 1 && std::strcmp(argv[1], "--graphed") == 0;
    if (graphed) { --argc; ++argv; }
    int n = argc > 1 ? std::atoi(argv[1]) : 20000;
    int k = argc > 2 ? std::atoi(argv[2]) : 1000;
    size_t bytes = (size_t)(argc > 3 ? std::atoi(argv[3]) : 1024) << 20;
    int exit_code = argc > 4 ? std::atoi(argv[4]) : 0;
    dom = nvtxDomainCreateA("demo_cpp");
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraphExec_t ge, eager_ge = nullptr;
    if (capture(s, k, &ge) || (graphed && capture(s, n, &eager_ge))) return 1;
    void *host, *dev;
    CK(cudaMallocHost(&host, bytes));
    CK(cudaMalloc(&dev, bytes));
    empty<<<1, 1, 0, s>>>();
    CK(cudaStreamSynchronize(s));
    // the set-up's own traffic (pinning the copy's buffer writes GPU page tables) must not share a counter
    // sample with the first range either: no range is open, so samples come every 5 ms (idle sampling)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));

    auto t0 = std::chrono::steady_clock::now();
    nvtxRangePushA("demo_app");  // core API, default domain
    push("eager_launches");
    auto te = std::chrono::steady_clock::now();
    if (graphed) CK(cudaGraphLaunch(eager_ge, s));
    else for (int i = 0; i < n; ++i) empty<<<1, 1, 0, s>>>();
    CK(cudaStreamSynchronize(s));
    double eager_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - te).count();
    pop();
    const auto gap = std::chrono::milliseconds(5);  // quiet time between phases (see demo_nvtx.py)
    std::this_thread::sleep_for(gap);
    push("graph_launch");
    CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    pop();
    std::this_thread::sleep_for(gap);
    push("h2d_copy");
    CK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s));
    CK(cudaStreamSynchronize(s));
    pop();
    std::this_thread::sleep_for(gap);
    push("idle");
    std::thread worker([] { push("worker_thread"); std::this_thread::sleep_for(std::chrono::milliseconds(50)); pop(); });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    worker.join();
    pop();
    nvtxRangePop();
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("{\"app\": \"cpp\", \"graphed\": %s, \"workload_s\": %.6f, \"eager_s\": %.6f, \"eager_launches\": %d, \"graph_nodes\": %d, "
                "\"copy_bytes\": %zu}\n", graphed ? "true" : "false", secs, eager_s, n, k, bytes);
    return exit_code;
}
