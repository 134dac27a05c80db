"""Benchmark (run on a multi-GPU machine; not a test): does measuring every GPU at once change any GPU's
figures? Runs `pcietrace run` on each GPU alone, then on all of them at once (one worker process per GPU),
and prints each GPU's headline figures (the `per_gpu` table) side by side with the difference.
Goal (issue 8): every figure within 2 % of the GPU-alone run; `pcietrace run` with defaults within 60 s.
Usage: python3 bench/parallel_vs_alone.py [--quick] [--no-latency] [--alone 0,1,..] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FIGURES = ["eager_h2d_bytes", "eager_d2h_bytes", "host_us_per_launch", "host_us_per_launch_python",
           "eager_gpu_us", "graph_gpu_us", "speedup_min_kernel", "host_rtt_us"]


def run(gpu: str, extra: list[str]) -> tuple[dict[str, Any], float]:
    """`pcietrace run --gpu GPU --json --no-save` -> (its JSON document, wall seconds)."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pcietrace", "run", "--gpu", gpu, "--json", "--no-save", *extra],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit(f"pcietrace run --gpu {gpu} failed:\n{proc.stderr}")
    return json.loads(proc.stdout), time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="pass --quick to every run")
    ap.add_argument("--no-latency", action="store_true", help="pass --no-latency to every run")
    ap.add_argument("--alone", default=None, help="CUDA ordinals to also measure alone (default: every GPU)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    extra = (["--quick"] if a.quick else []) + (["--no-latency"] if a.no_latency else [])
    together, t_all = run("all", extra)
    gpus = together["meta"]["gpus"]
    ordinals = [int(x) for x in a.alone.split(",")] if a.alone else [g["cuda_ordinal"] for g in gpus]
    rows, walls = [], {"all": t_all}
    by_index = {r["nvml_index"]: r for r in together["results"]["per_gpu"]}
    for o in ordinals:
        alone, t = run(str(o), extra)
        walls[str(o)] = t
        r_alone = alone["results"]["per_gpu"][0]
        r_all = by_index[r_alone["nvml_index"]]
        for f in FIGURES:
            x, y = r_alone.get(f), r_all.get(f)
            diff = (y - x) / x * 100 if x not in (None, 0) and y is not None else None
            rows.append({"cuda_ordinal": o, "nvml_index": r_alone["nvml_index"], "figure": f, "alone": x,
                         "all_at_once": y, "diff_pct": diff})
    print(f"{len(gpus)} GPUs ({gpus[0]['name']}), driver {together['meta'].get('driver')}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; options: {' '.join(extra) or 'defaults'}")
    print(f"wall time: all GPUs at once {t_all:.1f} s (goal <= 60 s with defaults); alone: "
          + ", ".join(f"GPU {k} {v:.1f} s" for k, v in walls.items() if k != "all"))
    print(f"{'GPU':>3} {'figure':<28} {'alone':>12} {'all at once':>12} {'diff %':>8}")
    worst = 0.0
    for r in rows:
        d = r["diff_pct"]
        worst = max(worst, abs(d)) if d is not None else worst
        fmt = (lambda v: "–" if v is None else f"{v:,.3f}")
        print(f"{r['cuda_ordinal']:>3} {r['figure']:<28} {fmt(r['alone']):>12} {fmt(r['all_at_once']):>12} "
              f"{'–' if d is None else f'{d:+.2f}':>8}")
    print(f"largest difference {worst:.2f} % (goal <= 2 %): {'met' if worst <= 2 else 'NOT MET'}")
    if a.json:
        a.json.write_text(json.dumps({"walls_s": walls, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
