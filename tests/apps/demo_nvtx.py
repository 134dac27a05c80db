"""Demo application for `pcietrace attach` (it does not use pcietrace): NVTX ranges of known traffic.

Ranges (domain "demo", inside an outer "demo_app" range): ``eager_launches`` (N empty kernels, one
cuLaunchKernel each), ``graph_launch`` (one launch of a graph of K empty kernels), ``h2d_copy``
(a pinned host->device copy), ``idle`` (a sleep). A worker thread opens a range of its own. Prints
its own workload time as JSON. Usage: python demo_nvtx.py [--graphed] [N] [K] [COPY_MIB] [EXIT_CODE]

``--graphed``: the same work and ranges, but the N kernels of ``eager_launches`` are captured into a graph
beforehand (outside every range) and the range launches that graph once: ``pcietrace compare`` of an eager
and a graphed attach run checks attach's "graph saves" prediction.

``DEMO_TRUTH=1`` (run it alone, not under attach): the app also reads its GPU's NVML counters (fields 197/198)
right before ``eager_launches`` opens and right after it closes, and prints the range's bytes as
``truth_h2d_bytes`` / ``truth_d2h_bytes``: the bytes these launches of this kernel cost, the oracle for
attach's figure (one read's own traffic, ~15 kB H2D, rides along: under 0.1 % of 20,000 launches).
"""

import json
import os
import sys
import threading
import time

import nvtx
from cuda.bindings import driver as d
from cuda.bindings import nvrtc


def ck(result):
    if int(result[0]) != 0:
        raise RuntimeError(f"CUDA error {result[0]}")
    return result[1] if len(result) == 2 else result[1:]


def capture(fn, stream, kernels: int):
    """An executable graph of ``kernels`` launches of ``fn``, uploaded."""
    ck(d.cuStreamBeginCapture(stream, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
    for _ in range(kernels):
        ck(d.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, 0, 0))
    graph = ck(d.cuStreamEndCapture(stream))
    exe = ck(d.cuGraphInstantiate(graph, 0))
    ck(d.cuGraphUpload(exe, stream))
    return exe


def counter_reader(dev):
    """A function returning (RX, TX) of CUDA device ``dev``'s NVML counters (cumulative, 32-bit)."""
    import pynvml

    pynvml.nvmlInit()
    bus = ck(d.cuDeviceGetPCIBusId(32, dev)).split(b"\0", 1)[0]
    h = pynvml.nvmlDeviceGetHandleByPciBusId(bus)
    return lambda: tuple(v.value.uiVal for v in pynvml.nvmlDeviceGetFieldValues(h, [198, 197]))


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--graphed"]
    graphed = len(args) < len(sys.argv) - 1
    n = int(args[0]) if len(args) > 0 else 20000
    k = int(args[1]) if len(args) > 1 else 1000
    copy_bytes = (int(args[2]) if len(args) > 2 else 1024) << 20
    exit_code = int(args[3]) if len(args) > 3 else 0
    ck(d.cuInit(0))
    dev = ck(d.cuDeviceGet(0))
    ctx = ck(d.cuDevicePrimaryCtxRetain(dev))
    ck(d.cuCtxSetCurrent(ctx))
    major = ck(d.cuDeviceGetAttribute(d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = ck(d.cuDeviceGetAttribute(d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    prog = ck(nvrtc.nvrtcCreateProgram(b'extern "C" __global__ void empty() {}', b"e.cu", 0, [], []))
    ck(nvrtc.nvrtcCompileProgram(prog, 1, [f"--gpu-architecture=sm_{major}{minor}".encode()]))
    cubin = b" " * ck(nvrtc.nvrtcGetCUBINSize(prog))
    ck(nvrtc.nvrtcGetCUBIN(prog, cubin))
    fn = ck(d.cuModuleGetFunction(ck(d.cuModuleLoadData(cubin)), b"empty"))
    stream = ck(d.cuStreamCreate(1))
    exe = capture(fn, stream, k)
    eager_exe = capture(fn, stream, n) if graphed else None
    host = ck(d.cuMemHostAlloc(copy_bytes, 0))
    dst = ck(d.cuMemAlloc(copy_bytes))
    ck(d.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, 0, 0))
    ck(d.cuStreamSynchronize(stream))

    def worker() -> None:
        with nvtx.annotate("worker_thread", domain="demo"):
            time.sleep(0.05)

    gap = 0.005  # quiet time between phases, so no phase's traffic shares a counter sample with another

    # the set-up's own traffic (pinning the copy's buffer writes ~2.5 MB of GPU page tables) must not share a
    # counter sample with the first range either: no range is open, so samples come every 5 ms (idle sampling)
    truth = os.environ.get("DEMO_TRUTH") == "1"
    read = counter_reader(dev) if truth else lambda: (0, 0)
    time.sleep(0.01)
    t0 = time.perf_counter()
    with nvtx.annotate("demo_app", domain="demo"):
        rx0, tx0 = read()
        with nvtx.annotate("eager_launches", domain="demo"):
            te = time.perf_counter()
            if graphed:
                ck(d.cuGraphLaunch(eager_exe, stream))
            else:
                for _ in range(n):
                    d.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, 0, 0)
            ck(d.cuStreamSynchronize(stream))
            eager_s = time.perf_counter() - te
        rx1, tx1 = read()
        time.sleep(gap)
        with nvtx.annotate("graph_launch", domain="demo"):
            ck(d.cuGraphLaunch(exe, stream))
            ck(d.cuStreamSynchronize(stream))
        time.sleep(gap)
        with nvtx.annotate("h2d_copy", domain="demo"):
            ck(d.cuMemcpyHtoDAsync(dst, host, copy_bytes, stream))
            ck(d.cuStreamSynchronize(stream))
        time.sleep(gap)
        th = threading.Thread(target=worker)
        with nvtx.annotate("idle", domain="demo"):
            th.start()
            time.sleep(0.2)
            th.join()
    workload_s = time.perf_counter() - t0
    print(json.dumps({"app": "python", "graphed": graphed, "workload_s": workload_s, "eager_s": eager_s, "eager_launches": n, "graph_nodes": k,
                      "copy_bytes": copy_bytes,
                      **({"truth_h2d_bytes": (rx1 - rx0) % 2**32, "truth_d2h_bytes": (tx1 - tx0) % 2**32}
                         if truth else {})}))
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
