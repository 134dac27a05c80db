// Native baseline for bench/launch_rate.py: the same spin kernel launched with cuLaunchKernel and a
// prebuilt parameter array, as fast as C++ can. Prints launches per second.
// Build: nvcc -O2 -o native_launch bench/native_launch.cu -lcuda
#include <cuda.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>

extern "C" __global__ void pt_spin(unsigned long long ns, unsigned long long* elapsed)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    t = t0;
    while (t - t0 < ns) { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); }
    if (elapsed != 0 && threadIdx.x == 0) { *elapsed = t - t0; }
}

#define CK(x) do { CUresult e = (x); if (e != CUDA_SUCCESS) { const char* s; cuGetErrorName(e, &s); \
    std::fprintf(stderr, "%s failed: %s\n", #x, s); std::exit(1); } } while (0)

int main(int argc, char** argv)
{
    long n = argc > 1 ? std::atol(argv[1]) : 200000;
    int reps = argc > 2 ? std::atoi(argv[2]) : 3;
    CK(cuInit(0));
    CUdevice dev; CK(cuDeviceGet(&dev, 0));
    CUcontext ctx; CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
    CUstream s; CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUfunction f;
    if (cudaGetFuncBySymbol((cudaFunction_t*)&f, (const void*)pt_spin) != cudaSuccess) { std::fprintf(stderr, "cudaGetFuncBySymbol failed\n"); return 1; }
    unsigned long long ns = 0; unsigned long long* out = nullptr;
    void* params[] = {&ns, &out};
    for (int i = 0; i < 1000; ++i) CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr));
    CK(cuStreamSynchronize(s));
    for (int r = 0; r < reps; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        for (long i = 0; i < n; ++i) {
            if (cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr) != CUDA_SUCCESS) { std::fprintf(stderr, "launch failed\n"); return 1; }
        }
        auto t1 = std::chrono::steady_clock::now();
        CK(cuStreamSynchronize(s));
        double sec = std::chrono::duration<double>(t1 - t0).count();
        std::printf("native_launches_per_s %.0f\n", n / sec);
    }
    return 0;
}
