"""Probe (run on a GPU machine; not a test): is the GPU time per queued eager kernel a property of the
process, of the stream, or of the moment?

Seen on 4x H200 (2026-11-22, docs/lab/reports/h200x4-parallel-vs-alone-20261122/session7-langrep15.json): inside one
`pcietrace run` the ten eager bursts of empty kernels agree within 0.1 % (median 1.331 us, GPU 0), but
between runs the same GPU's figure moves over 1.30-1.46 us, in what look like two levels. This runs, in
``--procs`` fresh processes one after another, ``--streams`` streams each (a new non-blocking stream in the
same primary context), ``--bursts`` bursts of 900 empty eager kernels behind a blocker on each, and prints
the median GPU time per kernel per stream. If streams in one process differ as much as processes do, a
run can average over streams; if not, the level is set per process (context) and only several processes
show it. ``--contexts``: each stream in a context of its own (cuCtxCreate), to see whether a context draws
its level.

    python3 docs/lab/bench/eager_gpu_probe.py [--gpu 0] [--procs 6] [--streams 4] [--bursts 5] [--contexts]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "bench"))
from _stats import range_pct  # noqa: E402


def one_process(gpu: int, streams: int, bursts: int, contexts: bool) -> list[dict]:
    """Per stream: median eager and graph GPU time per kernel (us) and host cost per launch (us).
    ``contexts``: each stream in a context of its own (cuCtxCreate) instead of the primary context."""
    from pcietrace.device.backend import CudaBackend
    from pcietrace.record.generate import LaunchGenerator

    keep, out = [], []
    for s in range(streams):
        be = CudaBackend(gpu, own_context=contexts)  # a new stream (in the primary context, or a new context)
        be.activate()
        keep.append(be)
        gen = LaunchGenerator(be)
        row: dict = {"stream": s}
        for mode, k in (("eager", 1), ("graph", 10)):
            recs = [gen.burst(mode, 0.0, k, 900 // k) for _ in range(bursts)]
            row[f"{mode}_gpu_us"] = statistics.median(r["gpu_ns"] / r["launches"] / 1e3 for r in recs)
            row[f"{mode}_host_us_per_call"] = statistics.median(r["host_ns"] / r["calls"] / 1e3 for r in recs)
            row[f"{mode}_saturated"] = sum(r["saturated"] for r in recs)
        out.append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", type=int, default=0, help="CUDA device number")
    ap.add_argument("--procs", type=int, default=6)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--bursts", type=int, default=5)
    ap.add_argument("--contexts", action="store_true", help="each stream in a new context (cuCtxCreate)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(one_process(a.gpu, a.streams, a.bursts, a.contexts)))
        return 0
    cmd = [sys.executable, __file__, "--child", "--gpu", str(a.gpu), "--streams", str(a.streams),
           "--bursts", str(a.bursts)] + ["--contexts"] * a.contexts
    levels = []
    for p in range(a.procs):
        rows = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        eager = [r["eager_gpu_us"] for r in rows]
        levels.append(eager)
        print(f"process {p}: eager us/kernel per stream " + " ".join(f"{x:.3f}" for x in eager)
              + "; graph " + " ".join(f"{r['graph_gpu_us']:.3f}" for r in rows)
              + "; host us/launch " + " ".join(f"{r['eager_host_us_per_call']:.2f}" for r in rows)
              + f"; saturated {sum(r['eager_saturated'] for r in rows)}/{a.streams * a.bursts}", flush=True)
    within = statistics.median(range_pct(x) for x in levels)
    firsts = [x[0] for x in levels]
    meds = [statistics.median(x) for x in levels]
    print(f"spread within a process over streams (median over processes): {within:.1f} %")
    print(f"spread between processes, first stream: {range_pct(firsts):.1f} %; median over streams: "
          f"{range_pct(meds):.1f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
