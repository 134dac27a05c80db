"""``pcietrace graphs``: the floor from its idle windows, then per workload size and strategy the time per
iteration and the PCIe bytes."""

from __future__ import annotations

import pandas as pd

from pcietrace.analysis import counters
from pcietrace.analysis import graphs as graphs_analysis
from pcietrace.analysis.kinds import shared
from pcietrace.analysis.results import GraphsResult
from pcietrace.session import Session


def analyze(s: Session, options: shared.Options) -> GraphsResult:
    cum = counters.cumulative_bytes(s.samples, s.counters)
    out = shared.sampling(s, cum)
    per_window = not s.meta.get("graphs_plan", {}).get("sync", True)
    if not len(s.windows) or not len(s.samples):
        return GraphsResult.of({**out, "graphs": graphs_analysis.summary(s.graphs, pd.DataFrame(), per_window)})
    wb = counters.window_bytes(cum, s.windows)
    fl = counters.floor(wb)
    return GraphsResult.of({**out, "floor": fl,
                            "graphs": graphs_analysis.summary(s.graphs, counters.subtract_floor(wb, fl), per_window)})
