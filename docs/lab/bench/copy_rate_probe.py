"""Probe (run on a GPU machine; not a test): how often a pinned host->device copy runs slow, and at which PCIe
link generation and width.

Seen on the H100 (2026-11-22): one 256 MiB pinned copy took 4.9 ms in 20 of 24 app runs and 5.6-11.2 ms in 4,
and a recorded slow one moved a steady 24-26 GB/s for 11 ms where its neighbours moved 50-65 GB/s (about
Gen4 x16 against Gen5 x16). The suspect was the link's dynamic speed, and the question whether it happens
without pcietrace too. Answer (H100, eighth session, docs/lab/reports/copy-rate-20261122/): it does, with no NVML read
in the process at all, in episodes of ~50-100 ms; NVML saw Gen5 x16 before and after every slow copy.
This times ``--copies`` copies of ``--mib`` MiB, ``--gap-ms`` of idle time apart (the demo apps' 5 ms), and
reads NVML's current link generation and width right before and after each one (``--no-link``: not at all,
since those reads are driver calls of their own). Prints each slow copy (below
``--slow`` of the median rate) with the link it saw, and the rate distribution. Run it alone and under
attach, in one call:

    python3 docs/lab/bench/copy_rate_probe.py [--copies 60] [--mib 256] [--gap-ms 5] [--gpu 0] [--no-link]
    python3 -m pcietrace attach --no-calibrate -o /tmp/cr -- python3 docs/lab/bench/copy_rate_probe.py
"""

from __future__ import annotations

import argparse
import statistics
import time

from pcietrace.collectors import nvml
from pcietrace.device import cuda


def link(idx: int) -> str:
    """The link as NVML reports it now, e.g. "Gen5 x16"."""
    h = nvml.handle(idx)
    gen = nvml.query_or("?", "nvmlDeviceGetCurrPcieLinkGeneration", h)
    width = nvml.query_or("?", "nvmlDeviceGetCurrPcieLinkWidth", h)
    return f"Gen{gen} x{width}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=60)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--gap-ms", type=float, default=5.0, help="idle time before each copy (ms)")
    ap.add_argument("--gpu", type=int, default=0, help="CUDA device number")
    ap.add_argument("--slow", type=float, default=0.75, help="a copy is slow below this fraction of the median rate")
    ap.add_argument("--no-link", action="store_true", help="do not read the link generation and width")
    a = ap.parse_args()
    gpu = cuda.Gpu(a.gpu)
    idx = nvml.index_for_bus_id(gpu.bus_id)
    nbytes = a.mib << 20
    src, dst = gpu.alloc_pinned(nbytes), gpu.alloc_device(nbytes)
    gpu.copy_h2d(dst, src, nbytes)  # first touch, not timed
    gpu.synchronize()
    rows = []
    for _ in range(a.copies):
        time.sleep(a.gap_ms / 1e3)
        before = "-" if a.no_link else link(idx)
        t0 = time.perf_counter_ns()
        gpu.copy_h2d(dst, src, nbytes)
        gpu.synchronize()
        t1 = time.perf_counter_ns()
        after = "-" if a.no_link else link(idx)
        rows.append((nbytes / (t1 - t0), (t1 - t0) / 1e6, before, after))
    med = statistics.median(r[0] for r in rows)
    slow = [(i, r) for i, r in enumerate(rows) if r[0] < a.slow * med]
    info = nvml.gpu_info(idx)
    print(f"GPU {a.gpu} ({gpu.name}, {gpu.bus_id}), {a.copies} copies of {a.mib} MiB, {a.gap_ms:g} ms apart; "
          f"max link Gen{info.pcie_gen_max} x{info.pcie_width_max}")
    ms = sorted(r[1] for r in rows)
    print(f"rate median {med:.1f} GB/s; ms per copy: min {ms[0]:.2f}, median {statistics.median(ms):.2f}, "
          f"P95 {ms[int(0.95 * (len(ms) - 1))]:.2f}, max {ms[-1]:.2f}")
    print(f"slow (< {a.slow:g} x median rate): {len(slow)} of {len(rows)}")
    for i, (gbps, t_ms, before, after) in slow:
        print(f"  copy {i}: {t_ms:.2f} ms, {gbps:.1f} GB/s, link before {before}, after {after}")
    seen = sorted({r[2] for r in rows} | {r[3] for r in rows})
    print(f"links seen: {', '.join(seen)}")
    gpu.free_pinned(src)
    gpu.free_device(dst)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
