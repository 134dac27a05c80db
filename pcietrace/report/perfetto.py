"""Chrome trace JSON (opens in Perfetto / chrome://tracing): a PCIe counter track per GPU, a launches-per-ms
track per process, and NVTX ranges under their process and thread."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pandas as pd


def _count(x: float) -> int | None:
    """A launch count, or None where launches were not counted (NaN)."""
    return None if pd.isna(x) else int(x)


def chrome_trace(meta: dict[str, Any], rates: pd.DataFrame, ranges: pd.DataFrame,
                 launches: pd.DataFrame | None = None) -> dict[str, Any]:
    """``rates``: :func:`pcietrace.analysis.counters.rates`; ``ranges``: attributed ranges
    (:func:`pcietrace.analysis.attribution.attribute`); ``launches``:
    :func:`pcietrace.analysis.attribution.launch_rate`. Timestamps are microseconds from the first sample."""
    launches = launches if launches is not None else pd.DataFrame(columns=["pid", "t_ns", "eager_per_ms", "graph_per_ms"])
    starts = [int(df[c].min()) for df, c in ((rates, "t_ns"), (ranges, "t_start_ns")) if len(df)]
    t0 = min(starts, default=0)
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


def write_trace(session: Any, results: dict[str, pd.DataFrame], path: Path) -> None:
    """An attach run's Perfetto trace (:func:`chrome_trace`) written to ``path``: ``results`` from
    :func:`pcietrace.analysis.analyze`, the launch track from :func:`pcietrace.analysis.launch_timeline`."""
    from pcietrace.analysis import launch_timeline

    trace = chrome_trace(session.meta, results["rates"], results["range_instances"], launch_timeline(session))
    path = Path(path)
    text = json.dumps(trace)
    if path.exists() and not path.is_file():  # a device or a pipe (/dev/stdout, /dev/full): written into, never replaced
        with open(path, "w") as f:
            f.write(text)
        return
    tmp = path.with_name(f".{path.name[:200]}.{os.getpid()}.tmp")
    try:  # whole or not at all: a full disk leaves no truncated trace (nor a file another one had there)
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
