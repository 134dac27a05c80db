"""Benchmark (run on a GPU machine; not a test): pcietrace's native measurement core against a C++ oracle.

Two modes, both on GPU 0 and both building bench/oracle_loops.cu with nvcc in the same call:

In-process (the default). The oracle is built as a shared library (liboracle.so, plain ``extern "C"`` C++
loops) and loaded with ctypes into ONE fresh process (started with multiprocessing ``spawn``, as
`pcietrace run`'s per-GPU workers are) next to pcietrace's native core, on the same thread and the same
primary context; the oracle keeps its own stream, buffers, kernel and graph, as a C++ program would. Per
figure, ``--pairs`` pairs of small chunks alternate ABBA (oracle chunk, pcietrace chunk, pcietrace chunk,
oracle chunk, ...): a chunk is ``--chunk-repeats`` launch/copy + synchronize repeats, ``--chunk-bursts``
bursts of 900 launches behind a 20 ms blocker, or ``--rate-chunk-s`` of launching as fast as possible.
Why this resolves a few %: between processes the same loops differ by 5-13 % (CPU placement, context and
allocation layout, clock and power state), which 7 separate-process pairs cannot average below 3 %. Within
one process both sides run on the same thread (so the same CPU placement across a pair), the same context,
the same driver threads and state; a pair's two chunks are milliseconds apart, so drift cancels within the
pair and only the loops' own difference is left.
Per figure: each side's median over all its samples, the per-pair errors (pcietrace chunk median - oracle
chunk median) / oracle chunk median, their median with a 95 % bootstrap interval, and the oracle's
chunk-to-chunk spread (IQR / median of its chunk medians). After the pairs, the same process measures the
Python path (cuda.bindings) and, where torch imports, PyTorch once each for the "what the language adds"
columns (they have no goal). The eager launch rate is paired in-process too.

Separate processes (``--separate-processes``; what the note of 2026-11-22 reported). ``--rounds`` PAIRS of
rounds, each round a fresh process: the oracle is its own executable; a pcietrace round runs in a spawned
process. Within a pair the order alternates (ABBA...). Per figure: the per-pair error, its median with a 95 %
bootstrap interval, each side's median, and the oracle's round-to-round spread (IQR / median).

Figures: eager launch rate, host cost per launch behind a blocker, launch + synchronize (eager, graph of 1),
4-byte copies + synchronize (H2D, D2H). pcietrace's come from the code `pcietrace run` and `pcietrace latency`
use (the generator's window and burst, the latency suite's native loops). This parent process never touches
the GPU while measuring; it reads the driver version through NVML afterwards.
Goals (issue 8): eager launch rate 1 + median paired error >= 0.97; every time figure |median paired
error| <= 3 %.
Runtime on an H100, in-process defaults: nvcc ~20-40 s, then ~1 min (rate chunks ~17 s, bursts ~10 s,
synchronize rows ~1 s, the Python path and torch ~15 s). Separate processes: ~20 s per pair, ~2.5 min for 7.
Usage: python3 bench/native_core.py [--pairs 40] [--json FILE]
       python3 bench/native_core.py --separate-processes [--rounds 7] [--rate-launches 300000] [--json FILE]
"""

from __future__ import annotations

import argparse
import ctypes
import functools
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

import numpy as np
from _stats import iqr_pct, median_ci, pct_diff
from pcietrace.errors import PcietraceError

HERE = Path(__file__).parent
#: Per separate-process round: timed repeats of each synchronize loop, bursts behind a blocker and calls per
#: burst (the oracle gets the same numbers). BURST_CALLS is also the in-process burst size.
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
#: Bytes per copy in the copy rows.
COPY_BYTES = 4
_LLP = ctypes.POINTER(ctypes.c_longlong)


def build_oracle(shared: bool = False) -> Path:
    """Build bench/oracle_loops.cu with nvcc: the program (separate-process mode) or, with ``shared``, the
    library liboracle.so (in-process mode); exits with one line if nvcc is missing or fails."""
    if shutil.which("nvcc") is None:
        sys.exit("native_core: nvcc not found (the C++ oracle is built in the same call; run on a GPU machine)")
    out = Path(tempfile.mkdtemp()) / ("liboracle.so" if shared else "oracle_loops")
    flags = ["-shared", "-Xcompiler", "-fPIC", "-DORACLE_LIBRARY"] if shared else []
    if subprocess.run(["nvcc", "-O2", *flags, "-o", str(out), str(HERE / "oracle_loops.cu"), "-lcuda"]).returncode:
        sys.exit("native_core: building bench/oracle_loops.cu failed (nvcc's message above)")
    return out


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


class CppOracle:
    """liboracle.so (bench/oracle_loops.cu) in this process, on GPU ``ordinal``'s primary context: one method
    per figure, each running one chunk and returning its samples (launches/s, or us)."""

    def __init__(self, path: Path, ordinal: int = 0) -> None:
        lib = ctypes.CDLL(str(path))
        i, ll, dp, llp = ctypes.c_int, ctypes.c_longlong, ctypes.POINTER(ctypes.c_double), _LLP
        for name, args in (("oracle_init", [i]), ("oracle_launch_rate", [ll, dp]),
                           ("oracle_host_per_launch", [i, i, dp]), ("oracle_launch_sync_each", [i, i, llp]),
                           ("oracle_copy_sync_each", [i, i, i, llp]), ("oracle_close", [])):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, i
        self._lib = lib
        self._check(lib.oracle_init(ordinal), "oracle_init")

    @staticmethod
    def _check(rc: int, call: str) -> None:
        if rc:
            raise RuntimeError(f"{call} failed with {rc} (a CUresult; -1: cudaGetFuncBySymbol failed; "
                               "the oracle's stderr names the call)")

    def rate(self, n: int) -> list[float]:
        """Launches per second of ``n`` eager launches as fast as possible (one sample)."""
        got = ctypes.c_double()
        self._check(self._lib.oracle_launch_rate(int(n), ctypes.byref(got)), "oracle_launch_rate")
        return [got.value]

    def host_us(self, bursts: int) -> list[float]:
        """Per burst: host us per launch of BURST_CALLS launches behind a 20 ms blocker."""
        out = (ctypes.c_double * bursts)()
        self._check(self._lib.oracle_host_per_launch(bursts, BURST_CALLS, out), "oracle_host_per_launch")
        return list(out)

    def _each(self, name: str, args: tuple[int, ...], repeats: int) -> list[float]:
        """Run ``name(*args, repeats, out_ns)``; the per-repeat times in us."""
        out = np.zeros(repeats, np.int64)
        self._check(getattr(self._lib, name)(*args, repeats, out.ctypes.data_as(_LLP)), name)
        return (out / 1e3).tolist()

    def sync_us(self, graph: bool, repeats: int) -> list[float]:
        """Per repeat: us of one launch (eager, or the graph of one) + stream synchronize (2 warm-ups untimed)."""
        return self._each("oracle_launch_sync_each", (int(graph),), repeats)

    def copy_us(self, h2d: bool, repeats: int) -> list[float]:
        """Per repeat: us of one COPY_BYTES copy + stream synchronize (2 warm-ups untimed)."""
        return self._each("oracle_copy_sync_each", (int(h2d), COPY_BYTES), repeats)

    def close(self) -> None:
        self._check(self._lib.oracle_close(), "oracle_close")


class Ours:
    """pcietrace's native core on GPU 0 through the code `pcietrace run` and `pcietrace latency` use, with the
    same methods as :class:`CppOracle` (one chunk -> samples)."""

    def __init__(self) -> None:
        from pcietrace.device import native
        from pcietrace.device.backend import CudaBackend
        from pcietrace.record.generate import LaunchConfig, LaunchGenerator

        self._native, self._cfg = native, LaunchConfig
        self.be = CudaBackend(0)
        gpu = self.be.gpu
        self.host, self.dev = gpu.alloc_pinned(64), gpu.alloc_device(64)
        self.stream = int(gpu.stream)
        self.gen = LaunchGenerator(self.be, path="native")
        self._loops = {False: self.be.native_loops("eager", 1, 0), True: self.be.native_loops("graph", 1, 0)}

    def rate(self, duration_s: float) -> list[float]:
        """Launches per second of one as-fast-as-possible window of ``duration_s`` (one sample)."""
        return [self.gen.window(self._cfg("eager", 0.0, 1, None, duration_s, "bench"))["achieved_rate_hz"]]

    def host_us(self, bursts: int) -> list[float]:
        """Per burst: host us per launch of BURST_CALLS launches behind the generator's 20 ms blocker."""
        return [self.gen.burst("eager", 0.0, 1, BURST_CALLS)["host_ns"] / BURST_CALLS / 1e3 for _ in range(bursts)]

    def sync_us(self, graph: bool, repeats: int) -> list[float]:
        """Per repeat: us of one launch (eager, or the graph of one) + stream synchronize (2 warm-ups untimed)."""
        loops = self._loops[graph]
        loops.sync_each(2)
        return (loops.sync_each(repeats) / 1e3).tolist()

    def copy_us(self, h2d: bool, repeats: int) -> list[float]:
        """Per repeat: us of one COPY_BYTES copy + stream synchronize (2 warm-ups untimed)."""
        self._native.copy_sync_each(h2d, self.dev, self.host, COPY_BYTES, self.stream, 2)
        return (self._native.copy_sync_each(h2d, self.dev, self.host, COPY_BYTES, self.stream, repeats) / 1e3).tolist()


def python_figures(ours: Ours) -> dict[str, float]:
    """The same figures launched from Python (cuda.bindings) on ``ours``' GPU: one round, medians."""
    from pcietrace.record.generate import LaunchConfig, LaunchGenerator

    be, gpu, host, dev = ours.be, ours.be.gpu, ours.host, ours.dev
    gen = LaunchGenerator(be, path="python")
    rate_cfg = LaunchConfig("eager", 0.0, 1, None, 1.0, "bench")
    gen.window(rate_cfg)  # warm
    launch, graph1 = be.launcher(0), be.graph_launcher(1, 0)
    return {"eager_launches_per_s": gen.window(rate_cfg)["achieved_rate_hz"],
            "host_us_per_launch": statistics.median(
                gen.burst("eager", 0.0, 1, BURST_CALLS)["host_ns"] / BURST_CALLS / 1e3 for _ in range(BURSTS)),
            "launch_sync_eager_us": _median_us(lambda: (launch(), gpu.synchronize()), REPEATS),
            "launch_sync_graph1_us": _median_us(lambda: (graph1(), gpu.synchronize()), REPEATS),
            "copy_h2d_4B_us": _median_us(lambda: (gpu.copy_h2d(dev, host, COPY_BYTES), gpu.synchronize()), REPEATS),
            "copy_d2h_4B_us": _median_us(lambda: (gpu.copy_d2h(host, dev, COPY_BYTES), gpu.synchronize()), REPEATS)}


def torch_host_us(ours: Ours) -> float | None:
    """PyTorch's host us per launch (median of BURSTS bursts), or None without torch. Imports torch: call last."""
    torch = ours.be.torch_loops()
    if torch is None:
        return None
    return statistics.median(
        ours.gen.burst("eager", 0.0, 1, BURST_CALLS, loops=torch)["host_ns"] / BURST_CALLS / 1e3 for _ in range(BURSTS))


def pcietrace_round() -> dict[str, Any]:
    """One pcietrace round on GPU 0, meant to run in a fresh process: {"native": figures, "python":
    figures, "torch_us": PyTorch host us per launch or None, "gpu", "bus_id"}. Native figures first, so
    the Python path and torch (imported last) cannot disturb them."""
    ours = Ours()
    ours.rate(1.0)  # warm
    native = {"eager_launches_per_s": ours.rate(1.0)[0],
              "host_us_per_launch": statistics.median(ours.host_us(BURSTS)),
              "launch_sync_eager_us": statistics.median(ours.sync_us(False, REPEATS)),
              "launch_sync_graph1_us": statistics.median(ours.sync_us(True, REPEATS)),
              "copy_h2d_4B_us": statistics.median(ours.copy_us(True, REPEATS)),
              "copy_d2h_4B_us": statistics.median(ours.copy_us(False, REPEATS))}
    python = python_figures(ours)
    return {"gpu": ours.be.gpu.name, "bus_id": ours.be.gpu.bus_id, "native": native, "python": python,
            "torch_us": torch_host_us(ours)}


def in_fresh_process(fn: Callable[[], Any]) -> Any:
    """``fn()`` in a new spawned process (gone when it returns), its result sent back."""
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as ex:
        return ex.submit(fn).result()


def abba(pairs: int, oracle: Callable[[], Any], ours: Callable[[], Any],
         on_pair: Callable[[int, Any, Any, float], None] | None = None) -> tuple[list[Any], list[Any]]:
    """``pairs`` pairs of (oracle, ours) calls, the order within a pair alternating (oracle first in even
    pairs, ours first in odd ones: ABBA...): (oracle results, our results), index i of both = pair i.
    ``on_pair(i, o, p, seconds)`` is called after each pair."""
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
        if on_pair:
            on_pair(i, o, p, time.monotonic() - t0)
    return got_o, got_p


def run_rounds(pairs: int, oracle: Callable[[], dict[str, float]],
               ours: Callable[[], dict[str, Any]]) -> tuple[list[dict[str, float]], list[dict[str, Any]]]:
    """Separate-process mode: ``pairs`` pairs of (oracle, ours) rounds, ABBA (see :func:`abba`)."""
    def report(i: int, o: dict[str, float], p: dict[str, Any], took_s: float) -> None:
        err = pct_diff(p["native"]["launch_sync_eager_us"], o["launch_sync_eager_us"])
        print(f"pair {i + 1}/{pairs} ({'oracle first' if i % 2 == 0 else 'pcietrace first'}, "
              f"{took_s:.1f} s): launch+sync eager {err:+.2f} %", file=sys.stderr)

    return abba(pairs, oracle, ours, report)


def in_process_run(lib: Path, pairs: int, chunk_repeats: int, chunk_bursts: int, rate_chunk_s: float) -> dict[str, Any]:
    """In-process mode, meant to run in a fresh process: pcietrace's native core and the oracle library on
    GPU 0 in this one process and thread; per figure ``pairs`` ABBA pairs of chunks (one untimed warm-up
    chunk per side first). Returns {"gpu", "bus_id", "oracle_rate_launches" (per rate chunk), "chunks":
    {figure: {"oracle": [[samples] per pair], "native": [...]}}, "python": figures, "torch_us"}."""
    ours = Ours()  # first: it retains the primary context and makes it current on this thread
    oracle = CppOracle(lib)  # the same primary context, its own stream
    # The oracle launches a fixed count per rate chunk: as many as it calls in rate_chunk_s.
    n_rate = max(1000, int(oracle.rate(20_000)[0] * rate_chunk_s))
    r, b = chunk_repeats, chunk_bursts
    sides = {
        "eager_launches_per_s": (lambda: oracle.rate(n_rate), lambda: ours.rate(rate_chunk_s)),
        "host_us_per_launch": (lambda: oracle.host_us(b), lambda: ours.host_us(b)),
        "launch_sync_eager_us": (lambda: oracle.sync_us(False, r), lambda: ours.sync_us(False, r)),
        "launch_sync_graph1_us": (lambda: oracle.sync_us(True, r), lambda: ours.sync_us(True, r)),
        "copy_h2d_4B_us": (lambda: oracle.copy_us(True, r), lambda: ours.copy_us(True, r)),
        "copy_d2h_4B_us": (lambda: oracle.copy_us(False, r), lambda: ours.copy_us(False, r)),
    }
    chunks = {}
    for key, *_ in FIGURES:
        t0 = time.monotonic()
        o_side, p_side = sides[key]
        o_side(), p_side()  # warm-up chunks, not kept
        o, p = abba(pairs, o_side, p_side)
        chunks[key] = {"oracle": o, "native": p}
        errs = [pct_diff(statistics.median(b), statistics.median(a)) for a, b in zip(o, p)]
        print(f"{key}: {pairs} chunk pairs in {time.monotonic() - t0:.1f} s, median paired error "
              f"{statistics.median(errs):+.2f} %", file=sys.stderr)
    oracle.close()
    return {"gpu": ours.be.gpu.name, "bus_id": ours.be.gpu.bus_id, "oracle_rate_launches": n_rate,
            "chunks": chunks, "python": python_figures(ours), "torch_us": torch_host_us(ours)}


def _judge(key: str, label: str, unit: str, goal: str, oracle: float, native: float, python: float,
           errs: list[float], oracle_spread: list[float], native_spread: list[float]) -> dict[str, Any]:
    """One figure's row: medians, the paired errors (%) with their median and 95 % bootstrap interval, each
    side's spread (IQR / median, %, of ``*_spread``) and whether the goal is met on the median paired error."""
    med, lo, hi = median_ci(errs)
    ok = 1 + med / 100 >= RATIO_GOAL if goal == "ratio" else abs(med) <= TIME_GOAL_PCT
    return {"figure": key, "label": label, "unit": unit, "goal": goal,
            "oracle": oracle, "native": native, "python": python,
            "paired_error_pct": errs, "error_median_pct": med, "error_ci95_pct": [lo, hi],
            "oracle_iqr_pct": iqr_pct(oracle_spread), "native_iqr_pct": iqr_pct(native_spread), "met": bool(ok)}


def compare(oracle: list[dict[str, float]], ours: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Separate-process mode, per figure: each side's median over rounds, the per-pair errors and the
    round-to-round spreads (see :func:`_judge`)."""
    rows = []
    for key, label, unit, goal in FIGURES:
        o = [r[key] for r in oracle]
        n = [r["native"][key] for r in ours]
        py = [r["python"][key] for r in ours]
        errs = [pct_diff(b, a) for a, b in zip(o, n)]
        rows.append(_judge(key, label, unit, goal, statistics.median(o), statistics.median(n),
                           statistics.median(py), errs, o, n))
    return rows


def compare_chunks(run: dict[str, Any]) -> list[dict[str, Any]]:
    """In-process mode, per figure: each side's median over all its samples, the per-pair errors of the
    chunk medians and the chunk-to-chunk spreads (see :func:`_judge`); Python from its one round."""
    rows = []
    for key, label, unit, goal in FIGURES:
        o_chunks, n_chunks = run["chunks"][key]["oracle"], run["chunks"][key]["native"]
        o_med = [statistics.median(c) for c in o_chunks]
        n_med = [statistics.median(c) for c in n_chunks]
        errs = [pct_diff(b, a) for a, b in zip(o_med, n_med)]
        rows.append(_judge(key, label, unit, goal, statistics.median(s for c in o_chunks for s in c),
                           statistics.median(s for c in n_chunks for s in c), run["python"][key], errs, o_med, n_med))
    return rows


def print_table(rows: list[dict[str, Any]]) -> bool:
    """The comparison table; True if every goal is met."""
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
    return all(r["met"] for r in rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="Method and goals: see the module docstring (bench/native_core.py).")
    ap.add_argument("--separate-processes", action="store_true",
                    help="the earlier mode: oracle and pcietrace rounds each in a fresh process (default: in-process)")
    ap.add_argument("--pairs", type=int, default=40,
                    help="in-process: ABBA pairs of chunks per figure; >= 2")
    ap.add_argument("--chunk-repeats", type=int, default=201,
                    help="in-process: launch/copy + synchronize repeats per chunk (~2 ms at ~9 us each)")
    ap.add_argument("--chunk-bursts", type=int, default=5,
                    help=f"in-process: bursts of {BURST_CALLS} launches behind a 20 ms blocker per host-cost chunk")
    ap.add_argument("--rate-chunk-s", type=float, default=0.2,
                    help="in-process: seconds of launching as fast as possible per launch-rate chunk")
    ap.add_argument("--rounds", type=int, default=7,
                    help="--separate-processes: pairs of rounds (oracle + pcietrace, order alternating), each "
                         "round a fresh process; >= 2")
    ap.add_argument("--rate-launches", type=int, default=300_000,
                    help="--separate-processes: launches per oracle rate run (3 runs; ~1 s each at 300k launches/s)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures, paired errors and CIs here")
    a = ap.parse_args()
    if a.rounds < 2 or a.pairs < 2:
        ap.error("--rounds and --pairs must be at least 2 (one pair says nothing about the noise)")
    if a.chunk_repeats < 1 or a.chunk_bursts < 1 or not 0 < a.rate_chunk_s <= 10:
        ap.error("--chunk-repeats and --chunk-bursts must be >= 1, --rate-chunk-s in (0, 10]")
    lib_or_exe = build_oracle(shared=not a.separate_processes)
    try:
        return measure(a, lib_or_exe)
    except (PcietraceError, RuntimeError, subprocess.CalledProcessError) as exc:  # e.g. no GPU: one line
        print(f"native_core: {exc}", file=sys.stderr)
        return 2


def measure(a: argparse.Namespace, lib_or_exe: Path) -> int:
    """Measure in the mode ``a`` asks for, print the table (and write --json); 0."""
    t0 = time.monotonic()
    if a.separate_processes:
        oracle, ours = run_rounds(a.rounds, lambda: oracle_round(lib_or_exe, a.rate_launches),
                                  lambda: in_fresh_process(pcietrace_round))
        rows = compare(oracle, ours)
        gpu, bus_id = ours[0]["gpu"], ours[0]["bus_id"]
        torch_all = [r["torch_us"] for r in ours if r["torch_us"] is not None]
        torch_us = statistics.median(torch_all) if torch_all else None
        method = f"{a.rounds} pairs of rounds, each a fresh process, order alternating (ABBA)"
        spread = "the C++ loop's own round-to-round spread"
    else:
        run = in_fresh_process(functools.partial(in_process_run, lib_or_exe, a.pairs, a.chunk_repeats,
                                                 a.chunk_bursts, a.rate_chunk_s))
        rows = compare_chunks(run)
        gpu, bus_id, torch_us = run["gpu"], run["bus_id"], run["torch_us"]
        method = (f"in-process: one process and thread, same context, {a.pairs} ABBA chunk pairs per figure "
                  f"(chunk = {a.chunk_repeats} repeats / {a.chunk_bursts} bursts / {a.rate_chunk_s:g} s of launches)")
        spread = "the C++ loop's own chunk-to-chunk spread"
    took = time.monotonic() - t0
    try:
        from pcietrace.collectors import nvml

        driver = nvml.driver_version()  # after every measurement: NVML never shares a process with a timed one
    except Exception as exc:  # noqa: BLE001 - the figures stand without it
        driver = f"unknown ({type(exc).__name__})"
    print(f"device: {gpu} ({bus_id}), driver {driver}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"{method}, {took:.0f} s")
    met_all = print_table(rows)
    if torch_us is not None:
        print(f"{'host cost per launch, PyTorch (us)':<36} {'':>12} {'':>12} {torch_us:>11,.3f}"
              "  (x.fill_(0) on a 1-element tensor)")
    print(f"paired err = median over pairs of (pcietrace - oracle) / oracle; CI = bootstrap of that median; "
          f"oracle IQR = {spread}")
    print(f"ALL GOALS {'MET' if met_all else 'NOT MET'}")
    if a.json:
        common = {"mode": "separate-processes" if a.separate_processes else "in-process", "device": gpu,
                  "bus_id": bus_id, "driver": driver, "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                  "burst_calls": BURST_CALLS, "figures": rows, "all_goals_met": met_all,
                  "torch_host_us_per_launch": torch_us}
        if a.separate_processes:
            extra = {"pairs": a.rounds,
                     "order": ["oracle first" if i % 2 == 0 else "pcietrace first" for i in range(a.rounds)],
                     "repeats": REPEATS, "bursts": BURSTS, "rate_launches": a.rate_launches,
                     "rounds": {"oracle": oracle, "native": [r["native"] for r in ours],
                                "python": [r["python"] for r in ours], "torch_us": [r["torch_us"] for r in ours]}}
        else:
            extra = {"pairs": a.pairs, "order": "ABBA (oracle first in even pairs)", "chunk_repeats": a.chunk_repeats,
                     "chunk_bursts": a.chunk_bursts, "rate_chunk_s": a.rate_chunk_s,
                     "oracle_rate_launches": run["oracle_rate_launches"], "python": run["python"],
                     "chunk_medians": {k: {side: [statistics.median(c) for c in v[side]] for side in v}
                                       for k, v in run["chunks"].items()}}
        a.json.write_text(json.dumps({**common, **extra}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
