// C++ oracle for bench/native_core.py: the loops pcietrace's native core runs (pcietrace/native/pt_loops.c),
// written the plain way a CUDA C++ program would, on the same spin kernel, stream kind and sizes.
//
// Two builds of this one file:
//  - a program (separate-process mode), printing one "figure value" line per measurement (medians over repeats):
//      nvcc -O2 -o oracle_loops bench/oracle_loops.cu -lcuda
//      oracle_loops [launches_for_rate=200000] [repeats=201] [bursts=15] [burst_calls=900]
//  - a shared library (in-process mode) loaded with ctypes next to pcietrace's own loops, on the same primary
//    context; the extern "C" oracle_* functions below run one chunk of one loop each:
//      nvcc -O2 -shared -Xcompiler -fPIC -DORACLE_LIBRARY -o liboracle.so bench/oracle_loops.cu -lcuda
// The oracle owns its stream, buffers, kernel (from this file, via cudaGetFuncBySymbol) and graph, as a C++
// program would. Every function returns 0 or the failing CUresult (-1: cudaGetFuncBySymbol failed; -2: not
// initialised), with the failing call named on stderr.
#include <cuda.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

#include "oracle_spin.cuh"  // pt_spin, CK

static long long now_ns()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// What the oracle owns: its stream, the spin kernel with an empty duration and a 20 ms blocker's, the graph
// of one kernel, and a pinned / device buffer pair for the copies.
static CUstream s;
static CUfunction f;
static unsigned long long ns = 0, blocker_ns = 20000000ULL;
static unsigned long long* no_out = nullptr;
static void* params[] = {&ns, &no_out};
static void* blocker_params[] = {&blocker_ns, &no_out};
static CUgraph g;
static CUgraphExec exe;
static void* hbuf;
static CUdeviceptr dbuf;
static bool ready = false;

static CUresult launch() { return cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr); }

extern "C" {

// Set up on GPU `ordinal`'s primary context (made current on the calling thread) and warm up (1000 launches).
int oracle_init(int ordinal)
{
    CK(cuInit(0));
    CUdevice dev; CK(cuDeviceGet(&dev, ordinal));
    CUcontext ctx; CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    if (cudaSetDevice(ordinal) != cudaSuccess ||
        cudaGetFuncBySymbol((cudaFunction_t*)&f, (const void*)pt_spin) != cudaSuccess) {
        std::fprintf(stderr, "oracle: cudaGetFuncBySymbol failed\n");
        return -1;
    }
    CK(cuCtxSetCurrent(ctx));
    for (int i = 0; i < 1000; ++i) CK(launch());
    CK(cuStreamSynchronize(s));
    CK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    CK(launch());
    CK(cuStreamEndCapture(s, &g));
    CK(cuGraphInstantiate(&exe, g, 0));
    CK(cuGraphUpload(exe, s));
    CK(cuMemHostAlloc(&hbuf, 64, 0));
    CK(cuMemAlloc(&dbuf, 64));
    CK(cuStreamSynchronize(s));
    ready = true;
    return 0;
}

// Eager launch rate: `n` launches as fast as C++ can call cuLaunchKernel, then synchronize;
// *launches_per_s = n / (time of the calls).
int oracle_launch_rate(long long n, double* launches_per_s)
{
    if (!ready) return -2;
    long long t0 = now_ns();
    for (long long i = 0; i < n; ++i) CK(launch());
    long long t1 = now_ns();
    CK(cuStreamSynchronize(s));
    *launches_per_s = n / ((t1 - t0) / 1e9);
    return 0;
}

// Host cost per launch: per burst, `burst_calls` launches queued behind the 20 ms blocker (the queue never
// fills); us_per_launch[b] = the calls' time / burst_calls, in us.
int oracle_host_per_launch(int bursts, int burst_calls, double* us_per_launch)
{
    if (!ready) return -2;
    CK(launch());
    CK(cuStreamSynchronize(s));
    for (int b = 0; b < bursts; ++b) {
        CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, blocker_params, nullptr));
        long long t0 = now_ns();
        for (int i = 0; i < burst_calls; ++i) CK(launch());
        long long t1 = now_ns();
        CK(cuStreamSynchronize(s));
        us_per_launch[b] = (t1 - t0) / 1e3 / burst_calls;
    }
    return 0;
}

// Launch + synchronize, eager (graph == 0) or the graph of one kernel: 2 untimed repeats, then
// out_ns[i] = wall time of repeat i.
int oracle_launch_sync_each(int graph, int repeats, long long* out_ns)
{
    if (!ready) return -2;
    for (int i = 0; i < repeats + 2; ++i) {
        long long t0 = now_ns();
        CK(graph ? cuGraphLaunch(exe, s) : launch());
        CK(cuStreamSynchronize(s));
        if (i >= 2) out_ns[i - 2] = now_ns() - t0;
    }
    return 0;
}

// `nbytes` copy + synchronize between pinned host memory and the device (h2d != 0: to the device): 2 untimed
// repeats, then out_ns[i] = wall time of repeat i.
int oracle_copy_sync_each(int h2d, int nbytes, int repeats, long long* out_ns)
{
    if (!ready) return -2;
    if (nbytes < 0 || nbytes > 64) return (int)CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < repeats + 2; ++i) {
        long long t0 = now_ns();
        CK(h2d ? cuMemcpyHtoDAsync(dbuf, hbuf, nbytes, s) : cuMemcpyDtoHAsync(hbuf, dbuf, nbytes, s));
        CK(cuStreamSynchronize(s));
        if (i >= 2) out_ns[i - 2] = now_ns() - t0;
    }
    return 0;
}

// Release what oracle_init made (the primary context stays retained, as pcietrace shares it).
int oracle_close()
{
    if (!ready) return 0;
    ready = false;
    CK(cuStreamSynchronize(s));
    CK(cuMemFreeHost(hbuf));
    CK(cuMemFree(dbuf));
    CK(cuGraphExecDestroy(exe));
    CK(cuGraphDestroy(g));
    CK(cuStreamDestroy(s));
    return 0;
}

}  // extern "C"

#ifndef ORACLE_LIBRARY
static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The program: one round, each figure a median over its repeats (eager rate: of three runs).
static int run(long n_rate, int repeats, int bursts, int burst_calls)
{
    int rc;
    if ((rc = oracle_init(0))) return rc;
    std::vector<double> rates(3), host(bursts);
    for (double& r : rates)
        if ((rc = oracle_launch_rate(n_rate, &r))) return rc;
    std::printf("eager_launches_per_s %.1f\n", median(rates));
    if ((rc = oracle_host_per_launch(bursts, burst_calls, host.data()))) return rc;
    std::printf("host_us_per_launch %.4f\n", median(host));
    const char* names[] = {"launch_sync_eager_us", "launch_sync_graph1_us", "copy_h2d_4B_us", "copy_d2h_4B_us"};
    std::vector<long long> t(repeats);
    for (int k = 0; k < 4; ++k) {
        rc = k < 2 ? oracle_launch_sync_each(k, repeats, t.data())
                   : oracle_copy_sync_each(k == 2, 4, repeats, t.data());
        if (rc) return rc;
        std::printf("%s %.4f\n", names[k], median(std::vector<double>(t.begin(), t.end())) / 1e3);
    }
    return oracle_close();
}

int main(int argc, char** argv)
{
    long n_rate = argc > 1 ? std::atol(argv[1]) : 200000;
    int repeats = argc > 2 ? std::atoi(argv[2]) : 201;
    int bursts = argc > 3 ? std::atoi(argv[3]) : 15;
    int burst_calls = argc > 4 ? std::atoi(argv[4]) : 900;
    return run(n_rate, repeats, bursts, burst_calls) ? 1 : 0;
}
#endif
