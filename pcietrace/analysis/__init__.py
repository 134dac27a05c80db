"""Analysis: pure functions from a recorded :class:`~pcietrace.session.Session` to named DataFrames.

Never imports rich or touches a GPU. :func:`analyze` is the one entry point the CLI and tests use.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from pcietrace.analysis import attribution, counters, launch, validate
from pcietrace.analysis import latency as latency_analysis
from pcietrace.session import Session

#: Result tables in display order; each is a DataFrame documented in its producing function.
RESULT_TABLES = ("sampling", "floor", "calibration", "per_launch", "per_node", "by_duration",
                 "cpu_cost", "gpu_time", "speedup", "latency", "topology_model", "ranges", "range_instances", "whole_run")


def analyze(session: Session, us_per_level: float = latency_analysis.DEFAULT_US_PER_LEVEL) -> dict[str, pd.DataFrame]:
    """All result tables of a session (tables whose inputs are missing come back empty).
    ``us_per_level``: round trip added per PCIe switch level, for the topology model. A session that
    breaks an invariant the figures rely on raises :class:`~pcietrace.errors.DataError` first."""
    validate.check(session)
    out: dict[str, pd.DataFrame] = {t: pd.DataFrame() for t in RESULT_TABLES}
    s = session
    if len(s.samples):
        out["sampling"] = counters.sample_gaps(s.samples)
    attach = str(s.meta.get("kind", "")).startswith("attach")
    if len(s.windows) and len(s.samples) and not attach:
        cum = counters.cumulative_bytes(s.samples, s.counters)
        wb = counters.window_bytes(cum, s.windows)
        fl = counters.floor(wb)
        wb = counters.subtract_floor(wb, fl)
        out["floor"] = fl
        out["per_launch"] = launch.per_launch_fits(wb, fl)
        if len(out["per_launch"]):
            out["per_node"] = launch.per_node(out["per_launch"])
        out["by_duration"] = launch.by_duration(wb)
    if len(s.calibration):
        out["calibration"] = s.calibration
    if len(s.bursts):
        out["cpu_cost"] = launch.cpu_cost(s.bursts)
        if len(s.calibration):
            out["gpu_time"] = launch.gpu_time(s.bursts, s.calibration)
    if len(s.e2e):
        out["speedup"] = launch.speedup(s.e2e)
    if s.meta.get("kind") == "attach" and len(s.samples):  # ("attach-failed": the program never ran)
        out.update(_attach(s, out))
    if len(s.latency):
        out["latency"] = latency_analysis.summary(s.latency)
        if len(out["gpu_time"]):
            levels = {g["nvml_index"]: g["switch_levels"] for g in (s.meta.get("topology") or {}).get("gpus", [])
                      if g.get("nvml_index") is not None}
            out["topology_model"] = latency_analysis.topology_model(out["gpu_time"], out["latency"], levels, us_per_level)
    return out


def to_jsonable(results: dict[str, pd.DataFrame]) -> dict[str, Any]:
    """Result tables as lists of records (NaN -> null), for the JSON report and ``--json``."""
    return {k: json.loads(v.to_json(orient="records")) for k, v in results.items()}


def _attach(s: Session, out: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Attribution for an attach session: the idle windows before/after the program give the floor."""
    cum = counters.cumulative_bytes(s.samples, s.counters)
    fl = counters.floor(counters.window_bytes(cum, s.windows)) if len(s.windows) else pd.DataFrame()
    floor_bps = {"h2d": float(fl["rx_Bps"].sum()), "d2h": float(fl["tx_Bps"].sum())} if len(fl) else {}
    gap_ns = float(out["sampling"]["median_gap_us"].max()) * 1e3 if len(out["sampling"]) else 0.0
    ranges = attribution.ranges_from_events(s.events) if len(s.events) else pd.DataFrame(columns=attribution.RANGE_COLUMNS)
    inst = attribution.attribute(ranges, cum, floor_bps) if len(ranges) else ranges
    return {"floor": fl, "range_instances": inst,
            "ranges": attribution.summarize(inst, s.meta.get("launch_costs"), short_ns=2 * gap_ns),
            "whole_run": attribution.whole_run(cum, s.events, s.meta["t_app_start_ns"], s.meta["t_app_end_ns"], floor_bps)}
