// A program that calls the CUDA driver's launch entry points directly, linked against libcuda (-lcuda), as
// driver-API programs and CuPy do: no dlsym, no cuGetProcAddress on the launch path. attach's GPU test counts
// its launches per NVTX range against what it made.
//
//     nvcc -O2 -o driver_api_app tests/apps/driver_api_app.cu -lcuda [N]
//
// Ranges (default domain, nvtxRangePushA): `direct_launch` N cuLaunchKernel, `direct_ex` N cuLaunchKernelEx,
// `direct_cooperative` N cuLaunchCooperativeKernel, `direct_graph` N cuGraphLaunch of a 1-kernel graph (N = argv[1],
// default 200), each followed by cuStreamSynchronize inside the range. Any failure: one line, exit 1.
#include <cuda.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <cstdio>
#include <cstdlib>

extern "C" __global__ void empty_kernel() {}

#define CHECK(call)                                                                     \
    do {                                                                                \
        CUresult r_ = (call);                                                           \
        if (r_ != CUDA_SUCCESS) {                                                       \
            const char *n_ = "?";                                                       \
            cuGetErrorName(r_, &n_);                                                    \
            std::fprintf(stderr, "driver_api_app: %s failed: %s\n", #call, n_);         \
            std::exit(1);                                                               \
        }                                                                               \
    } while (0)

int main(int argc, char **argv)
{
    const int n = argc > 1 ? std::atoi(argv[1]) : 200;
    if (n < 1) { std::fprintf(stderr, "driver_api_app: N must be >= 1\n"); return 1; }
    cudaFunction_t rf;
    if (cudaGetFuncBySymbol(&rf, (const void *)empty_kernel) != cudaSuccess) {  // also makes the primary context current
        std::fprintf(stderr, "driver_api_app: cudaGetFuncBySymbol failed\n");
        return 1;
    }
    CUfunction f = (CUfunction)rf;
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUlaunchConfig cfg = {};
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = 32; cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.hStream = s;
    CUgraph g;
    CUgraphExec ge;
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, nullptr, nullptr));  // captured outside every range
    CHECK(cuStreamEndCapture(s, &g));
    CHECK(cuGraphInstantiate(&ge, g, 0));
    CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, nullptr, nullptr));  // warm-up, outside every range
    CHECK(cuStreamSynchronize(s));

    nvtxRangePushA("direct_launch");
    for (int i = 0; i < n; ++i) CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, nullptr, nullptr));
    CHECK(cuStreamSynchronize(s));
    nvtxRangePop();
    nvtxRangePushA("direct_ex");
    for (int i = 0; i < n; ++i) CHECK(cuLaunchKernelEx(&cfg, f, nullptr, nullptr));
    CHECK(cuStreamSynchronize(s));
    nvtxRangePop();
    nvtxRangePushA("direct_cooperative");
    for (int i = 0; i < n; ++i) CHECK(cuLaunchCooperativeKernel(f, 1, 1, 1, 32, 1, 1, 0, s, nullptr));
    CHECK(cuStreamSynchronize(s));
    nvtxRangePop();
    nvtxRangePushA("direct_graph");
    for (int i = 0; i < n; ++i) CHECK(cuGraphLaunch(ge, s));
    CHECK(cuStreamSynchronize(s));
    nvtxRangePop();

    CHECK(cuGraphExecDestroy(ge));
    CHECK(cuGraphDestroy(g));
    CHECK(cuStreamDestroy(s));
    return 0;
}
