"""attach's launch-count savings prediction on a slowed host (GPU machine; not a test).

Per app (the Python demo; the C++ demo where nvcc builds it) and host condition -- ``plain``, or ``slowed``: a
busy loop pinned to the app's CPU, so the app gets about half of it -- ``--pairs`` pairs of runs: the eager app
under attach, then the graphed app under attach. The eager range's predicted saving ("graphs save", launch counts
only) is set beside the measured one (eager range time minus graphed), predicted twice from the same recording:
with the injection library's timing of launch and synchronize calls, and without it (the timing columns
dropped: the rule every recording made before it gets). Truth and both predictions come from the same runs.

    python3 docs/lab/bench/savings_timed.py [--pairs 3] [--keep DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from pcietrace.analysis import analyze
from pcietrace.analysis.savings import savings
from pcietrace.record.attach import TIMING_COLUMNS
from pcietrace.session import Session

APPS = Path(__file__).resolve().parents[3] / "tests" / "apps"
RANGE = "eager_launches"


def attach(cmd: list[str], out: Path) -> None:
    """``cmd`` under ``pcietrace attach`` (with its on-the-spot launch costs), saved to ``out``."""
    p = subprocess.run([sys.executable, "-m", "pcietrace", "attach", "-o", str(out), "--", *cmd],
                       capture_output=True, text=True, timeout=300, cwd=out.parent)
    if p.returncode:
        raise SystemExit(f"attach {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")


def untimed(session: Session) -> Session:
    """The same recording without the call timing (as recorded before the library timed calls)."""
    session.events = session.events.drop(columns=[c for c in TIMING_COLUMNS if c in session.events])
    return session


def pair(app: str, cmd: list[str], graphed: list[str], cond: str, rep: int, work: Path) -> dict:
    """One eager and one graphed attach run: the eager range's figures and both predictions."""
    e, g = work / f"{app}-{cond}-{rep}-eager", work / f"{app}-{cond}-{rep}-graph"
    attach(cmd, e)
    attach(graphed, g)
    res_g = analyze(Session.load(g))
    res_e = analyze(Session.load(e))
    timed = savings(res_e, res_g).set_index("name").loc[RANGE]
    old = savings(analyze(untimed(Session.load(e))), res_g).set_index("name").loc[RANGE]
    inst = res_e["range_instances"].set_index("name").loc[RANGE]
    n = float(inst["eager_launches"])
    row = {"app": app, "host": cond, "rep": rep, "launches": n, "us_per_launch": inst["excl_ns"] / n / 1e3,
           "launch_call_us": inst["launch_call_ns"] / n / 1e3, "sync_wait_us": inst["sync_wait_ns"] / n / 1e3,
           "measured_ms": timed["measured_ms"], "timed_ms": timed["predicted_ms"], "timed_bound": timed["launch_bound"],
           "untimed_ms": old["predicted_ms"], "untimed_bound": old["launch_bound"]}
    row["timed_err_pct"] = (row["timed_ms"] - row["measured_ms"]) / abs(row["measured_ms"]) * 100
    row["untimed_err_pct"] = (row["untimed_ms"] - row["measured_ms"]) / abs(row["measured_ms"]) * 100
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3, help="pairs of runs per app and host condition (default 3)")
    ap.add_argument("--keep", type=Path, default=None, help="copy each app and condition's first eager run here")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    a = ap.parse_args()
    cpu = str(max(os.sched_getaffinity(0)))
    apps = {"python": [sys.executable, str(APPS / "demo_nvtx.py")]}
    work = Path(tempfile.mkdtemp(prefix="savings-timed-"))
    if shutil.which("nvcc"):
        exe = work / "demo_nvtx"
        subprocess.run(["nvcc", "-O2", "-o", str(exe), str(APPS / "demo_nvtx.cu"), "-ldl"], check=True)
        apps["cpp"] = [str(exe)]
    rows = []
    for cond in ("plain", "slowed"):
        hog = (subprocess.Popen(["taskset", "-c", cpu, sys.executable, "-c", "while True: pass"])
               if cond == "slowed" else None)
        try:
            for app, base in apps.items():
                pinned = ["taskset", "-c", cpu, *base]
                for rep in range(a.pairs):
                    rows.append(pair(app, [*pinned, "20000", "1000", "256"], [*pinned, "--graphed", "20000", "1000", "256"],
                                     cond, rep, work))
                    print(json.dumps(rows[-1], default=str), flush=True)
                if a.keep:
                    shutil.copytree(work / f"{app}-{cond}-0-eager", a.keep / f"{app}-{cond}-eager", dirs_exist_ok=True)
                    shutil.copytree(work / f"{app}-{cond}-0-graph", a.keep / f"{app}-{cond}-graph", dirs_exist_ok=True)
        finally:
            if hog:
                hog.kill()
                hog.wait()
    t = pd.DataFrame(rows)
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(t.round(2).to_string(index=False))
        print(t.groupby(["app", "host"])[["timed_err_pct", "untimed_err_pct"]].agg(lambda s: s.abs().max())
              .rename(columns=lambda c: "worst |" + c + "|").round(1).to_string())
    if a.json:
        a.json.write_text(t.to_json(orient="records", indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
