"""A CuPy app (no torch) whose PCIe traffic per NVTX range is known: a blind oracle for `pcietrace attach`, beside
tests/apps/blind_app.py, with the same output protocol, written the way CuPy users write a program.

Written from the user's side only (README, bench/blind_attach.py, blind_app.py). The enclosing range of each phase
is CuPy's own ``cupy.cuda.nvtx.RangePush``/``RangePop`` (nvtxRangePushA, NVTX's default domain); the nested ranges
inside a phase are ``cupyx.profiler.time_range`` context managers (the same push/pop underneath). Each round runs
every phase once, in a fixed order; ``BLIND_CALLS`` rounds (default 8). Per call (MiB = 2**20 B):

- ``pinned_h2d``: 8 copies of 8 MiB from pinned host arrays (``cupyx.empty_pinned``) to device arrays with
  ``ndarray.set(host, stream=s)`` on a non-blocking ``cupy.cuda.Stream``, each inside a nested ``time_range("chunk")``
  (depth 1, no truth of its own, no row); then a device synchronize. 64 MiB H2D, 0 launches.
- ``d2h_get``: 4 device arrays of 8 MiB copied back with ``.get(stream=s, out=pinned)`` into pinned host arrays;
  synchronize. 32 MiB D2H, 0 launches.
- ``elementwise``: 500 calls of a ``cupy.ElementwiseKernel`` (``y = a * x + b`` on 1 Mi float32, every argument
  given, so nothing is allocated) and 100 of a ``cupy.RawKernel`` (a saxpy in CUDA C, explicit grid/block), one
  kernel launch each (no reductions, no memsets); synchronize. No payload, 600 launches.
- ``graph_replay``: a CUDA graph captured once, before the rounds, with CuPy's stream capture
  (``s.begin_capture()``, the same ElementwiseKernel 20 times on ``s``, ``s.end_capture()``); the phase launches it
  50 times (``g.launch(stream=s)``), then synchronizes. No payload; ``launches_expected`` null: the meta's
  ``graph_replays`` (50) are what attach should count (a replay is one graph launch; the 20 kernels inside are not
  launches, ``graph_kernels_per_replay`` in the meta).
- ``pageable_h2d``: ``cupy.asarray`` of a 16 MiB pageable NumPy array, 2 times (CuPy may stage it through a pinned
  buffer of its own: the same bytes cross PCIe); synchronize. 32 MiB H2D, 0 launches.

Every body runs twice outside any range before the rounds (kernels compiled and loaded, memory-pool and
pinned-pool blocks made, the graph uploaded by its first launches).

Truth (``BLIND_TRUTH=1``, the default), as blind_app.py: NVML PCIe counters (field 198 RX = H2D, 197 TX = D2H,
32-bit, differences mod 2**32) read OUTSIDE every range: synchronize, read, sleep 6 ms, range, sleep 6 ms, read;
each round's empty reference window (read, 6 + 6 ms, read) is subtracted. ``BLIND_TRUTH=0``: no NVML reads, same
sleeps. Output: JSON lines to ``$BLIND_OUT`` (default ``cupy_app.jsonl``): ``meta`` first, ``ref`` and ``range``
rows, ``end`` last. Device: ``$LOCAL_RANK`` (default 0).

    BLIND_OUT=cupy.jsonl python3 tests/apps/cupy_app.py
"""

from __future__ import annotations

import os
import sys

import numpy as np

import cupy
import cupyx
from cupy.cuda import nvtx
from cupyx.profiler import time_range

from truth_reads import GAP_S, Counters, MiB, rounds, settings, write_rows

H2D_CHUNKS, H2D_CHUNK_BYTES = 8, 8 * MiB
D2H_ARRAYS, D2H_BYTES = 4, 8 * MiB
PAGEABLE_COPIES, PAGEABLE_BYTES = 2, 16 * MiB
N_ELEMENTS = 1 << 20         # float32 elements of the kernels' arrays
ELEMENTWISE_LAUNCHES, RAW_LAUNCHES = 500, 100
GRAPH_KERNELS, GRAPH_REPLAYS = 20, 50
BLOCK = 256

SAXPY_SRC = r"""
extern "C" __global__
void saxpy(const float* x, const float* y, float* out, const float a, const unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = a * x[i] + y[i];
    }
}
"""


def bus_id_of(dev: int) -> str:
    """PCI bus id of CUDA device ``dev`` (CUDA's numbering: CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER apply)."""
    bus = cupy.cuda.runtime.deviceGetPCIBusId(dev)
    bus = bus.decode() if isinstance(bus, (bytes, bytearray)) else str(bus)
    return bus.split("\x00")[0].strip()


def gpu_name(dev: int) -> str:
    """The model name CUDA reports for device ``dev``."""
    name = cupy.cuda.runtime.getDeviceProperties(dev)["name"]
    return name.decode() if isinstance(name, (bytes, bytearray)) else str(name)


def sync(dev) -> None:
    """Wait for all work on ``dev`` (one device index, or a tuple of them)."""
    for d in dev if isinstance(dev, tuple) else (dev,):
        cupy.cuda.Device(d).synchronize()


def ranged(name: str, body):
    """``body`` inside a CuPy NVTX push/pop range ``name`` (popped also if ``body`` raises)."""
    def run():
        nvtx.RangePush(name)
        try:
            body()
        finally:
            nvtx.RangePop()
    return run


def run_meta(dev, truth_on: bool, calls: int, counters: Counters | None, order: list[str], **extra) -> dict:
    """The meta line written first: the process, the device (one index, or a tuple read as one), the truth
    settings, CuPy and CUDA versions, the GPU's model, the NVML index read and the order of the ranges;
    ``extra``: the app's own keys."""
    devs = dev if isinstance(dev, tuple) else (dev,)
    return {"kind": "meta", "pid": os.getpid(), "device": "+".join(map(str, devs)), "truth": truth_on,
            "calls": calls, "gap_s": GAP_S, "cupy": cupy.__version__, "numpy": np.__version__,
            "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(), "gpu": gpu_name(devs[0]),
            "nvml_index": counters.nvml_index if counters else None, "order": order, **extra}


def main() -> int:
    truth_on, calls, out_path = settings("cupy_app.jsonl", 8)
    dev = int(os.environ.get("LOCAL_RANK", "0"))
    cupy.cuda.Device(dev).use()
    s = cupy.cuda.Stream(non_blocking=True)

    # Buffers, allocated and touched before the loop (first-touch and allocator costs stay out of it).
    h2d_src = [cupyx.empty_pinned((H2D_CHUNK_BYTES,), dtype=np.uint8) for _ in range(H2D_CHUNKS)]
    for i, h in enumerate(h2d_src):
        h[...] = i + 1
    h2d_dst = [cupy.empty(H2D_CHUNK_BYTES, dtype=cupy.uint8) for _ in range(H2D_CHUNKS)]
    d2h_src = [cupy.full(D2H_BYTES, i + 1, dtype=cupy.uint8) for i in range(D2H_ARRAYS)]
    d2h_dst = [cupyx.empty_pinned((D2H_BYTES,), dtype=np.uint8) for _ in range(D2H_ARRAYS)]
    for h in d2h_dst:
        h[...] = 0
    pageable_src = np.full(PAGEABLE_BYTES // 4, 3.0, dtype=np.float32)  # plain NumPy memory: pageable
    x = cupy.ones(N_ELEMENTS, dtype=cupy.float32)
    y = cupy.zeros(N_ELEMENTS, dtype=cupy.float32)
    z = cupy.zeros(N_ELEMENTS, dtype=cupy.float32)
    gx = cupy.ones(N_ELEMENTS, dtype=cupy.float32)   # the graph's own arrays
    gy = cupy.zeros(N_ELEMENTS, dtype=cupy.float32)
    sync(dev)

    affine = cupy.ElementwiseKernel("float32 x, float32 a, float32 b", "float32 y", "y = a * x + b",
                                    "cupy_app_affine")
    saxpy = cupy.RawKernel(SAXPY_SRC, "saxpy")
    grid = ((N_ELEMENTS + BLOCK - 1) // BLOCK,)
    a32, n32 = np.float32(0.5), np.uint32(N_ELEMENTS)

    def pinned_h2d():
        for host, dst in zip(h2d_src, h2d_dst):
            with time_range("chunk"):
                dst.set(host, stream=s)
        sync(dev)

    def d2h_get():
        for src, host in zip(d2h_src, d2h_dst):
            src.get(stream=s, out=host)
        sync(dev)

    def elementwise():
        for _ in range(ELEMENTWISE_LAUNCHES):
            affine(x, 1.0001, 0.5, y)       # every argument given: one launch, no allocation
        for _ in range(RAW_LAUNCHES):
            saxpy(grid, (BLOCK,), (x, y, z, a32, n32))
        sync(dev)

    def pageable_h2d():
        kept = [cupy.asarray(pageable_src) for _ in range(PAGEABLE_COPIES)]
        sync(dev)
        del kept  # back to the memory pool, reused next call

    # Warm-up of the eager bodies, outside any range: kernels compiled and loaded, pool blocks made.
    for _ in range(2):
        for f in (pinned_h2d, d2h_get, elementwise, pageable_h2d):
            f()
    sync(dev)

    # The graph: captured once, outside every range, after its kernel is compiled (no allocation while capturing).
    with s:
        s.begin_capture()
        try:
            for _ in range(GRAPH_KERNELS):
                affine(gx, 1.0001, 0.5, gy)
        finally:
            g = s.end_capture()
    sync(dev)

    def graph_replay():
        for _ in range(GRAPH_REPLAYS):
            g.launch(stream=s)
        sync(dev)

    for _ in range(2):  # warm-up: the first launch uploads the graph
        graph_replay()
    sync(dev)

    counters = Counters(bus_id_of(dev)) if truth_on else None

    # name -> (body, payload bytes, direction, kernel launches expected (None: graph launches, see the meta))
    phases = {
        "pinned_h2d": (ranged("pinned_h2d", pinned_h2d), H2D_CHUNKS * H2D_CHUNK_BYTES, "h2d", 0),
        "d2h_get": (ranged("d2h_get", d2h_get), D2H_ARRAYS * D2H_BYTES, "d2h", 0),
        "elementwise": (ranged("elementwise", elementwise), 0, None, ELEMENTWISE_LAUNCHES + RAW_LAUNCHES),
        "graph_replay": (ranged("graph_replay", graph_replay), 0, None, None),
        "pageable_h2d": (ranged("pageable_h2d", pageable_h2d), PAGEABLE_COPIES * PAGEABLE_BYTES, "h2d", 0),
    }
    lines, loop_ns = rounds(lambda: sync(dev), counters, calls, phases)

    meta = run_meta(dev, truth_on, calls, counters, list(phases),
                    graph_replays=GRAPH_REPLAYS, graph_kernels_per_replay=GRAPH_KERNELS,
                    nested={"chunk": {"parent": "pinned_h2d", "per_call": H2D_CHUNKS,
                                      "payload_bytes": H2D_CHUNK_BYTES, "direction": "h2d", "truth": False}},
                    launch_kinds={"elementwise": {"ElementwiseKernel": ELEMENTWISE_LAUNCHES,
                                                  "RawKernel": RAW_LAUNCHES}})
    write_rows(out_path, meta, lines, loop_ns, calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
