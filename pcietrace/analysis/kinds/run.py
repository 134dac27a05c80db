"""``pcietrace run``: bytes per launch from the launch windows (floor removed), host and GPU cost per launch,
round trips, and the key figures per GPU."""

from __future__ import annotations

from typing import Any

from pcietrace.analysis import counters, launch, summary
from pcietrace.analysis.kinds import shared
from pcietrace.analysis.results import RunResult
from pcietrace.session import Session


def tables(s: Session, options: shared.Options) -> dict[str, Any]:
    """A run's result tables by name (those without inputs left out)."""
    cum = counters.cumulative_bytes(s.samples, s.counters)
    out = shared.sampling(s, cum)
    if len(s.windows) and len(s.samples):
        wb = counters.window_bytes(cum, s.windows)
        fl = counters.floor(wb)
        wb = counters.subtract_floor(wb, fl)
        out["floor"] = fl
        out["per_launch"] = launch.per_launch_fits(wb, fl)
        if len(out["per_launch"]):
            out["per_node"] = launch.per_node(out["per_launch"])
        out["by_duration"] = launch.by_duration(wb)
        out["fit_windows"] = launch.fit_windows(wb)
    out.update(shared.host_costs(s))
    out.update(shared.round_trips(s, out.get("gpu_time"), options.us_per_level))
    out["per_gpu"] = summary.gpu_figures(s.meta, out)
    return out


def analyze(s: Session, options: shared.Options) -> RunResult:
    return RunResult.of(tables(s, options))
