"""The injection library's own CPU cost per eager launch (no GPU needed; not a test).

A C loop (bench/interposer_loop.c) calls cuLaunchKernel of the fake driver (tests/native/fake_libcuda.c, whose
launch does nothing but read the clock twice) N times, alone (attach's "none" counter: the library is not in
the launch path) and through attach's trampolines ("interpose": the device lookup, the counts and the call's
timing; the loop begins no capture, so no capture query: docs/lab/bench/capture_query_probe.cu times that on a GPU), the
latter twice: calls timed by the TSC where the kernel's clocksource is it (the
library's default) and by CLOCK_MONOTONIC (PCIETRACE_CALL_CLOCK=monotonic).
Runs rotate; the figure is the median of the rounds' differences in ns per launch, with its 95 % bootstrap
interval. Divide by your own ns per launch (H100, C++: ~4,000) for the share.

    python3 bench/interposer_cost.py [--pairs 6] [--launches 2000000] [--pressure-kb 2048]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stats import median_ci, rotated  # noqa: E402
from pcietrace.record.attach import injection_env  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def build(work: Path) -> Path:
    """The fake driver (``work/libcuda.so.1``) and the loop; returns the loop."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("no C compiler (cc or gcc)")
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(work / "libcuda.so.1"),
                    str(ROOT / "tests" / "native" / "fake_libcuda.c")], check=True)
    subprocess.run([cc, "-O2", "-o", str(work / "loop"), str(ROOT / "bench" / "interposer_loop.c"), "-ldl"], check=True)
    return work / "loop"


CONFIGS = {"alone": "none", "interpose": "interpose", "interpose-monotonic": "interpose"}


def ns_per_launch(loop: Path, work: Path, config: str, launches: int, reps: int = 3, pressure_kb: int = 0) -> float:
    """The loop's best of ``reps`` figures (ns per launch) with the injection library set up as attach does;
    ``pressure_kb`` touched between launches (its time left out)."""
    traces = Path(tempfile.mkdtemp(dir=work))
    env = {**injection_env(traces, CONFIGS[config], None, [0], False), "LD_LIBRARY_PATH": str(work)}
    if config == "interpose-monotonic":
        env["PCIETRACE_CALL_CLOCK"] = "monotonic"
    out = subprocess.run([str(loop), str(launches), str(reps), str(pressure_kb)], env=env, capture_output=True,
                         text=True, check=True)
    return min(float(x) for x in out.stdout.split())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=6, help="rounds of the three configurations, rotating (default 6)")
    ap.add_argument("--launches", type=int, default=2_000_000, help="launch calls per figure (default 2,000,000)")
    ap.add_argument("--pressure-kb", type=int, default=0,
                    help="KiB touched between launches, as a large program's own work evicts the library's lines "
                         "(default 0: the library's lines stay in the caches); e.g. 2048")
    a = ap.parse_args()
    if a.pairs < 1 or a.launches < 1 or a.pressure_kb < 0:
        ap.error("--pairs and --launches must be >= 1, --pressure-kb >= 0")
    if a.pressure_kb and a.launches == ap.get_default("launches"):
        a.launches = max(20_000, a.launches * 16 // (a.pressure_kb + 16))  # (the touching takes far longer)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        loop = build(work)
        names = list(CONFIGS)
        rows = []
        for i in range(a.pairs):
            got = {c: ns_per_launch(loop, work, c, a.launches, pressure_kb=a.pressure_kb) for c in rotated(names, i)}
            rows.append([got[c] for c in names])
            print(f"round {i + 1}: " + ", ".join(f"{c} {got[c]:.1f}" for c in names) + " ns per launch")
    alone, inter, mono = np.array(rows).T
    for what, x in (("calls timed by the TSC (default)", inter), ("by CLOCK_MONOTONIC", mono)):
        med, lo, hi = median_ci(x - alone)
        print(f"the library's own cost per eager launch, {what}: {med:+.1f} ns [95 % CI {lo:+.1f}, {hi:+.1f}] "
              f"(fake launch alone: {np.median(alone):.1f} ns)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
