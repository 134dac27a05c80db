"""Benchmark (run on a GPU machine; not a test): pcietrace's native measurement core against a C++ oracle.

Method: builds bench/oracle_loops.cu with nvcc, then runs ``--rounds`` PAIRS of rounds on GPU 0, each round
in a fresh process: the oracle is its own executable; a pcietrace round runs in a process started with
multiprocessing ``spawn`` (as `pcietrace run`'s per-GPU workers are), so both sides start from a fresh
context and no round inherits torch, NVML or allocations of an earlier one (this parent process never
touches the GPU while rounds run). Within a pair the order alternates (oracle first, then pcietrace first:
ABBA...), so drift over the call hits both sides alike.
Figures per round: eager launch rate, host cost per launch behind a blocker, launch + synchronize (eager,
graph of 1), 4-byte copies + synchronize (H2D, D2H). pcietrace's come from the code `pcietrace run` and
`pcietrace latency` use (the generator's window and burst, the latency suite's native loops); its Python
path (cuda.bindings) and, where torch imports, PyTorch are measured the same way in the same process, after
the native figures, for the "what the language adds" columns.
Per figure: the per-pair error (pcietrace - oracle) / oracle, its median with a 95 % bootstrap interval,
each side's median, and the oracle's own round-to-round spread (IQR / median) as the noise of the truth.
Goals (issue 8): eager launch rate 1 + median paired error >= 0.97; every time figure |median paired
error| <= 3 %.
Runtime on an H100: ~20 s per pair (oracle ~5 s, pcietrace ~12-15 s incl. process start and torch) plus
~15 s nvcc: about 2.5 min with the default 7 pairs.
Usage: python3 bench/native_core.py [--rounds 7] [--rate-launches 300000] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable

from _stats import iqr_pct, median_ci, pct_diff

HERE = Path(__file__).parent
#: Per round: timed repeats of each synchronize loop, bursts behind a blocker and calls per burst
#: (the oracle gets the same numbers).
REPEATS, BURSTS, BURST_CALLS = 501, 31, 900
#: (key, label, unit, goal): "ratio" = pcietrace / C++ >= 0.97; "time" = within 3 % of C++.
FIGURES = [
    ("eager_launches_per_s", "eager launch rate", "launches/s", "ratio"),
    ("host_us_per_launch", "host cost per eager launch", "us", "time"),
    ("launch_sync_eager_us", "launch + synchronize, eager", "us", "time"),
    ("launch_sync_graph1_us", "launch + synchronize, graph of 1", "us", "time"),
    ("copy_h2d_4B_us", "4 B copy H2D + synchronize", "us", "time"),
    ("copy_d2h_4B_us", "4 B copy D2H + synchronize", "us", "time"),
]
RATIO_GOAL, TIME_GOAL_PCT = 0.97, 3.0


def build_oracle() -> Path:
    if shutil.which("nvcc") is None:
        sys.exit("native_core: nvcc not found (the C++ oracle is built in the same call; run on a GPU machine)")
    exe = Path(tempfile.mkdtemp()) / "oracle_loops"
    if subprocess.run(["nvcc", "-O2", "-o", str(exe), str(HERE / "oracle_loops.cu"), "-lcuda"]).returncode:
        sys.exit("native_core: building bench/oracle_loops.cu failed (nvcc's message above)")
    return exe


def oracle_round(exe: Path, n_rate: int) -> dict[str, float]:
    """One run of the C++ oracle (its own process): figure -> value."""
    out = subprocess.run([str(exe), str(n_rate), str(REPEATS), str(BURSTS), str(BURST_CALLS)], check=True,
                         capture_output=True, text=True).stdout
    return {k: float(v) for k, v in re.findall(r"^(\S+) (\S+)$", out, re.M)}


def _median_us(fn: Callable[[], Any], n: int) -> float:
    """Median wall time of ``fn`` over ``n`` calls, timed from Python (after 2 warm-up calls), in us."""
    fn(), fn()
    t = []
    for _ in range(n):
        t0 = time.monotonic_ns()
        fn()
        t.append(time.monotonic_ns() - t0)
    return statistics.median(t) / 1e3


def pcietrace_round() -> dict[str, Any]:
    """One pcietrace round on GPU 0, meant to run in a fresh process: {"native": figures, "python":
    figures, "torch_us": PyTorch host us per launch or None, "gpu", "bus_id"}. Native figures first, so
    the Python path and torch (imported last) cannot disturb them."""
    import numpy as np

    from pcietrace.device import native
    from pcietrace.device.backend import CudaBackend
    from pcietrace.record.generate import LaunchConfig, LaunchGenerator

    be = CudaBackend(0)
    gpu = be.gpu
    host, dev = gpu.alloc_pinned(64), gpu.alloc_device(64)
    stream = int(gpu.stream)
    rate_cfg = LaunchConfig("eager", 0.0, 1, None, 1.0, "bench")
    out: dict[str, Any] = {"gpu": gpu.name, "bus_id": gpu.bus_id}
    for path in ("native", "python"):
        gen = LaunchGenerator(be, path=path)
        gen.window(rate_cfg)  # warm
        fig = {"eager_launches_per_s": gen.window(rate_cfg)["achieved_rate_hz"],
               "host_us_per_launch": statistics.median(
                   gen.burst("eager", 0.0, 1, BURST_CALLS)["host_ns"] / BURST_CALLS / 1e3 for _ in range(BURSTS))}
        if path == "native":
            eager, graph = be.native_loops("eager", 1, 0), be.native_loops("graph", 1, 0)
            eager.sync_each(2), graph.sync_each(2)
            fig["launch_sync_eager_us"] = float(np.median(eager.sync_each(REPEATS))) / 1e3
            fig["launch_sync_graph1_us"] = float(np.median(graph.sync_each(REPEATS))) / 1e3
            for key, h2d in (("copy_h2d_4B_us", True), ("copy_d2h_4B_us", False)):
                native.copy_sync_each(h2d, dev, host, 4, stream, 2)
                fig[key] = float(np.median(native.copy_sync_each(h2d, dev, host, 4, stream, REPEATS))) / 1e3
        else:
            launch, graph1 = be.launcher(0), be.graph_launcher(1, 0)
            fig["launch_sync_eager_us"] = _median_us(lambda: (launch(), gpu.synchronize()), REPEATS)
            fig["launch_sync_graph1_us"] = _median_us(lambda: (graph1(), gpu.synchronize()), REPEATS)
            fig["copy_h2d_4B_us"] = _median_us(lambda: (gpu.copy_h2d(dev, host, 4), gpu.synchronize()), REPEATS)
            fig["copy_d2h_4B_us"] = _median_us(lambda: (gpu.copy_d2h(host, dev, 4), gpu.synchronize()), REPEATS)
        out[path] = fig
    out["torch_us"] = None
    torch = be.torch_loops()
    if torch is not None:
        gen = LaunchGenerator(be)
        out["torch_us"] = statistics.median(
            gen.burst("eager", 0.0, 1, BURST_CALLS, loops=torch)["host_ns"] / BURST_CALLS / 1e3 for _ in range(BURSTS))
    return out


def in_fresh_process(fn: Callable[[], Any]) -> Any:
    """``fn()`` in a new spawned process (gone when it returns), its result sent back."""
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as ex:
        return ex.submit(fn).result()


def run_rounds(pairs: int, oracle: Callable[[], dict[str, float]],
               ours: Callable[[], dict[str, Any]]) -> tuple[list[dict[str, float]], list[dict[str, Any]]]:
    """``pairs`` pairs of (oracle, ours) rounds, the order within a pair alternating (ABBA...):
    (oracle rounds, our rounds), index i of both = pair i."""
    got_o, got_p = [], []
    for i in range(pairs):
        t0 = time.monotonic()
        if i % 2 == 0:
            o = oracle()
            p = ours()
        else:
            p = ours()
            o = oracle()
        got_o.append(o)
        got_p.append(p)
        err = pct_diff(p["native"]["launch_sync_eager_us"], o["launch_sync_eager_us"])
        print(f"pair {i + 1}/{pairs} ({'oracle first' if i % 2 == 0 else 'pcietrace first'}, "
              f"{time.monotonic() - t0:.1f} s): launch+sync eager {err:+.2f} %", file=sys.stderr)
    return got_o, got_p


def compare(oracle: list[dict[str, float]], ours: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per figure: each side's median, the per-pair errors (%), their median and 95 % bootstrap interval,
    the oracle's IQR / median (%), and whether the goal is met (on the median paired error)."""
    rows = []
    for key, label, unit, goal in FIGURES:
        o = [r[key] for r in oracle]
        n = [r["native"][key] for r in ours]
        py = [r["python"][key] for r in ours]
        errs = [pct_diff(b, a) for a, b in zip(o, n)]
        med, lo, hi = median_ci(errs)
        ok = 1 + med / 100 >= RATIO_GOAL if goal == "ratio" else abs(med) <= TIME_GOAL_PCT
        rows.append({"figure": key, "label": label, "unit": unit, "goal": goal,
                     "oracle": statistics.median(o), "native": statistics.median(n), "python": statistics.median(py),
                     "paired_error_pct": errs, "error_median_pct": med, "error_ci95_pct": [lo, hi],
                     "oracle_iqr_pct": iqr_pct(o), "native_iqr_pct": iqr_pct(n), "met": bool(ok)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="Method and goals: see the module docstring (bench/native_core.py).")
    ap.add_argument("--rounds", type=int, default=7,
                    help="pairs of rounds (oracle + pcietrace, order alternating), each round a fresh process; >= 2")
    ap.add_argument("--rate-launches", type=int, default=300_000,
                    help="launches per oracle rate run (3 runs; ~1 s each at 300k launches/s)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures, paired errors and CIs here")
    a = ap.parse_args()
    if a.rounds < 2:
        ap.error("--rounds must be at least 2 (one pair says nothing about the noise)")
    exe = build_oracle()
    t0 = time.monotonic()
    oracle, ours = run_rounds(a.rounds, lambda: oracle_round(exe, a.rate_launches),
                              lambda: in_fresh_process(pcietrace_round))
    took = time.monotonic() - t0
    try:
        from pcietrace.collectors import nvml

        driver = nvml.driver_version()  # after every round: NVML never shares a process with a timed one
    except Exception as exc:  # noqa: BLE001 - the figures stand without it
        driver = f"unknown ({type(exc).__name__})"
    rows = compare(oracle, ours)
    torch_us = [r["torch_us"] for r in ours if r["torch_us"] is not None]
    print(f"device: {ours[0]['gpu']} ({ours[0]['bus_id']}), driver {driver}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {a.rounds} pairs of rounds, each a fresh process, "
          f"order alternating (ABBA), {took:.0f} s")
    head = (f"{'figure':<36} {'C++ oracle':>12} {'pcietrace':>12} {'Python':>11} {'paired err %':>12} "
            f"{'95 % CI':>17} {'oracle IQR %':>12}  goal")
    print(head + "\n" + "-" * len(head))
    for r in rows:
        lo, hi = r["error_ci95_pct"]
        med = r["error_median_pct"]
        goal_txt = (f"ratio {1 + med / 100:.3f} >= {RATIO_GOAL}" if r["goal"] == "ratio"
                    else f"|median| <= {TIME_GOAL_PCT:g} %")
        fmt = ",.0f" if r["goal"] == "ratio" else ",.3f"
        # Say where the interval disagrees with the verdict: a met goal whose CI reaches past it, or a missed
        # one whose CI reaches back inside.
        g_lo, g_hi = ((RATIO_GOAL - 1) * 100, float("inf")) if r["goal"] == "ratio" else (-TIME_GOAL_PCT, TIME_GOAL_PCT)
        note = ((" (CI reaches past the goal)" if lo < g_lo or hi > g_hi else "") if r["met"]
                else (" (CI reaches inside the goal)" if lo <= g_hi and hi >= g_lo else ""))
        print(f"{r['label'] + ' (' + r['unit'] + ')':<36} {r['oracle']:>12{fmt}} {r['native']:>12{fmt}} "
              f"{r['python']:>11{fmt}} {med:>+12.2f} {f'{lo:+.2f} .. {hi:+.2f}':>17} {r['oracle_iqr_pct']:>12.2f}  "
              f"{goal_txt}: {'met' if r['met'] else 'NOT MET'}{note}")
    if torch_us:
        print(f"{'host cost per launch, PyTorch (us)':<36} {'':>12} {'':>12} {statistics.median(torch_us):>11,.3f}"
              f"  (x.fill_(0) on a 1-element tensor; median of {len(torch_us)} rounds)")
    print("paired err = median over pairs of (pcietrace - oracle) / oracle; CI = bootstrap of that median; "
          "oracle IQR = the C++ loop's own round-to-round spread")
    met_all = all(r["met"] for r in rows)
    print(f"ALL GOALS {'MET' if met_all else 'NOT MET'}")
    if a.json:
        a.json.write_text(json.dumps({
            "device": ours[0]["gpu"], "bus_id": ours[0]["bus_id"], "driver": driver,
            "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "pairs": a.rounds,
            "order": ["oracle first" if i % 2 == 0 else "pcietrace first" for i in range(a.rounds)],
            "repeats": REPEATS, "bursts": BURSTS, "burst_calls": BURST_CALLS, "rate_launches": a.rate_launches,
            "figures": rows, "all_goals_met": met_all,
            "torch_host_us_per_launch": statistics.median(torch_us) if torch_us else None,
            "rounds": {"oracle": oracle, "native": [r["native"] for r in ours], "python": [r["python"] for r in ours],
                       "torch_us": [r["torch_us"] for r in ours]}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
