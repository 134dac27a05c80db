"""The recorder's memory over a long attach: the real CounterSampler (8 sampler processes, a stand-in counter
reader, no driver needed) spilling its samples to disk as attach does. Goal: the parent's resident memory flat
within 50 MB over 10 minutes.

    python3 bench/sampler_memory.py              # 10 minutes, 8 GPUs
    python3 bench/sampler_memory.py --minutes 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--gpus", type=int, default=8)
    args = p.parse_args()
    from pcietrace.collectors.sampler import SPILL_ROWS

    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "apps" / "sampler_spill_fake_nvml.py"),
                           str(args.minutes * 60), str(args.gpus), str(SPILL_ROWS)], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True)
    if proc.returncode:
        print(proc.stderr, file=sys.stderr)
        return 1
    res = json.loads(proc.stdout)
    rss = res["rss_mb"]
    settled = rss[len(rss) // 10:]  # (after the first tenth: imports and the first spill are done)
    print(f"{args.gpus} samplers, {args.minutes:g} min: {res['samples']:,} samples, {res['files']} files spilled, "
          f"at most {res['held']:,} held; parent RSS {rss[0]:.0f} MB at start, {min(settled):.0f}-{max(settled):.0f} MB "
          f"after the first tenth, {rss[-1]:.0f} MB at the end (goal: flat within 50 MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
