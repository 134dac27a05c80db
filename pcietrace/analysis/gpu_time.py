"""The GPU's busy time per range, from the kernel activity ``attach --gpu-time`` records.

The injection library writes one "kernel" event per kernel that ran (``t_ns`` = its start on the GPU,
``id`` = its CUDA ordinal, ``message`` = its end; CLOCK_MONOTONIC ns, the clock of the ranges). A range's
busy time is how long at least one kernel of its process ran inside it (kernels overlapping on streams
or GPUs count once), clipped to the range. Only processes whose library said "gputime on" get figures;
elsewhere the columns stay NaN (unknown, never 0).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pcietrace.analysis.notes import Note

KERNEL_COLUMNS = ["pid", "cuda_ordinal", "t_start_ns", "t_end_ns"]
#: Added to range instances by :func:`busy`.
BUSY_COLUMNS = ["gpu_busy_ns", "gpu_kernels", "gpu_short_ns"]


def host_events(events: pd.DataFrame) -> pd.DataFrame:
    """The events the program's own threads wrote (NVTX, launch counts, devices), without the kernel records:
    those carry GPU times and were written late, so the launch counters on them would mislead."""
    if not len(events) or "event" not in events:
        return events
    host = (events["event"] != "kernel").to_numpy()
    return events if host.all() else events[host]  # (no kernel records: the same frame, not a copy of it)


def recording_pids(events: pd.DataFrame) -> set[int]:
    """Processes whose injection library recorded kernel activity ("gputime" event saying "on")."""
    if not len(events) or "event" not in events:
        return set()
    ev = events[events["event"] == "gputime"]
    return {int(p) for p in ev.loc[ev["message"].str.startswith("on"), "pid"]}


def _all_kernels(events: pd.DataFrame) -> pd.DataFrame:
    k = events[events["event"] == "kernel"] if len(events) and "event" in events else pd.DataFrame()
    if not len(k):
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in KERNEL_COLUMNS})
    return pd.DataFrame({"pid": k["pid"].astype("int64"), "cuda_ordinal": k["id"].astype("int64"),
                         "t_start_ns": k["t_ns"].astype("int64"),
                         "t_end_ns": pd.to_numeric(k["message"]).astype("int64")})


def kernels(events: pd.DataFrame) -> pd.DataFrame:
    """The kernels in attach's events (:data:`KERNEL_COLUMNS`, ns on CLOCK_MONOTONIC), by process and start;
    without those CUPTI could not time (:func:`untimed`)."""
    out = _all_kernels(events)
    out = out[(out["t_start_ns"] != 0) | (out["t_end_ns"] != 0)]
    return out.sort_values(["pid", "t_start_ns"], kind="stable").reset_index(drop=True)


def untimed(events: pd.DataFrame) -> pd.Series:
    """Per process (index ``pid``): kernel records CUPTI could not time (start = end = 0 in its record), which
    busy times leave out, so a range holding them looks less busy than it was. Only processes with any."""
    k = _all_kernels(events)
    n = ((k["t_start_ns"] == 0) & (k["t_end_ns"] == 0)).groupby(k["pid"]).sum()
    return n[n > 0].astype("int64")


def dropped(events: pd.DataFrame) -> pd.Series:
    """Per process (index ``pid``): kernel records CUPTI dropped for want of buffer room ("gputime" events
    "dropped", ``id`` = how many), which busy times cannot hold. Only processes with any."""
    if not len(events) or "event" not in events:
        return pd.Series(dtype="int64")
    ev = events[(events["event"] == "gputime") & (events["message"] == "dropped")]
    return ev.groupby("pid")["id"].sum().astype("int64")


def missing(events: pd.DataFrame) -> pd.DataFrame:
    """Per recording process (:func:`recording_pids`) with fewer kernel records than eager launches (the
    launch counters on its last event): ``pid``, ``records``, ``eager_launches``. Every eager launch runs a
    kernel and graphs only add records, so the rest were never written: still in CUPTI's buffers when the
    process ended without its exit handlers (``os._exit``, a crash, a kill)."""
    cols = ["pid", "records", "eager_launches"]
    pids = recording_pids(events)
    host = host_events(events)
    if not pids or not len(host) or "eager_process" not in host:
        return pd.DataFrame(columns=cols)
    last = host.groupby("pid")["eager_process"].max()
    records = _all_kernels(events).groupby("pid").size()
    out = pd.DataFrame([{"pid": p, "records": int(records.get(p, 0)), "eager_launches": int(last.get(p, 0))}
                        for p in sorted(pids)], columns=cols)
    return out[out["records"] < out["eager_launches"]].reset_index(drop=True)


def notes(events: pd.DataFrame) -> list[Note]:
    """What the report must say about kernel records that busy times could not hold."""
    return ([Note("kernel_records_untimed", pid=pid, records=n) for pid, n in untimed(events).items()]
            + [Note("kernel_records_dropped", pid=pid, records=n) for pid, n in dropped(events).items()]
            + [Note("kernel_records_lost", pid=r.pid, records=r.records, eager_launches=r.eager_launches)
               for r in missing(events).itertuples()])


def _busy_before(t: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For each time in ``t`` (ns): how long before it at least one of the kernels [start, end) ran (ns)."""
    if not len(start):
        return np.zeros(len(t), np.int64)
    order = np.argsort(start, kind="stable")
    s, e = start[order], np.maximum.accumulate(end[order])
    opens = np.flatnonzero(np.r_[True, s[1:] > e[:-1]])  # a kernel that starts after all earlier ones ended
    span_s, span_e = s[opens], np.maximum.reduceat(e, opens)
    before = np.r_[0, np.cumsum(span_e - span_s)[:-1]]
    j = np.searchsorted(span_s, t, side="right") - 1
    jj = np.maximum(j, 0)
    return np.where(j >= 0, before[jj] + np.clip(t - span_s[jj], 0, span_e[jj] - span_s[jj]), 0)


def busy(instances: pd.DataFrame, kern: pd.DataFrame, on_pids: set[int], graph_kernel_ns: float = 0.0) -> pd.DataFrame:
    """``instances`` (range instances: ``pid``, ``t_start_ns``, ``t_end_ns``) with :data:`BUSY_COLUMNS`:
    ``gpu_busy_ns`` (the GPU ran a kernel of the range's process, clipped to the range), ``gpu_kernels``
    (kernels that started inside it) and ``gpu_short_ns`` (over those kernels, how much shorter than
    ``graph_kernel_ns`` they were: a kernel in a graph still takes at least that long on the GPU). NaN for
    processes not in ``on_pids`` (:func:`recording_pids`)."""
    out = instances.copy(deep=False)
    for c in BUSY_COLUMNS:
        out[c] = np.nan
    for pid, rows in out.groupby("pid").groups.items():
        if pid not in on_pids:
            continue
        k = kern[kern["pid"] == pid]
        s, e = k["t_start_ns"].to_numpy(np.int64), k["t_end_ns"].to_numpy(np.int64)
        a, b = out.loc[rows, "t_start_ns"].to_numpy(np.int64), out.loc[rows, "t_end_ns"].to_numpy(np.int64)
        out.loc[rows, "gpu_busy_ns"] = (_busy_before(b, s, e) - _busy_before(a, s, e)).astype(float)
        order = np.argsort(s, kind="stable")
        s_sorted = s[order]
        short = np.r_[0.0, np.cumsum(np.maximum(0.0, graph_kernel_ns - (e - s)[order]))]
        i, j = np.searchsorted(s_sorted, a, side="left"), np.searchsorted(s_sorted, b, side="left")
        out.loc[rows, "gpu_kernels"] = (j - i).astype(float)
        out.loc[rows, "gpu_short_ns"] = short[j] - short[i]
    return out
