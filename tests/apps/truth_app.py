"""An app of known PCIe traffic with its own truth: NVTX ranges whose counter bytes the app itself reads
through NVML right after each push and right before each pop (its GPU only), written as JSON lines to
$TRUTH_OUT. Run it alone (the truth) and under `pcietrace attach` (ours): bench/attach_truth.py compares.

    python3 truth_app.py [--torch] [--reps N]     (under torchrun: one GPU per rank)
    python3 truth_app.py --threads [--reps N]     (one process, one thread per GPU, cuda.bindings: "rank" = GPU)
Ranges (each N times): idle_20ms, eager_3000 (3,000 empty launches + sync), h2d_64MiB (~1.5 ms),
h2d_256MiB, d2h_64MiB, graph (a 1,000-node graph once; --torch: 50 replays of a captured 60-kernel graph),
capture_100 (100 kernels captured into a new graph: no launch runs). Each truth row also holds the launches
the range makes (``launches``: eager, graph, and captured, i.e. made into a stream being captured); the graphs
replayed in "graph" are captured once at set-up, outside every range.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

import nvtx
import pynvml

MiB = 1 << 20


#: TRUTH_READS: unset = the truth reads inside each range (right after its push, right before its pop); "0" = no
#: truth reads (overhead and idle-zero runs); "outside" = each range's reads sit OUTSIDE it, OUTSIDE_GAP_S before
#: its push and after its pop, and every round adds a range "gap_ref" with no work, read the same way: a range's
#: own bytes are then its window minus gap_ref's (the reads' share of the window and the gaps' traffic), and the
#: NVTX range holds none of the app's reads (bench/attach_truth.py --reads-outside).
READS = os.environ.get("TRUTH_READS", "inside")
#: Longer than attach's idle sampling interval (5 ms), so a sample falls between a truth read and the range edge.
OUTSIDE_GAP_S = 0.006


class Truth:
    """NVML counters of one GPU, read around every range: inside it (after its push, before its pop) or, with
    TRUTH_READS=outside, a gap outside it (see :data:`READS`)."""

    def __init__(self, bus_id: str, rank: int) -> None:
        pynvml.nvmlInit()
        self.h = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id.encode())
        self.index = pynvml.nvmlDeviceGetIndex(self.h)
        self.rank, self.rows = rank, []
        self.ids = {"pid": os.getpid(), "tid": threading.get_native_id()}

    def read(self) -> tuple[int, int, int]:
        v = pynvml.nvmlDeviceGetFieldValues(self.h, [197, 198])
        return time.monotonic_ns(), v[0].value.uiVal, v[1].value.uiVal

    def range(self, name: str, fn, launches: dict[str, int] | None = None) -> None:
        """``fn`` inside NVTX range ``name``; ``launches``: the kernel launches it makes (``eager``, ``graph``,
        ``captured``; absent: none)."""
        launches = {"eager": 0, "graph": 0, "captured": 0, **(launches or {})}
        if READS == "0":  # overhead runs: the same work without the truth's own reads
            t0 = time.monotonic_ns()
            with nvtx.annotate(name, domain="truth"):
                fn()
            self.rows.append({**self.ids, "rank": self.rank, "nvml_index": self.index, "range": name,
                              "dur_ns": time.monotonic_ns() - t0, "h2d": None, "d2h": None, "launches": launches})
            return
        outside = READS == "outside"  # the reads a gap outside the range: it holds none of their bytes
        if outside:
            t0, tx0, rx0 = self.read()
            time.sleep(OUTSIDE_GAP_S)
        with nvtx.annotate(name, domain="truth"):
            if not outside:
                t0, tx0, rx0 = self.read()
            fn()
            if not outside:
                t1, tx1, rx1 = self.read()
        if outside:
            time.sleep(OUTSIDE_GAP_S)
            t1, tx1, rx1 = self.read()
        self.rows.append({**self.ids, "rank": self.rank, "nvml_index": self.index, "range": name,
                          "dur_ns": t1 - t0, "h2d": (rx1 - rx0) % 2**32, "d2h": (tx1 - tx0) % 2**32,
                          "launches": launches, "reads": READS})


#: Kernels the "capture_100" range captures into a graph (launches that run nothing).
CAPTURED_KERNELS = 100


def torch_work(dev: int):
    import torch

    torch.cuda.set_device(dev)
    x = torch.zeros(1, device="cuda")
    host = torch.empty(256 * MiB, dtype=torch.uint8).pin_memory()
    d = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    sync = torch.cuda.synchronize

    def eager():
        for _ in range(3000):
            x.add_(1)
        sync()

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            x.add_(1)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(60):
            x.add_(1)

    def graphed():
        for _ in range(50):
            g.replay()
        sync()
    graphed.launches = 50

    def capture():
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            for _ in range(CAPTURED_KERNELS):
                x.add_(1)
    # torch's capture may add kernels of its own (e.g. RNG-state fills where its version registers the
    # generator) and launch a few eager ones beside it (2 per call on the H100), so both are "at least"
    capture.exact = {"captured_exact": False, "eager_exact": False}

    copies = {"h2d_64MiB": lambda: (d[:64 * MiB].copy_(host[:64 * MiB], non_blocking=True), sync()),
              "h2d_256MiB": lambda: (d.copy_(host, non_blocking=True), sync()),
              "d2h_64MiB": lambda: (host[:64 * MiB].copy_(d[:64 * MiB], non_blocking=True), sync())}
    return eager, graphed, capture, copies, None  # bus id: from torch's device properties in main()


def bindings_work(dev: int):
    from cuda.bindings import driver as drv, nvrtc

    def ok(r):
        assert int(r[0]) == 0, r
        return r[1] if len(r) == 2 else r[1:]

    ok(drv.cuInit(0))
    cu = ok(drv.cuDeviceGet(dev))
    ctx = ok(drv.cuDevicePrimaryCtxRetain(cu))
    ok(drv.cuCtxSetCurrent(ctx))
    major = ok(drv.cuDeviceGetAttribute(drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, cu))
    minor = ok(drv.cuDeviceGetAttribute(drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, cu))
    prog = ok(nvrtc.nvrtcCreateProgram(b'extern "C" __global__ void k(){}', b"k.cu", 0, [], []))
    ok(nvrtc.nvrtcCompileProgram(prog, 1, [f"--gpu-architecture=sm_{major}{minor}".encode()]))
    cubin = b" " * ok(nvrtc.nvrtcGetCUBINSize(prog))
    ok(nvrtc.nvrtcGetCUBIN(prog, cubin))
    fn = ok(drv.cuModuleGetFunction(ok(drv.cuModuleLoadData(cubin)), b"k"))
    st = ok(drv.cuStreamCreate(0))
    launch = lambda: drv.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, st, 0, 0)
    host = ok(drv.cuMemHostAlloc(256 * MiB, 0))
    d = ok(drv.cuMemAlloc(256 * MiB))
    sync = lambda: ok(drv.cuStreamSynchronize(st))

    def eager():
        for _ in range(3000):
            launch()
        sync()

    ok(drv.cuStreamBeginCapture(st, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
    for _ in range(1000):
        launch()
    exe = ok(drv.cuGraphInstantiate(ok(drv.cuStreamEndCapture(st)), 0))

    def graphed():
        ok(drv.cuGraphLaunch(exe, st))
        sync()
    graphed.launches = 1

    def capture():
        ok(drv.cuStreamBeginCapture(st, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        for _ in range(CAPTURED_KERNELS):
            launch()
        ok(drv.cuGraphDestroy(ok(drv.cuStreamEndCapture(st))))

    copies = {"h2d_64MiB": lambda: (drv.cuMemcpyHtoDAsync(d, host, 64 * MiB, st), sync()),
              "h2d_256MiB": lambda: (drv.cuMemcpyHtoDAsync(d, host, 256 * MiB, st), sync()),
              "d2h_64MiB": lambda: (drv.cuMemcpyDtoHAsync(host, d, 64 * MiB, st), sync())}
    bus = ok(drv.cuDeviceGetPCIBusId(32, cu)).split(b"\0", 1)[0].decode()
    return eager, graphed, capture, copies, bus


def ranges(truth: Truth, work, reps: int, barrier=None) -> tuple[int, int]:
    """The timed loop: every range ``reps`` times (``barrier()`` before each round: ranks start together).
    Returns (one-time set-up ns, loop wall ns)."""
    eager, graphed, capture, copies = work
    eager(), graphed(), capture(), [c() for c in copies.values()]  # warm every path outside the ranges
    t_init = time.monotonic_ns()
    if barrier:  # NCCL sets up its communicator at the first collective: a one-time cost, timed on its own
        barrier()
    init_ns = time.monotonic_ns() - t_init
    t_start = time.monotonic_ns()
    for _ in range(reps):
        if barrier:
            barrier()
        if READS == "outside":
            truth.range("gap_ref", lambda: None)
        truth.range("idle_20ms", lambda: time.sleep(0.02))
        truth.range("eager_3000", eager, {"eager": 3000})
        for name, c in copies.items():
            truth.range(name, c)
        truth.range("graph", graphed, {"graph": graphed.launches})
        truth.range("capture_100", capture, {"captured": CAPTURED_KERNELS, **getattr(capture, "exact", {})})
    return init_ns, time.monotonic_ns() - t_start


def write(rows: list[dict], summary: dict) -> None:
    with open(os.environ.get("TRUTH_OUT", "truth.jsonl"), "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        f.write(json.dumps(summary) + "\n")


def threads_main(reps: int) -> None:
    """One thread per GPU in one process (as a data-parallel job with threads does): each thread makes its
    GPU's primary context current, runs its ranges and reads its own GPU's counters."""
    from cuda.bindings import driver as drv

    drv.cuInit(0)
    n = int(drv.cuDeviceGetCount()[1])
    barrier, lock, errors = threading.Barrier(n), threading.Lock(), []

    def worker(dev: int) -> None:
        try:
            eager, graphed, capture, copies, bus = bindings_work(dev)
            with lock:  # NVML set-up once at a time; reads inside ranges are what they are
                truth = Truth(bus, dev)
            init_ns, wall_ns = ranges(truth, (eager, graphed, capture, copies), reps, barrier.wait)
            with lock:
                write(truth.rows, {**truth.ids, "rank": dev, "wall_ns": wall_ns, "init_ns": init_ns})
        except BaseException as exc:  # a thread's failure fails the app (and the bench), not silently
            errors.append(exc)
            barrier.abort()

    ts = [threading.Thread(target=worker, args=(d,), name=f"gpu{d}") for d in range(n)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    if errors:
        raise errors[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--torch", action="store_true")
    ap.add_argument("--threads", action="store_true", help="one process, one thread per GPU (cuda.bindings)")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    if a.threads:
        return threads_main(a.reps)
    rank, dev = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    dist = None
    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
        import torch.distributed as dist

        import torch
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", device_id=torch.device("cuda", dev))
    eager, graphed, capture, copies, bus = torch_work(dev) if a.torch else bindings_work(dev)
    if bus is None:
        import torch
        props = torch.cuda.get_device_properties(dev)
        bus = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    truth = Truth(bus, rank)  # TRUTH_READS=0: no reads in ranges (for runtime-overhead runs)
    init_ns, wall_ns = ranges(truth, (eager, graphed, capture, copies), a.reps, dist.barrier if dist else None)
    write(truth.rows, {**truth.ids, "rank": rank, "wall_ns": wall_ns, "init_ns": init_ns})
    if dist:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
