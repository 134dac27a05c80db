"""Benchmark (run on a multi-GPU machine; not a test): does measuring every GPU at once change any GPU's
figures?

Method: ``--repeats R`` times, `pcietrace run` on all the GPUs at once (one worker process per GPU), then on
each GPU alone (all, alone 0, alone 1, ..., all, alone 0, ...; every run its own process, `--json --no-save`).
Per GPU and headline figure (the ``per_gpu`` table): the median of the alone runs, the median of the
all-at-once runs, their difference in %, and the alone-vs-alone spread ((max - min) / median over the R alone
runs) as the noise floor. A figure DIFFERS only where |difference| > 2 % AND |difference| > that spread;
one beyond 2 % but inside the spread is reported as noise (the 2 % cannot be judged at that noise). With one
GPU (or ``--gpus N``) only alone runs are made and only the alone-vs-alone spread is reported.
Goals (issue 8): no figure differs (every GPU within 2 % of a single-GPU run); `pcietrace run` on all GPUs
with defaults within 60 s (the wall-time line; judged only for default options).
Runtime: (warm-up + R) all-at-once runs + R runs per GPU. With defaults a run took ~34 s on all of 4x H200 at
once (timed steps taking turns) and ~22 s per GPU alone, so R = 2 with one warm-up took 4.8 min on 4 GPUs; on
8x H200 (46 s at once side by side, before turns; ~26 s alone) ~8.5 min. ``--quick`` (passed to every run) roughly halves that and is the way to stay under ~6 min on 8 GPUs
or with R = 3; the 60 s wall-time goal is judged only on runs without it.
``--simulate N`` runs the same method on a SIMULATED box of N GPUs (no GPU needed; checks the script).
Usage: python3 bench/parallel_vs_alone.py [--repeats 2] [--warmup 1] [--gpus 0,1,..] [--quick] [--no-latency]
       [--simulate N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _stats import median_ci, pct_diff, range_pct

FIGURES = ["eager_h2d_bytes", "eager_d2h_bytes", "host_us_per_launch", "host_us_per_launch_python",
           "eager_gpu_us", "graph_gpu_us", "speedup_min_kernel", "host_rtt_us"]
GOAL_PCT, WALL_GOAL_S = 2.0, 60.0


def run(gpu: str, extra: list[str]) -> tuple[dict[str, Any], float]:
    """`pcietrace run --gpu GPU --json --no-save` -> (its JSON document, wall seconds)."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pcietrace", "run", "--gpu", gpu, "--json", "--no-save", *extra],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit(f"pcietrace run --gpu {gpu} failed:\n{proc.stderr}")
    return json.loads(proc.stdout), time.monotonic() - t0


def _value(row: dict[str, Any], figure: str) -> float | None:
    """``figure`` of one per_gpu row, None where it is missing or not finite."""
    v = row.get(figure)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def _values(per_round: list[float | None]) -> list[float]:
    """The values that are there (runs where the figure is missing are left out)."""
    return [v for v in per_round if v is not None]


def compare(alone: dict[int, list[dict[str, Any]]], together: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per GPU (NVML index) and figure, from its per_gpu rows of the alone and all-at-once runs: medians,
    difference in %, spreads in %, and the verdict: "same" (|diff| <= 2 %), "noise" (beyond 2 % but within the
    alone-vs-alone spread), "DIFFERS", or "alone only" (no all-at-once runs). ``alone`` and ``all_at_once``:
    the values per round (None where a run lacks the figure), so round i of one pairs with round i of the other."""
    out = []
    for idx in sorted(alone):
        for f in FIGURES:
            a_rounds = [_value(r, f) for r in alone[idx]]
            t_rounds = [_value(r, f) for r in together.get(idx, [])]
            a, t = _values(a_rounds), _values(t_rounds)
            a_med = statistics.median(a) if a else None
            t_med = statistics.median(t) if t else None
            a_spread = range_pct(a) if len(a) > 1 else None
            diff = pct_diff(t_med, a_med) if a and t else float("nan")
            if not t:
                verdict = "alone only"
            elif not math.isfinite(diff):
                verdict = "–"
            elif abs(diff) <= GOAL_PCT:
                verdict = "same"
            elif a_spread is not None and abs(diff) <= a_spread:
                verdict = "noise"
            else:
                verdict = "DIFFERS"
            out.append({"nvml_index": idx, "figure": f, "alone": a_rounds, "all_at_once": t_rounds, "alone_median": a_med,
                        "all_median": t_med, "diff_pct": diff if math.isfinite(diff) else None,
                        "alone_spread_pct": a_spread, "all_spread_pct": range_pct(t) if len(t) > 1 else None,
                        "verdict": verdict})
    return out


def pooled(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per figure, over every GPU and round: the paired change all-at-once / alone - 1 (the same GPU, the same
    round) in %, its median and percentile-bootstrap 95 % CI. Whether running GPUs together shifts a figure
    is asked of all GPUs at once, so one GPU's run-to-run noise does not decide it. Verdict: "same" (the
    whole CI within +-2 %), "DIFFERS" (|median| > 2 % and the CI excludes 0), else "noise" (the CI reaches
    past 2 % and spans 0: more rounds are needed to tell)."""
    out = []
    for f in FIGURES:
        pairs = [pct_diff(t, a) for r in rows if r["figure"] == f for t, a in zip(r["all_at_once"], r["alone"])]
        pairs = [x for x in pairs if math.isfinite(x)]
        if not pairs:
            continue
        med, lo, hi = median_ci(pairs)
        verdict = ("same" if -GOAL_PCT <= lo and hi <= GOAL_PCT else
                   "DIFFERS" if abs(med) > GOAL_PCT and (lo > 0 or hi < 0) else "noise")
        out.append({"figure": f, "pairs": len(pairs), "median_pct": med, "ci_lo_pct": lo, "ci_hi_pct": hi,
                    "verdict": verdict})
    return out


def print_pooled(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    pool = pooled(rows)
    print("\npaired over GPUs and rounds (all at once / alone - 1, same GPU and round):")
    print(f"{'figure':<28} {'pairs':>5} {'median %':>9} {'95 % CI':>18}  verdict")
    for p in pool:
        print(f"{p['figure']:<28} {p['pairs']:>5} {p['median_pct']:>+9.2f} "
              f"{'[' + format(p['ci_lo_pct'], '+.2f') + ', ' + format(p['ci_hi_pct'], '+.2f') + ']':>18}  {p['verdict']}")
    bad = [p["figure"] for p in pool if p["verdict"] == "DIFFERS"]
    noisy = [p["figure"] for p in pool if p["verdict"] == "noise"]
    print(f"measuring every GPU at once shifts {', '.join(bad) if bad else 'no figure'} by more than {GOAL_PCT:g} %"
          + ("" if bad else " (beyond its noise)")
          + (f"; not judged (the CI reaches past {GOAL_PCT:g} % and spans 0): {', '.join(noisy)}" if noisy else ""))
    return pool


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="Method, goals and runtimes: see bench/parallel_vs_alone.py's docstring.")
    ap.add_argument("--repeats", type=int, default=2, help="rounds of (all at once, each GPU alone); >= 2")
    ap.add_argument("--gpus", default=None, help="CUDA device numbers to measure, e.g. 0,1 (default: every GPU)")
    ap.add_argument("--warmup", type=int, default=1,
                    help="all-at-once runs made first and not counted (a fresh machine's first runs were slower: "
                         "4x H200, round 1 of 3 had host costs up to 30 %% higher); 0 = none")
    ap.add_argument("--quick", action="store_true", help="pass --quick to every run (about half the time)")
    ap.add_argument("--no-latency", action="store_true", help="pass --no-latency to every run")
    ap.add_argument("--simulate", type=int, default=None, metavar="N",
                    help="a SIMULATED box of N GPUs (no GPU needed; checks the method, measures nothing real)")
    ap.add_argument("--json", type=Path, default=None, help="also write every run's figures and the comparison here")
    ap.add_argument("--from-json", type=Path, default=None, metavar="FILE",
                    help="measure nothing: print the paired comparison of a file --json wrote")
    a = ap.parse_args()
    if a.from_json is not None:
        doc = json.loads(a.from_json.read_text())
        print(f"{a.from_json}: {doc['meta'].get('name')}, {doc['repeats']} rounds, "
              f"all at once {', '.join(f'{w:.1f}' for w in doc['walls_s']['all'])} s")
        print_pooled(doc["rows"])
        return 0
    if a.repeats < 2:
        ap.error("--repeats must be at least 2 (the alone-vs-alone spread needs two alone runs)")
    extra = (["--quick"] if a.quick else []) + (["--no-latency"] if a.no_latency else [])
    if a.simulate is not None:
        extra += ["--simulate", "--gpus", str(a.simulate)]
    try:
        ordinals = [int(x) for x in a.gpus.split(",")] if a.gpus else None
    except ValueError:
        ap.error(f"--gpus takes CUDA device numbers like 0,1, not {a.gpus!r}")
    if ordinals is None and a.simulate is not None:
        ordinals = list(range(a.simulate))
    sel = ",".join(map(str, ordinals)) if ordinals else "all"

    alone: dict[int, list[dict[str, Any]]] = {}
    together: dict[int, list[dict[str, Any]]] = {}
    walls: dict[str, list[float]] = {"all": []}
    meta: dict[str, Any] = {}
    runs: list[dict[str, Any]] = []
    t_start = time.monotonic()

    def one(gpu: str, label: str) -> tuple[dict[str, Any], float]:
        doc, wall = run(gpu, extra)
        print(f"{label}: {wall:.1f} s", file=sys.stderr)
        runs.append({"gpu": gpu, "label": label, "wall_s": wall, "per_gpu": doc["results"]["per_gpu"]})
        meta.update({k: doc["meta"].get(k) for k in ("driver", "simulated")}, name=doc["meta"]["gpus"][0].get("name"))
        return doc, wall

    first = None
    for i in range(a.warmup):
        doc, _ = one(sel, f"warm-up {i + 1} (not counted)")
        runs[-1]["warmup"] = True
        ordinals = ordinals or [g["cuda_ordinal"] for g in doc["meta"]["gpus"]]
    if ordinals is None:  # every GPU: the first all-at-once run says which there are
        first = one("all", "round 1: all GPUs at once")
        ordinals = [g["cuda_ordinal"] for g in first[0]["meta"]["gpus"]]
    single = len(ordinals) == 1
    for r in range(a.repeats):
        if not single:
            doc, wall = first if (r == 0 and first) else one(sel, f"round {r + 1}: all GPUs at once")
            walls["all"].append(wall)
            for row in doc["results"]["per_gpu"]:
                together.setdefault(row["nvml_index"], []).append(row)
        for o in ordinals:
            doc, wall = first if (single and r == 0 and first) else one(str(o), f"round {r + 1}: GPU {o} alone")
            walls.setdefault(str(o), []).append(wall)
            row = doc["results"]["per_gpu"][0]
            alone.setdefault(row["nvml_index"], []).append(row)
    took = time.monotonic() - t_start
    rows = compare(alone, together)

    sim = "SIMULATED " if meta.get("simulated") else ""
    print(f"{sim}{len(ordinals)} GPU(s) ({meta.get('name')}), driver {meta.get('driver')}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; options: {' '.join(extra) or 'defaults'}; "
          f"{a.repeats} rounds + {a.warmup} warm-up, {len(runs)} runs, {took / 60:.1f} min")
    default_opts = not a.quick and not a.no_latency and a.simulate is None
    if walls["all"]:
        worst = max(walls["all"])
        verdict = (f"goal <= {WALL_GOAL_S:g} s: {'met' if worst <= WALL_GOAL_S else 'NOT MET'}" if default_opts
                   else f"goal <= {WALL_GOAL_S:g} s applies to real GPUs with default options only")
        print(f"wall time, all GPUs at once: {', '.join(f'{w:.1f}' for w in walls['all'])} s ({verdict})")
    print("wall time alone (median): "
          + ", ".join(f"GPU {k} {statistics.median(v):.1f} s" for k, v in walls.items() if k != "all"))

    def fmt(v: float | None, spec: str = ",.3f") -> str:
        return "–" if v is None else format(v, spec)

    if single:
        print(f"{'GPU':>3} {'figure':<28} {'alone median':>13} {'alone spread %':>15}")
        for r in rows:
            print(f"{r['nvml_index']:>3} {r['figure']:<28} {fmt(r['alone_median']):>13} "
                  f"{fmt(r['alone_spread_pct'], '.2f'):>15}")
        print("one GPU: nothing runs at once; the spread is the noise any all-vs-alone difference must beat")
    else:
        print(f"{'GPU':>3} {'figure':<28} {'alone':>12} {'all at once':>12} {'diff %':>8} {'alone spread %':>15} "
              f"{'all spread %':>13}  verdict")
        for r in rows:
            print(f"{r['nvml_index']:>3} {r['figure']:<28} {fmt(r['alone_median']):>12} {fmt(r['all_median']):>12} "
                  f"{fmt(r['diff_pct'], '+.2f'):>8} {fmt(r['alone_spread_pct'], '.2f'):>15} "
                  f"{fmt(r['all_spread_pct'], '.2f'):>13}  {r['verdict']}")
        differ = [r for r in rows if r["verdict"] == "DIFFERS"]
        noise = [r for r in rows if r["verdict"] == "noise"]
        print(f"medians over {a.repeats} runs each; spread = (max - min) / median; a figure differs where "
              f"|diff| > {GOAL_PCT:g} % and beyond the alone-vs-alone spread")
        if noise:
            print(f"{len(noise)} figure(s) beyond {GOAL_PCT:g} % but within the alone-vs-alone spread (too noisy to "
                  "judge at this many repeats): " + ", ".join(f"GPU{r['nvml_index']} {r['figure']}" for r in noise))
        verdict = "NOT MET" if differ else "not judged (too noisy)" if noise else "met"
        print(f"{len(differ)} of {len(rows)} figures differ: every GPU within {GOAL_PCT:g} % of alone: {verdict}")
    pool = print_pooled(rows) if not single else []
    if a.json:
        a.json.write_text(json.dumps({"meta": meta, "options": extra, "repeats": a.repeats, "ordinals": ordinals,
                                      "walls_s": walls, "took_s": took, "rows": rows, "pooled": pool, "runs": runs},
                                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
