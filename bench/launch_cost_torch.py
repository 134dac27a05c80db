"""What attach's launch counting costs a PyTorch program per kernel launch (GPU machine; not a test).

A loop of one-kernel PyTorch ops (``x.add_(1)`` on a one-element CUDA tensor: one eager launch each, the host's
time, the GPU idle between) runs in a fresh process, rotating through:

- ``plain``: no pcietrace;
- ``nvtx``: the injection library as attach sets it up with ``--no-count-launches`` (NVTX's injection only; the
  loop runs inside one range, so it is loaded and out of the launch path);
- ``preload``: the same with the library in LD_PRELOAD as interpose mode has it, but counting off
  (PCIETRACE_COUNT=none): what preloading alone costs (the library's dlsym in the way of every lookup);
- ``interpose``: attach's default, the counting trampolines;
- ``cupti``: ``--launch-counter cupti``;
- ``baseline``: with ``--baseline LIB``, ``interpose`` with that build of the library instead (another version's,
  to compare two builds in one run).

Per round and configuration: ns per op (the best of ``--reps`` loops in the process); the figure is each
configuration's median difference from the same round's ``plain`` with its 95 % bootstrap interval.

    python3 bench/launch_cost_torch.py [--rounds 8] [--ops 200000] [--cpus 2-5]
    python3 bench/launch_cost_torch.py --configs plain,interpose,baseline --baseline OLD/_pt_inject.so
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stats import median_ci, rotated  # noqa: E402
from pcietrace.record.attach import injection_env  # noqa: E402

LOOP = r"""
import json, sys, time, torch
ops, reps = int(sys.argv[1]), int(sys.argv[2])
x = torch.zeros(1, device="cuda")
for _ in range(2000):
    x.add_(1)
torch.cuda.synchronize()
torch.cuda.nvtx.range_push("loop")  # (NVTX's first call loads the injection library, as a program's would)
best = float("inf")
for _ in range(reps):
    t0 = time.perf_counter_ns()
    for _ in range(ops):
        x.add_(1)
    torch.cuda.synchronize()
    best = min(best, (time.perf_counter_ns() - t0) / ops)
torch.cuda.nvtx.range_pop()
print(json.dumps({"ns_per_op": best}))
"""
CONFIGS = ("plain", "nvtx", "preload", "interpose", "cupti", "baseline")


def env_of(config: str, traces: Path, baseline: str = "") -> dict[str, str]:
    """The loop's environment under ``config`` (:data:`CONFIGS`; ``baseline``: that one's library)."""
    if config == "plain":
        return dict(os.environ)
    counter = {"nvtx": "none", "preload": "none", "interpose": "interpose", "cupti": "cupti",
               "baseline": "interpose"}[config]
    env = injection_env(traces, counter, None, [0], False)
    if config == "baseline":
        lib = os.path.abspath(baseline)
        env["LD_PRELOAD"] = env["LD_PRELOAD"].replace(env["NVTX_INJECTION64_PATH"], lib)
        env["NVTX_INJECTION64_PATH"] = lib
    if config == "preload":
        env["LD_PRELOAD"] = " ".join(filter(None, [env["NVTX_INJECTION64_PATH"], os.environ.get("LD_PRELOAD")]))
    return env


def ns_per_op(config: str, ops: int, reps: int, cpus: str, baseline: str = "") -> float:
    """One process's best loop (ns per op) under ``config``."""
    with tempfile.TemporaryDirectory() as traces:
        cmd = ["taskset", "-c", cpus] * bool(cpus) + [sys.executable, "-c", LOOP, str(ops), str(reps)]
        out = subprocess.run(cmd, env=env_of(config, Path(traces), baseline), capture_output=True, text=True,
                             timeout=600)
    if out.returncode:
        raise SystemExit(f"launch_cost_torch: {config} failed ({out.returncode}): {out.stderr[-2000:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["ns_per_op"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8, help="rounds of every configuration, rotating (default 8)")
    ap.add_argument("--ops", type=int, default=200_000, help="ops per loop (default 200,000)")
    ap.add_argument("--reps", type=int, default=3, help="loops per process, the best kept (default 3)")
    ap.add_argument("--cpus", default="", help="hold each process to these CPUs (taskset list; default: not held)")
    ap.add_argument("--configs", default=",".join(CONFIGS[:-1]),
                    help=f"which, comma-separated, of {','.join(CONFIGS)} (default {','.join(CONFIGS[:-1])})")
    ap.add_argument("--baseline", default="", metavar="LIB", help="the injection library the 'baseline' "
                    "configuration preloads (another build of it)")
    a = ap.parse_args()
    configs = [c for c in a.configs.split(",") if c]
    if "plain" not in configs or any(c not in CONFIGS for c in configs) or a.rounds < 2:
        ap.error(f"--configs: 'plain' and any of {', '.join(CONFIGS)}; --rounds >= 2")
    if ("baseline" in configs) != bool(a.baseline) or (a.baseline and not os.path.isfile(a.baseline)):
        ap.error("--baseline LIB (a file) goes with the 'baseline' configuration")
    runs: dict[str, list[float]] = {c: [] for c in configs}
    for r in range(a.rounds):
        for c in rotated(configs, r):
            runs[c].append(ns_per_op(c, a.ops, a.reps, a.cpus, a.baseline))
        print(f"round {r}: " + ", ".join(f"{c} {runs[c][-1]:,.0f}" for c in configs) + " ns per op", flush=True)
    plain = np.array(runs["plain"])
    print(f"ns per one-launch PyTorch op, against the same round's plain ({a.rounds} rounds; plain median "
          f"{np.median(plain):,.0f} ns):")
    for c in configs[1:]:
        med, lo, hi = median_ci(np.array(runs[c]) - plain)
        print(f"  {c:10s} {med:+8,.0f} ns  (95 % interval {lo:+,.0f} ... {hi:+,.0f}; {med / np.median(plain):+.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
