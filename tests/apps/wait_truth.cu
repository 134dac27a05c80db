// Oracle for attach's call timing (it does not use pcietrace): NVTX ranges whose launch calls and synchronize
// calls the app times itself, on CLOCK_MONOTONIC around each CUDA runtime call (so its figures include the
// runtime's own layer above the driver call that pcietrace times).
// Build: nvcc -O2 -o wait_truth tests/apps/wait_truth.cu -ldl      Usage: wait_truth [SPIN_MS [OUT.json [REPEATS]]]
// Ranges: "launches" (2,000 empty kernels, then a stream synchronize), "stream" (a kernel spinning SPIN_MS, then
// cudaStreamSynchronize), "event" (the same, waited for by cudaEventSynchronize), "device" (the same, by
// cudaDeviceSynchronize), "queue_full" (6,000 kernels of 20 us launched back to back: the launch queue fills,
// so launch calls wait for the GPU; then a stream synchronize). The five ranges run REPEATS times (default 1), in
// that order each time. Writes one JSON line (to OUT.json, else stdout): per range, the app's own sums per
// instance in order, launch_call_ns and sync_wait_ns (lists of REPEATS numbers).
#include <nvtx3/nvToolsExt.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <string>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); std::exit(1); } } while (0)

__global__ void empty() {}
__global__ void spin(long long ns)
{
    long long t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (long long t = t0; t - t0 < ns;) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
}

static long long now_ns()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

struct Sums { long long launch = 0, wait = 0; };
#define TIMED(sum, call) do { long long t0_ = now_ns(); CK(call); (sum) += now_ns() - t0_; } while (0)

int main(int argc, char** argv)
{
    long long spin_ns = (long long)((argc > 1 ? std::atof(argv[1]) : 20.0) * 1e6);
    const int repeats = argc > 3 ? std::atoi(argv[3]) : 1;
    if (repeats < 1) { std::fprintf(stderr, "REPEATS must be >= 1\n"); return 2; }
    cudaStream_t s;
    cudaEvent_t ev;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    empty<<<1, 1, 0, s>>>();
    CK(cudaDeviceSynchronize());
    std::map<std::string, std::pair<std::string, std::string>> sums;  // per range: its instances' sums, as JSON lists
    // One NVTX range: body(sums) makes and times its calls; the sums are appended to the range's lists.
    auto range = [&](const char* name, auto body) {
        Sums x;
        nvtxRangePushA(name);
        body(x);
        nvtxRangePop();
        auto& [launch, wait] = sums[name];
        launch += (launch.empty() ? "" : ", ") + std::to_string(x.launch);
        wait += (wait.empty() ? "" : ", ") + std::to_string(x.wait);
    };
    for (int r = 0; r < repeats; ++r) {
        range("launches", [&](Sums& x) {
            for (int i = 0; i < 2000; ++i) TIMED(x.launch, cudaLaunchKernel((const void*)empty, 1, 1, nullptr, 0, s));
            TIMED(x.wait, cudaStreamSynchronize(s));
        });
        void* args[] = {&spin_ns};
        range("stream", [&](Sums& x) {
            TIMED(x.launch, cudaLaunchKernel((const void*)spin, 1, 1, args, 0, s));
            TIMED(x.wait, cudaStreamSynchronize(s));
        });
        range("event", [&](Sums& x) {
            TIMED(x.launch, cudaLaunchKernel((const void*)spin, 1, 1, args, 0, s));
            CK(cudaEventRecord(ev, s));
            TIMED(x.wait, cudaEventSynchronize(ev));
        });
        range("device", [&](Sums& x) {
            TIMED(x.launch, cudaLaunchKernel((const void*)spin, 1, 1, args, 0, s));
            TIMED(x.wait, cudaDeviceSynchronize());
        });
        long long k_ns = 20000;
        void* kargs[] = {&k_ns};
        range("queue_full", [&](Sums& x) {
            for (int i = 0; i < 6000; ++i) TIMED(x.launch, cudaLaunchKernel((const void*)spin, 1, 1, kargs, 0, s));
            TIMED(x.wait, cudaStreamSynchronize(s));
        });
    }
    std::string out = "{\"app\": \"wait_truth\"";
    for (const auto& [name, lists] : sums)
        out += ", \"" + name + "\": {\"launch_call_ns\": [" + lists.first + "], \"sync_wait_ns\": [" + lists.second + "]}";
    FILE* f = argc > 2 ? std::fopen(argv[2], "w") : stdout;
    if (!f) { std::perror(argv[2]); return 1; }
    std::fprintf(f, "%s}\n", out.c_str());
    return f == stdout ? 0 : std::fclose(f);
}
