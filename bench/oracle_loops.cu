// C++ oracle for bench/native_core.py: the loops pcietrace's native core runs (pcietrace/native/pt_loops.c),
// written the plain way a CUDA C++ program would, on the same spin kernel, stream kind and sizes.
// Prints one "figure value" line per measurement (medians over repeats, where repeated).
// Build: nvcc -O2 -o oracle_loops bench/oracle_loops.cu -lcuda
// Usage: oracle_loops [launches_for_rate=200000] [repeats=201] [bursts=15] [burst_calls=900]
#include <cuda.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

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

static long long now_ns()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char** argv)
{
    long n_rate = argc > 1 ? std::atol(argv[1]) : 200000;
    int repeats = argc > 2 ? std::atoi(argv[2]) : 201;
    int bursts = argc > 3 ? std::atoi(argv[3]) : 15;
    int burst_calls = argc > 4 ? std::atoi(argv[4]) : 900;
    CK(cuInit(0));
    CUdevice dev; CK(cuDeviceGet(&dev, 0));
    CUcontext ctx; CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
    CUstream s; CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUfunction f;
    if (cudaGetFuncBySymbol((cudaFunction_t*)&f, (const void*)pt_spin) != cudaSuccess) {
        std::fprintf(stderr, "cudaGetFuncBySymbol failed\n");
        return 1;
    }
    CK(cuCtxSetCurrent(ctx));
    unsigned long long ns = 0, blocker_ns = 20000000ULL; unsigned long long* out = nullptr;
    void* params[] = {&ns, &out};
    void* blocker_params[] = {&blocker_ns, &out};
    auto launch = [&]() { return cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr); };
    for (int i = 0; i < 1000; ++i) CK(launch());
    CK(cuStreamSynchronize(s));

    // 1. eager launch rate: as fast as C++ can call cuLaunchKernel (three runs, the median).
    std::vector<double> rates;
    for (int r = 0; r < 3; ++r) {
        long long t0 = now_ns();
        for (long i = 0; i < n_rate; ++i) if (launch() != CUDA_SUCCESS) { std::fprintf(stderr, "launch failed\n"); return 1; }
        long long t1 = now_ns();
        CK(cuStreamSynchronize(s));
        rates.push_back(n_rate / ((t1 - t0) / 1e9));
    }
    std::printf("eager_launches_per_s %.1f\n", median(rates));

    // 2. host cost per launch: calls queued behind a 20 ms blocker (the queue never fills).
    std::vector<double> host;
    for (int b = 0; b < bursts; ++b) {
        CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, blocker_params, nullptr));
        long long t0 = now_ns();
        for (int i = 0; i < burst_calls; ++i) CK(launch());
        long long t1 = now_ns();
        CK(cuStreamSynchronize(s));
        host.push_back((t1 - t0) / 1e3 / burst_calls);
    }
    std::printf("host_us_per_launch %.4f\n", median(host));

    // 3. launch + synchronize, eager and a graph of one kernel.
    CUgraph g; CUgraphExec exe;
    CK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    CK(launch());
    CK(cuStreamEndCapture(s, &g));
    CK(cuGraphInstantiate(&exe, g, 0));
    CK(cuGraphUpload(exe, s));
    CK(cuStreamSynchronize(s));
    std::vector<double> eager, graph;
    for (int i = 0; i < repeats + 2; ++i) {
        long long t0 = now_ns();
        CK(launch());
        CK(cuStreamSynchronize(s));
        if (i >= 2) eager.push_back((now_ns() - t0) / 1e3);
    }
    for (int i = 0; i < repeats + 2; ++i) {
        long long t0 = now_ns();
        CK(cuGraphLaunch(exe, s));
        CK(cuStreamSynchronize(s));
        if (i >= 2) graph.push_back((now_ns() - t0) / 1e3);
    }
    std::printf("launch_sync_eager_us %.4f\n", median(eager));
    std::printf("launch_sync_graph1_us %.4f\n", median(graph));

    // 4. 4-byte copies + synchronize between pinned host memory and the device.
    void* hbuf; CUdeviceptr dbuf;
    CK(cuMemHostAlloc(&hbuf, 64, 0));
    CK(cuMemAlloc(&dbuf, 64));
    std::vector<double> h2d, d2h;
    for (int i = 0; i < repeats + 2; ++i) {
        long long t0 = now_ns();
        CK(cuMemcpyHtoDAsync(dbuf, hbuf, 4, s));
        CK(cuStreamSynchronize(s));
        if (i >= 2) h2d.push_back((now_ns() - t0) / 1e3);
    }
    for (int i = 0; i < repeats + 2; ++i) {
        long long t0 = now_ns();
        CK(cuMemcpyDtoHAsync(hbuf, dbuf, 4, s));
        CK(cuStreamSynchronize(s));
        if (i >= 2) d2h.push_back((now_ns() - t0) / 1e3);
    }
    std::printf("copy_h2d_4B_us %.4f\n", median(h2d));
    std::printf("copy_d2h_4B_us %.4f\n", median(d2h));
    CK(cuMemFreeHost(hbuf));
    CK(cuMemFree(dbuf));
    CK(cuGraphExecDestroy(exe));
    CK(cuGraphDestroy(g));
    return 0;
}
