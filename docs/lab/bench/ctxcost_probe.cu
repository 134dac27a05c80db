// Probe (GPU machine; not a test): what attach's launch counting costs per
// launch. Times cuCtxGetDevice and cuCtxGetCurrent alone (the interposer asks cuCtxGetDevice at every launch,
// to charge a range the GPUs it launched on), then an eager launch loop with and without an extra
// cuCtxGetDevice per launch. Run it plain and under attach; the launch loop's difference between the two is
// the interposer's whole per-launch cost:
//   nvcc -O2 -o /tmp/ctxcost docs/lab/bench/ctxcost_probe.cu -lcuda && /tmp/ctxcost
//   python3 -m pcietrace attach --no-calibrate -- /tmp/ctxcost
// 4x H200, 2026-11-22 (docs/lab/reports/attach-truth-20261122/h200x4-session7/ctxcost-*.log): cuCtxGetDevice 9-12 ns,
// cuCtxGetCurrent 6-9 ns; launches 2,449-2,858 ns plain, 2,667-2,837 ns under attach, 2,615-2,914 ns under
// attach --no-count-launches: the interposer is inside the loop's own noise.
#include <cuda.h>
#include <cstdio>
#include <time.h>

static long long now_ns() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000LL + t.tv_nsec; }
__global__ void empty() {}

int main() {
    cudaFree(0);  // the runtime's primary context, current on this thread
    const int n = 1000000;
    int dev;
    CUcontext ctx;
    for (int rep = 0; rep < 3; ++rep) {
        long long t0 = now_ns();
        for (int i = 0; i < n; ++i) cuCtxGetDevice(&dev);
        long long t1 = now_ns();
        for (int i = 0; i < n; ++i) cuCtxGetCurrent(&ctx);
        long long t2 = now_ns();
        printf("ns per call: cuCtxGetDevice %.1f, cuCtxGetCurrent %.1f\n", (t1 - t0) / double(n), (t2 - t1) / double(n));
    }
    cudaStream_t s;
    cudaStreamCreate(&s);
    const int calls = 500;  // below the launch queue's depth, so the host never waits for the GPU
    for (int rep = 0; rep < 5; ++rep) {
        long long best[2] = {1LL << 62, 1LL << 62};
        for (int r = 0; r < 20; ++r) {
            for (int extra = 0; extra < 2; ++extra) {
                cudaStreamSynchronize(s);
                long long t0 = now_ns();
                for (int i = 0; i < calls; ++i) {
                    if (extra) cuCtxGetDevice(&dev);
                    empty<<<1, 1, 0, s>>>();
                }
                long long t = now_ns() - t0;
                if (t < best[extra]) best[extra] = t;
            }
        }
        printf("ns per launch (best of 20 x %d): plain %.1f, with one more cuCtxGetDevice %.1f\n", calls,
               best[0] / double(calls), best[1] / double(calls));
    }
    return 0;
}
