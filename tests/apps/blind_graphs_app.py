"""A PyTorch app with CUDA graphs, streams and threads whose PCIe traffic per NVTX range is known: a blind
oracle for `pcietrace attach`, beside tests/apps/blind_app.py, with the same output protocol.

Written from the user's side only (README, `pcietrace attach --help`, bench/blind_attach.py, blind_app.py).
``torch.cuda.nvtx`` ranges (NVTX's default domain); each round runs every range once, in a fixed order;
``BLIND_CALLS`` rounds (default 8). Payloads are per call (MiB = 2**20 B):

- ``graph_replay_h2d``: a ``torch.cuda.CUDAGraph`` captured once, before the rounds, whose body copies a 16 MiB
  pinned host tensor to the device (``copy_(..., non_blocking=True)``) and runs one ``add_``; the range replays
  it 8 times, then synchronizes. 128 MiB H2D. Launches: 8 graph launches + the eager kernels torch's
  ``replay()`` itself launches (2 ``fill_`` of its RNG seed/offset tensors per replay in some torch versions,
  none in others: counted at warm-up, see below).
- ``graph_replay_d2h``: the same, device -> pinned host. 128 MiB D2H.
- ``side_stream_overlap``: a 32 MiB pinned H2D copy on a side ``torch.cuda.Stream`` while the default stream runs
  64 in-place elementwise ops (``add_``/``mul_`` by a Python float on a contiguous 64 MiB float32 CUDA tensor:
  one kernel each); streams joined, synchronized. 32 MiB H2D, 64 launches.
- ``pageable_d2h_cpu``: ``.cpu()`` of a 24 MiB device tensor (pageable D2H, then synchronize). 24 MiB D2H, 0.
- ``capture_only``: captures a new graph of 50 ``add_`` kernels, no replay (destroyed after the range). No
  payload; launches: 0 + torch's eager kernels at capture begin (2 ``fill_`` in some versions, counted at
  warm-up); the 50 are captured (``captured_expected``), in neither count.
- ``cross_thread``: ``range_start`` on the main thread; a worker thread copies 96 MiB pinned H2D, synchronizes
  and calls ``range_end``; the main thread joins. 96 MiB H2D, 0 launches (start/end ranges count the process's).
- ``tiny_ranges_outer``: 50 inner push/pop ranges ``tiny_h2d_1MiB`` (depth 1, no truth of their own), each a
  1 MiB pinned H2D copy + stream synchronize. 50 MiB H2D outer, 1 MiB per inner call, 0 launches.
- ``idle_10ms``: sleeps 10 ms. Truth ~0 (the floor check).

``launches_expected``: what attach should count per call, eager kernel launches + graph launches (a replay is
one). torch's own graph bookkeeping launches vary by version, so the app counts them at warm-up, outside every
range, under a ``TorchDispatchMode`` (it sees every aten op, also those torch's C++ calls): eager ``fill_``/
``zero_`` (one kernel each) count, ops that launch nothing are allowed, any other op makes it null (unknown).

Truth (``BLIND_TRUTH=1``, the default), as blind_app.py: NVML PCIe counters (field 198 RX = H2D, 197 TX = D2H,
32-bit) read OUTSIDE every range: synchronize, read, sleep 6 ms, range, sleep 6 ms, read; each round's empty
reference window (read, 6 + 6 ms, read) is subtracted. Inner ranges get no truth. ``BLIND_TRUTH=0``: no NVML
reads, same sleeps. Output: JSON lines to ``$BLIND_OUT`` (default ``blind_graphs_app.jsonl``): ``meta`` first,
``ref`` and ``range`` rows, ``end`` last. Device ``cuda:$LOCAL_RANK`` (default 0).

    BLIND_OUT=truth.jsonl python3 tests/apps/blind_graphs_app.py
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable

import torch

# the truth as blind_app.py takes it: its NVML reader, its windows 6 ms away, its rows (this folder is on sys.path as a script)
from blind_app import Counters, bus_id_of, range_row, ref_row, run_meta, settings, window, write_rows

MiB = 1 << 20
GRAPH_MIB, REPLAYS = 16, 8   # 8 replays, not 4: 128 MiB keeps the range >= 2 ms on a Gen5 x16 link
OVERLAP_MIB, COMPUTE_OPS, COMPUTE_MIB = 32, 64, 64
PAGEABLE_MIB, CROSS_MIB, TINY = 24, 96, 50
CAPTURED = 50
KERNEL_OPS = {"aten.fill_.Scalar", "aten.zero_.default"}  # one fill kernel each on a contiguous CUDA tensor
NO_KERNEL_OPS = {"aten.empty.memory_format", "aten.empty_strided.default", "aten.detach.default",
                 "aten.alias.default", "aten.view.default"}


def graph_ctx(g: torch.cuda.CUDAGraph):
    """torch.cuda.graph in thread_local mode where torch has it (other threads' CUDA calls cannot break it)."""
    try:
        return torch.cuda.graph(g, capture_error_mode="thread_local")
    except TypeError:  # torch without capture_error_mode
        return torch.cuda.graph(g)


def count_kernels(fn: Callable[[], None]) -> dict:
    """Run ``fn`` under a TorchDispatchMode: the kernels its eager aten ops launch (None where an op of unknown
    kernel count ran eagerly), how many aten ops it sent into a capture, and every op seen."""
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError as e:
        fn()
        return {"eager_kernels": None, "captured_ops": None, "ops": [], "error": repr(e)}
    seen: list[tuple[str, bool]] = []

    class _Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append((str(func), bool(torch.cuda.is_current_stream_capturing())))
            return func(*args, **(kwargs or {}))

    try:
        with _Mode():
            fn()
    except Exception as e:  # the mode failed on this torch: the count is unknown, not guessed
        return {"eager_kernels": None, "captured_ops": None, "ops": seen, "error": repr(e)}
    eager = [op for op, capturing in seen if not capturing]
    unknown = sorted({op for op in eager if op not in KERNEL_OPS | NO_KERNEL_OPS})
    return {"eager_kernels": None if unknown else sum(op in KERNEL_OPS for op in eager),
            "captured_ops": sum(capturing for _, capturing in seen), "ops": seen, "unknown": unknown}


def main() -> int:
    truth_on, calls, out_path = settings("blind_graphs_app.jsonl", 8)
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(dev)
    nvtx = torch.cuda.nvtx
    main_stream = torch.cuda.current_stream(dev)  # the default stream: ranges run their eager work here
    side = torch.cuda.Stream(dev)

    # Buffers, allocated and touched before the loop (first-touch, pinning and allocator costs stay out of it).
    def pinned(mib: int, v: int) -> torch.Tensor:
        return torch.full((mib * MiB,), v, dtype=torch.uint8, pin_memory=True)

    def on_dev(mib: int, v: int = 0) -> torch.Tensor:
        return torch.full((mib * MiB,), v, dtype=torch.uint8, device=dev)

    gh_src, gh_dst = pinned(GRAPH_MIB, 1), on_dev(GRAPH_MIB)
    gd_src, gd_dst = on_dev(GRAPH_MIB, 2), pinned(GRAPH_MIB, 0)
    g_small = torch.zeros(1024, dtype=torch.float32, device=dev)
    ov_src, ov_dst = pinned(OVERLAP_MIB, 3), on_dev(OVERLAP_MIB)
    ov_x = torch.zeros(COMPUTE_MIB * MiB // 4, dtype=torch.float32, device=dev)  # resident: no PCIe traffic
    pg_src = on_dev(PAGEABLE_MIB, 4)
    ct_src, ct_dst = pinned(CROSS_MIB, 5), on_dev(CROSS_MIB)
    tiny_src, tiny_dst = pinned(TINY, 6), on_dev(TINY)
    tiny_pairs = [(tiny_dst[i * MiB:(i + 1) * MiB], tiny_src[i * MiB:(i + 1) * MiB]) for i in range(TINY)]
    cap_x = torch.zeros(1024, dtype=torch.float32, device=dev)

    def h2d_body() -> None:
        gh_dst.copy_(gh_src, non_blocking=True)  # non_blocking: a blocking copy would synchronize inside capture
        g_small.add_(1.0)

    def d2h_body() -> None:
        gd_dst.copy_(gd_src, non_blocking=True)
        g_small.add_(1.0)

    def capture(body: Callable[[], None]) -> torch.cuda.CUDAGraph:
        # torch's recipe: run the body once eagerly on a side stream, then capture it
        side.wait_stream(main_stream)
        with torch.cuda.stream(side):
            body()
        main_stream.wait_stream(side)
        torch.cuda.synchronize(dev)
        g = torch.cuda.CUDAGraph()
        with graph_ctx(g):
            body()
        torch.cuda.synchronize(dev)
        return g

    g_h2d, g_d2h = capture(h2d_body), capture(d2h_body)

    def replays(g: torch.cuda.CUDAGraph) -> Callable[[], None]:
        def body() -> None:
            for _ in range(REPLAYS):
                g.replay()  # one cudaGraphLaunch on the current (default) stream
            torch.cuda.synchronize(dev)
        return body

    def overlap() -> None:
        side.wait_stream(main_stream)  # an event record + stream wait: no kernel
        with torch.cuda.stream(side):
            ov_dst.copy_(ov_src, non_blocking=True)  # a memcpy on the side stream, no kernel
        for i in range(COMPUTE_OPS):  # in place by a Python float on a contiguous float32 tensor: one kernel each
            if i % 2:
                ov_x.mul_(0.5)
            else:
                ov_x.add_(1.0)
        main_stream.wait_stream(side)
        torch.cuda.synchronize(dev)

    def pageable_d2h() -> None:
        pg_src.cpu()  # pageable destination: the driver stages the copy, then torch waits for the stream
        torch.cuda.synchronize(dev)

    held: list[torch.cuda.CUDAGraph] = []  # graphs captured in a range, destroyed after its window

    def capture_only() -> None:
        g = torch.cuda.CUDAGraph()
        with graph_ctx(g):
            for _ in range(CAPTURED):
                cap_x.add_(1.0)  # captured: a node, nothing runs
        held.append(g)

    thread_errors: list[BaseException] = []

    def cross_worker(rid: int | None) -> None:
        try:
            torch.cuda.set_device(dev)  # a new thread starts on device 0
            ct_dst.copy_(ct_src, non_blocking=True)
            torch.cuda.synchronize(dev)
        except BaseException as e:  # re-raised on the main thread
            thread_errors.append(e)
        finally:
            if rid is not None:
                nvtx.range_end(rid)

    def cross_thread(rid_name: str | None) -> None:
        rid = nvtx.range_start(rid_name) if rid_name else None
        t = threading.Thread(target=cross_worker, args=(rid,), name="blind-cross-thread")
        t.start()
        t.join()
        if thread_errors:
            raise thread_errors[0]

    inner_ns: list[int] = []

    def tiny(push: bool) -> None:
        inner_ns.clear()
        for dst, src in tiny_pairs:
            t0 = time.perf_counter_ns()
            if push:
                nvtx.range_push("tiny_h2d_1MiB")
            dst.copy_(src, non_blocking=True)
            main_stream.synchronize()
            if push:
                nvtx.range_pop()
            inner_ns.append(time.perf_counter_ns() - t0)

    # Warm-up, outside every range: every path once (kernels loaded, graphs uploaded, copy paths initialised),
    # and torch's own eager launches around replay and capture counted (see the module docstring).
    for g in (g_h2d, g_d2h):
        g.replay()
        g.replay()
    torch.cuda.synchronize(dev)
    rep_h2d, rep_d2h = count_kernels(g_h2d.replay), count_kernels(g_d2h.replay)
    torch.cuda.synchronize(dev)
    cap = count_kernels(capture_only)
    capture_only()
    held.clear()
    for f in (overlap, pageable_d2h):
        f()
    cross_thread(None)
    tiny(push=False)
    torch.cuda.synchronize(dev)

    counters = Counters(bus_id_of(dev.index)) if truth_on else None

    def graph_launches(k: int | None) -> int | None:  # per call: REPLAYS graph launches + k eager per replay
        return None if k is None else REPLAYS * (1 + k)

    def pushed(name: str, f: Callable[[], None]) -> Callable[[], None]:
        def body() -> None:
            nvtx.range_push(name)
            f()
            nvtx.range_pop()
        return body

    def tiny_outer() -> None:
        nvtx.range_push("tiny_ranges_outer")
        tiny(push=True)
        nvtx.range_pop()

    # (name, body, payload bytes, direction, launches expected per call (None: not known exactly), extra fields)
    kinds: list[tuple[str, Callable[[], None], int, str | None, int | None, dict]] = [
        ("graph_replay_h2d", pushed("graph_replay_h2d", replays(g_h2d)), REPLAYS * GRAPH_MIB * MiB, "h2d",
         graph_launches(rep_h2d["eager_kernels"]), {"graph_launches_expected": REPLAYS}),
        ("side_stream_overlap", pushed("side_stream_overlap", overlap), OVERLAP_MIB * MiB, "h2d", COMPUTE_OPS, {}),
        ("graph_replay_d2h", pushed("graph_replay_d2h", replays(g_d2h)), REPLAYS * GRAPH_MIB * MiB, "d2h",
         graph_launches(rep_d2h["eager_kernels"]), {"graph_launches_expected": REPLAYS}),
        ("idle_10ms", pushed("idle_10ms", lambda: time.sleep(0.010)), 0, None, 0, {}),
        ("pageable_d2h_cpu", pushed("pageable_d2h_cpu", pageable_d2h), PAGEABLE_MIB * MiB, "d2h", 0, {}),
        ("capture_only", pushed("capture_only", capture_only), 0, None, cap["eager_kernels"],
         {"captured_expected": CAPTURED if cap["captured_ops"] == CAPTURED else None}),
        ("cross_thread", lambda: cross_thread("cross_thread"), CROSS_MIB * MiB, "h2d", 0, {"range_kind": "start"}),
        ("tiny_ranges_outer", tiny_outer, TINY * MiB, "h2d", 0, {}),
    ]

    lines: list[dict] = []

    time.sleep(0.020)  # quiet between the warm-up and the first range
    t_loop0 = time.perf_counter_ns()
    for rnd in range(calls):
        ref, _ = window(dev, counters, lambda: None)  # the empty reference window of this round
        lines.append(ref_row(rnd, ref))
        for name, body, nbytes, direction, launches, extra in kinds:
            raw, ns = window(dev, counters, body)
            held.clear()  # capture_only's graph is destroyed here, outside its window
            lines.append({**range_row(name, rnd, raw, ref, ns, nbytes, direction, launches), **extra})
            if name == "tiny_ranges_outer":
                for ins in inner_ns:
                    lines.append({"kind": "range", "name": "tiny_h2d_1MiB", "call": rnd, "depth": 1,
                                  "truth": False, "parent": name, "h2d_bytes": None, "d2h_bytes": None,
                                  "duration_ns": ins, "payload_bytes": MiB, "direction": "h2d",
                                  "launches_expected": 0})
    loop_ns = time.perf_counter_ns() - t_loop0

    def summary(c: dict) -> dict:  # the counts and the eager ops seen, for the meta line
        return {**{k: c.get(k) for k in ("eager_kernels", "captured_ops", "unknown", "error")},
                "eager_ops": sorted({op for op, capturing in c["ops"] if not capturing})}

    meta = run_meta(dev, truth_on, calls, counters, [k[0] for k in kinds],
                    torch_eager_kernels={"replay_h2d": summary(rep_h2d), "replay_d2h": summary(rep_d2h),
                                         "capture": summary(cap)})
    unknown = [k[0] for k in kinds if k[4] is None]
    if unknown:
        meta["launches_unknown"] = unknown
        print(f"blind_graphs_app: launches not known exactly for {unknown}: {meta['torch_eager_kernels']}",
              file=sys.stderr)
    write_rows(out_path, meta, lines, loop_ns, calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
