"""The injection library's own CPU cost per eager launch (no GPU needed; not a test).

A C loop (bench/interposer_loop.c) calls cuLaunchKernel of the fake driver (tests/native/fake_libcuda.c, whose
launch does nothing but read the clock twice) N times, alone (attach's "none" counter: the library is not in
the launch path) and through attach's trampolines ("interpose": the capture query, the device lookup, the counts
and the call's timing). Runs alternate ABBA; the figure is the median of the pairs' differences in ns per
launch, with its 95 % bootstrap interval. Divide by your own ns per launch (H100, C++: ~4,000) for the share.

    python3 bench/interposer_cost.py [--pairs 6] [--launches 2000000]
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
from _stats import median_ci  # noqa: E402
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


def ns_per_launch(loop: Path, work: Path, counter: str, launches: int, reps: int = 3) -> float:
    """The loop's best of ``reps`` figures (ns per launch) with the injection library set up as attach does."""
    traces = Path(tempfile.mkdtemp(dir=work))
    env = {**injection_env(traces, counter, None, [0], False), "LD_LIBRARY_PATH": str(work)}
    out = subprocess.run([str(loop), str(launches), str(reps)], env=env, capture_output=True, text=True, check=True)
    return min(float(x) for x in out.stdout.split())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=6, help="alone/interposed pairs, ABBA (default 6)")
    ap.add_argument("--launches", type=int, default=2_000_000, help="launch calls per figure (default 2,000,000)")
    a = ap.parse_args()
    if a.pairs < 1 or a.launches < 1:
        ap.error("--pairs and --launches must be >= 1")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        loop = build(work)
        rows = []
        for i in range(a.pairs):
            order = ("none", "interpose") if i % 2 == 0 else ("interpose", "none")
            got = {c: ns_per_launch(loop, work, c, a.launches) for c in order}
            rows.append((got["none"], got["interpose"]))
            print(f"pair {i + 1}: alone {got['none']:.1f} ns, through the trampolines {got['interpose']:.1f} ns "
                  "per launch")
    alone, inter = np.array(rows).T
    med, lo, hi = median_ci(inter - alone)
    print(f"the library's own cost per eager launch: {med:+.1f} ns [95 % CI {lo:+.1f}, {hi:+.1f}] "
          f"(fake launch alone: {np.median(alone):.1f} ns)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
