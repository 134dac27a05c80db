"""The recorder's memory over a long attach: `pcietrace attach` on stand-in GPUs (tests/apps/attach_fake_gpu.py:
the real samplers, one process per GPU, with a stand-in counter reader; the real injection library), running a
program that holds an NVTX range open the whole time, so every GPU is read at the fast rate. The resident memory
of pcietrace's own process and of each sampler process is logged every ``--every-s``, and a line fitted to each.
Goal: pcietrace's process flat within 50 MB over 10 minutes with 8 samplers.

    nice -n 10 python3 bench/sampler_memory.py                 # 10 minutes, 8 GPUs
    python3 bench/sampler_memory.py --minutes 1 --every-s 5
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: The goal: the recording process's resident memory stays within this many MB of where it settled.
FLAT_MB = 50.0
HOLD_APP = """import sys, time, nvtx
with nvtx.annotate("whole run", domain="bench"):
    time.sleep(float(sys.argv[1]))
"""


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def samplers(parent: int) -> list[int]:
    """The sampler processes of ``parent``: its children started by multiprocessing's spawn (not its resource
    tracker, not the traced program)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and b"spawn_main" in cmd:
            out.append(int(name))
    return sorted(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--every-s", type=float, default=30.0)
    args = p.parse_args()
    seconds = args.minutes * 60
    with tempfile.TemporaryDirectory(prefix="pcietrace-memory-") as tmp:
        app = Path(tmp) / "hold.py"
        app.write_text(HOLD_APP)
        env = dict(os.environ, PYTHONPATH=str(ROOT), PCIETRACE_FAKE_GPUS=str(args.gpus))
        cmd = [sys.executable, str(ROOT / "tests" / "apps" / "attach_fake_gpu.py"), "attach",
               "--gpu", ",".join(str(i) for i in range(args.gpus)), "--no-calibrate", "--no-count-launches",
               "--idle-s", "1", "-o", str(Path(tmp) / "run"), "--format", "csv", "--", sys.executable, str(app),
               str(seconds)]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        t0, rows = time.monotonic(), []
        print(f"{'t s':>6} {'pcietrace MB':>13} {'samplers MB (each)':>40}", flush=True)
        while proc.poll() is None:
            kids = samplers(proc.pid)
            if len(kids) == args.gpus:
                try:
                    row = (time.monotonic() - t0, rss_mb(proc.pid), [rss_mb(k) for k in kids])
                except OSError:  # (it ended between the two reads)
                    break
                rows.append(row)
                print(f"{row[0]:6.0f} {row[1]:13.1f} {' '.join(f'{m:.0f}' for m in row[2]):>40}", flush=True)
            time.sleep(args.every_s if rows else 0.5)
        err = proc.communicate()[1]
        if proc.returncode:
            print(err, file=sys.stderr)
            return 1
        saved = err.strip().splitlines()[-1] if err.strip() else ""
        import pyarrow.parquet as pq

        n_samples = pq.ParquetFile(Path(tmp) / "run" / "samples.parquet").metadata.num_rows
    if len(rows) < 3:
        print("too few points to fit", file=sys.stderr)
        return 1
    t = np.array([r[0] for r in rows])
    parent = np.array([r[1] for r in rows])
    kids = np.array([np.mean(r[2]) for r in rows])
    settled = parent[1:]  # (the first point: still starting)
    slope = np.polyfit(t[1:], settled, 1)[0]
    kid_slope = np.polyfit(t[1:], kids[1:], 1)[0]
    spread = settled.max() - settled.min()
    print(f"{args.gpus} samplers, {args.minutes:g} min: pcietrace {settled.min():.0f}-{settled.max():.0f} MB "
          f"(spread {spread:.1f} MB, slope {slope * 60:+.2f} MB/min); samplers {kids[1:].min():.0f}-{kids[1:].max():.0f} "
          f"MB each (slope {kid_slope * 60:+.2f} MB/min); goal: pcietrace flat within {FLAT_MB:g} MB -> "
          f"{'met' if spread <= FLAT_MB else 'NOT met'}")
    print(f"{n_samples:,} samples saved ({n_samples / args.gpus / seconds:,.0f} reads/s per GPU); attach said: {saved}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
