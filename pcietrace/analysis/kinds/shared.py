"""Steps every kind's analyzer may take: the sampler's own figures, the host's launch loops and the round trips."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from pcietrace.analysis import counters, launch, names
from pcietrace.analysis import latency as latency_analysis
from pcietrace.session import Session


@dataclass(frozen=True)
class Options:
    """``us_per_level``: round trip added per PCIe switch level, for the topology model; ``group_by``: how
    attach's ``ranges`` table groups range names (:data:`names.GROUP_BY`); ``release_events``,
    ``release_samples``: attach's analysis may let go of the session's events once its ranges are made, and of
    its samples once read (:func:`pcietrace.analysis.analyze`)."""

    us_per_level: float = latency_analysis.DEFAULT_US_PER_LEVEL
    group_by: str = names.DEFAULT_GROUP_BY
    release_events: bool = False
    release_samples: bool = False


def sampling(s: Session, cum: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The sampler's rate and gaps per GPU (``cum``: :func:`counters.cumulative_bytes`)."""
    return {"sampling": counters.sample_gaps(s.samples, s.counters, cum)} if len(s.samples) else {}


def host_costs(s: Session) -> dict[str, pd.DataFrame]:
    """The kernel calibration, host cost per launch (overall and by launching language), GPU time per kernel
    and the wall-time speedup of graphs, from whatever of their inputs the session holds."""
    out = {}
    if len(s.calibration):
        out["calibration"] = s.calibration
    if len(s.bursts):
        out["cpu_cost"] = launch.cpu_cost(s.bursts)
        out["host_cost_by_language"] = launch.host_cost_by_language(s.bursts)
        if len(s.calibration):
            out["gpu_time"] = launch.gpu_time(s.bursts, s.calibration, s.contexts)
    if len(s.e2e):
        out["speedup"] = launch.speedup(s.e2e)
    return out


def round_trips(s: Session, gpu_time: pd.DataFrame | None, us_per_level: float) -> dict[str, pd.DataFrame]:
    """The latency summary and, where GPU time per kernel is known (``gpu_time``), the topology model."""
    if not len(s.latency):
        return {}
    out = {"latency": latency_analysis.summary(s.latency)}
    if gpu_time is not None and len(gpu_time):
        levels = {g["nvml_index"]: g["switch_levels"] for g in (s.meta.get("topology") or {}).get("gpus", [])
                  if g.get("nvml_index") is not None}
        out["topology_model"] = latency_analysis.topology_model(gpu_time, out["latency"], levels, us_per_level)
    return out
