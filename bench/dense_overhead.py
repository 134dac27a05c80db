"""Benchmark (GPU machine): what `pcietrace attach` costs an app at emit_nvtx density, as a ratio with its interval.

Runs tests/apps/dense_app.py's ``fwd_emit`` phase (a range per op under ``torch.autograd.profiler.emit_nvtx``,
~100,000 ranges a second) for a loop of >= ``--seconds``, alternately plain and under `pcietrace attach`
(ABBA: plain-attached, attached-plain, ...), with the app's own NVML reads off (BLIND_TRUTH=0), and compares the
loop's wall time the app measures itself (attach's start-up, idle windows and analysis are outside it), and the
annotated phase's own time (the loop less its sleeps: the stricter figure). Prints each pair, the median slowdown
and its 95 % interval (Student t over the pairs' log ratios) for both. Goal: < 1 %. Ten pairs of a 10 s loop take
longer than one 600 s call on a lent machine: ``--save FILE`` appends each pair to FILE as it ends, and
``--combine FILE ...`` states the ratio over every pair saved, from several calls, without running anything.

    python3 bench/dense_overhead.py --pairs 10 --seconds 10 [--attach-args='--no-calibrate'] [--cpus 2-5] [--save F]
    python3 bench/dense_overhead.py --combine F1 F2
    python3 bench/dense_overhead.py --pairs 3 --seconds 4 --configs 'library=@library;attach=--no-calibrate;2ms=--no-calibrate --sample-interval-ms 2'
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from pcietrace.analysis.spread import t975
from pcietrace.record.attach import injection_env

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "tests" / "apps" / "dense_app.py"
ROUND_S = 0.05  # one round of fwd_emit with its truth windows' sleeps, as measured on an H100 (for --seconds)
LIBRARY = "@library"  # --configs: the injection library alone (the edges' and launches' cost, no reads)


def loop_s(attach: list[str] | None, calls: int, out: Path, timeout_s: float,
           cpus: str = "") -> tuple[float, float, float | None]:
    """One run's loop wall time and its phases' own time (s): the app alone (``attach`` None), under attach with
    those options, or (``attach`` == [LIBRARY]) with the injection library set up as attach does but no sampler and
    no counter read; ``cpus``: the app held to these CPUs (taskset) either way. Third: under attach, what its
    report says the app's range edges cost it (s, its processes' ``edges_ms``; None: not said)."""
    jsonl = out.with_suffix(".jsonl")
    env = {**os.environ, "BLIND_OUT": str(jsonl), "BLIND_CALLS": str(calls), "BLIND_TRUTH": "0",
           "DENSE_PHASES": "fwd_emit"}
    app = ["taskset", "-c", cpus] * bool(cpus) + [sys.executable, str(APP)]
    cmd = app if attach is None or attach == [LIBRARY] else [sys.executable, "-m", "pcietrace", "attach", "-o",
                                                             str(out), *attach, "--", *app]
    if attach == [LIBRARY]:
        out.mkdir(parents=True, exist_ok=True)
        env = {**injection_env(out, "interpose", None, [0], False), **{k: env[k] for k in env if k not in os.environ}}
    proc = subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=timeout_s)
    if proc.returncode:
        sys.exit(f"dense_overhead: {shlex.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    end = next(r for r in rows if r["kind"] == "end")
    said = None
    if (out / "report.json").is_file():
        procs = json.loads((out / "report.json").read_text())["meta"].get("processes", [])
        if any("edges_ms" in q for q in procs):
            said = sum(q.get("edges_ms", 0.0) for q in procs) / 1e3
    return end["loop_wall_ns"] / 1e9, sum(r["duration_ns"] for r in rows if r["kind"] == "range") / 1e9, said


def interval(ratios: list[float]) -> str:
    """The median slowdown, and the mean's 95 % interval over the pairs' log ratios."""
    logs = np.log(ratios)
    half = t975(len(logs) - 1) * logs.std(ddof=1) / np.sqrt(len(logs))
    lo, hi = np.expm1(logs.mean() - half), np.expm1(logs.mean() + half)
    return f"median {np.median(ratios) - 1:+.2%}, mean {np.expm1(logs.mean()):+.2%} (95 % interval {lo:+.2%} ... {hi:+.2%})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="example: python3 bench/dense_overhead.py --pairs 10 --seconds 10")
    ap.add_argument("--pairs", type=int, default=10, help="ABBA pairs, or rounds with --configs (default 10)")
    ap.add_argument("--seconds", type=float, default=10.0, help="the app's loop length, at least (default 10)")
    ap.add_argument("--attach-args", default="", type=shlex.split, help="extra `pcietrace attach` options, one string")
    ap.add_argument("--timeout-s", type=float, default=600, help="per run (default 600)")
    ap.add_argument("--cpus", default="", help="hold the app to these CPUs both ways (taskset list, e.g. 2-5): "
                                                 "less run-to-run spread from the scheduler (default: not held)")
    ap.add_argument("--save", type=Path, help="append each pair to this file (JSON lines) as it ends")
    ap.add_argument("--combine", type=Path, nargs="+", metavar="FILE",
                    help="run nothing: the ratio over every pair these --save files hold")
    ap.add_argument("--configs", help="instead of plain/attached pairs: rounds of the plain app and each of these "
                                       "configurations in a rotated order, NAME=ATTACH OPTIONS;... (@library: the "
                                       "injection library alone, no sampler), e.g. 'attach=;2ms=--sample-interval-ms 2'")
    a = ap.parse_args()
    if a.combine:
        try:
            rows = [json.loads(line) for f in a.combine for line in f.read_text().splitlines() if line.strip()]
            loops, phases = [float(r["loop"]) for r in rows], [float(r["phases"]) for r in rows]
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f"dense_overhead: not a --save file: {e}")
        if len(rows) < 2:
            sys.exit(f"dense_overhead: {len(rows)} pair(s) saved; the interval needs at least 2")
        summary(loops, phases, [tuple(r["said"]) for r in rows if r.get("said")],
                f"{len(rows)} pairs from {len(a.combine)} file(s)")
        return 0
    if a.pairs < 2 or a.seconds <= 0:
        ap.error("--pairs must be >= 2 and --seconds > 0")
    calls = max(1, int(a.seconds / ROUND_S))
    tmp = Path(tempfile.mkdtemp(prefix="dense-overhead-"))
    if a.configs:
        return matrix(a, calls, tmp)
    ratios, phase_ratios, said = [], [], []
    # (the ABBA order goes on from the pairs a --save file holds already: calls of an odd number of pairs stay balanced)
    saved = len(a.save.read_text().splitlines()) if a.save and a.save.is_file() else 0
    for p in range(a.pairs):
        order = ("plain", "attach") if (saved + p) % 2 == 0 else ("attach", "plain")
        t = {k: loop_s(None if k == "plain" else a.attach_args, calls, tmp / f"{p}-{k}", a.timeout_s, a.cpus) for k in order}
        ratios.append(t["attach"][0] / t["plain"][0])
        phase_ratios.append(t["attach"][1] / t["plain"][1])
        print(f"pair {p} ({'-'.join(order)}): loop {t['plain'][0]:.3f} s plain, {t['attach'][0]:.3f} s attached: "
              f"{ratios[-1] - 1:+.2%}; the phases alone {t['plain'][1]:.3f} s, {t['attach'][1]:.3f} s: "
              f"{phase_ratios[-1] - 1:+.2%}", flush=True)
        pair_said = None
        if t["attach"][2] is not None:  # the report's own figure against the slowdown measured around it
            said.append(pair_said := (t["attach"][2], t["attach"][1] - t["plain"][1]))
            print(f"  attach says the app's range edges cost it {said[-1][0]:.3f} s; the phases ran "
                  f"{said[-1][1]:+.3f} s longer", flush=True)
        if a.save:
            with a.save.open("a") as f:
                f.write(json.dumps({"loop": ratios[-1], "phases": phase_ratios[-1], "said": pair_said,
                                    "rounds": calls, "order": "-".join(order)}) + "\n")
    summary(ratios, phase_ratios, said, f"{a.pairs} pairs of a {calls}-round loop")
    return 0


def summary(ratios: list[float], phase_ratios: list[float], said: list[tuple[float, float]], what: str) -> None:
    """The ratio lines: the loop's and the phases' slowdown with their intervals, and attach's own figure."""
    print(f"RATIO attached / plain at emit_nvtx density ({what}; goal < 1 %):\n"
          f"  the app's loop: {interval(ratios)}\n  the annotated phases alone: {interval(phase_ratios)}")
    if said:
        told, slower = np.array(said).T
        print(f"EDGES attach's own figure for its range edges: median {np.median(told):.3f} s; the phases' slowdown "
              f"measured around it: median {np.median(slower):+.3f} s ({len(said)} pairs; figure / slowdown "
              f"{np.median(told / slower):.2f})")


def matrix(a: argparse.Namespace, calls: int, tmp: Path) -> int:
    """``--pairs`` rounds of the plain app and each ``--configs`` configuration, the order rotated each round; each
    configuration's slowdown against the same round's plain run."""
    configs = {"plain": None}
    for item in filter(None, a.configs.split(";")):
        name, _, opts = item.partition("=")
        configs[name.strip()] = shlex.split(opts) if opts.strip() != LIBRARY else [LIBRARY]
    names = list(configs)
    runs: dict[str, list[tuple[float, float, float | None]]] = {n: [] for n in names}
    for r in range(a.pairs):
        for n in names[r % len(names):] + names[:r % len(names)]:
            runs[n].append(loop_s(configs[n], calls, tmp / f"{r}-{n}", a.timeout_s, a.cpus))
            print(f"round {r} {n}: loop {runs[n][-1][0]:.3f} s, phases {runs[n][-1][1]:.3f} s", flush=True)
    print(f"RATIO against the same round's plain run ({a.pairs} rounds of a {calls}-round loop):")
    for n in names[1:]:
        loop = [x[0] / p[0] for x, p in zip(runs[n], runs["plain"])]
        phases = [x[1] / p[1] for x, p in zip(runs[n], runs["plain"])]
        print(f"  {n} ({shlex.join(configs[n] or [])}): the loop {interval(loop)}; the phases {interval(phases)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
