"""How range instances nest: each push/pop range's parent (the range one level up on the same thread that
holds it). Start/end ranges may cross threads and have no parent or children."""

from __future__ import annotations

import numpy as np
import pandas as pd


def parents(instances: pd.DataFrame) -> pd.Series:
    """Per instance (``pid``, ``tid``, ``kind``, ``depth``, ``t_start_ns``, ``t_end_ns``): the index label of
    its parent, or NaN. One pass per thread in start order (a parent opens before its children)."""
    out = pd.Series(np.nan, index=instances.index, dtype=object)
    push = instances[instances["kind"] == "push"]
    for _, g in push.groupby(["pid", "tid"], sort=False):
        g = g.sort_values(["t_start_ns", "depth"], kind="stable")
        latest: dict[int, tuple[object, int, int]] = {}  # depth -> (label, start, end) of the last range opened there
        for label, depth, a, b in zip(g.index, g["depth"], g["t_start_ns"], g["t_end_ns"]):
            up = latest.get(int(depth) - 1)
            if up is not None and up[1] <= a and b <= up[2]:
                out[label] = up[0]
            latest[int(depth)] = (label, a, b)
    return out


def children_sum(instances: pd.DataFrame, parent: pd.Series, column: str) -> pd.Series:
    """Per instance, the sum of ``column`` over its direct children: 0 without children, NaN where a child's
    value is NaN (unknown stays unknown)."""
    has = parent.notna()
    col, by = instances.loc[has, column].astype(float), parent[has].astype("int64")
    total = col.groupby(by).sum()
    total[col.isna().groupby(by).any()] = np.nan
    return total.reindex(instances.index, fill_value=0.0)
