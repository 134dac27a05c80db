"""A PyTorch app whose PCIe traffic per NVTX range is known: the blind oracle for `pcietrace attach`.

Written from the user's side only (README, `pcietrace attach --help`, the JSON attach writes), not from
attach's code or the team's own truth app, so that it does not share their blind spots.

Each round runs every range kind once, in a fixed interleaved order; ``BLIND_CALLS`` rounds (default 8).
The ranges are ``torch.cuda.nvtx`` ranges (``range_push``/``range_pop``, i.e. nvtxRangePushA, and one
``range_start``/``range_end``), so attach sees them in NVTX's default domain.

Truth (``BLIND_TRUTH=1``, the default): the GPU's NVML PCIe counters (field 198 RX = host->device = H2D,
field 197 TX = device->host = D2H; 32-bit, so differences are taken mod 2**32) are read OUTSIDE every range:
``torch.cuda.synchronize()``, read, sleep 6 ms, push ... pop, sleep 6 ms, read. A counter read is itself
~15 kB each way and the counters update every ~0.2 ms, so each round also reads an empty reference window the
same way (read, sleep 6 ms, sleep 6 ms, read) and subtracts its bytes from each range window of that round.
Nested ranges: read around the outer range only; the inner ranges get no truth.
``BLIND_TRUTH=0`` skips every NVML read but keeps the same sleeps (for runtime-overhead runs).

Output: one JSON line per range call to ``$BLIND_OUT`` (default ``blind_app.jsonl``), a first ``meta`` line
and a final ``end`` line with the loop's wall time. Device: ``cuda:$LOCAL_RANK`` (default 0).

    BLIND_OUT=truth.jsonl python3 tests/apps/blind_app.py
"""

from __future__ import annotations

import os
import sys
import time

import torch

import truth_reads
from truth_reads import GAP_S, WRAP, Counters, MiB, delta, range_row, ref_row, settings, write_rows  # noqa: F401

SMALL_COPIES, SMALL_BYTES = 2000, 4096
ELEMENTWISE_LAUNCHES = 500


def bus_id_of(dev: int) -> str:
    """PCI bus id of CUDA device ``dev`` (CUDA's numbering: CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER apply)."""
    try:
        from cuda.bindings import driver as cu

        err, bus = cu.cuDeviceGetPCIBusId(32, dev)
        if err == cu.CUresult.CUDA_SUCCESS:
            bus = bus.decode() if isinstance(bus, (bytes, bytearray)) else str(bus)
            return bus.split("\x00")[0]
    except Exception:  # no cuda.bindings, or it cannot reach the driver: ask torch
        pass
    props = torch.cuda.get_device_properties(dev)
    if all(hasattr(props, k) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
        return f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    raise RuntimeError("cannot find the GPU's PCI bus id (no cuda.bindings, torch too old): run with BLIND_TRUTH=0")


class _DeviceView:
    """A ``__cuda_array_interface__`` over mapped host memory, so torch can wrap it as a CUDA tensor."""

    def __init__(self, dptr: int, n: int, keep):
        self.keep = keep  # the host allocation must outlive the tensor
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (dptr, False),
                                         "strides": None, "version": 3}


def _synced(dev):
    """A call that synchronizes ``dev`` (one device, or a tuple of them)."""
    return lambda: [torch.cuda.synchronize(d) for d in (dev if isinstance(dev, tuple) else (dev,))]


def window(dev, counters: Counters | None, body) -> tuple[tuple[int, int] | None, int]:
    """:func:`truth_reads.window` with ``dev`` (a device, or a tuple of them) synchronized first."""
    return truth_reads.window(_synced(dev), counters, body)


def ranged(name: str, body):
    """``body`` inside an NVTX push/pop range ``name``."""
    def run():
        with torch.cuda.nvtx.range(name):
            body()
    return run


def rounds(dev, counters: Counters | None, calls: int, phases: dict) -> tuple[list[dict], int]:
    """:func:`truth_reads.rounds` with ``dev`` (a device, or a tuple of them) synchronized before each window."""
    return truth_reads.rounds(_synced(dev), counters, calls, phases)


def run_meta(dev, truth_on: bool, calls: int, counters: Counters | None, order: list[str], **extra) -> dict:
    """The meta line an app writes first: its process, its device (``dev``: one, or a tuple of devices whose
    counters are read as one), its truth settings, torch, the GPU's model, the NVML index read and the order of
    its ranges; ``extra``: the app's own keys."""
    devs = dev if isinstance(dev, tuple) else (dev,)
    return {"kind": "meta", "pid": os.getpid(), "device": "+".join(map(str, devs)), "truth": truth_on,
            "calls": calls, "gap_s": GAP_S, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(devs[0]),
            "nvml_index": counters.nvml_index if counters else None, "order": order, **extra}


def zero_copy_view(dev: torch.device, nbytes: int) -> tuple[torch.Tensor | None, dict]:
    """A CUDA float32 tensor whose storage is pinned, mapped HOST memory (a kernel reading it reads over
    PCIe), and how it was made; (None, {"skipped": reason}) where that cannot be done reliably."""
    try:
        from cuda.bindings import driver as cu
    except ImportError as e:
        return None, {"skipped": f"no cuda.bindings ({e}): torch alone has no documented host->device pointer call"}
    ok = cu.CUresult.CUDA_SUCCESS
    n = nbytes // 4
    host = torch.ones(n, dtype=torch.float32, pin_memory=True)
    try:
        err, dptr = cu.cuMemHostGetDevicePointer(host.data_ptr(), 0)
    except Exception as e:  # cuda.bindings cannot reach the driver (e.g. a version mismatch): skip, do not guess
        return None, {"skipped": f"cuda.bindings cuMemHostGetDevicePointer: {e!r}"}
    how = "torch pin_memory + cuMemHostGetDevicePointer"
    keep = host
    if err != ok:
        # Not mapped (no unified addressing?): allocate mapped memory the documented way instead.
        first = f"cuMemHostGetDevicePointer on torch's pinned tensor: {err}"
        err, hptr = cu.cuMemHostAlloc(nbytes, cu.CU_MEMHOSTALLOC_DEVICEMAP)
        if err != ok:
            return None, {"skipped": f"{first}; cuMemHostAlloc(DEVICEMAP): {err}"}
        err, dptr = cu.cuMemHostGetDevicePointer(hptr, 0)
        if err != ok:
            return None, {"skipped": f"{first}; cuMemHostGetDevicePointer on cuMemHostAlloc memory: {err}"}
        how, keep = f"cuMemHostAlloc(DEVICEMAP) + cuMemHostGetDevicePointer (after {first})", hptr
    try:
        view = torch.as_tensor(_DeviceView(int(dptr), n, keep), device=dev)
        if view.device != dev or view.data_ptr() != int(dptr):
            return None, {"skipped": f"torch wrapped the mapped pointer as {view.device} at {view.data_ptr():#x}"}
        view.fill_(1.0)  # through the device view: also checks that a kernel can touch it
        torch.cuda.synchronize(dev)
        if float(view[:4].sum().item()) != 4.0:
            return None, {"skipped": "the device view of the mapped memory read back wrong values"}
    except Exception as e:  # any failure here means no reliable zero-copy path: skip, do not guess
        return None, {"skipped": f"torch.as_tensor(__cuda_array_interface__) on mapped memory: {e!r}"}
    return view, {"how": how, "device_ptr_equals_host_ptr": int(dptr) == (host.data_ptr() if keep is host else int(keep))}


def main() -> int:
    truth_on, calls, out_path = settings("blind_app.jsonl", 8)
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(dev)
    nvtx = torch.cuda.nvtx

    # Buffers, allocated and touched before the loop (first-touch and allocator costs stay out of it).
    h2d_src = torch.full((48 * MiB,), 1, dtype=torch.uint8, pin_memory=True)
    h2d_dst = torch.empty(48 * MiB, dtype=torch.uint8, device=dev)
    d2h_src = torch.full((24 * MiB,), 2, dtype=torch.uint8, device=dev)
    d2h_dst = torch.empty(24 * MiB, dtype=torch.uint8, pin_memory=True)
    pageable_src = torch.full((40 * MiB,), 3, dtype=torch.uint8)  # not pinned: the driver stages it
    pageable_dst = torch.empty(40 * MiB, dtype=torch.uint8, device=dev)
    small_src = torch.full((SMALL_COPIES * SMALL_BYTES,), 4, dtype=torch.uint8, pin_memory=True)
    small_dst = torch.empty(SMALL_COPIES * SMALL_BYTES, dtype=torch.uint8, device=dev)
    se_src = torch.full((8 * MiB,), 5, dtype=torch.uint8, pin_memory=True)
    se_dst = torch.empty(8 * MiB, dtype=torch.uint8, device=dev)
    one = torch.zeros(1, dtype=torch.float32, device=dev)
    big = torch.empty(256 * MiB // 4, dtype=torch.float32, device=dev)
    zc, zc_info = zero_copy_view(dev, 32 * MiB)
    zc_out = torch.empty(32 * MiB // 4, dtype=torch.float32, device=dev)

    def h2d_pinned():
        h2d_dst.copy_(h2d_src, non_blocking=True)
        torch.cuda.synchronize(dev)

    def d2h_pinned():
        d2h_dst.copy_(d2h_src, non_blocking=True)
        torch.cuda.synchronize(dev)

    def h2d_pageable():
        pageable_dst.copy_(pageable_src)
        torch.cuda.synchronize(dev)

    def many_small():
        for i in range(0, SMALL_COPIES * SMALL_BYTES, SMALL_BYTES):
            small_dst[i:i + SMALL_BYTES].copy_(small_src[i:i + SMALL_BYTES], non_blocking=True)
        torch.cuda.synchronize(dev)

    def zero_copy():
        torch.add(zc, 1.0, out=zc_out)  # one elementwise kernel reading 32 MiB of host memory over PCIe
        torch.cuda.synchronize(dev)

    def elementwise():
        for _ in range(ELEMENTWISE_LAUNCHES):
            one.add_(1.0)
        torch.cuda.synchronize(dev)

    def memset():
        big.zero_()
        torch.cuda.synchronize(dev)

    def idle():
        time.sleep(0.015)

    def start_end_copy():
        se_dst.copy_(se_src, non_blocking=True)
        torch.cuda.synchronize(dev)

    # Warm-up, outside any range: every operation once (kernels loaded, copy paths initialised).
    for f in (h2d_pinned, d2h_pinned, h2d_pageable, many_small, elementwise, memset, start_end_copy):
        f()
    if zc is not None:
        zero_copy()
    torch.cuda.synchronize(dev)

    counters = Counters(bus_id_of(dev.index)) if truth_on else None

    # (name, body, payload bytes, direction, kernel launches expected (None: not known exactly))
    kinds = [
        ("h2d_pinned_48MiB", h2d_pinned, 48 * MiB, "h2d", 0),
        ("elementwise_500", elementwise, 0, None, ELEMENTWISE_LAUNCHES),
        ("d2h_pinned_24MiB", d2h_pinned, 24 * MiB, "d2h", 0),
        ("idle_15ms", idle, 0, None, 0),
        ("h2d_pageable_40MiB", h2d_pageable, 40 * MiB, "h2d", 0),
        ("memset_only", memset, 0, None, 1),  # zero_() on CUDA is one fill kernel
        ("many_small_h2d", many_small, SMALL_COPIES * SMALL_BYTES, "h2d", 0),
    ]
    if zc is not None:
        kinds.append(("zero_copy_read", zero_copy, 32 * MiB, "h2d", 1))
    order = [k[0] for k in kinds] + ["start_end_copy", "step_nested"]

    lines: list[dict] = []

    inner_ns: dict[str, int] = {}

    def nested():
        nvtx.range_push("step_nested")
        for name, f in (("inner_h2d", h2d_pinned), ("inner_d2h", d2h_pinned)):
            t0 = time.perf_counter_ns()
            nvtx.range_push(name)
            f()
            nvtx.range_pop()
            inner_ns[name] = time.perf_counter_ns() - t0
        nvtx.range_pop()

    def pushed(name, f):
        def body():
            nvtx.range_push(name)
            f()
            nvtx.range_pop()
        return body

    def started():
        rid = nvtx.range_start("start_end_copy")
        start_end_copy()
        nvtx.range_end(rid)

    bodies = {name: pushed(name, f) for name, f, *_ in kinds}
    bodies["start_end_copy"] = started
    bodies["step_nested"] = nested
    expect = {name: (nbytes, direction, launches) for name, _, nbytes, direction, launches in kinds}
    expect["start_end_copy"] = (8 * MiB, "h2d", 0)
    expect["step_nested"] = (72 * MiB, "h2d+d2h", 0)
    nested_expect = {"inner_h2d": (48 * MiB, "h2d", 0), "inner_d2h": (24 * MiB, "d2h", 0)}

    t_loop0 = time.perf_counter_ns()
    for rnd in range(calls):
        ref, _ = window(dev, counters, lambda: None)  # the empty reference window of this round
        lines.append(ref_row(rnd, ref))
        for name in order:
            raw, ns = window(dev, counters, bodies[name])
            lines.append(range_row(name, rnd, raw, ref, ns, *expect[name]))
            if name == "step_nested":
                for inner, (ib, idir, il) in nested_expect.items():
                    lines.append({"kind": "range", "name": inner, "call": rnd, "depth": 1, "truth": False,
                                  "parent": "step_nested", "h2d_bytes": None, "d2h_bytes": None,
                                  "duration_ns": inner_ns[inner], "payload_bytes": ib, "direction": idir,
                                  "launches_expected": il})
    loop_ns = time.perf_counter_ns() - t_loop0

    meta = run_meta(dev, truth_on, calls, counters, order, zero_copy=zc_info)
    write_rows(out_path, meta, lines, loop_ns, calls)
    if zc is None:
        print(f"blind_app: zero_copy_read skipped: {zc_info['skipped']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
