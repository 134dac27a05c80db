"""Chrome trace JSON (opens in Perfetto / chrome://tracing): PCIe counter tracks and NVTX ranges."""

from __future__ import annotations

from typing import Any

import pandas as pd


def chrome_trace(meta: dict[str, Any], rates: pd.DataFrame, ranges: pd.DataFrame) -> dict[str, Any]:
    """``rates``: :func:`pcietrace.analysis.counters.rates`; ``ranges``: attributed ranges
    (:func:`pcietrace.analysis.attribution.attribute`). Timestamps are microseconds from the first sample."""
    starts = ([int(rates["t_ns"].min())] if len(rates) else []) + ([int(ranges["t_start_ns"].min())] if len(ranges) else [])
    t0 = min(starts, default=0)
    ev: list[dict[str, Any]] = [{"ph": "M", "pid": 0, "name": "process_name", "args": {"name": "PCIe counters (NVML)"}}]
    for r in rates.itertuples():
        ev.append({"ph": "C", "pid": 0, "tid": 0, "name": f"GPU{r.nvml_index} PCIe MB/s", "ts": (r.t_ns - t0) / 1e3,
                   "args": {"H2D (RX)": round(r.rx_Bps / 1e6, 3), "D2H (TX)": round(r.tx_Bps / 1e6, 3)}})
    for pid in sorted(set(ranges["pid"])) if len(ranges) else []:
        ev.append({"ph": "M", "pid": int(pid), "name": "process_name", "args": {"name": f"{meta.get('command', ['app'])[0]} (pid {pid})"}})
    for r in ranges.itertuples():
        ev.append({"ph": "X", "pid": int(r.pid), "tid": int(r.tid), "name": str(r.name), "cat": str(r.domain),
                   "ts": (r.t_start_ns - t0) / 1e3, "dur": max(r.duration_ns, 0) / 1e3,
                   "args": {"H2D bytes": round(float(r.h2d_bytes)), "D2H bytes": round(float(r.d2h_bytes)),
                            "eager launches": int(r.eager_launches), "graph launches": int(r.graph_launches)}})
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {"tool": "pcietrace", "command": " ".join(meta.get("command", [])), "simulated": meta.get("simulated", False)}}
