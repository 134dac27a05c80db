"""How range instances nest: each push/pop range's parent (the range one level up on the same thread that
holds it). Start/end ranges may cross threads and have no parent or children."""

from __future__ import annotations

import numpy as np
import pandas as pd


def codes(*columns: np.ndarray) -> np.ndarray:
    """Per row, a number for its combination of ``columns`` values, in order of first appearance."""
    if not len(columns[0]):
        return np.zeros(0, np.int64)
    return pd.DataFrame({i: c for i, c in enumerate(columns)}).groupby(list(range(len(columns))), sort=False).ngroup().to_numpy()


def parents(instances: pd.DataFrame) -> pd.Series:
    """Per instance (``pid``, ``tid``, ``kind``, ``depth``, ``t_start_ns``, ``t_end_ns``): the index label of
    its parent, or NaN. Per thread in start order (a parent opens before its children): the range opened last
    one level up before it, where it holds it."""
    # (labels of an integer index as floats, NaN for none: no Python object per range)
    out = pd.Series(np.nan, index=instances.index, dtype=float if instances.index.dtype.kind in "iu" else object)
    at = np.flatnonzero((instances["kind"] == "push").to_numpy())
    if not at.size:
        return out
    thread = codes(instances["pid"].to_numpy()[at], instances["tid"].to_numpy()[at])
    a = instances["t_start_ns"].to_numpy(np.int64)[at]
    b = instances["t_end_ns"].to_numpy(np.int64)[at]
    depth = instances["depth"].to_numpy(np.int64)[at]
    order = np.lexsort((np.arange(at.size), depth, a, thread))  # each thread's ranges in the order opened
    rank = np.empty(at.size, np.int64)
    rank[order] = np.arange(at.size)
    # the latest range at (thread, depth - 1) opened before each one: one sorted key, searched
    levels = depth - depth.min() + 1
    width = int(levels.max()) + 1
    key = (thread * width + levels) * at.size + rank
    sorted_key = np.sort(key)
    want = (thread * width + levels - 1) * at.size + rank
    i = np.searchsorted(sorted_key, want, "left") - 1
    found = sorted_key[np.maximum(i, 0)]
    hit = (i >= 0) & (found // at.size == want // at.size)
    up = order[found[hit] % at.size]
    me = np.flatnonzero(hit)
    holds = (a[up] <= a[me]) & (b[me] <= b[up])
    out.iloc[at[me[holds]]] = instances.index.to_numpy()[at[up[holds]]]
    return out


def children_sum(instances: pd.DataFrame, parent: pd.Series, column: str) -> pd.Series:
    """Per instance, the sum of ``column`` over its direct children: 0 without children, NaN where a child's
    value is NaN (unknown stays unknown)."""
    has = parent.notna()
    col, by = instances.loc[has, column].astype(float), parent[has].astype("int64")
    total = col.groupby(by).sum()
    total[col.isna().groupby(by).any()] = np.nan
    return total.reindex(instances.index, fill_value=0.0)
