"""Paired host-cost comparisons for the GPU tests.

On the lent VMs the host's speed drifts by 10-35 % over seconds (bench/host_noise.py: per-round
medians of 900-launch bursts 3.05-4.10 us on the H100) and can switch between two speeds mid-run (4x H200:
one GPU's native bursts 3.2 us, then 5.4 us). Python's extra cost per launch is 12-40 % of the native cost,
so two medians taken over separate bursts can swap. Compared burst by burst, each burst against the other
path's burst taken just before it, both see the same host.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pcietrace.analysis.launch import shortest_eager

#: Columns of :func:`paired_extra_us`.
PAIR_COLUMNS = ["nvml_index", "base_us", "us", "extra_us"]


def paired_extra_us(bursts: pd.DataFrame, path: str, base: str = "native") -> pd.DataFrame:
    """Per eager burst of ``path`` at its GPU's shortest kernel, the ``base`` burst on the same GPU and kernel
    that started just before it: host us per launch call of each (``base_us``, ``us``) and ``extra_us`` =
    ``us - base_us``. Bursts that ran dry (``saturated`` False: a host stall, not launch cost) are left out,
    and so is a pair whose base ran dry. Bursts are ordered by ``t_start_ns``, else by their row order
    (records are appended as they are taken)."""
    b = shortest_eager(bursts)
    b = b.assign(us=b["host_ns"] / b["calls"] / 1e3, ok=b["saturated"].astype(bool),
                 t=b["t_start_ns"] if "t_start_ns" in b else np.arange(len(b))).sort_values("t", kind="stable")
    mine = b.loc[b["path"] == path, ["nvml_index", "t", "us", "ok"]]
    other = b.loc[b["path"] == base, ["nvml_index", "t", "us", "ok"]].rename(columns={"us": "base_us", "ok": "base_ok"})
    pairs = pd.merge_asof(mine, other, on="t", by="nvml_index", direction="backward", allow_exact_matches=False)
    pairs = pairs[pairs["ok"] & (pairs["base_ok"] == True)]  # noqa: E712  (NaN where no base burst came before)
    return pairs.assign(extra_us=pairs["us"] - pairs["base_us"])[PAIR_COLUMNS].reset_index(drop=True)
