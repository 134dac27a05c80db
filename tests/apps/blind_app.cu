// blind_app.cu: a C++/CUDA app whose PCIe traffic and launches per NVTX range are known; the second blind
// oracle for `pcietrace attach` (issue 7).
//
// Written from the user's side only (README, `pcietrace attach --help`, tests/apps/blind_app.py's output
// format and truth method), not from attach's code or the team's own truth apps. It exercises what the
// PyTorch oracle does not: a named NVTX domain with registered strings, colors and payloads (NVTX3 C++ API),
// nvtxRangePushEx, strided 2D copies, unified-memory migration, cudaHostRegister'ed memory, the legacy default
// stream, cudaLaunchKernelEx, cooperative launches, graph replays, the per-thread default stream, ranges on
// worker threads and a bare nvtxMarkA.
//
// Build (CUDA 12 or 13 toolkit, NVTX3 headers are header-only; NVML is dlopen'ed, not linked):
//     nvcc -O2 -std=c++17 -o blind_app_cpp tests/apps/blind_app.cu -ldl -lpthread
// (nvcc links the CUDA runtime statically by default; add `-cudart shared` for a build whose runtime is
// libcudart.so, to compare how attach's launch counter sees the two). Needs NVTX >= 3.1 headers
// (nvtx3::scoped_range_in), as in CUDA 12.x/13.
// Run (the same environment as blind_app.py):
//     BLIND_OUT=truth.jsonl [BLIND_CALLS=8] [BLIND_TRUTH=1] [LOCAL_RANK=0] ./blind_app_cpp
//
// Ranges, each once per round in this order (BLIND_CALLS rounds, default 8); bytes are payload bytes (the
// counters also count TLP headers, ~8 % more, and each launch moves ~2 KB H2D itself: the truth reads see all
// of it), launches are per call:
//   h2d_pinned_40MiB      domain "blind" (nvtx3::scoped_range_in<blind_domain>, registered string, color,
//                         payload): cudaMemcpyAsync 40 MiB pinned -> device + stream sync.  H2D 41,943,040 B, 0 launches
//   launch_chevron_300    300 tiny_kernel<<<1,32,0,s>>> + sync.                          no payload, 300 eager launches
//   d2h_2d_3000x8KiB      nvtxRangePushEx (ASCII, color): cudaMemcpy2DAsync D2H, 3000 rows of 8 KiB out of a
//                         16 KiB-pitched device buffer into pinned memory + sync.  D2H 24,576,000 B, 0 launches
//   idle_12ms             sleep 12 ms.                                                    no payload (~0 B), 0 launches
//   (mark_only)           nvtxMarkA("mark_only") between two ranges: no range, no JSON line
//   um_prefetch_to_gpu    cudaMemPrefetchAsync of a 48 MiB managed buffer (resident on the host) to the GPU
//                         + sync.                                                          H2D 50,331,648 B, 0 launches
//   launch_ex_200         200 cudaLaunchKernelEx with a priority launch attribute + sync.  no payload, 200 eager launches
//   registered_d2h        cudaMemcpyAsync 24 MiB device -> malloc'd host memory registered with
//                         cudaHostRegister (outside the range) + sync.                     D2H 25,165,824 B, 0 launches
//   graph_replay_20       20 cudaGraphLaunch of a graph captured before the loop (10 kernels + a 1 MiB H2D
//                         copy node) + sync.           H2D 20,971,520 B, 20 graph launches, 0 eager
//   um_prefetch_to_host   prefetch the managed buffer back to the host + sync.             D2H 50,331,648 B, 0 launches
//   h2d_pageable_20MiB    cudaMemcpy (synchronous, legacy default stream) of 20 MiB from plain `new char[]`,
//                         then cudaDeviceSynchronize (a pageable H2D cudaMemcpy may return before the last
//                         staged DMA has landed; the sync keeps its bytes inside the range).  H2D 20,971,520 B
//   launch_cooperative_50 50 cudaLaunchCooperativeKernel + sync.                           no payload, 50 eager launches
//   threads_4x8MiB        (default domain, main thread) 4 std::threads, each on its own stream:
//                         nvtxRangePushA("thread_h2d"), 8 MiB pinned H2D + 25 launches + stream sync, pop.
//                         H2D 33,554,432 B; the main thread itself launches nothing (attach counts a range's
//                         own thread's launches: 0), its process 100 (`launches_expected_process`).
//     thread_h2d          (4 per round, one per thread) no truth; depth 1 under threads_4x8MiB logically, but
//                         NVTX depth 0 on its own thread (`thread_depth`).  H2D 8,388,608 B, 25 eager launches
//   stream_per_thread_100 100 launches into cudaStreamPerThread + sync.                   no payload, 100 eager launches
// A device without concurrentManagedAccess skips both um_* kinds, one without cooperative launch skips
// launch_cooperative_50; the meta line says so (`skipped`). Everything runs once outside any range first
// (kernels loaded, streams created, graph instantiated, NVTX domain and strings registered, UM pages mapped).
//
// Truth (BLIND_TRUTH=1, the default), as blind_app.py: the GPU's NVML PCIe counters (field 198 RX = H2D, field
// 197 TX = D2H; 32-bit, differences mod 2^32) of the GPU found by its PCI bus id, read OUTSIDE every range:
// cudaDeviceSynchronize, read, sleep 6 ms, range, sleep 6 ms, read. Each round first reads an empty reference
// window the same way (read, sleep 6 ms, sleep 6 ms, read), whose bytes (the reads' own traffic and the
// background) are subtracted from that round's range windows. Ranges on worker threads get no truth.
// BLIND_TRUTH=0: no NVML at all, the same sleeps (for runtime-overhead runs).
//
// Output: JSON lines to $BLIND_OUT (default blind_app.jsonl), the same keys as blind_app.py: a `meta` line, a
// `ref` line per round, a `range` line per call, an `end` line with `loop_wall_ns`. Times are CLOCK_MONOTONIC
// (attach's sampler clock). Any failed CUDA/NVML call: one line on stderr, exit 1, no output file.

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>
#include <nvtx3/nvtx3.hpp>

#include <dlfcn.h>
#include <time.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t MiB = size_t(1) << 20;
constexpr int GAP_MS = 6;          // between a truth read and a range edge (longer than attach's 5 ms idle sampling)
constexpr int IDLE_MS = 12;
constexpr uint64_t WRAP = uint64_t(1) << 32;  // NVML fields 197/198 are 32-bit counters
constexpr unsigned FIELD_TX = 197, FIELD_RX = 198;  // PCIE_COUNT_TX_BYTES (D2H), PCIE_COUNT_RX_BYTES (H2D)

constexpr size_t H2D_BYTES = 40 * MiB;
constexpr size_t ROWS = 3000, ROW_BYTES = 8 * 1024, PITCH_BYTES = 16 * 1024;
constexpr size_t UM_BYTES = 48 * MiB;
constexpr size_t REG_BYTES = 24 * MiB;
constexpr size_t PAGEABLE_BYTES = 20 * MiB;
constexpr size_t GRAPH_COPY_BYTES = 1 * MiB;
constexpr int GRAPH_KERNELS = 10, GRAPH_REPLAYS = 20;
constexpr int THREADS = 4, THREAD_LAUNCHES = 25;
constexpr size_t THREAD_BYTES = 8 * MiB;
constexpr int CHEVRON = 300, LAUNCH_EX = 200, COOP = 50, PER_THREAD = 100;

[[noreturn]] void die(const char* fmt, ...) {
  std::fprintf(stderr, "blind_app.cu: ");
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "\n");
  std::exit(1);
}

void ck(cudaError_t e, const char* what, int line) {
  if (e != cudaSuccess) die("%s failed: %s (%s), line %d", what, cudaGetErrorName(e), cudaGetErrorString(e), line);
}
#define CK(call) ck((call), #call, __LINE__)

int64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

__global__ void tiny_kernel(int x) {
  if (x == -1) __trap();  // never taken; keeps the kernel from being optimised into nothing visible
}

// ---- NVML, dlopen'ed (no nvml.h here): the few declarations needed, layout from the NVML reference ----
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef union {
  double dVal;
  unsigned int uiVal;
  unsigned long ulVal;
  unsigned long long ullVal;
  signed long long sllVal;
} nvmlValue_t;
typedef struct {
  unsigned int fieldId;
  unsigned int scopeId;
  long long timestamp;
  long long latencyUsec;
  unsigned int valueType;  // nvmlValueType_t
  unsigned int nvmlReturn;  // nvmlReturn_t
  nvmlValue_t value;
} nvmlFieldValue_t;
static_assert(sizeof(nvmlFieldValue_t) == 40, "nvmlFieldValue_t layout");

class Counters {
 public:
  // Opens NVML and finds the GPU with PCI bus id `bus_id` (as cudaDeviceGetPCIBusId spells it).
  explicit Counters(const std::string& bus_id) {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib_) die("dlopen libnvidia-ml.so.1: %s (run with BLIND_TRUTH=0 to skip the truth reads)", dlerror());
    init_ = reinterpret_cast<int (*)()>(sym("nvmlInit_v2"));
    by_bus_ = reinterpret_cast<int (*)(const char*, nvmlDevice_t*)>(sym("nvmlDeviceGetHandleByPciBusId_v2"));
    fields_ = reinterpret_cast<int (*)(nvmlDevice_t, int, nvmlFieldValue_t*)>(sym("nvmlDeviceGetFieldValues"));
    shutdown_ = reinterpret_cast<int (*)()>(sym("nvmlShutdown"));
    err_str_ = reinterpret_cast<const char* (*)(int)>(dlsym(lib_, "nvmlErrorString"));
    auto get_index = reinterpret_cast<int (*)(nvmlDevice_t, unsigned*)>(dlsym(lib_, "nvmlDeviceGetIndex"));
    nv("nvmlInit_v2", init_());
    // NVML spells the domain with 8 hex digits, CUDA with 4: try CUDA's, then NVML's.
    std::string lower = bus_id;
    for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
    std::vector<std::string> spellings{bus_id, lower};
    size_t colon = lower.find(':');
    if (colon != std::string::npos && colon < 8) spellings.push_back(std::string(8 - colon, '0') + lower);
    int rc = -1;
    for (const auto& s : spellings) {
      rc = by_bus_(s.c_str(), &dev_);
      if (rc == 0) break;
    }
    nv(("nvmlDeviceGetHandleByPciBusId_v2(" + bus_id + ")").c_str(), rc);
    unsigned idx = 0;
    if (get_index && get_index(dev_, &idx) == 0) nvml_index = int(idx);
    read();  // fail here, before the loop, if the fields are not supported
  }
  ~Counters() {
    if (shutdown_) shutdown_();
  }
  // (rx_bytes = H2D, tx_bytes = D2H), each the low 32 bits of the counter.
  std::pair<uint64_t, uint64_t> read() {
    nvmlFieldValue_t v[2];
    std::memset(v, 0, sizeof v);
    v[0].fieldId = FIELD_RX;
    v[1].fieldId = FIELD_TX;
    nv("nvmlDeviceGetFieldValues", fields_(dev_, 2, v));
    for (const auto& f : v)
      if (f.nvmlReturn != 0) die("NVML field %u: %s (%u)", f.fieldId, err(int(f.nvmlReturn)), f.nvmlReturn);
    return {v[0].value.ullVal % WRAP, v[1].value.ullVal % WRAP};
  }
  int nvml_index = -1;

 private:
  void* sym(const char* name) {
    void* p = dlsym(lib_, name);
    if (!p) die("libnvidia-ml.so.1 has no %s", name);
    return p;
  }
  const char* err(int rc) { return err_str_ ? err_str_(rc) : "NVML error"; }
  void nv(const char* what, int rc) {
    if (rc != 0) die("%s failed: %s (NVML %d)", what, err(rc), rc);
  }
  void* lib_ = nullptr;
  nvmlDevice_t dev_ = nullptr;
  int (*init_)() = nullptr;
  int (*by_bus_)(const char*, nvmlDevice_t*) = nullptr;
  int (*fields_)(nvmlDevice_t, int, nvmlFieldValue_t*) = nullptr;
  int (*shutdown_)() = nullptr;
  const char* (*err_str_)(int) = nullptr;
};

// ---- JSON, by hand: one object per line ----
std::string jstr(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += char(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else {
      o += char(c);
    }
  }
  return o + "\"";
}

class Obj {  // keys in insertion order
 public:
  Obj& raw(const std::string& k, const std::string& json) {
    body_ += (body_.empty() ? "" : ", ") + jstr(k) + ": " + json;
    return *this;
  }
  Obj& s(const std::string& k, const std::string& v) { return raw(k, jstr(v)); }
  Obj& i(const std::string& k, long long v) { return raw(k, std::to_string(v)); }
  Obj& b(const std::string& k, bool v) { return raw(k, v ? "true" : "false"); }
  Obj& null(const std::string& k) { return raw(k, "null"); }
  std::string str() const { return "{" + body_ + "}"; }

 private:
  std::string body_;
};

// ---- the named NVTX domain and its registered string (NVTX3 C++ API) ----
struct blind_domain {
  static constexpr char const* name{"blind"};
};
struct h2d_message {
  static constexpr char const* message{"h2d_pinned_40MiB"};
};

struct Expect {
  size_t payload_bytes;
  const char* direction;  // "h2d", "d2h" or nullptr
  long long eager, graph;
};

}  // namespace

int main() {
  const char* env_truth = std::getenv("BLIND_TRUTH");
  const bool truth_on = !(env_truth && std::string(env_truth) == "0");
  const char* env_calls = std::getenv("BLIND_CALLS");
  const char* env_out = std::getenv("BLIND_OUT");
  const char* env_rank = std::getenv("LOCAL_RANK");
  char* endp = nullptr;
  const long calls = env_calls ? std::strtol(env_calls, &endp, 10) : 8;
  if (env_calls && (*endp || calls < 1)) die("BLIND_CALLS must be a positive integer, not '%s'", env_calls);
  const long dev = env_rank ? std::strtol(env_rank, &endp, 10) : 0;
  if (env_rank && (*endp || dev < 0)) die("LOCAL_RANK must be a device number, not '%s'", env_rank);
  const std::string out_path = env_out ? env_out : "blind_app.jsonl";

  int ndev = 0;
  CK(cudaGetDeviceCount(&ndev));
  if (dev >= ndev) die("LOCAL_RANK=%ld but only %d CUDA device(s) are visible", dev, ndev);
  CK(cudaSetDevice(int(dev)));
  CK(cudaFree(nullptr));  // create the context now
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, int(dev)));
  int runtime_version = 0, driver_version = 0, managed_ok = 0, coop_ok = 0, prio_least = 0, prio_greatest = 0;
  CK(cudaRuntimeGetVersion(&runtime_version));
  CK(cudaDriverGetVersion(&driver_version));
  CK(cudaDeviceGetAttribute(&managed_ok, cudaDevAttrConcurrentManagedAccess, int(dev)));
  CK(cudaDeviceGetAttribute(&coop_ok, cudaDevAttrCooperativeLaunch, int(dev)));
  CK(cudaDeviceGetStreamPriorityRange(&prio_least, &prio_greatest));
  char bus_id[32] = {0};
  CK(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, int(dev)));
  std::map<std::string, std::string> skipped;
  if (!managed_ok) {
    const char* why = "device has no concurrentManagedAccess: cudaMemPrefetchAsync to it is not supported";
    skipped["um_prefetch_to_gpu"] = skipped["um_prefetch_to_host"] = why;
  }
  if (!coop_ok) skipped["launch_cooperative_50"] = "device has no cudaDevAttrCooperativeLaunch";

  // ---- buffers and streams, all made and touched before the loop ----
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  char *h2d_src, *h2d_dst;
  CK(cudaMallocHost(&h2d_src, H2D_BYTES));
  CK(cudaMalloc(&h2d_dst, H2D_BYTES));
  std::memset(h2d_src, 1, H2D_BYTES);

  char *pitched_src, *rows_dst;
  CK(cudaMalloc(&pitched_src, ROWS * PITCH_BYTES));
  CK(cudaMemset(pitched_src, 2, ROWS * PITCH_BYTES));
  CK(cudaMallocHost(&rows_dst, ROWS * ROW_BYTES));
  std::memset(rows_dst, 0, ROWS * ROW_BYTES);

  char* um = nullptr;
  if (managed_ok) {
    CK(cudaMallocManaged(&um, UM_BYTES));
    std::memset(um, 3, UM_BYTES);  // first touch on the host: pages resident there
  }

  void* reg_host = nullptr;
  if (posix_memalign(&reg_host, size_t(sysconf(_SC_PAGESIZE)), REG_BYTES) != 0) die("posix_memalign of %zu B failed", REG_BYTES);
  std::memset(reg_host, 0, REG_BYTES);
  CK(cudaHostRegister(reg_host, REG_BYTES, cudaHostRegisterDefault));
  char* reg_src;
  CK(cudaMalloc(&reg_src, REG_BYTES));
  CK(cudaMemset(reg_src, 4, REG_BYTES));

  char* pageable = new char[PAGEABLE_BYTES];
  std::memset(pageable, 5, PAGEABLE_BYTES);
  char* pageable_dst;
  CK(cudaMalloc(&pageable_dst, PAGEABLE_BYTES));

  // The graph: 10 kernels and a 1 MiB H2D copy, captured on its own stream, instantiated once.
  cudaStream_t gs;
  CK(cudaStreamCreateWithFlags(&gs, cudaStreamNonBlocking));
  char *graph_src, *graph_dst;
  CK(cudaMallocHost(&graph_src, GRAPH_COPY_BYTES));
  CK(cudaMalloc(&graph_dst, GRAPH_COPY_BYTES));
  std::memset(graph_src, 6, GRAPH_COPY_BYTES);
  cudaGraph_t graph;
  cudaGraphExec_t graph_exec;
  CK(cudaStreamBeginCapture(gs, cudaStreamCaptureModeThreadLocal));
  for (int k = 0; k < GRAPH_KERNELS; ++k) tiny_kernel<<<1, 32, 0, gs>>>(k);
  CK(cudaGetLastError());
  CK(cudaMemcpyAsync(graph_dst, graph_src, GRAPH_COPY_BYTES, cudaMemcpyHostToDevice, gs));
  CK(cudaStreamEndCapture(gs, &graph));
  CK(cudaGraphInstantiate(&graph_exec, graph, 0));

  cudaStream_t ts[THREADS];
  char *thread_src[THREADS], *thread_dst[THREADS];
  for (int t = 0; t < THREADS; ++t) {
    CK(cudaStreamCreateWithFlags(&ts[t], cudaStreamNonBlocking));
    CK(cudaMallocHost(&thread_src[t], THREAD_BYTES));
    CK(cudaMalloc(&thread_dst[t], THREAD_BYTES));
    std::memset(thread_src[t], 7 + t, THREAD_BYTES);
  }
  CK(cudaDeviceSynchronize());

  // ---- the range bodies (what runs between push and pop), also used for the warm-up without NVTX ----
  auto h2d_pinned = [&] {
    CK(cudaMemcpyAsync(h2d_dst, h2d_src, H2D_BYTES, cudaMemcpyHostToDevice, s));
    CK(cudaStreamSynchronize(s));
  };
  auto chevron = [&] {
    for (int k = 0; k < CHEVRON; ++k) tiny_kernel<<<1, 32, 0, s>>>(k);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(s));
  };
  auto d2h_2d = [&] {
    CK(cudaMemcpy2DAsync(rows_dst, ROW_BYTES, pitched_src, PITCH_BYTES, ROW_BYTES, ROWS, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
  };
  auto idle = [] { sleep_ms(IDLE_MS); };
  auto um_to = [&](bool to_gpu) {
#if CUDART_VERSION >= 13000
    cudaMemLocation loc{};
    loc.type = to_gpu ? cudaMemLocationTypeDevice : cudaMemLocationTypeHost;
    loc.id = to_gpu ? int(dev) : 0;  // id is ignored for the host
    CK(cudaMemPrefetchAsync(um, UM_BYTES, loc, 0, s));
#else
    CK(cudaMemPrefetchAsync(um, UM_BYTES, to_gpu ? int(dev) : cudaCpuDeviceId, s));
#endif
    CK(cudaStreamSynchronize(s));
  };
  cudaLaunchAttribute prio_attr[1];
  prio_attr[0].id = cudaLaunchAttributePriority;
  prio_attr[0].val.priority = prio_greatest;
  cudaLaunchConfig_t ex_cfg = {};
  ex_cfg.gridDim = dim3(1);
  ex_cfg.blockDim = dim3(32);
  ex_cfg.dynamicSmemBytes = 0;
  ex_cfg.stream = s;
  ex_cfg.attrs = prio_attr;
  ex_cfg.numAttrs = 1;
  auto launch_ex = [&] {
    for (int k = 0; k < LAUNCH_EX; ++k) CK(cudaLaunchKernelEx(&ex_cfg, tiny_kernel, k));
    CK(cudaStreamSynchronize(s));
  };
  auto registered_d2h = [&] {
    CK(cudaMemcpyAsync(reg_host, reg_src, REG_BYTES, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
  };
  auto graph_replay = [&] {
    for (int k = 0; k < GRAPH_REPLAYS; ++k) CK(cudaGraphLaunch(graph_exec, gs));
    CK(cudaStreamSynchronize(gs));
  };
  auto h2d_pageable = [&] {
    CK(cudaMemcpy(pageable_dst, pageable, PAGEABLE_BYTES, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
  };
  auto cooperative = [&] {
    for (int k = 0; k < COOP; ++k) {
      int arg = k;
      void* args[] = {&arg};
      CK(cudaLaunchCooperativeKernel(tiny_kernel, dim3(1), dim3(32), args, 0, s));
    }
    CK(cudaStreamSynchronize(s));
  };
  auto per_thread = [&] {
    for (int k = 0; k < PER_THREAD; ++k) tiny_kernel<<<1, 32, 0, cudaStreamPerThread>>>(k);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(cudaStreamPerThread));
  };
  // Worker threads: each sets the device (a new thread's current device is 0), then its own range.
  // Errors are kept and reported by the main thread after the join.
  int64_t thread_ns[THREADS];
  auto threads_body = [&](bool with_nvtx) {
    std::string errors[THREADS];
    std::vector<std::thread> pool;
    for (int t = 0; t < THREADS; ++t) {
      pool.emplace_back([&, t] {
        auto tck = [&](cudaError_t e, const char* what) {
          if (e != cudaSuccess && errors[t].empty())
            errors[t] = std::string(what) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
          return e == cudaSuccess;
        };
        if (!tck(cudaSetDevice(int(dev)), "cudaSetDevice (worker thread)")) return;
        const int64_t t0 = mono_ns();
        if (with_nvtx) nvtxRangePushA("thread_h2d");
        tck(cudaMemcpyAsync(thread_dst[t], thread_src[t], THREAD_BYTES, cudaMemcpyHostToDevice, ts[t]),
            "cudaMemcpyAsync (worker thread)");
        for (int k = 0; k < THREAD_LAUNCHES; ++k) tiny_kernel<<<1, 32, 0, ts[t]>>>(k);
        tck(cudaGetLastError(), "tiny_kernel<<<>>> (worker thread)");
        tck(cudaStreamSynchronize(ts[t]), "cudaStreamSynchronize (worker thread)");
        if (with_nvtx) nvtxRangePop();
        thread_ns[t] = mono_ns() - t0;
      });
    }
    for (auto& th : pool) th.join();
    for (int t = 0; t < THREADS; ++t)
      if (!errors[t].empty()) die("thread %d: %s", t, errors[t].c_str());
  };

  // ---- warm-up, outside any range: every path once, and the NVTX domain and registered string made ----
  const auto& h2d_msg = nvtx3::registered_string_in<blind_domain>::get<h2d_message>();
  const nvtx3::event_attributes h2d_attr{h2d_msg, nvtx3::rgb{0x20, 0x80, 0xF0},
                                         nvtx3::payload{static_cast<int64_t>(H2D_BYTES)}};
  h2d_pinned();
  chevron();
  d2h_2d();
  if (managed_ok) {
    um_to(true);
    um_to(false);  // back on the host: each round's um_prefetch_to_gpu migrates all of it
  }
  launch_ex();
  registered_d2h();
  graph_replay();
  h2d_pageable();
  if (coop_ok) cooperative();
  threads_body(false);
  per_thread();
  CK(cudaDeviceSynchronize());

  Counters* counters = truth_on ? new Counters(bus_id) : nullptr;

  // ---- the ranges, in round order: name -> body with its NVTX edges ----
  struct Kind {
    std::string name;
    std::function<void()> body;
    Expect expect;
    bool named_domain;
  };
  auto pushed = [](const char* name, std::function<void()> f) {
    return [name, f] {
      nvtxRangePushA(name);
      f();
      nvtxRangePop();
    };
  };
  std::vector<Kind> kinds;
  kinds.push_back({"h2d_pinned_40MiB",
                   [&] {
                     nvtx3::scoped_range_in<blind_domain> r{h2d_attr};
                     h2d_pinned();
                   },
                   {H2D_BYTES, "h2d", 0, 0}, true});
  kinds.push_back({"launch_chevron_300", pushed("launch_chevron_300", chevron), {0, nullptr, CHEVRON, 0}, false});
  kinds.push_back({"d2h_2d_3000x8KiB",
                   [&] {
                     nvtxEventAttributes_t a;
                     std::memset(&a, 0, sizeof a);
                     a.version = NVTX_VERSION;
                     a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
                     a.colorType = NVTX_COLOR_ARGB;
                     a.color = 0xFFE07020;
                     a.messageType = NVTX_MESSAGE_TYPE_ASCII;
                     a.message.ascii = "d2h_2d_3000x8KiB";
                     nvtxRangePushEx(&a);
                     d2h_2d();
                     nvtxRangePop();
                   },
                   {ROWS * ROW_BYTES, "d2h", 0, 0}, false});
  kinds.push_back({"idle_12ms", pushed("idle_12ms", idle), {0, nullptr, 0, 0}, false});
  if (managed_ok)
    kinds.push_back({"um_prefetch_to_gpu", pushed("um_prefetch_to_gpu", [&] { um_to(true); }),
                     {UM_BYTES, "h2d", 0, 0}, false});
  kinds.push_back({"launch_ex_200", pushed("launch_ex_200", launch_ex), {0, nullptr, LAUNCH_EX, 0}, false});
  kinds.push_back({"registered_d2h", pushed("registered_d2h", registered_d2h), {REG_BYTES, "d2h", 0, 0}, false});
  kinds.push_back({"graph_replay_20", pushed("graph_replay_20", graph_replay),
                   {GRAPH_REPLAYS * GRAPH_COPY_BYTES, "h2d", 0, GRAPH_REPLAYS}, false});
  if (managed_ok)
    kinds.push_back({"um_prefetch_to_host", pushed("um_prefetch_to_host", [&] { um_to(false); }),
                     {UM_BYTES, "d2h", 0, 0}, false});
  kinds.push_back({"h2d_pageable_20MiB", pushed("h2d_pageable_20MiB", h2d_pageable),
                   {PAGEABLE_BYTES, "h2d", 0, 0}, false});
  if (coop_ok)
    kinds.push_back({"launch_cooperative_50", pushed("launch_cooperative_50", cooperative),
                     {0, nullptr, COOP, 0}, false});
  kinds.push_back({"threads_4x8MiB", pushed("threads_4x8MiB", [&] { threads_body(true); }),
                   {THREADS * THREAD_BYTES, "h2d", 0, 0}, false});  // own thread: 0 launches; its process: 100
  kinds.push_back({"stream_per_thread_100", pushed("stream_per_thread_100", per_thread),
                   {0, nullptr, PER_THREAD, 0}, false});

  // One truth window: sync, read, 6 ms, body, 6 ms, read. Returns the body's ns; bytes in h2d/d2h if truth.
  auto window = [&](const std::function<void()>& body, uint64_t& h2d, uint64_t& d2h, int64_t& t0) {
    CK(cudaDeviceSynchronize());
    std::pair<uint64_t, uint64_t> before{}, after{};
    if (counters) before = counters->read();
    sleep_ms(GAP_MS);
    t0 = mono_ns();
    if (body) body();
    const int64_t t1 = mono_ns();
    sleep_ms(GAP_MS);
    if (counters) {
      after = counters->read();
      h2d = (after.first + WRAP - before.first) % WRAP;
      d2h = (after.second + WRAP - before.second) % WRAP;
    }
    return t1 - t0;
  };

  std::vector<std::string> lines;
  const int64_t loop0 = mono_ns();
  for (long rnd = 0; rnd < calls; ++rnd) {
    uint64_t ref_h2d = 0, ref_d2h = 0;
    int64_t t0 = 0;
    window(nullptr, ref_h2d, ref_d2h, t0);
    Obj ref;
    ref.s("kind", "ref").s("name", "_ref").i("call", rnd);
    if (counters)
      ref.i("h2d_bytes", (long long)ref_h2d).i("d2h_bytes", (long long)ref_d2h);
    else
      ref.null("h2d_bytes").null("d2h_bytes");
    lines.push_back(ref.str());
    for (const Kind& k : kinds) {
      uint64_t h2d = 0, d2h = 0;
      const int64_t ns = window(k.body, h2d, d2h, t0);
      Obj r;
      r.s("kind", "range").s("name", k.name).i("call", rnd).i("depth", 0).b("truth", counters != nullptr);
      if (counters)
        r.i("h2d_bytes", (long long)h2d - (long long)ref_h2d).i("d2h_bytes", (long long)d2h - (long long)ref_d2h)
            .i("raw_h2d_bytes", (long long)h2d).i("raw_d2h_bytes", (long long)d2h);
      else
        r.null("h2d_bytes").null("d2h_bytes").null("raw_h2d_bytes").null("raw_d2h_bytes");
      r.i("duration_ns", ns).i("t_start_ns", t0).i("payload_bytes", (long long)k.expect.payload_bytes);
      if (k.expect.direction)
        r.s("direction", k.expect.direction);
      else
        r.null("direction");
      r.i("launches_expected", k.expect.eager + k.expect.graph).i("graph_launches_expected", k.expect.graph);
      if (k.named_domain) r.s("domain", blind_domain::name);
      if (k.name == "threads_4x8MiB") r.i("launches_expected_process", THREADS * THREAD_LAUNCHES);
      lines.push_back(r.str());
      if (k.name == "threads_4x8MiB") {
        for (int t = 0; t < THREADS; ++t) {
          Obj in;
          in.s("kind", "range").s("name", "thread_h2d").i("call", rnd).i("depth", 1).b("truth", false)
              .s("parent", "threads_4x8MiB").i("thread", t).i("thread_depth", 0)
              .null("h2d_bytes").null("d2h_bytes").null("raw_h2d_bytes").null("raw_d2h_bytes")
              .i("duration_ns", thread_ns[t]).i("payload_bytes", (long long)THREAD_BYTES).s("direction", "h2d")
              .i("launches_expected", THREAD_LAUNCHES).i("graph_launches_expected", 0);
          lines.push_back(in.str());
        }
      }
      if (k.name == "idle_12ms") nvtxMarkA("mark_only");  // a mark, no range: between two truth windows
    }
  }
  const int64_t loop_ns = mono_ns() - loop0;

  Obj skip;
  for (const auto& kv : skipped) skip.s(kv.first, kv.second);
  std::string order = "[";
  for (size_t n = 0; n < kinds.size(); ++n) order += (n ? ", " : "") + jstr(kinds[n].name);
  order += "]";
  Obj meta;
  meta.s("kind", "meta").s("app", "blind_app.cu").i("pid", getpid()).s("device", "cuda:" + std::to_string(dev))
      .s("gpu", prop.name).s("pci_bus_id", bus_id).b("truth", truth_on).i("calls", calls)
      .raw("gap_s", std::to_string(GAP_MS / 1000.0)).i("cuda_runtime_version", runtime_version)
      .i("cuda_driver_version", driver_version);
  if (counters && counters->nvml_index >= 0)
    meta.i("nvml_index", counters->nvml_index);
  else
    meta.null("nvml_index");
  meta.raw("skipped", skip.str())
      .raw("zero_copy", Obj().s("skipped", "not exercised by blind_app.cu (blind_app.py covers it)").str())
      .raw("order", order).s("mark", "nvtxMarkA(\"mark_only\") after idle_12ms, outside any range");

  FILE* f = std::fopen(out_path.c_str(), "w");
  if (!f) die("cannot write %s: %s", out_path.c_str(), std::strerror(errno));
  std::fprintf(f, "%s\n", meta.str().c_str());
  for (const auto& l : lines) std::fprintf(f, "%s\n", l.c_str());
  std::fprintf(f, "%s\n", Obj().s("kind", "end").i("loop_wall_ns", loop_ns).i("rounds", calls).str().c_str());
  if (std::fclose(f) != 0) die("cannot write %s: %s", out_path.c_str(), std::strerror(errno));
  for (const auto& kv : skipped) std::fprintf(stderr, "blind_app.cu: %s skipped: %s\n", kv.first.c_str(), kv.second.c_str());

  delete counters;
  CK(cudaGraphExecDestroy(graph_exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaHostUnregister(reg_host));
  std::free(reg_host);
  delete[] pageable;
  return 0;
}
