"""Benchmark (GPU machine): how much `pcietrace attach` slows the demo apps, in one run.

Runs each demo app alternately plain and under attach (several attach variants, to separate the
costs), and compares the apps' own timings, median of paired ratios: the whole workload (which
includes sleeps, so it is noisy) and its eager phase alone (20000 launches; the difference per launch
is the cost of counting one launch). Goal: < 3 %. Usage: python3 bench/attach_overhead.py [--pairs 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

APPS = Path(__file__).resolve().parent.parent / "tests" / "apps"


VARIANTS = {"interpose (default)": [], "cupti": ["--launch-counter", "cupti"], "no launch counting": ["--no-count-launches"]}


def timings(cmd: list[str], attach: list[str] | None, out: Path) -> dict:
    """The app's own workload time: plain (``attach`` None) or under attach with extra options."""
    full = cmd if attach is None else [sys.executable, "-m", "pcietrace", "attach", "--no-calibrate", *attach,
                                       "-o", str(out), "--", *cmd]
    proc = subprocess.run(full, capture_output=True, text=True, cwd=out.parent)  # not the repo root: use the install
    if proc.returncode:
        raise SystemExit(f"{' '.join(full)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith('{"app"'))
    return json.loads(line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=5)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    apps = {"python": [sys.executable, str(APPS / "demo_nvtx.py")]}
    if shutil.which("nvcc"):
        subprocess.run(["nvcc", "-O2", "-o", str(tmp / "demo_nvtx"), str(APPS / "demo_nvtx.cu"), "-ldl"], check=True)
        apps["cpp"] = [str(tmp / "demo_nvtx")]
    for name, cmd in apps.items():
        for v, (variant, opts) in enumerate(VARIANTS.items()):
            plain, attached = [], []
            for i in range(a.pairs):  # plain and attached runs alternate, so drift hits both
                run = tmp / f"{name}-{v}-{i}"  # one folder per attached run (attach refuses to overwrite a run)
                plain.append(timings(cmd, None, run))
                attached.append(timings(cmd, opts, run))
            for key in ("workload_s", "eager_s"):
                ratios = [b[key] / p[key] for p, b in zip(plain, attached)]
                extra = statistics.median(b[key] - p[key] for p, b in zip(plain, attached)) / plain[0]["eager_launches"]
                print(f"{name} [{variant}] {key}: plain {statistics.median(p[key] for p in plain) * 1e3:.1f} ms, attached "
                      f"{statistics.median(b[key] for b in attached) * 1e3:.1f} ms; RATIO attach slowdown = "
                      f"{statistics.median(ratios) - 1:+.2%} (median of {a.pairs} pairs; goal < 3 %)"
                      + (f"; {extra * 1e6:+.2f} us per launch" if key == "eager_s" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
