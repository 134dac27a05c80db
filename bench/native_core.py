"""Benchmark (run on a GPU machine; not a test): pcietrace's native measurement core against a C++ oracle.

Builds bench/oracle_loops.cu with nvcc and, in ONE run, alternates rounds of the oracle (a separate
process) with rounds of pcietrace on the same GPU: eager launch rate, host cost per launch behind a
blocker, launch + synchronize (eager, graph of 1), 4-byte copies + synchronize (H2D, D2H). pcietrace's
figures come from the code `pcietrace run` and `pcietrace latency` use (the generator's window and
burst, the latency suite's native loops); its Python path (cuda.bindings) and, where torch imports,
PyTorch are measured the same way for the "what the language adds" columns.
Goals: native launch rate / C++ >= 0.97; every time figure within 3 % of C++.
Usage: python3 bench/native_core.py [--rounds 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from pcietrace.collectors import nvml
from pcietrace.device import native
from pcietrace.device.backend import CudaBackend
from pcietrace.record.generate import LaunchConfig, LaunchGenerator

HERE = Path(__file__).parent
REPEATS, BURSTS, BURST_CALLS = 201, 15, 900
#: (key, label, unit, goal): "ratio" = pcietrace / C++ >= 0.97; "time" = within 3 % of C++.
FIGURES = [
    ("eager_launches_per_s", "eager launch rate", "launches/s", "ratio"),
    ("host_us_per_launch", "host cost per eager launch", "us", "time"),
    ("launch_sync_eager_us", "launch + synchronize, eager", "us", "time"),
    ("launch_sync_graph1_us", "launch + synchronize, graph of 1", "us", "time"),
    ("copy_h2d_4B_us", "4 B copy H2D + synchronize", "us", "time"),
    ("copy_d2h_4B_us", "4 B copy D2H + synchronize", "us", "time"),
]


def build_oracle() -> Path:
    exe = Path(tempfile.mkdtemp()) / "oracle_loops"
    subprocess.run(["nvcc", "-O2", "-o", str(exe), str(HERE / "oracle_loops.cu"), "-lcuda"], check=True)
    return exe


def oracle_round(exe: Path, n_rate: int) -> dict[str, float]:
    out = subprocess.run([str(exe), str(n_rate), str(REPEATS), str(BURSTS), str(BURST_CALLS)], check=True,
                         capture_output=True, text=True).stdout
    return {k: float(v) for k, v in re.findall(r"^(\S+) (\S+)$", out, re.M)}


def _median_us(fn: Callable[[], None], n: int) -> float:
    """Median wall time of ``fn`` over ``n`` calls, timed from Python (after 2 warm-up calls)."""
    fn(), fn()
    t = []
    for _ in range(n):
        t0 = time.monotonic_ns()
        fn()
        t.append(time.monotonic_ns() - t0)
    return statistics.median(t) / 1e3


def pcietrace_round(be: CudaBackend, bufs: tuple[int, int]) -> tuple[dict[str, float], dict[str, float], float | None]:
    """(native figures, Python figures, PyTorch host us per launch or None) for one round."""
    gpu, (host, dev) = be.gpu, bufs
    stream = int(gpu.stream)
    rate_cfg = LaunchConfig("eager", 0.0, 1, None, 1.0, "bench")
    figures: list[dict[str, float]] = []
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
        figures.append(fig)
    torch = be.torch_loops()
    torch_us = None
    if torch is not None:
        gen = LaunchGenerator(be)
        torch_us = statistics.median(gen.burst("eager", 0.0, 1, BURST_CALLS, loops=torch)["host_ns"] / BURST_CALLS / 1e3
                                     for _ in range(BURSTS))
        be.activate()
    return figures[0], figures[1], torch_us


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="alternating oracle / pcietrace rounds (medians taken)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    a = ap.parse_args()
    exe = build_oracle()
    be = CudaBackend(0)
    bufs = (be.gpu.alloc_pinned(64), be.gpu.alloc_device(64))
    rounds: dict[str, list[dict[str, float]]] = {"oracle": [], "native": [], "python": []}
    torch_us: list[float] = []
    n_rate = 0
    for r in range(a.rounds):
        nat, py, tu = pcietrace_round(be, bufs)
        n_rate = n_rate or int(nat["eager_launches_per_s"])  # ~1 s of launches per oracle rate run
        rounds["native"].append(nat)
        rounds["python"].append(py)
        if tu is not None:
            torch_us.append(tu)
        rounds["oracle"].append(oracle_round(exe, n_rate))
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    med = {src: {k: statistics.median(x[k] for x in rs) for k, *_ in FIGURES} for src, rs in rounds.items()}
    print(f"device: {be.gpu.name} ({be.gpu.bus_id}), driver {nvml.driver_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {a.rounds} alternating rounds (medians)")
    head = f"{'figure':<34} {'C++ oracle':>12} {'pcietrace native':>17} {'Python':>10} {'error %':>8}  goal"
    print(head + "\n" + "-" * len(head))
    met_all, table = True, []
    for key, label, unit, goal in FIGURES:
        o, n, p = med["oracle"][key], med["native"][key], med["python"][key]
        err = (n - o) / o * 100
        ok = n / o >= 0.97 if goal == "ratio" else abs(err) <= 3
        met_all &= ok
        goal_txt = f"ratio {n / o:.3f} >= 0.97" if goal == "ratio" else "|error| <= 3 %"
        print(f"{label + ' (' + unit + ')':<34} {o:>12,.3f} {n:>17,.3f} {p:>10,.3f} {err:>+8.2f}  {goal_txt}: "
              f"{'met' if ok else 'NOT MET'}")
        table.append({"figure": key, "unit": unit, "oracle": o, "native": n, "python": p, "error_pct": err, "met": ok})
    if torch_us:
        t = statistics.median(torch_us)
        print(f"{'host cost per launch, PyTorch (us)':<34} {'':>12} {'':>17} {t:>10,.3f}  (x.fill_(0) on a 1-element tensor)")
    print(f"ALL GOALS {'MET' if met_all else 'NOT MET'}")
    if a.json:
        a.json.write_text(json.dumps({"device": be.gpu.name, "driver": nvml.driver_version(), "figures": table,
                                      "torch_host_us_per_launch": statistics.median(torch_us) if torch_us else None,
                                      "rounds": rounds}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
