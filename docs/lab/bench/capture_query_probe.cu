// Probe (GPU machine; not a test): what attach's captured-launch check costs per launch. The interposer asks
// cuStreamIsCapturing of a launch's stream (a launch into a stream being captured is counted as captured, not
// eager) once the process has begun a capture. Times that query alone on a created stream, CU_STREAM_LEGACY and
// CU_STREAM_PER_THREAD, not capturing and (the created stream) capturing; then an eager launch loop with and
// without an extra query per launch. Run it plain and under attach; the launch loop's difference between the
// two is the interposer's whole per-launch cost (device lookup and, after the capture, capture query included):
//   nvcc -O2 -o /tmp/capq docs/lab/bench/capture_query_probe.cu -lcuda && /tmp/capq
//   python3 -m pcietrace attach --no-calibrate -- /tmp/capq
// Under attach the "captured" line must equal the kernels captured here (kCaptured) and "eager" the launches
// of the timed loops plus the warm-up (the probe prints both figures it made).
// The plain launch loop is timed before the probe's capture and again after it: under attach the difference
// (less the plain run's) is what the query costs each launch, and what a program that never captures does not
// pay. Its blocks vary by ~5 % (H100), more than the query's 30-50 ns; "with one more cuStreamIsCapturing" is
// the steadier estimate of the query's cost.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <time.h>

static long long now_ns() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000LL + t.tv_nsec; }
__global__ void empty() {}

static double query_ns(CUstream s, int n) {
    CUstreamCaptureStatus st;
    long long t0 = now_ns();
    for (int i = 0; i < n; ++i) cuStreamIsCapturing(s, &st);
    return (now_ns() - t0) / double(n);
}

const int calls = 500;  // below the launch queue's depth, so the host never waits for the GPU
long long launched = 0;

// Five lines of the launch loop's best of 20 x ``calls`` ns per launch, without and with one more query per launch.
static void launch_loops(cudaStream_t s, const char *when) {
    CUstream cs = (CUstream)s;
    for (int rep = 0; rep < 5; ++rep) {
        long long best[2] = {1LL << 62, 1LL << 62};
        for (int r = 0; r < 20; ++r) {
            for (int extra = 0; extra < 2; ++extra) {
                cudaStreamSynchronize(s);
                CUstreamCaptureStatus st;
                long long t0 = now_ns();
                for (int i = 0; i < calls; ++i) {
                    if (extra) cuStreamIsCapturing(cs, &st);
                    empty<<<1, 1, 0, s>>>();
                }
                long long dt = now_ns() - t0;
                launched += calls;
                if (dt < best[extra]) best[extra] = dt;
            }
        }
        printf("%s: ns per launch (best of 20 x %d): plain %.1f, with one more cuStreamIsCapturing %.1f\n", when,
               calls, best[0] / double(calls), best[1] / double(calls));
    }
}

int main() {
    cudaFree(0);  // the runtime's primary context, current on this thread
    const int n = 1000000;
    cudaStream_t s;
    cudaStreamCreate(&s);
    CUstream cs = (CUstream)s;
    for (int i = 0; i < calls; ++i, ++launched) empty<<<1, 1, 0, s>>>();  // warm-up
    launch_loops(s, "before any capture");
    for (int rep = 0; rep < 3; ++rep)
        printf("ns per cuStreamIsCapturing: stream %.1f, CU_STREAM_LEGACY %.1f, CU_STREAM_PER_THREAD %.1f\n",
               query_ns(cs, n), query_ns(CU_STREAM_LEGACY, n), query_ns(CU_STREAM_PER_THREAD, n));
    const int kCaptured = 1000;
    cudaGraph_t g;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    double capturing = query_ns(cs, n);
    for (int i = 0; i < kCaptured; ++i) empty<<<1, 1, 0, s>>>();
    cudaStreamEndCapture(s, &g);
    printf("ns per cuStreamIsCapturing while the stream captures: %.1f; kernels captured: %d\n", capturing, kCaptured);
    cudaGraphDestroy(g);
    launch_loops(s, "after a capture");
    cudaStreamSynchronize(s);
    printf("eager launches made: %lld\n", launched);
    return 0;
}
