"""The per-GPU headline table: one row per GPU with the figures a many-GPU box is compared by.
Stateless: result tables in, a DataFrame out."""

from __future__ import annotations

import numpy as np
import pandas as pd

PER_GPU_COLUMNS = ["nvml_index", "h2d_bytes_per_launch", "d2h_bytes_per_launch", "host_us_per_launch",
                   "host_us_per_launch_python", "eager_gpu_us", "graph_gpu_us", "kernel_us", "speedup",
                   "host_rtt_us", "switch_levels"]


def _by_gpu(df: pd.DataFrame, value: str, **where: object) -> dict[int, float]:
    if not len(df) or value not in df:
        return {}
    sel = df
    for col, v in where.items():
        sel = sel[sel[col] == v]
    return {int(k): float(x) for k, x in sel.groupby("nvml_index")[value].first().items()}


def _at_shortest(df: pd.DataFrame, value: str) -> dict[int, tuple[float, float]]:
    """Per GPU: (shortest kernel_us, ``value`` there)."""
    if not len(df):
        return {}
    first = df.sort_values("kernel_us").groupby("nvml_index").first()
    return {int(i): (float(r["kernel_us"]), float(r[value])) for i, r in first.iterrows()}


def per_gpu(results: dict[str, pd.DataFrame], switch_levels: dict[int, int | None]) -> pd.DataFrame:
    """One row per GPU: eager H2D/D2H bytes per launch (fit), host us per eager launch (native loops)
    and from Python (cuda.bindings), GPU us per empty kernel eager / graph, the end-to-end graph
    speedup at the shortest kernel (``kernel_us``), the host-memory read round trip (us) and the
    GPU's PCIe switch levels. Reports from before the native loops have only the Python figure (``switch_levels``: NVML index -> levels, from the topology). Missing
    inputs give NaN. Columns: :data:`PER_GPU_COLUMNS`."""
    pl = results.get("per_launch", pd.DataFrame())
    h2d = _by_gpu(pl, "bytes_per_call", mode="eager", direction="h2d")
    d2h = _by_gpu(pl, "bytes_per_call", mode="eager", direction="d2h")
    lang = results.get("host_cost_by_language", pd.DataFrame())
    native = _by_gpu(lang, "us_per_launch", path="native")
    python = _by_gpu(lang, "us_per_launch", path="python")
    gt = results.get("gpu_time", pd.DataFrame())
    eager, graph = _at_shortest(gt, "eager_gpu_us"), _at_shortest(gt, "graph_gpu_us")
    sp = _at_shortest(results.get("speedup", pd.DataFrame()), "speedup")
    rtt = _by_gpu(results.get("latency", pd.DataFrame()), "median_us", test="host_read_rtt")
    gpus = sorted(set(h2d) | set(native) | set(eager) | set(sp) | set(rtt))
    if not gpus:
        return pd.DataFrame(columns=PER_GPU_COLUMNS)
    nan = (np.nan, np.nan)
    rows = [{"nvml_index": i, "h2d_bytes_per_launch": h2d.get(i, np.nan), "d2h_bytes_per_launch": d2h.get(i, np.nan),
             "host_us_per_launch": native.get(i, np.nan),
             "host_us_per_launch_python": python.get(i, np.nan),
             "eager_gpu_us": eager.get(i, nan)[1], "graph_gpu_us": graph.get(i, nan)[1],
             "kernel_us": sp.get(i, eager.get(i, nan))[0], "speedup": sp.get(i, nan)[1],
             "host_rtt_us": rtt.get(i, np.nan), "switch_levels": switch_levels.get(i)} for i in gpus]
    return pd.DataFrame(rows, columns=PER_GPU_COLUMNS)
