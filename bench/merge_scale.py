"""How `pcietrace merge` scales: 64 synthetic node recordings merged by 4 workers vs 1 (goal: >= 2.5x faster
on a machine with >= 4 cores), and the merge's peak memory (the merging process and its largest worker) against
the number of nodes (goal: independent of it: for the merging process and for its largest worker, the fitted
growth across the sizes < 10 % of the smallest size's peak; no process ever holds more than one node's raw
samples, nor the merging process every node's range instances or timelines).

Each synthetic node is a real attach recording (tests/data, the two-GPU torchrun one) repeated ``--tiles``
times end to end (counters continued, times shifted), with a host, a label-less node name and a clock offset
of its own.

    python bench/merge_scale.py                 # 64 nodes
    python bench/merge_scale.py --nodes 16 --tiles 1 --sizes 4,8,16   # quicker
    python bench/merge_scale.py --scheduler tcp://head:8786           # the 4-vs-1 part on a Dask cluster
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "data" / "attach_h200x2_torchrun_outside"
#: "Independent of the number of nodes": the fitted growth of the peak across the sizes, as a share of the
#: smallest size's peak (a worker's first nodes warm its allocator up; later ones reuse that memory).
GROWTH_GOAL = 0.10


def synth_nodes(folder: Path, n: int, tiles: int, source: Path = SOURCE) -> list[Path]:
    """``n`` node recordings in ``folder``: ``source`` repeated ``tiles`` times each, nodes named synth-NNN."""
    from pcietrace.session import Session

    s = Session.load(source)
    mod = np.uint64(2) ** np.uint64(int(s.counters[0]["bits"]))
    t = [s.samples["t_ns"], s.events["t_ns"], s.windows["t_start_ns"], s.windows["t_end_ns"]]
    span = int(max(x.max() for x in t) - min(x.min() for x in t)) + 10**6
    first = s.samples.groupby("nvml_index")[["tx_raw", "rx_raw"]].transform("first")
    last = s.samples.groupby("nvml_index")[["tx_raw", "rx_raw"]].transform("last")
    step = ((last - first) % mod).astype(np.uint64)  # one repeat's bytes, so the next starts where it ended

    def tile(df: pd.DataFrame, cols: tuple[str, ...], k: int, raw: bool = False) -> pd.DataFrame:
        out = df.assign(**{c: df[c] + k * span for c in cols})
        if raw:
            for c in ("tx_raw", "rx_raw"):
                out[c] = ((df[c].astype(np.uint64) + np.uint64(k) * step[c]) % mod).astype(np.uint64)
        return out

    long = dataclasses.replace(
        s, samples=pd.concat([tile(s.samples, ("t_ns",), k, raw=True) for k in range(tiles)], ignore_index=True),
        # each repeat's processes are processes of their own (a thread's launch counts never run backwards)
        events=pd.concat([tile(s.events, ("t_ns",), k).assign(pid=s.events["pid"] + k * 10**7,
                                                              tid=s.events["tid"] + k * 10**7)
                          for k in range(tiles)], ignore_index=True),
        windows=pd.concat([tile(s.windows, ("t_start_ns", "t_end_ns"), k) for k in range(tiles)], ignore_index=True))
    long.meta = {**s.meta, "t_app_end_ns": s.meta["t_app_end_ns"] + (tiles - 1) * span}
    paths = []
    for i in range(n):
        long.meta["node"] = {"host": f"synth-{i:03d}", "label": None, "launcher": {"NODE_RANK": str(i)},
                             "clock": {"realtime_minus_monotonic_ns": 1_800_000_000 * 10**9 + i * 10**6,
                                       "uncertainty_ns": 40, "reads": 15}}
        long.save(folder / f"node-{i:03d}")
        paths.append(folder / f"node-{i:03d}")
    return paths


def child(paths: list[str], out: str, workers: int, scheduler: str | None) -> None:
    """In a fresh process: one merge, then its wall time and peak RSS (its own, and its largest worker's)."""
    from pcietrace import multinode

    t = time.perf_counter()
    multinode.merge([Path(p) for p in paths], Path(out), workers=workers, scheduler=scheduler)
    wall = time.perf_counter() - t
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({"wall_s": wall, "own_mb": own, "worker_mb": kids}))


def run_merge(paths: list[Path], out: Path, workers: int, scheduler: str | None = None) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, __file__, "--child", str(out), str(workers), scheduler or "", *map(str, paths)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:  # the merge's own one line (or traceback) says why
        sys.exit(f"merge_scale: the merge of {len(paths)} nodes failed (exit {done.returncode}): {done.stderr.strip()[-800:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        out, workers, scheduler, *paths = sys.argv[2:]
        child(paths, out, int(workers), scheduler or None)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--tiles", type=int, default=2, help="repeats of the source recording per node")
    ap.add_argument("--sizes", default="4,16,64", help="node counts for the memory fit")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--scheduler", default=None, help="a Dask scheduler for the speed part (default: local processes)")
    ap.add_argument("--no-speed", action="store_true", help="the memory part only")
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    sizes = [int(x) for x in args.sizes.split(",") if int(x) <= args.nodes]
    with tempfile.TemporaryDirectory(prefix="merge-scale-") as tmp:
        root = Path(tmp)
        paths = synth_nodes(root / "nodes", args.nodes, args.tiles)
        from pcietrace.session import Session

        one = Session.load(paths[0])
        node_mb = one.samples.memory_usage(deep=True).sum() / 1e6 + one.events.memory_usage(deep=True).sum() / 1e6
        print(f"{args.nodes} synthetic nodes, each {len(one.samples):,} samples and {len(one.events):,} events "
              f"({node_mb:.1f} MB in memory); {cores} CPU cores usable")
        ratio = math.nan
        if not args.no_speed:  # (1 worker: one node at a time in the merging process, no worker started)
            runs = {w: run_merge(paths, root / f"speed-{w}", w, args.scheduler) for w in (1, args.workers)}
            ratio = runs[1]["wall_s"] / runs[args.workers]["wall_s"]
            verdict = (("met" if ratio >= 2.5 else "NOT met") if cores >= args.workers else
                       f"not checked: {cores} cores usable, the goal is for >= {args.workers}")
            print(f"speed: 1 worker {runs[1]['wall_s']:.1f} s, {args.workers} workers {runs[args.workers]['wall_s']:.1f} "
                  f"s: {ratio:.2f}x (goal >= 2.5x; {verdict})")
        peaks: dict[str, list[float]] = {"merging process": [], "largest worker": []}
        for n in sizes:
            r = run_merge(paths[:n], root / f"mem-{n}", args.workers)
            peaks["merging process"].append(r["own_mb"])
            peaks["largest worker"].append(r["worker_mb"])
            print(f"memory: {n:3d} nodes: merging process {r['own_mb']:.0f} MB, largest worker {r['worker_mb']:.0f} MB "
                  f"({r['wall_s']:.1f} s)")
        ok = True
        for who, mb in peaks.items():
            slope, intercept = np.polyfit(sizes, mb, 1) if len(sizes) > 1 else (0.0, mb[0])
            growth = slope * (sizes[-1] - sizes[0])
            ok &= bool(growth < GROWTH_GOAL * mb[0])
            print(f"memory fit, {who}: {intercept:.0f} MB + {slope:.3f} MB/node: {growth:+.1f} MB from {sizes[0]} to "
                  f"{sizes[-1]} nodes, {100 * growth / mb[0]:+.1f} % of its peak at {sizes[0]} (goal: < "
                  f"{100 * GROWTH_GOAL:.0f} %; {'met' if growth < GROWTH_GOAL * mb[0] else 'NOT met'})")
        print(f"(a merge holding every node's samples and events would grow by {node_mb * (sizes[-1] - sizes[0]):.0f} MB)")
    return 0 if ok and (math.isnan(ratio) or ratio >= 2.5 or cores < args.workers) else 1


if __name__ == "__main__":
    sys.exit(main())
