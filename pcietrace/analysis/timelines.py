"""Timelines recomputed from the raw samples whenever needed (plots, Perfetto), never saved: one row per GPU
(or process) and bin, so saving them would multiply a long run's report.json (21 MB for 8 GPUs x 20 s)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from pcietrace.analysis import attribution, gpu_time
from pcietrace.schema import NO_LAUNCH_COUNTER
from pcietrace.session import Session

#: Result tables that are timelines (left out of the saved report and of ``--json``).
TIMELINES = ("rates", "launch_rates")

#: The most bins a timeline has per GPU (or process): a longer run gets longer bins (whole ms), so an hour on
#: 8 GPUs is 8 x 100,000 rows, not 8 x 3.6 million.
MAX_TIMELINE_BINS = 100_000


def timeline_bin_ns(meta: dict[str, Any], span_ns: int = 0, max_bins: int = MAX_TIMELINE_BINS) -> int:
    """Bin of the attach timelines (PCIe rates, launch rates): the sampling interval, at least 1 ms, and long
    enough that ``span_ns`` (the timeline's length) makes at most ``max_bins`` bins (in whole ms)."""
    fine = max(int(float(meta.get("sample_interval_ms") or 1.0) * 1e6), 1_000_000)
    return max(fine, -(-int(span_ns) // max_bins // 1_000_000) * 1_000_000)


def span_ns(t: pd.Series) -> int:
    """The time ``t`` covers (0 for none)."""
    return int(t.max() - t.min()) if len(t) else 0


def launch_timeline(session: Session, max_bins: int = MAX_TIMELINE_BINS) -> pd.DataFrame:
    """An attach run's launches per ms per process over time (:func:`attribution.launch_rate`, binned by
    :func:`timeline_bin_ns`: at most ``max_bins`` bins per process); no rows where launches were not counted
    (``--no-count-launches``: no launch track rather than a flat 0)."""
    if session.meta.get("launch_counter") == NO_LAUNCH_COUNTER:
        return pd.DataFrame(columns=attribution.LAUNCH_RATE_COLUMNS)
    events = gpu_time.host_events(session.events)
    span = span_ns(events["t_ns"]) if len(events) else 0
    return attribution.launch_rate(events, timeline_bin_ns(session.meta, span, max_bins))


def quiet_interval_ns(meta: dict[str, Any]) -> int:
    """The sampler's interval while a range was open but the link was not busy (0 = none, also for recordings
    made before it): never shorter than the sampling interval, as in the sampler."""
    return _slower_interval_ns(meta, "quiet_sample_interval_ms")


def idle_interval_ns(meta: dict[str, Any]) -> int:
    """The sampler's interval while no range was open (attach's idle-aware sampling; 0 = off, also for
    recordings made before it): never shorter than the sampling interval, as in the sampler."""
    return _slower_interval_ns(meta, "idle_sample_interval_ms")


def _slower_interval_ns(meta: dict[str, Any], key: str) -> int:
    """The interval ``meta[key]`` (ms) in ns, at least ``sample_interval_ms``; 0 where it is 0 or absent."""
    ms = float(meta.get(key) or 0.0)
    return int(max(ms, float(meta.get("sample_interval_ms") or 0.0)) * 1e6) if ms > 0 else 0
