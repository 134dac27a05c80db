// C++ oracle for the GPU time per empty eager kernel (bench/eager_gpu_truth.py): what one CUDA C++ program,
// in its own process and primary context, measures as a GPU runs queued empty kernels back to back.
//   nvcc -O2 -o eager_gpu_oracle bench/eager_gpu_oracle.cu -lcuda
//   eager_gpu_oracle [bursts=5] [burst_calls=900]
// Per burst: a 20 ms blocker kernel, then `burst_calls` launches of an empty spin kernel, with CUDA events
// recorded after the blocker and after the last launch; GPU us per kernel = elapsed / burst_calls. Prints
// "eager_gpu_us <median over bursts>" and "saturated <bursts whose blocker outlasted the launch loop>".
// A failing driver call is named on stderr and its CUresult is the exit code (oracle_spin.cuh: CK).
#include <cuda.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "oracle_spin.cuh"  // pt_spin, CK

int main(int argc, char** argv)
{
    int bursts = argc > 1 ? std::atoi(argv[1]) : 5;
    int calls = argc > 2 ? std::atoi(argv[2]) : 900;
    CK(cuInit(0));
    CUdevice dev; CK(cuDeviceGet(&dev, 0));
    CUcontext ctx; CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
    CUstream s; CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUfunction f;
    if (cudaSetDevice(0) != cudaSuccess || cudaGetFuncBySymbol((cudaFunction_t*)&f, (const void*)pt_spin) != cudaSuccess) {
        std::fprintf(stderr, "oracle: cudaGetFuncBySymbol failed\n");
        return 1;
    }
    CK(cuCtxSetCurrent(ctx));
    unsigned long long ns = 0, blocker_ns = 20000000ULL;
    unsigned long long* no_out = nullptr;
    void* params[] = {&ns, &no_out};
    void* blocker_params[] = {&blocker_ns, &no_out};
    for (int i = 0; i < 100; ++i) CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr));  // warm up
    CK(cuStreamSynchronize(s));
    CUevent a, b; CK(cuEventCreate(&a, CU_EVENT_DEFAULT)); CK(cuEventCreate(&b, CU_EVENT_DEFAULT));
    std::vector<double> us;
    int saturated = 0;
    for (int k = 0; k < bursts; ++k) {
        CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, blocker_params, nullptr));
        CK(cuEventRecord(a, s));
        for (int i = 0; i < calls; ++i) CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr));
        saturated += cuEventQuery(a) == CUDA_ERROR_NOT_READY;
        CK(cuEventRecord(b, s));
        CK(cuEventSynchronize(b));
        float ms; CK(cuEventElapsedTime(&ms, a, b));
        us.push_back(ms * 1e3 / calls);
    }
    std::sort(us.begin(), us.end());
    size_t n = us.size();
    std::printf("eager_gpu_us %.4f\nsaturated %d\n", n % 2 ? us[n / 2] : 0.5 * (us[n / 2 - 1] + us[n / 2]), saturated);
    CK(cuEventDestroy(a)); CK(cuEventDestroy(b)); CK(cuStreamDestroy(s)); CK(cuDevicePrimaryCtxRelease(dev));
    return 0;
}
