"""Ranges of several threads open at the same time on one GPU. The counters are per GPU, not per thread or
process, so each of those ranges is charged what the others moved meanwhile too (a server's worker threads, two
processes sharing a GPU): :func:`concurrent` finds where that happened, for a note."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from pcietrace.analysis import nesting
from pcietrace.analysis.floor import gpu_sets

#: A GPU's shared time is said where it is at least this share of the time its working ranges were open (two
#: threads' ranges that only touch, or overlap by a read's length, are not worth a note).
MIN_SHARE = 0.01


def _stretches(thread: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The stretches (starts, ends; ns) that each thread had any of its spans ``a``..``b`` open, all threads'
    together (a thread's own overlapping or touching spans joined)."""
    order = np.lexsort((a, thread))
    th, a, b = thread[order], a[order], b[order]
    reach = pd.Series(b, copy=False).groupby(th, sort=False).cummax().to_numpy()  # (the furthest end so far)
    new = np.ones(len(a), bool)
    new[1:] = (th[1:] != th[:-1]) | (a[1:] > reach[:-1])
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(a)) - 1
    return a[first], reach[last]


def _shared_before(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Where two or more of the stretches (``starts``, ``ends``) are open at once: each edge's time (ascending),
    how many are open from it to the next, the shared time (ns) before it, and the time any is open (ns)."""
    t = np.concatenate([starts, ends])
    step = np.concatenate([np.ones(len(starts), np.int64), -np.ones(len(ends), np.int64)])
    order = np.lexsort((step, t))  # (an end before a start at the same time: touching is not sharing)
    t, open_ = t[order], np.cumsum(step[order])
    gap = np.diff(t)
    before = np.concatenate([[0], np.cumsum(gap * (open_[:-1] >= 2))])
    return t, open_, before, int((gap * (open_[:-1] >= 1)).sum())


def _shared_at(x: np.ndarray, t: np.ndarray, open_: np.ndarray, before: np.ndarray) -> np.ndarray:
    """The shared time (ns) before each time ``x``."""
    k = np.searchsorted(t, x, side="right") - 1
    inside = k >= 0
    kk = np.maximum(k, 0)
    at = before[kk] + np.where(open_[kk] >= 2, x - t[kk], 0)
    return np.where(inside, np.minimum(at, before[-1]), 0)


def concurrent(ranges: pd.DataFrame, parent: np.ndarray, group: pd.Series) -> list[dict[str, Any]]:
    """Per GPU (NVML index) where push/pop ranges of two or more threads, each a range whose own thread launched or
    copied on a GPU while it was open and that holds no range that did (a thread waiting inside a range while
    another thread works, as the main thread in PyTorch's ``backward()``, moves nothing), were open at the same
    time for at least :data:`MIN_SHARE` of the time any was: ``gpu``, ``threads`` and ``processes`` (those of the
    ranges that shared), ``at_once`` (the most open at a time), ``shared_ms`` (the time two or more were open),
    ``open_ms`` (any) and ``names`` (the groups whose ranges were open longest while shared, up to three).
    ``ranges``: with ``kind``, ``gpus``, ``gpus_rule`` and ``worked``
    (:func:`pcietrace.analysis.attribution.range_gpus`); ``parent``: each one's parent's row, -1 for none
    (:func:`pcietrace.analysis.nesting.parent_rows`); ``group``: each one's group (a name where missing). None of
    ranges charged every GPU for want of knowing theirs (``gpus_rule`` "all sampled"); start/end ranges are left
    out, as their work is their process's."""
    if not len(ranges) or "worked" not in ranges:
        return []
    worked = ranges["worked"].to_numpy(bool)
    holds_working = np.zeros(len(ranges), bool)
    child = (parent >= 0) & worked
    holds_working[parent[child].astype(np.int64)] = True
    working = worked & ~holds_working & (ranges["kind"] == "push").to_numpy()
    if "gpus_rule" in ranges:  # (a range whose GPUs are unknown is charged every GPU: another note says so)
        working &= (ranges["gpus_rule"] != "all sampled").to_numpy()
    rows = np.flatnonzero(working)  # (what follows reads only these: a long run's working ranges)
    del holds_working, working, child, worked
    pids = ranges["pid"].to_numpy(np.int64)[rows]
    thread = nesting.codes(pids, ranges["tid"].to_numpy(np.int64)[rows])
    if not thread.size or thread.max() < 1:  # (one thread: nothing to share)
        return []
    a, b = (ranges[c].to_numpy(np.int64)[rows] for c in ("t_start_ns", "t_end_ns"))
    np.maximum(b, a, out=b)  # (a range ending before its start: none of its own time)
    holds, gpus = gpu_sets(ranges["gpus"].iloc[rows])
    group = (group if isinstance(group.dtype, pd.CategoricalDtype) else group.astype("category")).iloc[rows]
    out = []
    for idx in gpus:
        mine = np.flatnonzero(holds(idx))
        if len(pd.unique(thread[mine])) < 2:
            continue
        t, open_, before, open_ns = _shared_before(*_stretches(thread[mine], a[mine], b[mine]))
        if before[-1] < MIN_SHARE * open_ns or not before[-1]:
            continue
        shared = _shared_at(b[mine], t, open_, before) - _shared_at(a[mine], t, open_, before)
        codes = group.cat.codes.to_numpy()[mine]
        per_group = np.bincount(codes[codes >= 0], weights=shared[codes >= 0], minlength=len(group.cat.categories))
        top = [str(group.cat.categories[i]) for i in np.argsort(-per_group, kind="stable")[:3] if per_group[i] > 0]
        sharing = mine[shared > 0]  # (the threads and processes that shared: not those that only worked apart)
        out.append({"gpu": int(idx), "threads": len(pd.unique(thread[sharing])),
                    "processes": len(pd.unique(pids[sharing])),
                    "at_once": int(open_.max()), "shared_ms": before[-1] / 1e6, "open_ms": open_ns / 1e6,
                    "names": top})
    return out
