"""`pcietrace attach` of a real training job on real GPUs (GPU machine): the recorder's memory while the job runs, and
what attach costs after it ends.

Runs tests/apps/train_job.py (a range per step, per layer, around backward and the optimizer: ~14 ranges per
~2.5 ms step) for ``--seconds``, alone (1 GPU) or under ``torchrun --nproc_per_node N``, under `pcietrace attach`.
Every ``--every-s`` it logs the resident memory of pcietrace's own process and of each sampler process. At the end
it prints: how long after the job's last rank ended attach had shown its report (the last line before the one
naming the Perfetto trace, which attach writes after the report) and exited (both CLOCK_MONOTONIC), pcietrace's
peak resident memory (VmHWM), when the program exited and each saved file was written, its memory's spread and
slope while the job ran (a line fitted after the first minute), and the head of attach's report. Goals: the
report within 30 s of the job's end in < 2 GB (4 GPUs, >= 150 s); the recorder flat within 50 MB over >= 10
minutes. ``--gpus N`` on a machine with fewer GPUs runs N ranks sharing them in turn.

    python3 bench/attach_job.py --gpus 4 --seconds 150 --out DIR
    python3 bench/attach_job.py --gpus 1 --seconds 630 --every-s 15 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from sampler_memory import FLAT_MB, rss_mb, samplers

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "tests" / "apps" / "train_job.py"
#: The goals after the job: seconds to the report, GB of pcietrace's peak resident memory.
END_S, END_GB = 30.0, 2.0


def hwm_mb(pid: int) -> float:
    """A process's peak resident memory so far (VmHWM), MB."""
    with open(f"/proc/{pid}/status") as f:
        return next((int(line.split()[1]) for line in f if line.startswith("VmHWM:")), 0) / 1024  # (0: exited)


def _after_the_job(run: Path, last_rank_ns: int, exit_ns: int) -> None:
    """Where attach's time after the job went: when the program (torchrun: its ranks' teardown and its own) exited,
    per the saved run's ``t_app_end_ns``, and when each saved file was last written (its mtime), all from the
    last rank's loop end."""
    wall_minus_mono = time.time() - time.monotonic()
    try:
        meta = json.loads((run / "report.json").read_text())["meta"]
    except (OSError, ValueError, KeyError):
        return
    at = {"program exited": meta.get("t_app_end_ns", 0) / 1e9}
    for f in sorted(run.iterdir(), key=lambda f: f.stat().st_mtime):
        at[f"{f.name} written"] = f.stat().st_mtime - wall_minus_mono
    at["attach exited"] = exit_ns / 1e9
    print("AFTER the last rank's loop ended: " + "; ".join(f"{k} {v - last_rank_ns / 1e9:+.1f} s" for k, v in at.items()))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=1, help="ranks, one per GPU (1: no torchrun; default 1)")
    p.add_argument("--seconds", type=float, default=150.0, help="training time (default 150)")
    p.add_argument("--every-s", type=float, default=10.0, help="memory logged this often (default 10)")
    p.add_argument("--out", type=Path, required=True, help="a new folder: the recording, the ranks' files, the log")
    p.add_argument("--attach-args", default="", type=shlex.split, help="extra `pcietrace attach` options, one string")
    a = p.parse_args()
    if a.gpus < 1 or a.seconds <= 0 or a.every_s <= 0:
        p.error("--gpus must be >= 1, --seconds and --every-s > 0")
    a.out.mkdir(parents=True, exist_ok=False)
    job = [sys.executable, str(APP), "--seconds", str(a.seconds), "--out", str(a.out / "job")]
    if a.gpus > 1:
        job[1:2] = ["-m", "torch.distributed.run", "--nproc_per_node", str(a.gpus), str(APP)]
    cmd = [sys.executable, "-m", "pcietrace", "attach", "-o", str(a.out / "run"), *a.attach_args, "--", *job]
    print("$", shlex.join(cmd), flush=True)
    shown: dict[str, int] = {}  # when the report's last line came; whether attach then named its Perfetto trace

    def copy_lines(pipe, report) -> None:
        for line in pipe:
            report.write(line)
            if line.startswith((b"Perfetto trace:", b"pcietrace: error: could not write the Perfetto",
                                b"pcietrace: interrupted: the Perfetto")):
                shown["trace"] = 1
            elif "trace" not in shown:
                shown["report"] = time.monotonic_ns()

    with open(a.out / "report.txt", "wb") as report:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))  # (each line timed as it comes)
        reader = threading.Thread(target=copy_lines, args=(proc.stdout, report), daemon=True)
        reader.start()
        t0, rows, peak, last = time.monotonic(), [], 0.0, -1e9
        print(f"{'t s':>6} {'pcietrace MB':>13} {'samplers MB (each)':>30}", flush=True)
        while proc.poll() is None:
            try:
                peak = max(peak, hwm_mb(proc.pid))
                if time.monotonic() - last >= a.every_s:
                    last = time.monotonic()
                    row = (last - t0, rss_mb(proc.pid), [rss_mb(k) for k in samplers(proc.pid)])
                    rows.append(row)
                    print(f"{row[0]:6.0f} {row[1]:13.1f} {' '.join(f'{m:.0f}' for m in row[2]):>30}", flush=True)
            except OSError:  # (it ended between two reads)
                pass
            time.sleep(0.2)
        t_exit = time.monotonic_ns()
        reader.join()
    ranks = [json.loads(f.read_text()) for f in sorted(a.out.glob("job.rank*.json"))]
    print(f"attach exit code {proc.returncode}; ranks {len(ranks)}, ranges per rank "
          f"{[r['ranges'] for r in ranks]}")
    if ranks:
        job_end_ns = max(r["end_ns"] for r in ranks)
        end_s, exit_s = (shown.get("report", t_exit) - job_end_ns) / 1e9, (t_exit - job_end_ns) / 1e9
        print(f"END attach showed its report {end_s:.1f} s and exited {exit_s:.1f} s after the job's last rank ended "
              f"(Perfetto trace named after the report: {'yes' if 'trace' in shown else 'no'}); pcietrace's peak "
              f"resident memory {peak / 1024:.2f} GB (goal: the report within {END_S:g} s, {END_GB:g} GB -> "
              f"{'met' if end_s <= END_S and peak / 1024 <= END_GB else 'NOT met'})")
        _after_the_job(a.out / "run", max(r["end_ns"] for r in ranks), t_exit)
        end_t = max(r["end_ns"] for r in ranks) / 1e9 - t0  # (the job's end on the log's clock)
        during = [r for r in rows if 60 <= r[0] <= end_t]
        if len(during) >= 3:
            t = np.array([r[0] for r in during])
            mb = np.array([r[1] for r in during])
            kids = np.array([np.mean(r[2]) if r[2] else np.nan for r in during])
            print(f"FLAT while the job ran (from 60 s to {end_t:.0f} s, {len(during)} points): pcietrace "
                  f"{mb.min():.0f}-{mb.max():.0f} MB (spread {np.ptp(mb):.1f} MB, slope "
                  f"{np.polyfit(t, mb, 1)[0] * 60:+.2f} MB/min); samplers {np.nanmin(kids):.0f}-{np.nanmax(kids):.0f} "
                  f"MB each; goal: flat within {FLAT_MB:g} MB -> {'met' if np.ptp(mb) <= FLAT_MB else 'NOT met'}")
    print("attach's report (head):")
    print("".join((a.out / "report.txt").open().readlines()[:60]))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
