"""Where attach's runtime overhead comes from (run on a GPU machine; not a test): the truth app without its
own reads (TRUTH_READS=0), run alone and in several configurations, interleaved; prints the median of the
app's timed loop and of each range's duration per configuration.

    python3 bench/attach_overhead_matrix.py SCENARIO [--pairs N] [--reps R]
``--reps R``: the app's repetitions of its ranges (default the app's 5: a ~0.25 s loop, whose wall time
varied by up to +-9 % between plain torchrun runs on 2x H200; more repetitions average that out).
Configurations: alone; attach (defaults, --no-calibrate: idle-aware sampling, 2 ms in launch-only ranges, 0.5 ms
during copies, 5 ms outside ranges); attach-idle0 (--idle-sample-interval-ms 0 --quiet-sample-interval-ms 0: 0.5 ms
throughout, the default before idle-aware sampling); attach with
the sampler's duty cap at 0.5 and 1 (off); attach-nowake (PCIETRACE_EDGE_WAKE=0: range edges do not wake the
samplers, which read at their own pace, so no read starts right after a push beside the range's first driver
call); attach-1ms and attach-10ms (--sample-interval-ms 1 / 10 with --quiet-sample-interval-ms 0: inside ranges,
copies or not); attach-nocount
(--no-count-launches: no launch trampolines, no per-launch device lookup) and
attach-nocount-10ms (both), which tell the injection's per-launch cost from the reads'; inject (the injection library
as attach sets it up, trampolines in the launch path, but no sampler and no counter read at all) and sampler (a
bare CounterSampler at 0.5 ms beside the plain app), which split attach into its two halves on the real driver;
inject-sampler (both halves at once, no attach: whether they only cost together).
``--pin CPUS``: the app (not attach or its samplers) runs under ``taskset -c CPUS`` in every configuration, to
tell a per-process level (PyTorch's eager_3000 +-10 % between plain runs on the H100) from where the scheduler
put the app (it did not narrow: CV 11.6 % pinned, 10.1 % not). ``--no-aslr``: the app under ``setarch -R`` (its
address space laid out the same in every run), for a level drawn from where memory lands. Besides the medians it
prints each configuration's spread between runs (coefficient of variation).
(A first run on 4x H200
also had `sampler`: a bare CounterSampler at 0.5 ms beside the app, no injection: +41.8 %, the same as attach:
there the reads, not the injection, cost. On 2x H200 later, the launch-bound `eager_3000` range still took
+4.5 % at 10 ms inside ranges; the nocount configurations test the injection for it. On 4x H200 (2026-11-22),
defaults, 10 pairs: `eager_3000` +2.0 %, the loop +1.4 %; docs/lab/bench/ctxcost_probe.cu put the
interposer's per-launch cost inside the launch loop's noise.) A run cut short by `timeout` (SIGTERM)
summarises the pairs it completed; each run's loop time goes to stderr as it ends. Besides the medians it prints
each range's P95 and max per call (a slow tail: one 256 MiB copy at 2.3x its median under attach, H100).
"""

from __future__ import annotations

import argparse
import json
import platform
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _side_sampler  # noqa: E402
from _stats import median_ci  # noqa: E402
from attach_truth import command, truth_rows  # noqa: E402
from pcietrace.record.attach import injection_env  # noqa: E402

ONE_PACE = ["--quiet-sample-interval-ms", "0"]  # (inside ranges, copies or not: --sample-interval-ms)
CONFIGS = {"alone": None, "attach": [], "attach-idle0": ["--idle-sample-interval-ms", "0", *ONE_PACE],
           "attach-duty0.5": ["--sampler-duty", "0.5"],
           "attach-duty1": ["--sampler-duty", "1"], "attach-1ms": ["--sample-interval-ms", "1", *ONE_PACE],
           "attach-10ms": ["--sample-interval-ms", "10", *ONE_PACE], "attach-nocount": ["--no-count-launches"],
           "attach-nocount-10ms": ["--no-count-launches", "--sample-interval-ms", "10", *ONE_PACE],
           "attach-nowake": [],
           "inject": None, "sampler": None, "inject-sampler": None}
HALVES = ("inject", "sampler", "inject-sampler")  # run only when named


def once(config: str, cmd: list[str], work: Path, i: int) -> tuple[pd.Series, pd.DataFrame]:
    """One run of the app in ``config``: (median ms per range and the loop, every call's row)."""
    out = work / f"{config}-{i}.jsonl"
    env = {**__import__("os").environ, "TRUTH_OUT": str(out), "TRUTH_READS": "0"}
    if config == "attach-nowake":
        env["PCIETRACE_EDGE_WAKE"] = "0"
    if config in HALVES:
        side = None
        if "sampler" in config:
            side = _side_sampler.start()
        if "inject" in config:
            traces = work / f"{config}-{i}"
            traces.mkdir()
            env = {**injection_env(traces, "interpose", None, [0], False), "TRUTH_OUT": str(out), "TRUTH_READS": "0"}
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if side is not None:
            side.communicate("")
    else:
        pre = [] if CONFIGS[config] is None else [sys.executable, "-m", "pcietrace", "attach", "--no-calibrate",
                                                   "-o", str(work / f"r-{config}-{i}"), *CONFIGS[config], "--"]
        subprocess.run(pre + cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows, walls = truth_rows(out)
    per_range = rows.groupby("range")["dur_ns"].median() / 1e6
    inits = [json.loads(x).get("init_ns", 0) for x in out.read_text().splitlines() if '"wall_ns"' in x]
    return pd.concat([per_range, pd.Series({"LOOP (mean over ranks)": sum(walls.values()) / len(walls) / 1e6,
                                            "NCCL first barrier (mean over ranks)": sum(inits) / len(inits) / 1e6})]), rows


def _stop(*_: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--reps", type=int, default=None, help="the app's repetitions (default: its own, 5)")
    ap.add_argument("--configs", default=",".join(c for c in CONFIGS if c not in HALVES),
                    help="which configurations (alone is always run; inject, sampler and inject-sampler only when named)")
    ap.add_argument("--pin", metavar="CPUS", help="run the app under taskset -c CPUS (attach and samplers unpinned)")
    ap.add_argument("--no-aslr", action="store_true", help="run the app under setarch -R (no address randomisation)")
    a = ap.parse_args()
    for c in set(CONFIGS) - {"alone", *a.configs.split(",")}:
        del CONFIGS[c]
    work = Path(tempfile.mkdtemp())
    cmd = command(a.scenario, work)
    if a.reps is not None:  # the Python apps take --reps, the C++ one a positional count
        cmd += ["--reps", str(a.reps)] if a.scenario != "cpp" else [str(a.reps)]
    if a.pin:
        cmd = ["taskset", "-c", a.pin, *cmd]
    if a.no_aslr:
        cmd = ["setarch", platform.machine(), "-R", *cmd]
    res: dict[str, list[pd.Series]] = {c: [] for c in CONFIGS}
    calls: dict[str, list[pd.DataFrame]] = {c: [] for c in CONFIGS}
    signal.signal(signal.SIGTERM, _stop)  # `timeout` ends it: summarise the pairs made so far
    try:
        for i in range(a.pairs):
            for c in (list(CONFIGS) if i % 2 == 0 else list(CONFIGS)[::-1]):  # ABBA: drift cancels in the pairs
                summary, rows = once(c, cmd, work, i)
                res[c].append(summary)
                calls[c].append(rows)
                print(f"pair {i + 1} {c}: loop {res[c][-1]['LOOP (mean over ranks)']:.1f} ms", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        done = min(len(v) for v in res.values())
        print(f"stopped: {done} complete pair(s) summarised", flush=True)
        if not done:
            return 1
        res = {c: v[:done] for c, v in res.items()}
        calls = {c: v[:done] for c, v in calls.items()}
        a.pairs = done
    barrier = "NCCL first barrier (mean over ranks)"
    if max(x[barrier] for v in res.values() for x in v) < 0.01:  # no barrier: two clock reads apart, not a figure
        res = {c: [x.drop(barrier) for x in v] for c, v in res.items()}
    table = pd.DataFrame({c: pd.concat(v, axis=1).median(axis=1) for c, v in res.items()})
    print(f"== {a.scenario}: median ms ({a.pairs} interleaved runs each)")
    print(table.round(2).to_string())
    print((table.div(table["alone"], axis=0) - 1).map(lambda x: f"{x:+.1%}").to_string())
    # each run's level: a per-process level as wide as the cost sought needs many pairs, or a pinned app
    spread = pd.DataFrame({c: pd.concat(v, axis=1).pipe(lambda d: d.std(axis=1) / d.mean(axis=1) * 100)
                           for c, v in res.items()})
    print(f"== spread between runs: coefficient of variation of the runs' medians, % (--pin {a.pin or 'off'}"
          f"{', --no-aslr' if a.no_aslr else ''})")
    print(spread.round(2).to_string())
    # A slow call now and then (a 256 MiB copy at 2.3x its median under attach, H100) hides in the medians
    for q in (0.95, 1.0):
        tail = pd.DataFrame({c: pd.concat(v).groupby("range")["dur_ns"].quantile(q) / 1e6 for c, v in calls.items()})
        print(f"== {'P95' if q < 1 else 'max'} ms per call (every call of every run and rank)")
        print(tail.round(2).to_string())
    loop = "LOOP (mean over ranks)"
    for c in CONFIGS:  # the app's runtime per pair (same round), then the median over pairs with its 95 % CI
        if c == "alone":
            continue
        ratios = [100 * (x[loop] / y[loop] - 1) for x, y in zip(res[c], res["alone"])]
        med, lo, hi = median_ci(ratios)
        print(f"{c}: app runtime per pair {', '.join(f'{r:+.1f}' for r in ratios)} % -> median {med:+.2f} % "
              f"[95 % CI {lo:+.2f}, {hi:+.2f}]")
        # each range the same way: its median call per run, paired by round (the median over all calls of all runs
        # above mixes the runs' levels: each process draws its own, e.g. torch eager_3000 +-10 % between runs)
        for r in table.index.drop([loop, barrier], errors="ignore"):
            med, lo, hi = median_ci([100 * (x[r] / y[r] - 1) for x, y in zip(res[c], res["alone"])])
            print(f"    {r}: median per pair {med:+.2f} % [95 % CI {lo:+.2f}, {hi:+.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
