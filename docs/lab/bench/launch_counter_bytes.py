"""Do attach's launch counters add PCIe bytes per launch? (GPU machine; not a test)

The demo app (tests/apps/demo_nvtx.py, DEMO_TRUTH=1) reads NVML itself around its eager range of N empty
launches and prints the range's bytes. It runs plain, with the injection library counting through its
trampolines ("interpose"), counting through CUPTI driver callbacks ("cupti"), and interposing with CUPTI's
kernel records on ("gpu-time", attach --gpu-time), no sampler in any (the library alone, as attach sets it up),
in rotating order. Per configuration: the median H2D and D2H bytes per launch over the rounds, and the
difference from plain with its 95 % bootstrap interval. attach in CUPTI mode read ~3 % above the plain app's
truth in the nineteenth session; this says whether CUPTI itself moves that many bytes (H100, twentieth /
twenty-first sessions: cupti +2.98 / +2.63 % H2D, +1.58 / +1.56 % D2H; interpose +0.07 / -0.02 %; gpu-time,
twenty-first: +1.60 % H2D, +12.96 % D2H).

    python3 docs/lab/bench/launch_counter_bytes.py [--rounds 6] [--launches 20000]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from _stats import median_ci, rotated  # noqa: E402
from pcietrace.record.attach import injection_env  # noqa: E402

DEMO = Path(__file__).resolve().parents[3] / "tests" / "apps" / "demo_nvtx.py"
CONFIGS = ("plain", "interpose", "cupti", "gpu-time")


def per_launch(config: str, launches: int, work: Path) -> tuple[float, float]:
    """(H2D, D2H) bytes per launch of one demo run under ``config``."""
    traces = Path(tempfile.mkdtemp(dir=work))
    env = (dict(os.environ) if config == "plain" else
           injection_env(traces, "interpose", None, [0], False, gpu_time=True) if config == "gpu-time" else
           injection_env(traces, config, None, [0], False))
    out = subprocess.run([sys.executable, str(DEMO), str(launches), "1000", "16"], env={**env, "DEMO_TRUTH": "1"},
                         capture_output=True, text=True, timeout=300, check=True)
    doc = json.loads(out.stdout.splitlines()[-1])
    return doc["truth_h2d_bytes"] / launches, doc["truth_d2h_bytes"] / launches


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6, help="rounds of the configurations (default 6)")
    ap.add_argument("--launches", type=int, default=20_000, help="launches in the measured range (default 20,000)")
    a = ap.parse_args()
    if a.rounds < 1 or a.launches < 1:
        ap.error("--rounds and --launches must be >= 1")
    got: dict[str, list[tuple[float, float]]] = {c: [] for c in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for c in rotated(CONFIGS, r):
                got[c].append(per_launch(c, a.launches, Path(tmp)))
                print(f"round {r + 1} {c:9s}: H2D {got[c][-1][0]:8.1f} B, D2H {got[c][-1][1]:7.1f} B per launch")
    plain = np.array(got["plain"])
    for c in CONFIGS:
        v = np.array(got[c])
        line = f"{c:9s}: median H2D {np.median(v[:, 0]):8.1f} B, D2H {np.median(v[:, 1]):7.1f} B per launch"
        if c != "plain":
            for k, name in ((0, "H2D"), (1, "D2H")):
                med, lo, hi = median_ci((v[:, k] - plain[:, k]) / np.median(plain[:, k]) * 100)
                line += f"; {name} vs plain {med:+.2f} % [{lo:+.2f}, {hi:+.2f}]"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
