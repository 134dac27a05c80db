"""How range instances nest: each push/pop range's parent (the range one level up on the same thread that
holds it). Start/end ranges may cross threads and have no parent or children."""

from __future__ import annotations

import numpy as np
import pandas as pd


def codes(*columns: np.ndarray) -> np.ndarray:
    """Per row, a number for its combination of ``columns`` values, in order of first appearance."""
    if not len(columns[0]):
        return np.zeros(0, np.int64)
    # (each column factorized and folded into the codes so far: a few arrays of codes, no frame of the columns)
    out = np.zeros(len(columns[0]), np.int64)
    for c in columns:
        own, distinct = pd.factorize(c)
        out *= len(distinct)
        out += own
        del own
        out = pd.factorize(out)[0]
    return out.astype(np.int64, copy=False)


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
    depth = instances["depth"].to_numpy(np.int64)[at]
    order = np.lexsort((depth, a, thread))  # each thread's ranges in the order opened (a stable sort: ties by row)
    rank = np.empty(at.size, np.int64)
    rank[order] = np.arange(at.size)
    # the latest range at (thread, depth - 1) opened before each one: one sorted key, searched (the per-range
    # arrays let go as soon as read: a long run has millions)
    width = int(depth.max() - depth.min()) + 2
    level = thread * width + (depth - depth.min() + 1)  # (thread, depth) in one number
    del thread, depth
    want = (level - 1) * at.size + rank
    level *= at.size
    level += rank
    del rank
    level.sort()
    i = np.searchsorted(level, want, "left") - 1
    found = level[np.maximum(i, 0)]
    del level
    hit = (i >= 0) & (found // at.size == want // at.size)
    del i, want
    up = order[found[hit] % at.size]
    del found, order
    me = np.flatnonzero(hit)
    b = instances["t_end_ns"].to_numpy(np.int64)[at]
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
