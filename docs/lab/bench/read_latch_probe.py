"""When, inside one NVML counter read, does the value it returns apply? (run on a GPU machine; not a test)

A read of the PCIe counters (fields 197/198) takes 0.3 ms on an idle GPU and up to ~1.3 ms while the link is
busy (blind oracle, H100: a zero-copy kernel's range). The sampler stamps each value at the read's midpoint.
If the value is latched elsewhere in the read, bytes near a range's edge land on the wrong side of it.

This probe runs one long, steady transfer at a time (a 1 GiB pinned H2D copy, a 1 GiB D2H copy, a kernel
reading 1 GiB of mapped host memory) and reads the counters back to back from the host meanwhile. The transfer's
progress is taken as linear between its launch and its end (host time after the end event, seen by a thread
blocked on it), so each value maps to the time it applies (``tau``). Per mode it prints where ``tau`` falls in
its read: ``beta = (tau - start) / (end - start)`` (0: the read's start, 0.5: its midpoint, 1: its end), and
``tau - end`` in us, against the read's duration.

    python3 docs/lab/bench/read_latch_probe.py [--gpu 0] [--repeats 4] [--mib 1024] [--json FILE]
Needs torch (and cuda.bindings for the zero-copy mode, which is skipped without it).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "apps"))
from pcietrace.collectors import nvml  # noqa: E402

WRAP = 1 << 32


def transfer(mode: str, bufs: dict) -> None:
    """Launch one transfer of ``mode`` on the current stream (asynchronous)."""
    if mode == "h2d":
        bufs["dev"].copy_(bufs["host"], non_blocking=True)
    elif mode == "d2h":
        bufs["host"].copy_(bufs["dev"], non_blocking=True)
    else:  # zero copy: one elementwise kernel reads the mapped host memory over PCIe
        torch.add(bufs["zc"], 1.0, out=bufs["zc_out"])


def one(reader: nvml.CounterReader, mode: str, bufs: dict, col: int) -> dict:
    """One transfer with reads back to back: each read's (start, end) ns and counter (column ``col``: 0 tx,
    1 rx), the launch and end host times, and the bytes the transfer moved (a read 10 ms later)."""
    torch.cuda.synchronize()
    base = reader.read()[col]
    ev = torch.cuda.Event()
    done: list[int] = []
    t_launch = time.monotonic_ns()
    transfer(mode, bufs)
    ev.record()
    waiter = threading.Thread(target=lambda: (ev.synchronize(), done.append(time.monotonic_ns())))
    waiter.start()
    reads = []
    while not done or len([r for r in reads if r[0] > done[0]]) < 3:
        s = time.monotonic_ns()
        v = reader.read()
        e = time.monotonic_ns()
        if v is not None:
            reads.append((s, e, (v[col] - base) % WRAP))
    waiter.join()
    time.sleep(0.01)
    total = (reader.read()[col] - base) % WRAP
    return {"t_launch": t_launch, "t_done": done[0], "total": total, "reads": reads}


def latch(run: dict, edge_ms: float = 0.5) -> np.ndarray:
    """Per read in the transfer's interior: (duration us, beta, tau - end us)."""
    t0, t1, total = run["t_launch"], run["t_done"], run["total"]
    out = []
    for s, e, v in run["reads"]:
        if not (0.05 * total < v < 0.95 * total) or s < t0 + edge_ms * 1e6 or e > t1 - edge_ms * 1e6:
            continue
        tau = t0 + (t1 - t0) * v / total
        out.append(((e - s) / 1e3, (tau - s) / max(e - s, 1), (tau - e) / 1e3))
    return np.array(out).reshape(-1, 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", type=int, default=0, help="CUDA device = NVML index here (one-GPU machines)")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.cuda.set_device(a.gpu)
    n = a.mib << 20
    bufs = {"host": torch.ones(n, dtype=torch.uint8, pin_memory=True),
            "dev": torch.empty(n, dtype=torch.uint8, device="cuda")}
    modes = ["h2d", "d2h"]
    try:
        from blind_app import zero_copy_view
        zc, info = zero_copy_view(torch.device("cuda", a.gpu), n)
        if zc is not None:
            bufs.update(zc=zc, zc_out=torch.empty(n // 4, dtype=torch.float32, device="cuda"))
            modes.append("zero_copy")
        else:
            print(f"zero copy skipped: {info}")
    except ImportError as e:
        print(f"zero copy skipped: {e}")
    reader = nvml.CounterReader(a.gpu, "fields")
    for m in modes:  # warm up every path once
        transfer(m, bufs)
    torch.cuda.synchronize()
    results: dict[str, list] = {m: [] for m in modes}
    for rep in range(a.repeats):
        for m in modes:
            results[m].append(one(reader, m, bufs, 0 if m == "d2h" else 1))
    print(f"{'mode':10} {'reads':>5} {'GB/s':>6} {'read us p50':>11} {'beta p10':>8} {'p50':>6} {'p90':>6}"
          f" {'tau-end us p10':>14} {'p50':>6} {'p90':>6}")
    summary = {}
    for m, runs in results.items():
        x = np.vstack([latch(r) for r in runs])
        gbps = np.median([r["total"] / (r["t_done"] - r["t_launch"]) for r in runs])
        if not len(x):
            print(f"{m:10} no interior reads")
            continue
        q = lambda col, p: float(np.percentile(x[:, col], p))  # noqa: E731
        summary[m] = {"reads": len(x), "GBps": float(gbps), "read_us_p50": q(0, 50),
                      "beta": [q(1, 10), q(1, 50), q(1, 90)], "tau_minus_end_us": [q(2, 10), q(2, 50), q(2, 90)],
                      "rows": x.tolist()}
        print(f"{m:10} {len(x):5d} {gbps:6.1f} {q(0, 50):11.0f} {q(1, 10):8.2f} {q(1, 50):6.2f} {q(1, 90):6.2f}"
              f" {q(2, 10):14.0f} {q(2, 50):6.0f} {q(2, 90):6.0f}")
        # does the latch point move with the read's duration? least squares tau - start = c + f * duration
        f, c = np.polyfit(x[:, 0], x[:, 1] * x[:, 0], 1)
        summary[m]["fit_tau_minus_start_us"] = {"per_us_of_read": float(f), "constant_us": float(c)}
        print(f"{'':10} tau - start = {c:.0f} us + {f:.2f} x read duration")
    if a.json:
        Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "summary": summary,
                                            "runs": {m: r for m, r in results.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
