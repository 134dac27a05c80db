"""attach's graph-savings prediction against the truth (run after bench/graphs_h100.sh; not a test).

The truth is measured without any tracing cost: the plain eager attach run's range time minus the graphed
run's. The predictions come from the eager runs: with `--gpu-time` (GPU busy time, less the host cost the
kernel records add, as calibrated on the spot) and without (launch counts only). Goal (issue 11): within 20 %.

    python3 bench/savings_truth.py EAGER_RUN EAGER_GPUTIME_RUN GRAPHED_RUN [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from pcietrace.analysis import analyze
from pcietrace.analysis.savings import savings
from pcietrace.session import Session


def table(plain: Path, gputime: Path, graphed: Path) -> pd.DataFrame:
    runs = {k: Session.load(p) for k, p in (("plain", plain), ("gputime", gputime), ("graphed", graphed))}
    res = {k: analyze(s) for k, s in runs.items()}
    truth = savings(res["plain"], res["graphed"], runs["plain"].meta.get("launch_costs"))
    pred = res["gputime"]["ranges"].set_index(["domain", "name"])
    out = truth[["domain", "name", "eager_ms", "graphed_ms", "eager_launches", "measured_ms", "predicted_model_ms"]].rename(
        columns={"predicted_model_ms": "predicted_launch_counts_ms"})
    out["predicted_gpu_time_ms"] = [pred["graph_savings_ms"].get((d, n)) for d, n in zip(out["domain"], out["name"])]
    out["gpu_time_run_ms"] = [pred["incl_ms"].get((d, n)) for d, n in zip(out["domain"], out["name"])]
    for k in ("launch_counts", "gpu_time"):
        out[f"error_{k}_pct"] = (out[f"predicted_{k}_ms"] - out["measured_ms"]) / out["measured_ms"].abs() * 100
    out["gpu_time_us_per_launch"] = (runs["gputime"].meta.get("launch_costs") or {}).get("gpu_time_us_per_launch")
    return out[out["eager_launches"] > 0].reset_index(drop=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs=3, type=Path, metavar="RUN", help="eager, eager --gpu-time, graphed (saved attach runs)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    t = table(*a.runs)
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(t.round(2).to_string(index=False))
    worst = t["error_gpu_time_pct"].abs().max()
    print(f"worst |error| with --gpu-time: {worst:.1f} % (goal <= 20 %): {'met' if worst <= 20 else 'NOT MET'}")
    if a.json:
        a.json.write_text(json.dumps(json.loads(t.to_json(orient="records")), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
