"""Which threads' launches a push/pop range counts: its own thread's, and those its process's other threads made
while it was open outside any range of their own (:func:`helped_counts`).

PyTorch launches a training step's backward pass from its autograd engine's threads while the thread that called
``backward()`` waits: counted by that thread alone, a ``train_step`` range read 412 of the 1,068 launches made in
it. Under ``emit_nvtx`` the engine's threads open ranges of their own, all named
``autograd::engine::evaluate_function: ...`` (:data:`ENGINE_PREFIX`): their work is still the waiting thread's.
Where another thread's own range was open across one of the range's edges (threads launching side by side, each
in its own ranges), which of its launches were made for which range cannot be told: the range then counts its own
thread's alone, as its ``*_process`` figures count every thread's."""

from __future__ import annotations

import numpy as np

#: The outermost ranges of PyTorch's autograd engine threads under emit_nvtx (a backward node's evaluation).
ENGINE_PREFIX = "autograd::engine::evaluate_function"


def engine_threads(tid: np.ndarray, depth: np.ndarray, names: np.ndarray) -> np.ndarray:
    """The threads (of ``tid``, one process's push/pop ranges) whose every outermost range is the autograd
    engine's (``names``: whether each range's name starts with :data:`ENGINE_PREFIX`)."""
    top = depth == 0
    threads, code = np.unique(tid[top], return_inverse=True)
    other = np.zeros(threads.size, bool)
    np.logical_or.at(other, code, ~names[top])
    return threads[~other]


def helped_counts(tid: np.ndarray, t_start: np.ndarray, t_end: np.ndarray, depth: np.ndarray, engine: np.ndarray,
                  own: dict[str, np.ndarray], process: dict[str, np.ndarray], launches: tuple[str, ...]
                  ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One process's push/pop ranges (their thread ``tid``, times, ``depth`` on their thread) with their own
    thread's figures (``own``: name -> values) and their process's (``process``, the same names): the rows whose
    figures other threads' launches touched, and per name their figures with their process's other threads'
    made while they were open outside their own ranges added.
    ``engine``: the autograd engine's threads (:func:`engine_threads`), whose ranges count as outside;
    ``launches``: the names that are launch counts, where other threads' launches show (the rest, such as the
    time inside launch calls, follow them: a clock's rounding alone adds nothing). A range that another thread's
    own range overlaps without lying inside it keeps its own thread's figures."""
    others = {k: process[k] - own[k] for k in own}
    asked = np.zeros(tid.size, bool)
    for k in launches:
        asked |= others[k] > 0
    q = np.flatnonzero(asked)
    if not q.size:
        return q, {}
    qa, qb, qt = t_start[q], t_end[q], tid[q]
    blocked = np.zeros(q.size, bool)
    inside = {k: np.zeros(q.size) for k in own}  # (other threads' launches in their own ranges inside a range)
    theirs = np.flatnonzero((depth == 0) & ~np.isin(tid, engine))
    for t in np.unique(tid[theirs]):
        rows = theirs[tid[theirs] == t]
        rows = rows[np.argsort(t_start[rows], kind="stable")]  # (a thread's outermost ranges: one after another)
        a, b = t_start[rows], t_end[rows]
        first = np.searchsorted(b, qa, "right")  # its first range that ends after the range starts
        after = np.searchsorted(a, qb, "left")  # its ranges that start before the range ends: rows[:after]
        n = rows.size
        across = ((first < n) & (a[np.minimum(first, n - 1)] < qa)) | ((after > 0) & (b[np.maximum(after - 1, 0)] > qb))
        blocked |= across & (qt != t)
        for k, v in own.items():
            summed = np.concatenate([[0.0], np.cumsum(np.nan_to_num(v[rows]), dtype=float)])
            inside[k] += np.where(qt != t, summed[np.maximum(after, first)] - summed[first], 0.0)
    out = {}
    for k in own:
        helped = own[k][q] + np.maximum(others[k][q] - inside[k], 0)
        out[k] = np.where(blocked | np.isnan(helped), own[k][q], helped)
    return q, out
