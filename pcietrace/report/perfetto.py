"""Chrome trace JSON (opens in Perfetto / chrome://tracing): a PCIe counter track per GPU, a launches-per-ms
track per process, and NVTX ranges under their process and thread."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd


def _count(x: float) -> int | None:
    """A launch count, or None where launches were not counted (NaN)."""
    return None if pd.isna(x) else int(x)


def _t0(rates: pd.DataFrame, ranges: pd.DataFrame) -> int:
    """The first sample's or range's time."""
    return min((int(df[c].min()) for df, c in ((rates, "t_ns"), (ranges, "t_start_ns")) if len(df)), default=0)


def chrome_trace(meta: dict[str, Any], rates: pd.DataFrame, ranges: pd.DataFrame,
                 launches: pd.DataFrame | None = None, t0_ns: int | None = None) -> dict[str, Any]:
    """``rates``: :func:`pcietrace.analysis.counters.rates`; ``ranges``: attributed ranges
    (:func:`pcietrace.analysis.attribution.attribute`); ``launches``:
    :func:`pcietrace.analysis.attribution.launch_rate`. Timestamps are microseconds from ``t0_ns`` (default:
    the first sample)."""
    launches = launches if launches is not None else pd.DataFrame(columns=["pid", "t_ns", "eager_per_ms", "graph_per_ms"])
    t0 = _t0(rates, ranges) if t0_ns is None else t0_ns
    ev: list[dict[str, Any]] = [{"ph": "M", "pid": 0, "name": "process_name", "args": {"name": "PCIe counters (NVML)"}}]
    for idx in sorted(set(rates["nvml_index"])) if len(rates) else []:
        ev.append({"ph": "M", "pid": 0, "tid": int(idx), "name": "thread_name", "args": {"name": f"GPU{idx}"}})
    for r in rates.itertuples():
        mbps = {"H2D (RX)": r.rx_Bps / 1e6, "D2H (TX)": r.tx_Bps / 1e6}  # NaN (over a counter reset): left out
        ev.append({"ph": "C", "pid": 0, "tid": int(r.nvml_index), "name": f"GPU{r.nvml_index} PCIe MB/s",
                   "ts": (r.t_ns - t0) / 1e3, "args": {k: round(v, 3) for k, v in mbps.items() if v == v}})
    program = meta.get("command", ["app"])[0]
    pids = sorted(set(ranges["pid"]) | set(launches["pid"])) if len(ranges) or len(launches) else []
    for pid in pids:
        ev.append({"ph": "M", "pid": int(pid), "name": "process_name", "args": {"name": f"{program} (pid {pid})"}})
    for pid, tid in sorted(set(zip(ranges["pid"], ranges["tid"]))) if len(ranges) else []:
        name = "main thread" if pid == tid else f"thread {tid}"
        ev.append({"ph": "M", "pid": int(pid), "tid": int(tid), "name": "thread_name", "args": {"name": name}})
    for r in launches.itertuples():
        ev.append({"ph": "C", "pid": int(r.pid), "name": "launches per ms", "ts": (r.t_ns - t0) / 1e3,
                   "args": {"eager": round(float(r.eager_per_ms), 2), "graph": round(float(r.graph_per_ms), 2)}})
    for r in ranges.itertuples():
        args = {"eager launches": _count(r.eager_launches), "graph launches": _count(r.graph_launches),
                "captured launches": _count(getattr(r, "captured_launches", 0)),
                "gpus": [int(g) for g in getattr(r, "gpus", [])], "status": getattr(r, "status", "ok")}
        for d in ("h2d", "d2h"):
            v = float(getattr(r, f"{d}_bytes"))
            args[f"{d.upper()} bytes"] = None if v != v else round(v)  # NaN (no floor, no data) -> null
        ev.append({"ph": "X", "pid": int(r.pid), "tid": int(r.tid), "name": str(r.name), "cat": str(r.domain),
                   "ts": (r.t_start_ns - t0) / 1e3, "dur": max(r.duration_ns, 0) / 1e3, "args": args})
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {"tool": "pcietrace", "command": " ".join(meta.get("command", [])), "simulated": meta.get("simulated", False)}}


#: Process ids of one node in a merged trace: its own (Linux's pid_max is at most 2^22) above ``node << PID_BITS``.
PID_BITS = 22


def node_events(meta: dict[str, Any], node: str, k: int, rates: pd.DataFrame, ranges: pd.DataFrame,
                launches: pd.DataFrame | None, t0_ns: int) -> list[dict[str, Any]]:
    """One node's part of a merged report's trace (:mod:`pcietrace.multinode`): its :func:`chrome_trace` from
    the merge's shared start ``t0_ns`` (every node's times on the wall clock), its counters and processes as
    processes of their own above ``k << PID_BITS``, named and sorted by node."""
    base = k << PID_BITS
    events: list[dict[str, Any]] = []
    for e in chrome_trace(meta, rates, ranges, launches, t0_ns)["traceEvents"]:
        e["pid"] = base + int(e["pid"])
        if e.get("name") == "process_name":
            e["args"] = {"name": f"{node}: {e['args']['name']}"}
            events.append({"ph": "M", "pid": e["pid"], "name": "process_sort_index", "args": {"sort_index": e["pid"]}})
        events.append(e)
    return events


def merged_header(meta: dict[str, Any]) -> dict[str, Any]:
    """A merged report's trace less its events (the nodes' parts, :func:`node_events`, go in ``traceEvents``)."""
    return {"displayTimeUnit": "ms",
            "otherData": {"tool": "pcietrace", "command": " ".join(meta.get("command") or []),
                          "nodes": [n["node"] for n in meta["merged"]["nodes"]], "simulated": meta.get("simulated", False)}}


def write_trace(session: Any, results: dict[str, pd.DataFrame], path: Path) -> None:
    """An attach run's Perfetto trace (:func:`chrome_trace`) written to ``path``: ``results`` from
    :func:`pcietrace.analysis.analyze`, the launch track from :func:`pcietrace.analysis.launch_timeline`."""
    from pcietrace.analysis import launch_timeline

    trace = chrome_trace(session.meta, results["rates"], results["range_instances"], launch_timeline(session))
    path.write_text(json.dumps(trace))
