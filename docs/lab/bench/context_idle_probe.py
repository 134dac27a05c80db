"""Does keeping extra CUDA contexts open (idle) on a GPU change what the run's own context measures, and how
long does making one take? Decides whether `pcietrace run` may make its fresh contexts (the eager GPU time's
context draws) before a GPU's timed turn instead of inside it.

Per round, interleaved: eager bursts (0 us kernels, 900 launches, native loop) in the run's own context with no
other context open, then with N idle contexts open (made before, closed after). Prints per round the GPU ns per
kernel and host ns per launch each way, the paired change (median over rounds, with a bootstrap 95 % interval),
and the time to make, use and close one context.

    python3 docs/lab/bench/context_idle_probe.py [--gpu 0] [--contexts 4] [--rounds 8]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from pcietrace.device.backend import CudaBackend  # noqa: E402
from pcietrace.record.generate import LaunchGenerator  # noqa: E402


def per_launch(gen: LaunchGenerator, bursts: int = 5) -> tuple[float, float]:
    """Median GPU ns per kernel and host ns per launch over ``bursts`` eager bursts of 900 empty kernels."""
    recs = [gen.burst("eager", 0.0, 1, 900) for _ in range(bursts)]
    return (float(np.median([r["gpu_ns"] / r["launches"] for r in recs])),
            float(np.median([r["host_ns"] / r["launches"] for r in recs])))


def ci(x: np.ndarray, rng: np.random.Generator) -> tuple[float, float, float]:
    boot = np.median(rng.choice(x, (4000, x.size)), axis=1)
    return float(np.median(x)), float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--contexts", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    be = CudaBackend(args.gpu)
    gen = LaunchGenerator(be)
    per_launch(gen, 2)  # warm
    rows, make_s, close_s = [], [], []
    for rnd in range(args.rounds):
        alone = per_launch(gen)
        t0 = time.monotonic()
        idle = [be.in_new_context() for _ in range(args.contexts)]
        make_s.append((time.monotonic() - t0) / args.contexts)
        be.activate()
        beside = per_launch(gen)
        t0 = time.monotonic()
        for c in idle:
            c.close()
        close_s.append((time.monotonic() - t0) / args.contexts)
        be.activate()
        rows.append((*alone, *beside))
        print(f"round {rnd}: GPU ns/kernel alone {alone[0]:.1f}, {args.contexts} idle contexts open {beside[0]:.1f}; "
              f"host ns/launch {alone[1]:.0f} vs {beside[1]:.0f}", flush=True)
    a = np.array(rows)
    rng = np.random.default_rng(0)
    for name, i in (("GPU time per eager kernel", 0), ("host cost per launch", 1)):
        m, lo, hi = ci(100 * (a[:, i + 2] / a[:, i] - 1), rng)
        print(f"{name}: with {args.contexts} idle contexts open vs none: {m:+.2f} % [{lo:+.2f}, {hi:+.2f}] "
              f"(median of {args.rounds} paired rounds, bootstrap 95 %)")
    print(f"making one context: {1e3 * np.median(make_s):.0f} ms; closing one: {1e3 * np.median(close_s):.0f} ms")
    be.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
