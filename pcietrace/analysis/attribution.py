"""NVTX ranges from injection events, and PCIe bytes and launches attributed to them.

Stateless: DataFrames in, DataFrames out. Times in ns on CLOCK_MONOTONIC (the sampler's clock); bytes
are counter bytes (TLP headers included) with the background floor removed; ``h2d`` = GPU RX,
``d2h`` = GPU TX, summed over the sampled GPUs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

RANGE_COLUMNS = ["pid", "tid", "domain", "name", "kind", "t_start_ns", "t_end_ns", "depth", "eager_launches",
                 "graph_launches", "eager_launches_process", "graph_launches_process", "closed"]
SUMMARY_COLUMNS = ["domain", "name", "calls", "incl_ms", "excl_ms", "h2d_bytes", "d2h_bytes", "excl_h2d_bytes",
                   "h2d_edge_bytes", "d2h_edge_bytes", "eager_launches", "graph_launches", "short_calls",
                   "h2d_bytes_per_launch", "launch_overhead_ms", "graph_savings_ms"]


def ranges_from_events(events: pd.DataFrame) -> pd.DataFrame:
    """Pair push/pop (per thread, by nesting) and start/end (per process, by id) into ranges.

    ``eager_launches``/``graph_launches`` count launches made by the range's own thread while it was
    open; the ``_process`` columns count the whole process's. Ranges still open when the process
    ended are closed at its last event and marked ``closed=False``.
    """
    rows: list[dict[str, Any]] = []

    def close(open_ev: Any, end_ev: Any, end_t: int, kind: str, closed: bool) -> None:
        rows.append({"pid": int(open_ev.pid), "tid": int(open_ev.tid), "domain": open_ev.domain, "name": open_ev.message,
                     "kind": kind, "t_start_ns": int(open_ev.t_ns), "t_end_ns": int(end_t), "depth": int(open_ev.depth),
                     "eager_launches": int(end_ev.eager_thread - open_ev.eager_thread),
                     "graph_launches": int(end_ev.graph_thread - open_ev.graph_thread),
                     "eager_launches_process": int(end_ev.eager_process - open_ev.eager_process),
                     "graph_launches_process": int(end_ev.graph_process - open_ev.graph_process), "closed": closed})

    for _, g in events.groupby("pid", sort=False):
        stacks: dict[int, list[Any]] = {}
        started: dict[int, Any] = {}
        last_of_thread: dict[int, Any] = {}
        last = None
        for ev in g.itertuples(index=False):
            last_of_thread[ev.tid] = last = ev
            if ev.event == "push":
                stacks.setdefault(ev.tid, []).append(ev)
            elif ev.event == "pop" and stacks.get(ev.tid):
                close(stacks[ev.tid].pop(), ev, ev.t_ns, "push", True)
            elif ev.event == "start":
                started[ev.id] = ev
            elif ev.event == "end" and ev.id in started:
                close(started.pop(ev.id), ev, ev.t_ns, "start", True)
        # Still open when the process ended (or crashed): close at its last event, counting the
        # thread's launches up to that thread's last event.
        for tid, stack in stacks.items():
            for ev in stack:
                close(ev, last_of_thread[tid], last.t_ns, "push", False)
        for ev in started.values():
            close(ev, last, last.t_ns, "start", False)
    # start/end ranges may cross threads, so their thread-local counts are undefined: use the process's.
    df = pd.DataFrame(rows, columns=RANGE_COLUMNS)
    start = df["kind"] == "start"
    df.loc[start, "eager_launches"] = df.loc[start, "eager_launches_process"]
    df.loc[start, "graph_launches"] = df.loc[start, "graph_launches_process"]
    return df.astype({"eager_launches": "int64", "graph_launches": "int64"}) if len(df) else df


def attribute(ranges: pd.DataFrame, cum: pd.DataFrame, floor_bps: dict[str, float]) -> pd.DataFrame:
    """Adds ``duration_ns``, ``h2d_bytes``, ``d2h_bytes`` (counter change over the range, interpolated
    between samples and summed over GPUs, minus floor x duration), ``h2d_edge_bytes``/``d2h_edge_bytes``
    (how far interpolation at the two edges can be off: for each edge, the counter increase over the
    sample interval around it times the larger of the two parts the edge splits it into), and the
    exclusive figures (``excl_ns``, ``excl_h2d_bytes``, ``excl_d2h_bytes``: minus the direct children
    of push/pop ranges on the same thread)."""
    out = ranges.copy()
    out["duration_ns"] = out["t_end_ns"] - out["t_start_ns"]
    a, b = out["t_start_ns"].to_numpy(np.int64), out["t_end_ns"].to_numpy(np.int64)
    for d, (net, edge) in _net_bytes(cum, a, b, floor_bps).items():
        out[f"{d}_bytes"], out[f"{d}_edge_bytes"] = net, edge
    for c in ("ns", "h2d_bytes", "d2h_bytes"):
        out[f"excl_{c}"] = out["duration_ns" if c == "ns" else c].astype(float)
    push = out[out["kind"] == "push"]
    for (pid, tid), g in push.groupby(["pid", "tid"]):
        g = g.sort_values(["t_start_ns", "depth"])
        for idx, r in g.iterrows():
            kids = g[(g["depth"] == r["depth"] + 1) & (g["t_start_ns"] >= r["t_start_ns"]) & (g["t_end_ns"] <= r["t_end_ns"])]
            if len(kids):
                out.loc[idx, "excl_ns"] -= kids["duration_ns"].sum()
                out.loc[idx, "excl_h2d_bytes"] -= kids["h2d_bytes"].sum()
                out.loc[idx, "excl_d2h_bytes"] -= kids["d2h_bytes"].sum()
    return out


def _net_bytes(cum: pd.DataFrame, a: np.ndarray, b: np.ndarray,
               floor_bps: dict[str, float]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per direction ("h2d", "d2h"): counter bytes between times ``a`` and ``b`` (ns, arrays), summed over
    GPUs, minus floor x duration; and the worst-case interpolation error at the two edges."""
    out = {}
    for d, col in (("h2d", "rx_bytes"), ("d2h", "tx_bytes")):
        total, edge = np.zeros(a.size), np.zeros(a.size)
        for _, g in cum.groupby("nvml_index"):
            t, y = g["t_ns"].to_numpy(np.int64), g[col].to_numpy(float)
            total += np.interp(b, t, y) - np.interp(a, t, y)
            edge += _edge_error(t, y, a) + _edge_error(t, y, b)
        out[d] = (total - floor_bps.get(d, 0.0) * (b - a) / 1e9, edge)
    return out


def _edge_error(t: np.ndarray, y: np.ndarray, edge: np.ndarray) -> np.ndarray:
    """Worst-case interpolation error at each ``edge``: the bytes counted over the sample interval
    that contains it, times the larger fraction of that interval on one side of the edge (all of
    them could have moved on that side)."""
    i = np.clip(np.searchsorted(t, edge, side="right") - 1, 0, max(t.size - 2, 0))
    if t.size < 2:
        return np.zeros(edge.size)
    span = np.maximum(t[i + 1] - t[i], 1)
    f = np.clip((edge - t[i]) / span, 0.0, 1.0)
    return (y[i + 1] - y[i]) * np.maximum(f, 1 - f)


def summarize(attributed: pd.DataFrame, costs: dict[str, float] | None, short_ns: float) -> pd.DataFrame:
    """Per (domain, name): ``calls``, ``incl_ms``/``excl_ms`` (summed), ``h2d_bytes``/``d2h_bytes``
    (inclusive, summed) with their worst-case edge errors ``h2d_edge_bytes``/``d2h_edge_bytes``, ``eager_launches``, ``graph_launches``, ``h2d_bytes_per_launch`` (over eager +
    graph launches), ``launch_overhead_ms`` (launches x the measured host cost per launch),
    ``graph_savings_ms`` (eager launches x (eager - graph) wall time per empty kernel: what capturing
    them into graphs could save at most) and ``short_calls`` (calls shorter than ``short_ns``, whose
    bytes rest on interpolation between counter samples)."""
    if not len(attributed):
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    g = attributed.groupby(["domain", "name"], sort=False)
    out = g.agg(calls=("name", "size"), incl_ms=("duration_ns", "sum"), excl_ms=("excl_ns", "sum"),
                h2d_bytes=("h2d_bytes", "sum"), d2h_bytes=("d2h_bytes", "sum"), excl_h2d_bytes=("excl_h2d_bytes", "sum"),
                h2d_edge_bytes=("h2d_edge_bytes", "sum"), d2h_edge_bytes=("d2h_edge_bytes", "sum"),
                eager_launches=("eager_launches", "sum"), graph_launches=("graph_launches", "sum"),
                short_calls=("duration_ns", lambda s: int((s < short_ns).sum()))).reset_index()
    out["incl_ms"] /= 1e6
    out["excl_ms"] /= 1e6
    launches = out["eager_launches"] + out["graph_launches"]
    out["h2d_bytes_per_launch"] = np.where(launches > 0, out["h2d_bytes"] / launches.where(launches > 0, 1), np.nan)
    if costs:
        out["launch_overhead_ms"] = (out["eager_launches"] * costs["host_us_per_eager_launch"]
                                     + out["graph_launches"] * costs["host_us_per_graph_launch"]) / 1e3
        saving = max(0.0, costs["wall_us_per_kernel_eager"] - costs["wall_us_per_kernel_graph"])
        out["graph_savings_ms"] = out["eager_launches"] * saving / 1e3
    else:
        out["launch_overhead_ms"] = np.nan
        out["graph_savings_ms"] = np.nan
    return out.sort_values("incl_ms", ascending=False, kind="stable").reset_index(drop=True)


def whole_run(cum: pd.DataFrame, events: pd.DataFrame, t0: int, t1: int, floor_bps: dict[str, float]) -> pd.DataFrame:
    """One row for the whole program run: duration, H2D/D2H bytes (floor removed) and launches."""
    row: dict[str, Any] = {"duration_ms": (t1 - t0) / 1e6}
    for d, (net, _) in _net_bytes(cum, np.array([t0], np.int64), np.array([t1], np.int64), floor_bps).items():
        row[f"{d}_bytes"] = float(net[0])
    last = events.groupby("pid").tail(1) if len(events) else events
    row["eager_launches"] = int(last["eager_process"].sum()) if len(last) else 0
    row["graph_launches"] = int(last["graph_process"].sum()) if len(last) else 0
    row["processes"] = int(events["pid"].nunique()) if len(events) else 0
    row["ranges"] = int(events["event"].isin(["push", "start"]).sum()) if len(events) else 0
    return pd.DataFrame([row])
