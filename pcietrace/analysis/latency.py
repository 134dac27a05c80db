"""Latency statistics and the topology model (DataFrames in, DataFrames out)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pcietrace.analysis.spread import iqr_pct

#: Round-trip time a PCIe switch level adds (us); ~0.3 us reported on real GPU servers, and switch
#: silicon is ~0.1-0.12 us one way per level (see docs/method.md, "Sources").
DEFAULT_US_PER_LEVEL = 0.3


#: Columns of :func:`summary` (the ``latency`` result table).
SUMMARY_COLUMNS = ["nvml_index", "test", "peer", "median_us", "p10_us", "p90_us", "ci95_us", "spread_pct", "n"]
#: Columns of :func:`topology_model`.
TOPOLOGY_MODEL_COLUMNS = ["nvml_index", "kernel_us", "switch_levels", "host_rtt_us", "eager_extra_us", "rtts_per_launch",
                          "us_per_level", "added_us_per_level", "eager_gpu_us", "share_per_level_pct",
                          "eager_gpu_us_plus1", "eager_gpu_us_plus2"]


def summary(latency: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per ``nvml_index, test, peer``: ``median_us``, ``p10_us``, ``p90_us``, ``ci95_us`` (half-width of a
    bootstrap 95 % interval of the median), ``spread_pct`` (interquartile range relative to the median)
    and ``n``."""
    rng = np.random.default_rng(seed)
    rows = []
    for (idx, test, peer), g in latency.groupby(["nvml_index", "test", "peer"], sort=False):
        v = g["value_us"].to_numpy(float)
        boot = np.median(rng.choice(v, size=(1000, v.size), replace=True), axis=1)
        lo, hi = np.percentile(boot, [2.5, 97.5])
        med = float(np.median(v))
        p10, p90 = np.percentile(v, [10, 90])
        rows.append({"nvml_index": int(idx), "test": test, "peer": int(peer), "median_us": med,
                     "p10_us": float(p10), "p90_us": float(p90), "ci95_us": float(hi - lo) / 2,
                     "spread_pct": iqr_pct(v), "n": int(v.size)})
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def topology_model(gpu_time: pd.DataFrame, lat: pd.DataFrame, switch_levels: dict[int, int],
                   us_per_level: float = DEFAULT_US_PER_LEVEL) -> pd.DataFrame:
    """What PCIe switch levels cost per launch, per GPU and kernel duration.

    ``eager_extra_us`` = GPU time per kernel eager minus graph (empty kernels, queue full): work the
    GPU does per eager launch that a graph avoids; ``rtts_per_launch`` = that over the measured host
    read round trip (how many serialized PCIe round trips it amounts to). Each added switch level adds
    ``us_per_level`` to every such round trip, so ``added_us_per_level`` = rtts x us_per_level per
    launch, and ``share_per_level_pct`` its share of the eager time per kernel at each duration.
    ``switch_levels`` is this GPU's current count; ``predicted_us_at_levels`` what its eager time per
    kernel would become with that many more levels (its current levels + 1, + 2).
    """
    rows = []
    rtt = lat[lat["test"] == "host_read_rtt"].set_index("nvml_index")["median_us"]
    for idx, g in gpu_time.groupby("nvml_index"):
        if idx not in rtt.index or not rtt.loc[idx] > 0:  # (no round trip, or a damaged 0: nothing to divide by)
            continue
        g = g.sort_values("kernel_us")
        base = g.iloc[0]
        extra = float(base["eager_gpu_us"] - base["graph_gpu_us"])
        n_rt = extra / float(rtt.loc[idx])
        added = n_rt * us_per_level
        for r in g.itertuples():
            rows.append({"nvml_index": int(idx), "kernel_us": r.kernel_us, "switch_levels": switch_levels.get(int(idx)),
                         "host_rtt_us": float(rtt.loc[idx]), "eager_extra_us": extra, "rtts_per_launch": n_rt,
                         "us_per_level": us_per_level, "added_us_per_level": added,
                         "eager_gpu_us": r.eager_gpu_us,
                         "share_per_level_pct": added / r.eager_gpu_us * 100 if r.eager_gpu_us > 0 else np.nan,
                         "eager_gpu_us_plus1": r.eager_gpu_us + added, "eager_gpu_us_plus2": r.eager_gpu_us + 2 * added})
    out = pd.DataFrame(rows, columns=TOPOLOGY_MODEL_COLUMNS)
    if len(out):  # whole numbers or None (a GPU the topology does not place), never NaN
        out["switch_levels"] = pd.Series([r["switch_levels"] for r in rows], dtype=object)
    return out
