"""Launches of a PyTorch training step, counted by `pcietrace attach` and by torch.profiler (run on a GPU).

tests/apps/backward_app.py runs forward, backward and the optimizer in a `train_step` NVTX range; PyTorch
launches the backward pass from its autograd threads. Two runs of the same steps:
1. under `pcietrace attach`: per call, the range's own thread's launches (`eager_launches` + `graph_launches`)
   and the whole process's while it was open (`*_launches_process`), and attach's note on threads with no range;
2. under torch.profiler (CUPTI runtime-API records with their threads, no pcietrace): per step, the launches
   of the thread that opened the step and of every thread within the step's time.
Prints both per step (median, min, max) and writes everything under --out.

    python3 docs/lab/bench/backward_launches.py --out DIR [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[3]
APP = ROOT / "tests" / "apps" / "backward_app.py"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for everything (new or empty)")
    ap.add_argument("--steps", type=int, default=20, help="training steps in ranges (default 20)")
    a = ap.parse_args()
    if a.out.exists() and any(a.out.iterdir()):
        ap.error(f"--out {a.out} is not empty")
    a.out.mkdir(parents=True, exist_ok=True)
    folder = a.out / "attach"
    subprocess.run([sys.executable, "-m", "pcietrace", "attach", "--no-calibrate", "-o", str(folder), "--",
                    sys.executable, str(APP), str(a.steps)], check=True, cwd=ROOT)
    rep = subprocess.run([sys.executable, "-m", "pcietrace", "report", str(folder), "--format", "json"],
                         check=True, capture_output=True, text=True, cwd=ROOT).stdout
    (a.out / "attach_report.json").write_text(rep)
    doc = json.loads(rep)
    inst = pd.DataFrame(doc["results"]["range_instances"])
    inst = inst[inst["name"] == "train_step"]
    ours = pd.DataFrame({"own_thread": inst["eager_launches"] + inst["graph_launches"],
                         "all_threads": inst["eager_launches_process"] + inst["graph_launches_process"]})
    prof_json = a.out / "profiler.json"
    subprocess.run([sys.executable, str(APP), str(a.steps)], check=True, cwd=ROOT,
                   env={**os.environ, "BACKWARD_PROFILE": str(prof_json)})
    prof = json.loads(prof_json.read_text())
    truth = pd.DataFrame(prof["steps"])
    rows = []
    for col in ("own_thread", "all_threads"):
        rows.append({"launches per step": col, "torch.profiler median": truth[col].median(),
                     "profiler min..max": f"{truth[col].min()}..{truth[col].max()}",
                     "attach median": ours[col].median(), "attach min..max": f"{ours[col].min()}..{ours[col].max()}"})
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    print(f"profiler threads with launches: {prof['threads']} (the step's own: {prof['main_thread']})")
    notes = [n for n in doc.get("summary", {}).get("lines", []) + [r["note"] for r in doc["results"].get("notes", [])] if "NVTX range" in n]
    print("attach's note:", notes[0] if notes else "(none)")
    (a.out / "summary.json").write_text(json.dumps({"table": table.to_dict("records"), "profiler": prof,
                                                    "attach_calls": ours.to_dict("records"), "note": notes}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
