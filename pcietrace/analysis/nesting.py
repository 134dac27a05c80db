"""How range instances nest: each push/pop range's parent (the range one level up on the same thread that
holds it). Start/end ranges may cross threads and have no parent or children."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

#: Rows :func:`children_sum` adds at a time (its working arrays: ~20 B a row).
CHUNK = 1_000_000


def codes(*columns: np.ndarray) -> np.ndarray:
    """Per row, a number for its combination of ``columns`` values, in order of first appearance."""
    if not len(columns[0]):
        return np.zeros(0, np.int64)
    whole = _packed(columns)
    if whole is not None:  # (integer columns: one key, one hash pass)
        return pd.factorize(whole)[0].astype(np.int64, copy=False)
    # (each column factorized and folded into the codes so far: a few arrays of codes, no frame of the columns)
    out = np.zeros(len(columns[0]), np.int64)
    for c in columns:
        own, distinct = pd.factorize(c)
        out *= len(distinct)
        out += own
        del own
        out = pd.factorize(out)[0]
    return out.astype(np.int64, copy=False)


def _packed(columns: tuple[np.ndarray, ...]) -> np.ndarray | None:
    """Integer (or bool) ``columns`` as one int64 per row, each column's value less its minimum in its own digit;
    None where a column is of another kind or the digits do not fit 63 bits."""
    if len(columns) < 2 or not all(isinstance(c, np.ndarray) and c.dtype.kind in "iub" for c in columns):
        return None
    spans = [(int(c.min()), int(c.max())) for c in columns]
    if math.prod(hi - lo + 1 for lo, hi in spans) >= 2**63 or max(hi for _, hi in spans) >= 2**63:
        return None
    out = np.empty(len(columns[0]), np.int64)
    for k, (c, (lo, hi)) in enumerate(zip(columns, spans)):
        # (in place, widened as added: uint64 values here are below 2**63, so read as int64 they are the same)
        c = c.view(np.uint8) if c.dtype.kind == "b" else c.view(np.int64) if c.dtype == np.uint64 else c
        if k:
            out *= hi - lo + 1
            out += c
        else:
            out[:] = c
        out -= lo
    return out


def stable_order(key: np.ndarray) -> np.ndarray:
    """``np.argsort(key, kind="stable")`` of non-negative integers, by 16-bit digits where they are below 2**32
    (NumPy radix-sorts 16-bit keys in one pass; wider ones take a comparison sort)."""
    if key.dtype.kind == "u" and key.dtype.itemsize <= 2:  # (a narrow key: one radix pass as it is)
        return np.argsort(key, kind="stable")
    top = int(key.max()) if key.size else 0
    if top >= 2**32 or (key.size and int(key.min()) < 0):
        return np.argsort(key, kind="stable")
    order = np.argsort((key & 0xFFFF).astype(np.uint16), kind="stable")
    if top >= 2**16:  # (the high digit, stably: ties keep the low digit's order)
        order = order[np.argsort((key[order] >> 16).astype(np.uint16), kind="stable")]
    return order


#: Where (thread, depth, rank) keys reach past this, :func:`parents` numbers the levels densely first.
KEYS_MAX = 2**62
#: Nesting levels past which a pass per level reads that level's rows alone (:func:`by_level`), not every row:
#: a pop forgotten in a loop nests a range a step, and passes over every row cost rows x levels (a 70,000-deep
#: trace's report took 23 s, a million-deep one hours).
MANY_LEVELS = 64


def by_level(depth: np.ndarray) -> list[np.ndarray]:
    """Rows by ``depth``, shallowest first, each level's rows in row order."""
    order = np.argsort(depth, kind="stable")
    return np.split(order, np.flatnonzero(np.diff(depth[order])) + 1)


def _dense_levels(thread: np.ndarray, depth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each (``thread``, ``depth``) pair's number among the distinct pairs (0 ... n-1), and the number of the pair
    one level up (``depth - 1``), -1 where no range has it. ``depth``: 0 ... 2^31 - 1 (:mod:`validate` refuses
    others)."""
    key = thread.astype(np.int64) << 32
    key |= depth.astype(np.int64)
    distinct = np.unique(key)
    level = np.searchsorted(distinct, key)
    key -= 1  # (depth 0's is the thread before's depth 2^32 - 1: never a depth)
    up = np.minimum(np.searchsorted(distinct, key), distinct.size - 1)
    return level, np.where(distinct[up] == key, up, -1)


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
    order = _opening_order(thread, a, depth)  # each thread's ranges in the order opened (ties by row)
    rank = np.empty(at.size, np.int64)
    rank[order] = np.arange(at.size)
    # the latest range at (thread, depth - 1) opened before each one: one sorted key, searched (the per-range
    # arrays let go as soon as read: a long run has millions)
    width = int(depth.max() - depth.min()) + 2
    if (int(thread.max()) + 1) * width * at.size < KEYS_MAX:
        level = thread * width + (depth - depth.min() + 1)  # (thread, depth) in one number
        above = level - 1
    else:  # (a deep nesting, as a pop forgotten in a loop leaves, where those numbers pass 64 bits)
        level, above = _dense_levels(thread, depth)
    del thread, depth
    want = above * at.size + rank
    del rank, above
    # (level, rank) sorted: the levels in rank order sorted stably by level (radix passes), then packed
    level = level[order]
    by_level = stable_order(level)
    level = level[by_level]
    level *= at.size
    level += by_level
    del by_level
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
    out.iloc[at[me[holds]]] = instances.index.take(at[up[holds]]).to_numpy()  # (take: a RangeIndex keeps no copy of itself)
    return out


def inside_own_group(parent: np.ndarray, group: np.ndarray, by: np.ndarray | None = None,
                     rows: np.ndarray | None = None) -> np.ndarray:
    """Per instance (``parent``: each one's parent's row, -1 for none, :func:`parent_rows`; ``group``: a code per
    instance, -1 for none): whether an instance enclosing it is of its own group, as where PyTorch's autocast
    re-dispatches an op inside a call of itself (``aten::linear`` in ``aten::linear``) or a module nests in one of
    its kind. ``by``: only enclosing instances where it is True count; ``rows``: only these instances are asked
    (the rest False). A level a pass, over the instances still climbing."""
    out = np.zeros(len(parent), bool)
    at = np.flatnonzero(parent >= 0) if rows is None else rows[parent[rows] >= 0]
    at = at.astype(parent.dtype, copy=False)  # (the instances still climbing; and where each has reached)
    up = parent[at]
    while at.size:
        out[at] |= (group[up] == group[at]) if by is None else (group[up] == group[at]) & by[up]
        up = parent[up]
        on = (up >= 0) & ~out[at]
        at, up = at[on], up[on]
    return out & (group >= 0)


def parent_rows(index: pd.Index, parent: pd.Series) -> np.ndarray:
    """Each instance's parent's row position (-1 for none) from :func:`parents`' labels, looked up in ``index``;
    32-bit where the rows' count fits (a long run's instances: half the bytes, and faster to gather by)."""
    up = parent.to_numpy()
    kind = np.int32 if len(up) < 2**31 else np.int64
    if isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1 and up.dtype.kind == "f":
        out = np.full(len(up), -1, kind)  # (labels are the positions: nothing to look up)
        has = (up >= 0) & (up < len(index))  # (NaN: neither)
        out[has] = up[has]
        return out
    has = ~pd.isna(up)
    out = np.full(len(up), -1, kind)
    out[has] = index.get_indexer(up[has].astype(index.dtype) if index.dtype.kind in "iu" else up[has])
    return out


def _opening_order(thread: np.ndarray, a: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """``np.lexsort((depth, a, thread))``: by thread, start, depth, then row; one packed key where it fits 63 bits."""
    packed = _packed((thread, a, depth))
    return np.argsort(packed, kind="stable") if packed is not None else np.lexsort((depth, a, thread))


def children_sum(parent_at: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per instance, the sum of ``values`` over its direct children (``parent_at``: each one's parent's row
    position, -1 for none, as :func:`parent_rows` gives them): 0 without children, NaN where a child's value is
    NaN (unknown stays unknown). The children are added in row order into their parents' rows: a count per row,
    no grouping."""
    out = np.zeros(len(parent_at))
    for lo in range(0, len(parent_at), CHUNK):  # (a long run's rows a chunk at a time: no copies of every one)
        at = parent_at[lo:lo + CHUNK]
        has = at >= 0
        np.add.at(out, at[has], values[lo:lo + CHUNK][has])
    return out
