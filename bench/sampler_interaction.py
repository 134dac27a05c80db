"""Does a sampler reading NVML slow an app's launches, more so with attach's library in the app? (GPU only)

PyTorch's `eager_3000` range (3,000 `x.add_(1)` + synchronize) took +5 ... +10 % under attach on the H100, and
+6 % with the injection library and a bare sampler beside the app but no attach (twenty-first session); yet
each process draws its own level of that range (+-11 % between plain runs, pinned or not), so pairs of runs
cannot resolve a few %. Here the comparison stays inside one process: the app starts a sampler process (0.5 ms
reads, as attach's in a range; plain environment, no library) and alternates blocks with the sampler reading
and paused (ABBA), timing the eager range in each. The per-process level cancels in each block pair's ratio.
The app runs plain, with the library interposing launches (``inject``: LD_PRELOAD trampolines, as attach sets
it up, no edge page) and with NVTX injection only (``nvtx``: no trampolines), in rotating order.

    python3 bench/sampler_interaction.py [--rounds 6] [--blocks 10] [--reps 10] [--work torch|bindings]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _side_sampler  # noqa: E402
from _stats import median_ci, rotated  # noqa: E402

CONFIGS = ("plain", "inject", "nvtx")
#: the library's and pcietrace's variables: the side sampler runs as attach's do, without them
OURS = ("LD_PRELOAD", "NVTX_INJECTION64_PATH", "CUDA_INJECTION64_PATH")


def app(work: str, blocks: int, reps: int) -> None:
    """In the traced process: the eager range timed in blocks, the side sampler reading or paused (ABBA)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "apps"))
    import truth_app

    eager = (truth_app.torch_work if work == "torch" else truth_app.bindings_work)(0)[0]
    env = {k: v for k, v in os.environ.items() if k not in OURS and not k.startswith("PCIETRACE_")}
    side = _side_sampler.start(paused=True, env=env)
    for _ in range(5):
        eager()
    for b in range(blocks):
        for state in (("on", "off") if b % 2 == 0 else ("off", "on")):
            _side_sampler.set_reading(side, state == "on")
            time.sleep(0.05)  # the sampler's first reads at the new state
            ms = []
            for _ in range(reps):
                t0 = time.perf_counter_ns()
                eager()
                ms.append((time.perf_counter_ns() - t0) / 1e6)
            print(json.dumps({"block": b, "sampler": state, "ms": statistics.median(ms)}), flush=True)
    side.communicate("")


def run(config: str, a: argparse.Namespace, work: Path) -> list[dict]:
    """One app process under ``config``: its blocks' rows."""
    from pcietrace.record.attach import injection_env

    traces = Path(tempfile.mkdtemp(dir=work))
    env = (dict(os.environ) if config == "plain" else
           injection_env(traces, "interpose" if config == "inject" else "none", None, [0], False))
    out = subprocess.run([sys.executable, __file__, "--app", "--work", a.work, "--blocks", str(a.blocks),
                          "--reps", str(a.reps)], env=env, check=True, capture_output=True, text=True).stdout
    return [json.loads(x) for x in out.splitlines() if x.startswith("{")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--blocks", type=int, default=10, help="block pairs per process (sampler reading, paused)")
    ap.add_argument("--reps", type=int, default=10, help="eager ranges timed per block")
    ap.add_argument("--work", choices=("torch", "bindings"), default="torch")
    ap.add_argument("--app", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.app:
        app(a.work, a.blocks, a.reps)
        return 0
    work = Path(tempfile.mkdtemp())
    effect: dict[str, list[float]] = {c: [] for c in CONFIGS}  # per process: sampler on vs off, %
    level: dict[str, list[float]] = {c: [] for c in CONFIGS}  # per process: ms per eager range, sampler paused
    for r in range(a.rounds):
        for c in rotated(CONFIGS, r):
            rows = run(c, a, work)
            on = {x["block"]: x["ms"] for x in rows if x["sampler"] == "on"}
            off = {x["block"]: x["ms"] for x in rows if x["sampler"] == "off"}
            ratios = [100 * (on[b] / off[b] - 1) for b in on if b in off]
            effect[c].append(float(np.median(ratios)))
            level[c].append(float(np.median(list(off.values()))))
            print(f"round {r + 1} {c:6}: eager range {level[c][-1]:.2f} ms with the sampler paused; reading: "
                  f"{effect[c][-1]:+.2f} % (block pairs {min(ratios):+.1f} ... {max(ratios):+.1f} %)", flush=True)
    for c in CONFIGS:
        med, lo, hi = median_ci(effect[c])
        lmed, llo, lhi = median_ci([100 * (x / y - 1) for x, y in zip(level[c], level["plain"])])
        print(f"{c:6}: the sampler reading slows the eager range {med:+.2f} % [95 % CI {lo:+.2f}, {hi:+.2f}] "
              f"(median over {len(effect[c])} processes); its level with the sampler paused vs plain, per round: "
              f"{lmed:+.2f} % [{llo:+.2f}, {lhi:+.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
