"""NVTX ranges from injection events, and PCIe bytes and launches attributed to them.

Stateless: DataFrames in, DataFrames out. Times in ns on CLOCK_MONOTONIC (the sampler's clock); bytes
are counter bytes (TLP headers included) with the background floor removed; ``h2d`` = GPU RX,
``d2h`` = GPU TX. A range's bytes are summed over **its** GPUs only (``gpus``, NVML indices): the devices
its thread launched on or had current while it was open; else its process's; else every sampled GPU
(``gpus_rule`` says which). Counters are per GPU, not per process: other traffic on those GPUs counts too.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from pcietrace.analysis import nesting, threads
from pcietrace.analysis.counters import (COUNTER_UPDATE_NS, MAX_LINK_BPS, could_hide_wrap, counted_by, gaps_overlapping,
                                         jumps, link_bps, movable_bytes, per_gpu, read_ns_of)
from pcietrace.analysis.counters import median as median_of
from pcietrace.analysis.floor import busy_reads, floor_bytes, floor_err_bytes, gpu_sets
from pcietrace.analysis.launch import DIRECTIONS
from pcietrace.collectors.sampler import FAST_HOLD_NS, faster_than_busy
from pcietrace.schema import CAPTURED_COLUMNS, TIMING_COLUMNS, by_object

#: A range's launch counts (its own thread's, and its process's other threads' where :mod:`threads` adds them).
LAUNCH_COUNT_COLUMNS = ("eager_launches", "graph_launches", "captured_launches")
RANGE_COLUMNS = ["pid", "tid", "domain", "name", "kind", "t_start_ns", "t_end_ns", "depth", "eager_launches",
                 "graph_launches", "eager_launches_process", "graph_launches_process", "captured_launches",
                 "captured_launches_process", "launch_call_ns", "sync_wait_ns", "closed"]
#: What :func:`attribute` adds to a range (in this order, after the range's own columns).
ATTRIBUTED_COLUMNS = ["duration_ns", "status", "stalls",
                      *(f"{d}_{c}" for d in DIRECTIONS for c in ("raw_bytes", "bytes", "edge_bytes", "floor_err_bytes")),
                      "excl_ns", "excl_h2d_bytes", "excl_d2h_bytes", "parent"]
#: Columns of an attributed range instance (the ``range_instances`` result table, before the groups
#: :func:`pcietrace.analysis.analyze` adds where measured: :data:`pcietrace.analysis.INSTANCE_EXTRAS`).
INSTANCE_COLUMNS = [*RANGE_COLUMNS, "gpus", "gpus_rule", *ATTRIBUTED_COLUMNS, "group"]  # ("gpus*": :func:`range_gpus`;
# "group": :func:`pcietrace.analysis.names.group_names`)
#: Range statuses, best first: bytes are reported only for "ok".
STATUSES = ("ok", "no floor", "no data", "wrap risk")
RANGE_EVENTS = {"push", "pop", "start", "end"}


def with_captured(events: pd.DataFrame) -> pd.DataFrame:
    """``events`` with ``captured_thread``/``captured_process`` (launches into a stream being captured into a
    graph); traces recorded before those were told apart read as 0 captured (their eager counts include them)."""
    missing = [c for c in CAPTURED_COLUMNS if c not in events.columns]
    return events.assign(**{c: 0 for c in missing}) if missing else events


def ranges_from_events(events: pd.DataFrame) -> pd.DataFrame:
    """Pair push/pop (per thread, by nesting) and start/end (per process, by id) into ranges.

    ``eager_launches``/``graph_launches`` count launches made while it was open by the range's own thread and by
    its process's other threads outside their own ranges (:mod:`pcietrace.analysis.threads`: PyTorch's autograd
    engine launching the backward pass), ``captured_launches`` those made into a stream being captured into a
    graph (nodes added, nothing launched: in neither of the other two); the ``_process`` columns count the whole
    process's. ``launch_call_ns`` (the same threads') and ``sync_wait_ns``: the ns the range's thread (a start/end
    range: its process) spent
    inside eager launch calls and inside synchronize calls (waiting for the GPU), NaN where not timed (traces
    recorded before, or outside interpose mode). Ranges still open when the process ended are closed at its
    last event and marked ``closed=False``. A pop with no range open on its thread is ignored, as is an end
    with no start of its id open; a second start of an id still open replaces the first.
    Rows: per process (in order of first event) the closed ranges in the order they closed, then the ranges
    left open (push/pop ones by thread, in order of the thread's first push, outermost first; then start/end
    ones, by when their id was opened).
    """
    events = with_captured(events)
    events = events.assign(**{c: -1 for c in TIMING_COLUMNS if c not in events.columns})
    n = len(events)
    kind = events["event"]
    pid, tid = events["pid"].to_numpy(), events["tid"].to_numpy()  # (as loaded: widened per range, not per event)
    pid_rank = pd.factorize(pid)[0]  # (processes in order of their first event)
    thread = nesting.codes(pid, tid)
    # each process's and each thread's last event (by rank or code), and each thread's first push
    last_of_pid, last_thread = (_last_positions(c) for c in (pid_rank, thread))
    is_push, is_pop = (kind == "push").to_numpy(bool), (kind == "pop").to_numpy(bool)
    pushes = np.flatnonzero(is_push)
    first_push = np.full(thread.max() + 1 if n else 0, n, np.int64)
    np.minimum.at(first_push, thread[pushes], pushes)
    first_push[first_push == n] = -1
    del pushes

    # push/pop: a stack per thread; its size after each event is the walk of +1/-1 reflected at 0 (a pop on
    # an empty stack is ignored), and a push at size k closes at the thread's next valid pop from size k
    # (the per-event arrays let go as soon as read: a long run has tens of millions of events)
    sel = np.flatnonzero(is_push | is_pop)
    sel = sel[nesting.stable_order(thread[sel])]
    th = thread[sel]
    pushed = is_push[sel]
    step = np.where(pushed, np.int8(1), np.int8(-1))
    # (each thread's events lie together: running sums and minima restart where each thread's begin; sizes in
    # 32 bits, the restarts' offsets in 64)
    begins = np.flatnonzero(np.r_[True, th[1:] != th[:-1]]) if th.size else np.zeros(0, np.int64)
    lengths = np.diff(np.r_[begins, th.size])
    walk = np.cumsum(step, dtype=np.int32 if th.size < 2**31 else np.int64)
    walk -= np.repeat(walk[begins] - step[begins], lengths)
    offset = 2 * (th.size + 1) * np.repeat(np.arange(begins.size, dtype=np.int64), lengths)  # (each thread below the ones before)
    low = walk - offset
    np.minimum.accumulate(low, out=low)
    low += offset
    del offset
    np.minimum(low, 0, out=low)
    size = walk - low.astype(walk.dtype)
    del walk, low, begins, lengths
    level = np.where(pushed, size, size - step)  # (a pop: the size before it)
    del size, step
    valid = pushed | (level > 0)
    del pushed
    sel, th, level = sel[valid], th[valid], level[valid]
    del valid
    # by thread, stack level, time: push, pop, push, pop... (sel is in time order within each thread already)
    key = nesting.stable_order(th * (int(level.max()) + 1 if level.size else 1) + level)
    sk = sel[key]
    del sel
    same = th[key]
    del th
    lk = level[key]
    del level, key
    same = np.r_[(same[1:] == same[:-1]) & (lk[1:] == lk[:-1]), False]  # (the next is of the same thread and level)
    del lk
    push_k = is_push[sk]
    closes = push_k & same  # (the next at the same level is then a pop)
    p_open, p_close = sk[closes], sk[1:][closes[:-1]]
    left = sk[push_k & ~same]  # still open: closed at the process's last event
    del sk, same, push_k, closes

    # start/end: per (process, id), an end closes the start just before it
    is_start, is_end = (kind == "start").to_numpy(bool), (kind == "end").to_numpy(bool)
    se = np.flatnonzero(is_start | is_end)
    ident = events["id"].to_numpy(np.int64)[se]
    se = se[np.lexsort((se, ident, pid[se]))]
    ids = events["id"].to_numpy(np.int64)[se]
    same_id = np.r_[(pid[se][1:] == pid[se][:-1]) & (ids[1:] == ids[:-1]), False]
    st = is_start[se]
    pair = st & same_id & np.r_[is_end[se][1:], False]
    s_open, s_close = se[pair], np.r_[se[1:], -1][pair]
    last_in_id = st & ~same_id
    # an id's dict slot dates from the first start after its last end: the order of the ones left open
    first_of_run = st & ~np.r_[False, st[:-1] & same_id[:-1]]
    run_from = np.maximum.accumulate(np.where(first_of_run, np.arange(se.size), -1)) if se.size else se
    s_left, s_left_since = se[last_in_id], se[run_from[last_in_id]] if se.size else se

    opened = np.concatenate([p_open, s_open, left, s_left])
    ended = np.concatenate([p_close, s_close, last_thread[thread[left]], last_of_pid[pid_rank[s_left]]])
    end_t = events["t_ns"].to_numpy(np.int64)
    t_end = np.concatenate([end_t[p_close], end_t[s_close], end_t[last_of_pid[pid_rank[left]]],
                            end_t[last_of_pid[pid_rank[s_left]]]])
    closed = np.concatenate([np.ones(p_open.size + s_open.size, bool), np.zeros(left.size + s_left.size, bool)])
    is_push_range = np.concatenate([np.ones(p_open.size, bool), np.zeros(s_open.size, bool),
                                    np.ones(left.size, bool), np.zeros(s_left.size, bool)])
    # row order: per process, closed ones by when they closed, then push/pop ones left open by their thread's
    # first push and from the outermost, then start/end ones by their slot
    rank = np.concatenate([np.zeros(p_open.size + s_open.size), np.ones(left.size), np.full(s_left.size, 2)])
    within = np.concatenate([p_close, s_close, first_push[thread[left]] if left.size else left, s_left_since])
    then = np.concatenate([np.zeros(p_open.size + s_open.size), left, np.zeros(s_left.size)])
    row = np.lexsort((then, within, rank, pid_rank[opened]))
    del rank, within, then, pid_rank, last_of_pid, last_thread, first_push
    opened, ended, t_end, closed, is_push_range = (a[row] for a in (opened, ended, t_end, closed, is_push_range))
    if not opened.size:
        return pd.DataFrame(columns=RANGE_COLUMNS)

    push_rows = np.flatnonzero(is_push_range)
    # each row set's opening and closing events, gathered once
    edges = {"all": (opened, ended), "push": (opened[push_rows], ended[push_rows])}

    def grew(column: str, rows: str = "all") -> np.ndarray:
        v = events[column].to_numpy()
        a, b = edges[rows]
        return v[b].astype(np.int64) - v[a]

    def timed(scope: str, rows: str) -> np.ndarray:
        v = events[scope].to_numpy()
        a, b = (v[x].astype(np.int64) for x in edges[rows])
        return np.where((a >= 0) & (b >= 0), (b - a).astype(float), np.nan)

    def scoped(of: Any, column: str) -> tuple[np.ndarray, np.ndarray]:
        """Each range's figure (a push/pop one's from its thread's column, a start/end one's from its process's)
        and its process's."""
        process = of(f"{column}_process", "all")
        own = process.copy()
        own[push_rows] = of(f"{column}_thread", "push")
        return own, process

    def names_of(column: str) -> pd.Categorical:  # (a few distinct names over millions of ranges: codes)
        c = events[column]
        if isinstance(c.dtype, pd.CategoricalDtype):  # (as loaded: its own codes)
            codes, uniques = c.cat.codes.to_numpy(), c.cat.categories
        else:
            codes, uniques = pd.factorize(c.to_numpy(object) if c.dtype == object else c)
        return pd.Categorical.from_codes(codes[opened], uniques).remove_unused_categories()

    # (counts and ids in 32 bits where they fit: a long run's millions of ranges held in less memory)
    out = {"pid": _narrow(pid[opened]), "tid": _narrow(tid[opened]), "domain": names_of("domain"),
           "name": names_of("message"),
           "kind": pd.Categorical.from_codes(np.where(is_push_range, 0, 1), ["push", "start"]),
           "t_start_ns": end_t[opened], "t_end_ns": t_end, "depth": _narrow(events["depth"].to_numpy()[opened])}
    # start/end ranges may cross threads, so their thread-local counts are undefined: use the process's.
    counted, whole = {}, {}
    for name, column, of in (("eager_launches", "eager", grew), ("graph_launches", "graph", grew),
                             ("captured_launches", "captured", grew), ("launch_call_ns", "call_ns", timed)):
        counted[name], whole[name] = scoped(of, column)
    # (a push/pop range's: its own thread's, and its process's other threads' outside their own ranges)
    _add_helped(counted, whole, push_rows, pid[opened[push_rows]], tid[opened[push_rows]],
                out["t_start_ns"][push_rows], t_end[push_rows], out["depth"][push_rows], out["name"][push_rows])
    for name, own in counted.items():
        out[name] = own if name == "launch_call_ns" else _narrow(own)
        if name != "launch_call_ns":
            out[f"{name}_process"] = _narrow(whole[name])
    del counted, whole
    out["sync_wait_ns"] = scoped(timed, "wait_ns")[0]
    out["closed"] = closed
    # (the columns as they are: a frame built from them copied every integer column into one block)
    return pd.DataFrame({c: out[c] for c in RANGE_COLUMNS}, copy=False)


def _add_helped(counted: dict[str, np.ndarray], whole: dict[str, np.ndarray], push_rows: np.ndarray,
                pid: np.ndarray, tid: np.ndarray, t_start: np.ndarray, t_end: np.ndarray, depth: np.ndarray,
                names: pd.Categorical) -> None:
    """``counted`` (each range's figures: its own thread's on ``push_rows``) with its process's other threads'
    added where :func:`pcietrace.analysis.threads.helped_counts` adds them, in place, a process at a time;
    ``whole``: its process's figures; the rest: of the push/pop ranges, in ``push_rows``' order."""
    others = np.zeros(push_rows.size, bool)  # (a process whose ranges saw no other thread's launch: nothing to do)
    for k in LAUNCH_COUNT_COLUMNS:
        others |= whole[k][push_rows] > counted[k][push_rows]
    if not others.any():
        return
    # (a code of -1, a range with no name, names no engine; one more slot, False, where it lands)
    engine_named = np.append(np.asarray(names.categories.astype(str).str.startswith(threads.ENGINE_PREFIX), bool),
                             False)[names.codes]
    for p in np.unique(pid[others]):
        rows = np.flatnonzero(pid == p)
        engine = threads.engine_threads(tid[rows], depth[rows], engine_named[rows])
        at, got = threads.helped_counts(tid[rows], t_start[rows], t_end[rows], depth[rows], engine,
                                        {k: v[push_rows[rows]] for k, v in counted.items()},
                                        {k: v[push_rows[rows]] for k, v in whole.items()}, LAUNCH_COUNT_COLUMNS)
        for k, v in got.items():
            counted[k][push_rows[rows[at]]] = v


def process_ranges(events: pd.DataFrame, gpus: list[dict[str, Any]], consume: bool = False) -> pd.DataFrame:
    """:func:`ranges_from_events` with :func:`range_gpus`, one process's events at a time: ranges pair and read
    their devices within their process, so a long run's working arrays are one process's, not every event's.
    The same rows, columns and categories as the two run over all the events at once.
    ``consume``: ``events`` taken apart (its columns deleted) into a copy per process, each let go once its
    ranges are made: a long run's events and ranges are never held whole together."""
    if not len(events):
        return range_gpus(pd.DataFrame(columns=RANGE_COLUMNS), events, gpus)
    code = pd.factorize(events["pid"].to_numpy())[0]  # (processes in order of their first event, as the rows are)
    if int(code.max()) == 0:  # (one process: its events read in place)
        return range_gpus(ranges_from_events(events), events, gpus)
    together = code.size < 2 or bool((code[1:] >= code[:-1]).all())  # (each process's events in one block)
    order = None if together else nesting.stable_order(code)
    bounds = np.searchsorted(code if together else code[order], np.arange(int(code.max()) + 2))
    del code
    # (names as categories of the whole run's, in its order: each process's ranges name a part of them)
    whole = {}
    for col, source in (("domain", "domain"), ("name", "message")):
        c = events[source]
        whole[col] = c.cat.categories if isinstance(c.dtype, pd.CategoricalDtype) else pd.factorize(c.to_numpy(object))[1]
    spans = list(zip(bounds[:-1], bounds[1:]))
    parts: list[Any] = [None] * len(spans)
    if consume:  # (copied out a column at a time, each of the whole's columns let go once copied)
        columns: list[dict[str, Any]] = [{} for _ in spans]
        for c in list(events.columns):
            v = events[c].array
            for k, (lo, hi) in enumerate(spans):
                columns[k][c] = v[lo:hi].copy() if order is None else v.take(order[lo:hi])
            del events[c], v
        parts = [pd.DataFrame(c, copy=False) for c in columns]
        del columns
    found = []
    for k, (lo, hi) in enumerate(spans):  # (one process's events at a time: a slice, a copy, or its own part)
        part = parts[k] if consume else events.iloc[lo:hi] if order is None else events.take(order[lo:hi])
        parts[k] = None
        r = ranges_from_events(part)
        if len(r):
            found.append(range_gpus(r, part, gpus))
        del part, r
    del order
    if not found:
        return range_gpus(pd.DataFrame(columns=RANGE_COLUMNS), events, gpus)
    out = {}
    for col in found[0].columns:
        cols = [f[col] for f in found]
        if col in whole:
            out[col] = union_categoricals(cols, ignore_order=True).set_categories(whole[col]).remove_unused_categories()
        elif isinstance(cols[0].dtype, pd.CategoricalDtype):
            out[col] = union_categoricals(cols, sort_categories=True)
        else:
            out[col] = np.concatenate([c.to_numpy() for c in cols])
        for f in found:  # (each part's column let go as it is joined)
            del f[col]
    return pd.DataFrame(out, copy=False)


def _narrow(v: np.ndarray) -> np.ndarray:
    """Integers as int32 where they lie within +-2**30 (two of them still add up within 32 bits), else as int64."""
    fits = not v.size or (-2**30 < int(v.min()) and int(v.max()) < 2**30)
    return v.astype(np.int32 if fits else np.int64, copy=False)


def _last_positions(codes: np.ndarray) -> np.ndarray:
    """Per code (0 ... max), the position of its last row."""
    out = np.zeros(int(codes.max()) + 1 if codes.size else 0, np.int64)
    np.maximum.at(out, codes, np.arange(codes.size, dtype=np.int64))
    return out


def _ordinals_to_nvml(events: pd.DataFrame, gpus: list[dict[str, Any]]) -> Any:
    """``to_nvml(pid, mask)``: the NVML indices (sorted) of the CUDA ordinals in bit set ``mask`` of process
    ``pid``, from the "cudevice" events that name each ordinal's PCI bus id (ordinals no GPU record matches
    are left out)."""
    by_bus = {str(g.get("bus_id", "")).lower(): int(g["nvml_index"]) for g in gpus}
    names = events[events["event"] == "cudevice"]
    ordinal_to_nvml = {(int(p), int(o)): by_bus.get(_bus(m)) for p, o, m in zip(names["pid"], names["id"], names["message"])}
    known: dict[tuple[int, int], list[int]] = {}

    def to_nvml(pid: int, mask: int) -> list[int]:
        if (pid, mask) not in known:
            found = {ordinal_to_nvml.get((pid, o)) for o in range(64) if mask >> o & 1}
            known[pid, mask] = sorted(i for i in found if i is not None)
        return known[pid, mask]
    return to_nvml


def _or_between(group: np.ndarray, t: np.ndarray, bits: np.ndarray, q_group: np.ndarray, q_from: np.ndarray,
                q_to: np.ndarray, own_first: np.uint64 | None = None) -> np.ndarray:
    """Per query: the OR of ``bits`` over the events of its group with ``q_from <= t <= q_to``. Events and the
    queries' two ends are merged in one order (by group, time; a query's start before events at its time, its
    end after them), where each query's events lie between its two ends. ``own_first``: a bit read without each
    query's first event (a range's own push, whose bits tell what came before it)."""
    m, k = t.size, q_from.size
    t_min = min(int(t.min()) if m else 0, int(q_from.min()) if k else 0)
    span = max(int(t.max()) if m else 0, int(q_to.max()) if k else 0) - t_min + 1
    groups = int(max(group.max() if m else 0, q_group.max() if k else 0)) + 1
    if m and groups * span < 2**62:  # (group and time in one number: events sorted once, each query's ends searched)
        key = group.astype(np.int64)
        key *= span
        key += t
        key -= t_min
        if t.size < 2 or bool((t[1:] >= t[:-1]).all()):  # (events in time order: sorted by group alone, a radix sort)
            order = nesting.stable_order(group)
            key = key[order]
        else:
            order = np.argsort(key, kind="stable")
            key.sort()
        lo = np.searchsorted(key, q_group.astype(np.int64) * span + (q_from - t_min), "left")
        hi = np.searchsorted(key, q_group.astype(np.int64) * span + (q_to - t_min), "right")
        del key
        merged = bits[order]
        del order
        return _bits_between(merged, lo, hi, own_first, None if own_first is None else np.minimum(lo + 1, hi))
    g = np.concatenate([group, q_group, q_group])
    at = np.concatenate([t, q_from, q_to])
    side = np.concatenate([np.ones(m, np.int8), np.zeros(k, np.int8), np.full(k, 2, np.int8)])
    order = np.lexsort((side, at, g))
    where = np.empty(m + 2 * k, np.int64)
    where[order] = np.arange(m + 2 * k)
    merged = np.concatenate([bits, np.zeros(2 * k, np.uint64)])[order]
    lo, hi = where[m:m + k], where[m + k:]
    # (past the query's start, then its first event)
    return _bits_between(merged, lo, hi, own_first, None if own_first is None else np.minimum(lo + 2, hi))


def _bits_between(bits: np.ndarray, lo: np.ndarray, hi: np.ndarray, bit: np.uint64 | None = None,
                  bit_lo: np.ndarray | None = None) -> np.ndarray:
    """Per query, the OR of ``bits[lo:hi]`` (``bit`` of ``bits[bit_lo:hi]``): per device bit seen (a few), how many
    of them carry it, from a running count (nested ranges overlap, so reducing each one's own slice would cost
    its length)."""
    out = np.zeros(lo.size, np.uint64)
    seen = int(np.bitwise_or.reduce(bits)) if bits.size else 0
    count = np.zeros(bits.size + 1, np.int32 if bits.size < 2**31 else np.int64)
    for b in (b for b in range(64) if seen >> b & 1):
        one = np.uint64(1 << b)
        np.cumsum((bits & one) != 0, out=count[1:])
        out[count[hi] > count[bit_lo if bit is not None and one == bit else lo]] |= one
    return out


def _thread_codes(pid: np.ndarray, tid: np.ndarray, q_pid: np.ndarray,
                  q_tid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A code per event for its thread (``pid``, ``tid``), and the same codes for the queries' ``q_pid``, ``q_tid``
    (-1: a thread no event has). One 64-bit key per row (pid above, tid below), not the events and queries
    stacked: a long run's events are tens of millions."""
    def key(p: np.ndarray, th: np.ndarray) -> np.ndarray:
        k = p.astype(np.int64)
        k <<= 32
        k |= th.astype(np.int64) & 0xFFFFFFFF
        return k

    codes, uniques = pd.factorize(key(pid, tid))
    q_codes = pd.Index(uniques).get_indexer(key(q_pid, q_tid))
    return codes.astype(np.int64, copy=False), q_codes.astype(np.int64, copy=False)


#: A bit of the events' device sets that no CUDA ordinal takes (64 GPUs in one process): set on an event whose
#: thread launched or copied since its previous event, so that a range's own work is read in the same pass as
#: its devices (:func:`range_gpus`'s ``worked``).
WORK_BIT = np.uint64(1 << 63)


def range_gpus(ranges: pd.DataFrame, events: pd.DataFrame, gpus: list[dict[str, Any]]) -> pd.DataFrame:
    """Adds ``gpus`` (sorted NVML indices whose bytes the range holds), ``gpus_rule`` ("thread", "process" or
    "all sampled") and ``worked``: whether a push/pop range's own thread launched or copied on a GPU while it was
    open (its children's time included; False where the recording has no device information; for a start/end
    range, its process). ``gpus``: the session's GPU records (``nvml_index``, ``bus_id``)."""
    out = ranges.copy(deep=False)  # (copy-on-write: the columns added are its own)
    sampled = sorted(int(g["nvml_index"]) for g in gpus)
    if "devmask" not in events.columns or not len(out):
        out["gpus"] = [sampled] * len(out)
        out["gpus_rule"] = pd.Categorical.from_codes(np.zeros(len(out), np.int8), ["all sampled"])
        out["worked"] = np.zeros(len(out), bool)
        return out
    to_nvml = _ordinals_to_nvml(events, gpus)
    bits = _device_bits(events)
    marked = not (bits & WORK_BIT).any()  # (else a process sees 64 GPUs: no work read, no device lost)
    if marked:  # (work since the thread's previous event: a push's was done before it, in the range around it)
        bits[events["devmask"].to_numpy(np.uint64) != 0] |= WORK_BIT
    e_pid, e_tid = events["pid"].to_numpy(), events["tid"].to_numpy()  # (as loaded)
    r_pid, r_tid = out["pid"].to_numpy(np.int64), out["tid"].to_numpy(np.int64)
    push = (out["kind"] == "push").to_numpy()
    # devmask names the devices launched or copied on since the thread's previous event, so (start, end] holds the
    # range's own: a push/pop range reads its thread's events, a start/end one its process's
    t = events["t_ns"].to_numpy(np.int64)
    a, b = out["t_start_ns"].to_numpy(np.int64), out["t_end_ns"].to_numpy(np.int64)
    own = np.zeros(len(out), np.uint64)
    p_code, p_ids = pd.factorize(e_pid)  # (each event's process: read for start/end ranges and the processes' devices)
    process = np.zeros(len(p_ids), np.uint64)  # (each process's devices: the OR of its events')
    np.bitwise_or.at(process, p_code, bits)
    if marked:
        process &= ~WORK_BIT
    starts = ~push
    if starts.any():  # start/end ranges: an OR over their process's events
        own[starts] = _or_between(p_code.astype(np.int64, copy=False), t, bits,
                                  pd.Index(p_ids).get_indexer(r_pid[starts]).astype(np.int64, copy=False),
                                  a[starts], b[starts])
    del p_code
    if push.any():  # push/pop ranges: an OR over their thread's events
        group, q_group = _thread_codes(e_pid, e_tid, r_pid[push], r_tid[push])
        own[push] = _or_between(group, t, bits, q_group, a[push], b[push], WORK_BIT if marked else None)
        del group, q_group
    out["worked"] = (own & WORK_BIT) != 0 if marked else np.zeros(len(out), bool)
    if marked:
        own &= ~WORK_BIT
    whole = pd.Series(process, index=p_ids).reindex(r_pid, fill_value=0).to_numpy(np.uint64)
    code = nesting.codes(r_pid, own, whole, push)
    first = np.full(int(code.max()) + 1 if code.size else 0, code.size, np.int64)  # (each combination's first range)
    np.minimum.at(first, code, np.arange(code.size, dtype=np.int64))
    result, rule = [], []
    for pid, mask, proc_mask, is_push in zip(r_pid[first], own[first], whole[first], push[first]):  # (a few combinations: one per process and device set)
        mine = [g for g in to_nvml(int(pid), int(mask)) if g in sampled]
        if mine:
            result.append(mine), rule.append("thread" if is_push else "process")
            continue
        theirs = [g for g in to_nvml(int(pid), int(proc_mask)) if g in sampled]
        result.append(theirs or sampled), rule.append("process" if theirs else "all sampled")
    lists = np.empty(len(result), object)
    lists[:] = result
    out["gpus"] = lists[code]
    out["gpus_rule"] = pd.Categorical(rule)[code] if rule else np.zeros(0, object)
    return out


def _bus(message: Any) -> str:
    from pcietrace.schema import normalize_bus_id

    try:
        return normalize_bus_id(str(message))
    except ValueError:
        return str(message).lower()


def _device_bits(events: pd.DataFrame) -> np.ndarray:
    """Per event: the devices it names as a bit set (launches and copies since the thread's previous event, and
    the device current at a range edge)."""
    bits = events["devmask"].to_numpy(np.uint64, copy=True)
    dev = events["dev"].to_numpy()
    edge = events["event"].isin(RANGE_EVENTS).to_numpy() & (dev >= 0) & (dev < 64)
    bits[edge] |= np.left_shift(np.uint64(1), dev[edge].astype(np.uint64))
    return bits


def open_ranges_at(ranges: pd.DataFrame, t_ns: np.ndarray) -> np.ndarray:
    """How many ranges (of every process and thread) are open at each time ``t_ns``: what the injection
    library counts in the edge page, which picks the sampler's rate under idle-aware sampling."""
    starts = np.sort(ranges["t_start_ns"].to_numpy(np.int64))
    ends = np.sort(ranges["t_end_ns"].to_numpy(np.int64))
    return np.searchsorted(starts, t_ns, "right") - np.searchsorted(ends, t_ns, "right")


def sampling_gaps(cum: pd.DataFrame, counters: dict[int, dict[str, Any]] | None = None, idle_ns: int = 0,
                  ranges: pd.DataFrame | None = None, quiet_ns: int = 0) -> dict[int, dict[str, Any]]:
    """Per GPU: sample times ``t``; per gap between consecutive samples whether it is a ``stall`` (longer
    than 4 counter updates and twice the median in-range gap) or a ``wrap`` risk (long enough for a
    saturated link to wrap the counter unseen, or holding a counter jump: :func:`counters.jumps`); and
    ``median_ns``, the median gap the sampler keeps while a range is open. With idle-aware sampling
    (``idle_ns`` > 0, the sampler's idle interval, and the recording's ``ranges``) a gap that starts while no
    range is open was meant to last up to ``idle_ns``: it is a stall only beyond twice that, and it does not
    count towards the median; one while a range is open is a stall only beyond twice ``quiet_ns`` (the
    sampler's interval there while the link is not busy: 0, none), unless the link moved faster than
    ``BUSY_BPS`` over an interval that ended less than ``FAST_HOLD_NS`` before it (the sampler was then meant
    to read fast, as the sampler decides it). ``counters``: each GPU's record
    (:attr:`pcietrace.session.Session.counters`: its counter width and link, :func:`could_hide_wrap`)."""
    out = {}
    if idle_ns > 0 and ranges is not None:  # (sorted once for every GPU: each GPU's search then runs in order)
        starts, ends = (_ascending(ranges[c].to_numpy(np.int64)) for c in ("t_start_ns", "t_end_ns"))
    for idx, g in per_gpu(cum):
        t = g["t_ns"].to_numpy(np.int64)
        gap = np.diff(t)
        if idle_ns > 0 and ranges is not None:  # (no range open: open_ranges_at)
            opened = counted_by(t[:-1], starts)
            opened -= counted_by(t[:-1], ends)
            idle = opened == 0
            del opened
        else:
            idle = np.zeros(gap.size, bool)
        fast = gap[~idle] if (~idle).any() else gap
        median = median_of(fast) if fast.size else 0.0
        del fast
        limit = max(4 * COUNTER_UPDATE_NS, 2 * median) if gap.size else 0
        stall = gap > limit
        if quiet_ns > 0 and gap.size:  # (a gap meant to last up to the quiet interval: no copy lately)
            moved = np.diff(g["tx_bytes"].to_numpy(np.float64)) + np.diff(g["rx_bytes"].to_numpy(np.float64))
            busy_end = np.where(faster_than_busy(moved, np.maximum(gap, 1)), t[1:], np.iinfo(np.int64).min // 2)
            last_busy = np.maximum.accumulate(busy_end)  # (the end of the latest busy interval up to each gap)
            quiet = np.ones(gap.size, bool)
            quiet[1:] = t[1:-1] - last_busy[:-1] >= FAST_HOLD_NS
            stall[quiet] = gap[quiet] > max(limit, 2 * quiet_ns)
            del moved, busy_end, last_busy, quiet
        stall[idle] = gap[idle] > max(limit, 2 * idle_ns)  # (a gap meant to last up to the idle interval)
        out[int(idx)] = {"t": t, "stall": stall, "median_ns": median,
                         "wrap": could_hide_wrap(t, read_ns_of(g), (counters or {}).get(int(idx))) | jumps(g)}
    return out


def _ascending(x: np.ndarray) -> np.ndarray:
    """``x`` sorted (itself where it is already: a caller that reads several GPUs sorts once)."""
    return x if x.size < 2 or (x[1:] >= x[:-1]).all() else np.sort(x)


def attribute(ranges: pd.DataFrame, cum: pd.DataFrame | None, floor: pd.DataFrame,
              counters: dict[int, dict[str, Any]] | None = None,
              gaps: dict[int, dict[str, Any]] | None = None, sums: dict[str, Any] | None = None,
              parent: pd.Series | None = None) -> pd.DataFrame:
    """Adds ``duration_ns``; per direction ``{d}_raw_bytes`` (counter change over the range, interpolated
    between samples, summed over the range's ``gpus``), ``{d}_bytes`` (raw minus the floor model; NaN unless
    ``status`` is "ok"), ``{d}_edge_bytes`` (how far the raw change can be off: the counter values' errors at
    its two edges, from :func:`edge_values`, made to grow with time by :func:`growing_edges`, but the change no
    further than 0 below and than its link moves in its time above) and ``{d}_floor_err_bytes`` (the
    95 % half-width of the floor subtracted, its GPUs' in quadrature:
    :func:`pcietrace.analysis.floor.floor_err_bytes`; NaN unless "ok"); ``stalls`` (sampling gaps the range
    overlaps that are longer than 4 counter updates);
    ``status`` (:data:`STATUSES`: "no data" where a GPU's samples do not cover the range, "wrap risk" where a
    gap could hide a counter wrap or the counter jumped, "no floor" where a GPU has none); and the exclusive
    figures (``excl_ns``, ``excl_h2d_bytes``, ``excl_d2h_bytes``: minus the direct children of push/pop ranges
    on the same thread) and ``parent`` (the row position of that parent, -1 for none).
    ``ranges`` must carry ``gpus`` (:func:`range_gpus`); ``floor``: :func:`pcietrace.analysis.floor.floor_model`;
    ``counters``: each GPU's record (:attr:`pcietrace.session.Session.counters`: its counter width, and its
    link, :func:`link_bps`, what its edges can move; default 32 bits, a Gen5 x16); ``gaps``:
    :func:`sampling_gaps` where the sampler's rate varied (idle-aware sampling; default: computed with one rate).
    The floor counts the reads inside each range, so a read rate that changes between ranges, idle time and
    the floor's calibration windows is accounted for read by read. ``sums``: :func:`gpu_sums` made already,
    a GPU's samples at a time (``cum`` then unused: None); ``parent``: :func:`nesting.parents` of ``ranges``
    made already (before the sums, so that its working arrays never lie beside them)."""
    out = ranges.copy(deep=False)
    out["duration_ns"] = out["t_end_ns"] - out["t_start_ns"]
    parent = parent if parent is not None else nesting.parents(out)  # (first: its keys let go before the sums)
    sums = sums if sums is not None else gpu_sums(ranges, cum, floor, counters, gaps)
    acc, status, stalls = sums["acc"], sums["status"], sums["stalls"]
    status = np.where(sums["holds"](None, sums["sampled"]), 2, status)  # a GPU with no samples at all
    del sums
    out["status"] = pd.Categorical.from_codes(status, STATUSES)
    out["stalls"] = _narrow(stalls)
    del stalls
    unknown = status != 0
    del status
    for d in DIRECTIONS:  # (each sum let go once in its column: a long run's ranges hold no spare copies)
        out[f"{d}_raw_bytes"] = acc[f"{d}_raw"]
        net = acc[f"{d}_raw"] - acc.pop(f"{d}_floor")
        net[unknown] = np.nan
        out[f"{d}_bytes"] = net
        out[f"{d}_edge_bytes"] = acc.pop(f"{d}_edge")
        err = np.sqrt(acc.pop(f"{d}_floor_var"))
        err[unknown] = np.nan
        out[f"{d}_floor_err_bytes"] = err
        del net, err
    del acc, unknown
    own = {"excl_ns": "duration_ns", "excl_h2d_bytes": "h2d_bytes", "excl_d2h_bytes": "d2h_bytes"}
    parent_at = nesting.parent_rows(out.index, parent)
    for excl, c in own.items():  # (one column's children's sums held at a time)
        values = out[c].to_numpy(float)
        out[excl] = values - nesting.children_sum(parent_at, values)
    out["parent"] = _narrow(parent_at)
    return out[list(dict.fromkeys([*ranges.columns, *ATTRIBUTED_COLUMNS]))]  # (ranges attributed again keep their order)


def gpu_sums(ranges: pd.DataFrame, cum: pd.DataFrame, floor: pd.DataFrame,
             counters: dict[int, dict[str, Any]] | None = None, gaps: dict[int, dict[str, Any]] | None = None,
             sums: dict[str, Any] | None = None, groups: np.ndarray | None = None) -> dict[str, Any]:
    """:func:`attribute`'s figures per range from the GPUs whose samples ``cum`` holds, added to ``sums`` (what
    an earlier call made for other GPUs; None: none yet), so that a long run's GPUs can be read one at a time
    (their cumulative counters never all held at once). Arguments as :func:`attribute`'s; ``floor`` needs rows
    for ``cum``'s GPUs only, ``gaps`` entries for them only. ``groups``: each range's group in the summary as a
    code (0 ... n-1, the same in every call); ``sums["shared"]`` then holds per direction and group the bytes its
    calls' edges share (:func:`shared_edges`), which its total's edge error need not count twice."""
    a, b = ranges["t_start_ns"].to_numpy(np.int64), ranges["t_end_ns"].to_numpy(np.int64)
    if sums is None:
        sums = {"acc": {k: np.zeros(a.size) for k in ("h2d_raw", "d2h_raw", "h2d_edge", "d2h_edge", "h2d_floor",
                                                        "d2h_floor", "h2d_floor_var", "d2h_floor_var")},
                "status": np.zeros(a.size, np.int8),  # index into STATUSES; the worst over the range's GPUs wins
                "stalls": np.zeros(a.size, np.int32), "holds": gpu_sets(ranges["gpus"])[0], "sampled": set()}
        if groups is not None:
            n = int(groups.max()) + 1 if groups.size else 0
            sums["shared"] = {d: np.zeros(n) for d in DIRECTIONS}
    acc, status, holds = sums["acc"], sums["status"], sums["holds"]
    names = _name_codes(ranges["name"]) if "name" in ranges else None  # (growing_edges: a range's other calls)
    gaps = gaps if gaps is not None else sampling_gaps(cum, counters)
    models = floor.set_index("nvml_index") if len(floor) else pd.DataFrame()
    for idx, g in per_gpu(cum):
        sums["sampled"].add(int(idx))
        k = np.flatnonzero(holds(int(idx)))  # the ranges holding this GPU: its figures are theirs only
        if not k.size:
            continue
        ak, bk = a[k], b[k]
        t = g["t_ns"].to_numpy(np.int64)
        gp = gaps[int(idx)]
        covered = (ak >= t[0]) & (bk <= t[-1])
        wrap = gaps_overlapping(t, gp["wrap"], ak, bk) > 0
        no_floor = int(idx) not in models.index or models.loc[int(idx), "status"] == "no floor"
        first, after = np.searchsorted(t, ak, "right"), np.searchsorted(t, bk, "right")  # samples inside: first..after-1
        reads = after - first
        st = np.where(~covered, 2, np.where(wrap, 3, 1 if no_floor else 0))
        status[k] = np.maximum(status[k], st)
        sums["stalls"][k] += gaps_overlapping(t, gp["stall"], ak, bk)
        model = None if no_floor else models.loc[int(idx)]
        # their reads' summed time (us): a range whose reads sat apart in read time states it in its floor error
        # (a floor with a read-time term reads it: :func:`pcietrace.analysis.floor.read_us_apart`)
        read_us = None
        if "read_ns" in g and model is not None and model.get("read_time_term"):
            spent_ns = np.zeros(len(g) + 1, np.int64)
            np.cumsum(g["read_ns"].to_numpy(), dtype=np.int64, out=spent_ns[1:])
            read_us = (spent_ns[after] - spent_ns[first]) / 1e3
            del spent_ns
        # reads ending a busy interval: their cost is stated to at least floor.STATE_MIN_SHARE (no interval shows it)
        busy = None if model is None else busy_reads(g, model, first, after)
        early, late = read_windows(g)
        link = link_bps((counters or {}).get(int(idx), {}))
        by_group = None if groups is None else np.lexsort((ak, groups[k]))  # (both directions pair calls in it)
        ys = tuple(g[f"{c}_bytes"].to_numpy() for c in DIRECTIONS.values())  # (as held: a few read per edge)
        # the floor's bytes per read and per ns, which the edges spread evenly (none without a floor)
        floors = [(0.0, 0.0) if no_floor else
                  np.nan_to_num(floor_bytes(model, d, np.array([1, 0]), np.array([0, 1]))) for d in DIRECTIONS]
        per_read, per_ns = tuple(float(f[0]) for f in floors), tuple(float(f[1]) for f in floors)
        # (both directions' edges at once: where each falls among the samples is the same for both)
        starts, ends = (edge_values_of(t, ys, x, side, early, late, per_read, per_ns, link, at)
                        for x, side, at in ((ak, "start", first), (bk, "end", after)))
        del ys
        for which, d in enumerate(DIRECTIONS):
            (ya, ea), (yb, eb) = starts[which], ends[which]
            starts[which] = ends[which] = None  # (each direction's let go as it is read)
            (ya, ea), (yb, eb) = growing_edges(ak, bk, ya, yb, ea, eb, np.ones(k.size, bool),
                                               None if names is None else names[k])
            raw, edge = yb - ya, ea + eb
            # the change over a range lies within its edges' errors, at least 0, and at most what the link moves
            # in its time (a 70 us call beside a 50 MB copy: the copy's interval bounds both its edges)
            room = link / 1e9 * (bk - ak) - raw
            acc[f"{d}_raw"][k] += raw
            acc[f"{d}_edge"][k] += np.maximum(np.maximum(np.minimum(edge, room), np.minimum(edge, raw)), 0.0)
            if groups is not None:  # (calls whose upper bound is their edges' own: the others' edges not paired)
                pairs = _consecutive_calls(by_group, groups[k], ak, bk, (st <= 1) & (edge <= room))
                sums["shared"][d] += shared_edges(pairs, ya, yb, ea, eb, sums["shared"][d].size)
            del raw, edge, room
            if not no_floor:
                acc[f"{d}_floor"][k] += floor_bytes(model, d, reads, bk - ak)
                acc[f"{d}_floor_var"][k] += floor_err_bytes(model, d, reads, bk - ak, read_us, busy) ** 2
    return sums


def _consecutive_calls(by_group: np.ndarray, groups: np.ndarray, a: np.ndarray, b: np.ndarray, known: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One GPU's ranges (``groups``: each one's group code; ``a``/``b``: starts and ends, ns; ``by_group``: their
    rows by group, then start) where ``known`` as pairs of calls of one group in a row by start, the first ended
    by the time the second starts: (first rows, second rows, their group)."""
    order = by_group[known[by_group]]
    g = groups[order]
    first, second = order[:-1], order[1:]
    pair = (g[1:] == g[:-1]) & (g[1:] >= 0) & (b[first] <= a[second])
    return first[pair], second[pair], g[1:][pair]


def shared_edges(pairs: tuple[np.ndarray, np.ndarray, np.ndarray], ya: np.ndarray, yb: np.ndarray, ea: np.ndarray,
                 eb: np.ndarray, n: int) -> np.ndarray:
    """Per group (``n`` codes), how much of its calls' summed edge errors it need not state for its total: calls of
    one group in a row (``pairs``: :func:`_consecutive_calls`) whose end and next start lie close (in one sample
    interval at emit_nvtx density) each bound the counter there, ``yb + eb`` at the end and ``ya - ea`` at the
    next start, and the counter never falls between them. A group's total is the sum over its calls of the
    counter at each end less at each start; taking each end with the next call's start, each pair's part is at
    most ``min(0, (yb + eb) - (ya - ea))`` (the counter does not fall), where the calls' errors summed allowed
    ``(yb + eb) - (ya - ea)`` (their estimates grow with time: :func:`growing_edges`). The difference, what the two
    edges' bounds overlap, is shared: each end and each start is in one pair at most, so the total's upper
    bound, the calls' summed estimates plus their summed errors less the shared bytes, holds (its lower bound:
    :func:`summarize`)."""
    first, second, group = pairs
    overlap = np.maximum((yb[first] + eb[first]) - (ya[second] - ea[second]), 0.0)
    return np.bincount(group, weights=overlap, minlength=n)


def _name_codes(names: pd.Series) -> np.ndarray:
    """A code per range for its name: a categorical column's own codes (a long run's ranges: no copy, no
    hashing of 1e7 names), a missing name a code of its own."""
    if not isinstance(names.dtype, pd.CategoricalDtype):
        return pd.factorize(names, use_na_sentinel=False)[0]
    codes = names.cat.codes.to_numpy()
    return np.where(codes < 0, len(names.cat.categories), codes) if (codes < 0).any() else codes


def value_curve(cum: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One GPU's counter ``column`` ("tx"/"rx"): (sample times, ns: the reads' midpoints; cumulative bytes;
    the earliest and latest each value can apply, ns: the read's start less one counter update, and its
    end), each ascending. Where in a read its values apply differs by direction and load
    (``docs/lab/bench/read_latch_probe.py``), hence the whole read. ``cum`` comes in time order with its values
    ascending (:func:`pcietrace.analysis.counters.cumulative_bytes` leaves out reads that step back); the
    windows of reads of different lengths are put in order too, the k-th earliest with the k-th value."""
    return (cum["t_ns"].to_numpy(np.int64), cum[f"{column}_bytes"].to_numpy(float), *read_windows(cum))


def read_windows(cum: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """:func:`value_curve`'s earliest and latest times (ns) each value can apply, each ascending (the same for
    both directions). Reads overlap little, so these are nearly in order: a stable sort (a merge of runs)
    puts them in order in about one pass."""
    t = cum["t_ns"].to_numpy(np.int64)
    half = read_ns_of(cum) // 2
    early, late = t - half, t + half  # (each made and sorted in place: a GPU's samples, twice, not six times)
    del half
    early -= COUNTER_UPDATE_NS
    early.sort(kind="stable")
    late.sort(kind="stable")
    return early, late


#: Edges :func:`edge_values` works out at a time.
EDGE_CHUNK = 1 << 18


def edge_values(t: np.ndarray, y: np.ndarray, edge: np.ndarray, side: str, early: np.ndarray | None = None,
                late: np.ndarray | None = None, floor_bytes_per_read: float = 0.0,
                floor_bytes_per_ns: float = 0.0, max_bps: float = MAX_LINK_BPS,
                after: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The cumulative counter at each range ``edge`` (``side`` "start" or "end") and how far that can be
    off (both in bytes), from samples at ``t`` (ns) with values ``y``.

    Between the two samples around an edge the interval's bytes could have moved on either side. The floor's share
    of them (one read, ``floor_bytes_per_read``, and the background, ``floor_bytes_per_ns``) is spread evenly over
    the interval, as the floor model counts it. A range wraps the work that moves its bytes, so the edge is where
    the rest changes: at a start, what the previous interval moved above the floor's rate runs on up to the edge and
    the remainder is the range's; at an end, the next interval's rate above the floor runs back to the edge and the
    remainder is the range's. (The rate-matching rule used before put half of a 0.5 ms copy that followed idle time
    outside its range: -35 ... -94 % on the blind oracle's short copies; this rule reads them within 0.3 %.) Where
    traffic outside any range abuts an edge (an app's warm-up copy just before its first range) this charges it to
    the range, no more than the link (``max_bps``, B/s) moves between the edge and the latest time the next sample's
    value can apply (nor between the earliest time the previous one's can and the edge; ``early``/``late``: the earliest
    and latest, ns, ascending, :func:`value_curve`; by default from one counter update before each sample's time to
    it). The error is the worst case within those bounds. A read in flight at the edge (begun before it, ended after
    it) may have taken its value on either side, so the bound reaches past it to the reads either side of it. Left
    out: a read begun after the edge whose value was up to one counter update old (taken before the edge). Edges
    outside the samples are clamped (and flagged "no data" by :func:`attribute`). ``after``: how many samples lie
    at or before each edge (``np.searchsorted(t, edge, "right")``), where the caller has it (both directions
    share it)."""
    ((est, err),) = edge_values_of(t, (y,), edge, side, early, late, (floor_bytes_per_read,), (floor_bytes_per_ns,),
                                   max_bps, after)
    return est, err


def edge_values_of(t: np.ndarray, ys: tuple[np.ndarray, ...], edge: np.ndarray, side: str,
                   early: np.ndarray | None, late: np.ndarray | None, floor_bytes_per_read: tuple[float, ...],
                   floor_bytes_per_ns: tuple[float, ...], max_bps: float = MAX_LINK_BPS,
                   after: np.ndarray | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`edge_values` of several counters sampled at the same times ``t`` (a GPU's two directions), each
    with its floor: where each edge falls among the samples and the reads in flight is found once for all."""
    if t.size < 2:
        # (bytes as floats whatever the counter's type: a GPU with one sample gave integers, which the edges'
        # meeting halfway could not hold)
        return [(np.full(edge.shape, float(y[0]) if y.size else 0.0), np.zeros(edge.shape)) for y in ys]
    early = t - COUNTER_UPDATE_NS if early is None else early
    late = t if late is None else late
    out = [(np.empty(edge.shape), np.empty(edge.shape)) for _ in ys]
    for lo in range(0, edge.size, EDGE_CHUNK):  # (a long run's edges a chunk at a time: a score of arrays per edge)
        at = slice(lo, lo + EDGE_CHUNK)
        plan = _edge_plan(t, edge[at], early, late, None if after is None else after[at])
        for (est, err), y, per_read, per_ns in zip(out, ys, floor_bytes_per_read, floor_bytes_per_ns):
            est[at], err[at] = _edge_at(plan, t, y, side, per_read, per_ns, max_bps)
    return out


class _EdgePlan(NamedTuple):
    """Where edges fall among a GPU's samples, whatever the counter (:func:`_edge_plan`)."""
    edge: np.ndarray
    i: np.ndarray       # the sample at or before each edge (clipped to the first interval's start)
    ended: np.ndarray   # the last read that ended by the edge
    began: np.ndarray   # the first read that began after it
    reach: list[np.ndarray]  # how long (ns) the link runs between the edge and each of four values' times


def _edge_plan(t: np.ndarray, edge: np.ndarray, early: np.ndarray, late: np.ndarray,
               after: np.ndarray | None) -> _EdgePlan:
    """Where each ``edge`` falls among samples at ``t`` and which reads were in flight at it (arguments as
    :func:`edge_values`'): the same for every counter read at those times."""
    n = t.size
    i = np.clip((np.searchsorted(t, edge, side="right") if after is None else after) - 1, 0, n - 2)
    t0, t1 = t[i], t[i + 1]
    # The reads that surely took their values on their own side of the edge: the samples around it, unless one
    # was in flight at the edge (begun before it, ended after it). Its value may be either side's (4x H100: the
    # read before a push ended after it and held the range's 16 MiB copy; the range read 2 % of its bytes), so
    # the bound reaches to the read before it or after it. Each value also bounds the edge by what the link
    # moves between it and the edge. (The estimate is left as it is: which side is as likely as not.)
    # (the searches only where a read was in flight: late[i] after the edge, early[i + 1] an update before it)
    ended, began = i.copy(), i + 1  # (rows of those reads; not ``after``, the count of samples by each edge)
    k = np.flatnonzero((late[i] > edge) & (t0 <= edge))  # (an edge before the first sample is clamped)
    ended[k] = np.searchsorted(late, edge[k], side="right") - 1  # the last read that ended by the edge
    k = np.flatnonzero((early[i + 1] < edge - COUNTER_UPDATE_NS) & (t1 >= edge))  # (and one after the last)
    began[k] = np.searchsorted(early, edge[k] - COUNTER_UPDATE_NS, side="left")  # the first that began after it
    reach = [np.maximum(late[i + 1] - edge, 0), np.maximum(late[i] - edge, 0), np.maximum(edge - early[i], 0),
             np.maximum(edge - early[i + 1], 0)]
    return _EdgePlan(edge, i, ended, began, reach)


def _edge_at(plan: _EdgePlan, t: np.ndarray, y: np.ndarray, side: str, floor_bytes_per_read: float,
             floor_bytes_per_ns: float, max_bps: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`edge_values` of one counter ``y`` from the edges' :func:`_edge_plan`."""
    n, edge, i = t.size, plan.edge, plan.i
    t0, t1, y0, y1 = t[i], t[i + 1], y[i], y[i + 1]
    e = np.clip(edge, t0, t1)
    span = np.maximum(t1 - t0, 1)
    moved = y1 - y0
    spread = np.clip(floor_bytes_per_read + floor_bytes_per_ns * span, 0, np.maximum(moved, 0))  # the floor's share
    rate = spread / span
    above = moved - spread
    if side == "start":
        j = np.maximum(i - 1, 0)
        prev = np.where(i >= 1, (y0 - y[j]) / np.maximum(t0 - t[j], 1), 0.0)
        est = y0 + rate * (e - t0) + np.clip((prev - rate) * (e - t0), 0, np.maximum(above, 0))
    else:
        j = np.minimum(i + 2, n - 1)
        nxt = np.where(i + 2 < n, (y[j] - y1) / np.maximum(t[j] - t1, 1), 0.0)
        est = y1 - rate * (t1 - e) - np.clip((nxt - rate) * (t1 - e), 0, np.maximum(above, 0))
    ended, began = plan.ended, plan.began
    y_before = np.where(ended >= 0, y[np.maximum(ended, 0)], -np.inf)
    y_after = np.where(began < n, y[np.minimum(began, n - 1)], np.inf)
    cap = max_bps / 1e9  # bytes per ns
    late_next, late_at, early_at, early_next = plan.reach
    lo = np.maximum(np.maximum(y_before, y1 - cap * late_next), y0 - cap * late_at)
    hi = np.minimum(np.minimum(y_after, y0 + cap * early_at), y1 + cap * early_next)
    ok = lo <= hi  # (else more bytes than the link moves: throughput-mode counters, a faster link)
    lo = np.where(ok, lo, np.where(ended >= 0, y_before, y0))
    hi = np.where(ok, hi, np.where(began < n, y_after, y1))
    est = np.clip(est, lo, hi)
    return est, np.maximum(est - lo, hi - est)


def growing_edges(a: np.ndarray, b: np.ndarray, ya: np.ndarray, yb: np.ndarray, ea: np.ndarray, eb: np.ndarray,
                  mine: np.ndarray, names: np.ndarray | None = None
                  ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """One GPU's counter estimates at its ranges' starts ``a`` and ends ``b`` (ns; ``ya``/``yb``, bytes, with
    errors ``ea``/``eb``; only where ``mine``), made to grow with time as the counter does. A pop and the next
    push in one sample interval can each take that interval's traffic by :func:`edge_values`' rule (the range
    that ends holds it if the next interval is quiet, the one that starts if the previous one is): both
    ranges would count the same bytes. There the estimates meet (between the running maximum and the reversed
    running minimum: unchanged where they grow already), and each error grows by its shift. They meet halfway,
    or, with ``names`` (a code per range: its calls share it), where the ranges' other calls say how their bytes
    go (:func:`_dispute_shares`). At equal times an end comes before a start."""
    k = np.flatnonzero(mine)
    t, y = np.concatenate([a[k], b[k]]), np.concatenate([ya[k], yb[k]])
    order = np.lexsort((np.repeat([1, 0], k.size), t))  # by time, ends first
    hi = np.maximum.accumulate(y[order])
    lo = np.minimum.accumulate(y[order][::-1])[::-1]
    met = hi + lo
    met /= 2
    if names is not None:
        at, share = _dispute_shares(order, hi, lo, y, names[k])
        met[at] = np.clip((1 - share) * lo[at] + share * hi[at], lo[at], hi[at])  # (in order, to the last bit)
    del hi, lo
    fixed = np.empty_like(y)
    fixed[order] = met
    del met
    ya, yb, ea, eb = ya.copy(), yb.copy(), ea.copy(), eb.copy()
    shift = np.abs(fixed - y)
    ya[k], yb[k] = fixed[:k.size], fixed[k.size:]
    ea[k], eb[k] = ea[k] + shift[:k.size], eb[k] + shift[k.size:]
    return (ya, ea), (yb, eb)


#: Bytes below which a range's typical bytes are not taken as its scale (a few counter reads' own traffic).
TYPICAL_MIN_BYTES = 100e3
#: A call whose edges are in dispute by no more than this many bytes each still says what its range moves.
SETTLED_BYTES = 100e3


def _dispute_shares(order: np.ndarray, hi: np.ndarray, lo: np.ndarray, y: np.ndarray,
                    names: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`growing_edges`' disputes settled by the ranges' other calls: per run of edges in dispute (in time
    order, ``order``: rows of ``y``, the n starts' estimates then the n ends'; ``hi``/``lo``: the running maximum
    and reversed minimum in that order), one share of the bytes in dispute (each edge at ``lo + share * (hi -
    lo)``: 0 gives them to the ranges that start, 1 to those that end, and the edges stay in time order) that
    brings the run's ranges nearest, each in proportion to its size, to the median of its name's calls whose
    edges are in dispute by at most :data:`SETTLED_BYTES` (least squares; a name with fewer than two such calls
    is left out, and a run whose ranges' names say nothing of its share keeps meeting halfway). Calls share a
    name whatever their domain or process. Returns the positions in
    ``order`` and their shares. Counters alone cannot tell on which side of the edges an interval's bytes moved;
    a 64 MiB copy right after a launch-only range, both inside one 2.5 ms interval, was otherwise read half in
    each (4x H200, the two-node torchrun job)."""
    n = y.size // 2
    pos = np.flatnonzero(hi > lo)
    if not pos.size:
        return pos, np.zeros(0)
    gap = hi[pos] - lo[pos]  # (the disputes' bytes, by position in dispute: a long run's edges are tens of millions)
    run = np.cumsum(np.r_[True, pos[1:] != pos[:-1] + 1]) - 1  # each disputed position's run
    row = order[pos]
    by_row = np.argsort(row)  # (the disputed edges by row, searched)
    rows, gaps, runs_of, lows = row[by_row], gap[by_row], run[by_row], lo[pos][by_row]

    def edge(r: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Rows ``r``' dispute: its bytes, run (-1: none), and the edge at share 0 and halfway."""
        i = np.minimum(np.searchsorted(rows, r), rows.size - 1)
        hit = rows[i] == r
        g = np.where(hit, gaps[i], 0.0)
        low = np.where(hit, lows[i], y[r])
        return g, np.where(hit, runs_of[i], -1), low, low + g / 2

    settled = np.isin(names, names[row % n])  # calls of the names in dispute...
    settled[row[gap > SETTLED_BYTES] % n] = False  # ...whose edges are in dispute by little or nothing
    mine = np.flatnonzero(settled)
    del settled
    calls = pd.Series(y[n + mine] - y[mine]).groupby(names[mine])
    typical = calls.median().where(calls.size() >= 2).reindex(range(int(names.max()) + 1)).to_numpy()
    # each (run, range) with an edge in the run: the range's bytes are base + share * slope there (its other
    # edge, in another run, taken halfway)
    pair = np.unique(run * n + row % n)
    r_run, r = pair // n, pair % n
    want = typical[names[r]]
    known = ~np.isnan(want)
    r_run, r, want = r_run[known], r[known], want[known]
    (g_end, run_end, lo_end, mid_end), (g_start, run_start, lo_start, mid_start) = edge(n + r), edge(r)
    end_in, start_in = run_end == r_run, run_start == r_run
    base = np.where(end_in, lo_end, mid_end) - np.where(start_in, lo_start, mid_start)
    slope = np.where(end_in, g_end, 0.0) - np.where(start_in, g_start, 0.0)
    weight = 1 / np.maximum(np.abs(want), TYPICAL_MIN_BYTES) ** 2
    runs = int(run[-1]) + 1
    num = np.bincount(r_run, weight * slope * (want - base), runs)
    den = np.bincount(r_run, weight * slope ** 2, runs)
    settle = den[run] > 0
    share = np.clip(num[run[settle]] / den[run[settle]], 0.0, 1.0)
    return pos[settle], share


def launches_by_untraced_threads(events: pd.DataFrame) -> pd.DataFrame:
    """Per process: its launches (eager + graph, ``launches``) and how many of them no thread with an NVTX event
    saw (``untraced``: made by threads that never opened a range or marked, e.g. PyTorch's autograd threads,
    which launch the backward pass, or after a thread's last event). A push/pop range counts those made while it
    was open (:mod:`pcietrace.analysis.threads`); each instance's ``*_launches_process`` counts every thread's."""
    cols = ["pid", "launches", "untraced"]
    if not len(events) or "eager_process" not in events:
        return pd.DataFrame(columns=cols)
    pid = events["pid"].to_numpy()
    proc, pids = pd.factorize(pid, sort=True)
    thread = nesting.codes(pid, events["tid"].to_numpy())

    def most(codes: np.ndarray, column: str) -> np.ndarray:  # (per code, the column's largest value)
        out = np.full(int(codes.max()) + 1, np.iinfo(np.int64).min, np.int64)
        values = events[column].to_numpy()
        for lo in range(0, len(values), nesting.CHUNK):  # (widened a chunk at a time: no 64-bit copy of every event)
            np.maximum.at(out, codes[lo:lo + nesting.CHUNK], values[lo:lo + nesting.CHUNK].astype(np.int64))
        return out

    total = most(proc, "eager_process") + most(proc, "graph_process")
    proc_of = np.zeros(int(thread.max()) + 1, np.int64)
    proc_of[thread] = proc  # (each thread's process)
    by_threads = np.zeros(len(pids), np.int64)
    np.add.at(by_threads, proc_of, most(thread, "eager_thread") + most(thread, "graph_thread"))
    return pd.DataFrame({"pid": pids, "launches": total, "untraced": total - by_threads}).astype(int)


def summarize(attributed: pd.DataFrame, costs: dict[str, float] | None, short_ns: float,
              shared: pd.DataFrame | None = None, inner: np.ndarray | None = None) -> pd.DataFrame:
    """Per (domain, name), every figure a total over its ``calls`` (none is per call); where ``attributed``
    carries ``group`` (:func:`pcietrace.analysis.names.group_names`) per (domain, group) instead, the group
    in ``name`` and how many distinct names it holds in ``names``; ``gpus`` (sorted NVML
    indices its calls were charged to, a list like each instance's, e.g. [0, 1]),
    ``incl_ms``/``excl_ms`` (summed), ``h2d_bytes``/``d2h_bytes`` (inclusive, summed; NaN if any call has no
    figure), ``excl_h2d_bytes`` (minus direct children's, summed; NaN likewise), ``h2d_raw_bytes``/
    ``d2h_raw_bytes`` (before the floor is removed, summed) and the worst-case edge errors of the totals
    ``h2d_edge_bytes``/``d2h_edge_bytes`` (the calls' summed, less what consecutive calls' edges share:
    ``shared``, per ``domain`` and ``group``, ``h2d_shared_bytes``/``d2h_shared_bytes``, :func:`shared_edges`;
    but never less than the total's estimate can lie above its lower bound, each call's counter change at least
    0) and the floor's 95 %
    half-widths ``h2d_floor_err_bytes``/``d2h_floor_err_bytes`` (summed: one floor serves every call),
    ``status`` (the worst of its calls), ``unknown_calls`` (calls not "ok": their bytes unknown) and
    ``h2d_measured_bytes``/``d2h_measured_bytes`` (summed over the other calls: the least the range moved where
    a few calls of a long run lie over a sampling stall that could hide a counter wrap; NaN with none measured),
    ``stalls`` (sampling stalls its calls overlap), ``eager_launches``, ``graph_launches``,
    ``captured_launches`` (made into a stream being captured: graph nodes, in neither count before),
    ``h2d_bytes_per_launch`` (over eager + graph launches), ``launch_overhead_ms`` (launches x the measured
    host cost per launch), ``graph_savings_ms`` (what capturing its eager launches into graphs could save at most: the
    instances' ``graph_savings_ms``, :func:`pcietrace.analysis.savings.predict_ms` per call; NaN without it),
    ``gpu_busy_ms``
    (``attach --gpu-time``: the GPU ran its process's kernels; NaN unknown) and ``short_calls`` (calls shorter
    than ``short_ns``, whose bytes rest on interpolation between counter samples). ``inner``: per instance, whether
    it lies in another call of its group (:func:`pcietrace.analysis.nesting.inside_own_group`): its inclusive
    figures (:data:`INCLUSIVE_SUMS`) are in that call's, and the totals leave them out; the measured totals keep
    it where no enclosing call of its group was measured."""
    if not len(attributed):
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    rank = {s: i for i, s in enumerate(STATUSES)}
    status = attributed["status"]
    status_rank = (np.asarray(status.cat.categories.map(rank), np.int8)[status.cat.codes.to_numpy()]
                   if isinstance(status.dtype, pd.CategoricalDtype) else status.map(rank))
    at = attributed.assign(status_rank=status_rank, captured_launches=attributed.get("captured_launches", 0),
                           short=(attributed["duration_ns"] < short_ns).to_numpy())
    if "group" not in at:
        at["group"] = at["name"]
    inner = inner if inner is not None and inner.any() else None
    if inner is not None:  # (its inclusive figures as 0 in the sums, none counted twice, unknown ones still
        # unknown; its exclusive ones its own)
        at = at.assign(**{c: at[c].where(~inner | at[c].isna(), 0) for c in INCLUSIVE_SUMS if c in at})
    g = at.groupby(["domain", "group"], sort=False, observed=True)
    out = g.agg(calls=("name", "size"), incl_ms=("duration_ns", "sum"), excl_ms=("excl_ns", "sum"),
                h2d_raw_bytes=("h2d_raw_bytes", "sum"), d2h_raw_bytes=("d2h_raw_bytes", "sum"),
                h2d_edge_bytes=("h2d_edge_bytes", "sum"), d2h_edge_bytes=("d2h_edge_bytes", "sum"),
                status_rank=("status_rank", "max"), stalls=("stalls", "sum"),
                short_calls=("short", "sum")).reset_index()
    out["short_calls"] = out["short_calls"].astype(np.int64)
    ids = g.ngroup().to_numpy()  # (each instance's group, -1 for none: pandas' nunique sorts every instance)
    if ids.dtype.kind == "f":  # (pandas marks a call of no group NaN, not -1: a range with no name)
        ids = np.where(np.isnan(ids), -1, ids).astype(np.int64)
    known = ids >= 0
    names = at["name"]  # (a categorical column's own codes: no hashing of every instance's name)
    name_codes, distinct_names = ((names.cat.codes.to_numpy(), names.cat.categories)
                                  if isinstance(names.dtype, pd.CategoricalDtype) else pd.factorize(names))

    def pairs_of(rows: np.ndarray, codes: np.ndarray, n: int) -> np.ndarray:  # (each (group, code) once, n codes)
        key = ids[rows]  # (made in place: no working copy of every instance)
        key *= n
        key += codes[rows]
        return pd.unique(key)
    n_names = max(len(distinct_names), 1)
    pairs = pairs_of(known & (name_codes >= 0), name_codes, n_names)
    out.insert(1 + list(out.columns).index("calls"), "names", np.bincount(pairs // n_names, minlength=len(out)))
    del names, name_codes, pairs
    calls = out["calls"].to_numpy()
    measured = g["h2d_bytes"].count().to_numpy()  # ("ok" calls: each has both directions' figures)
    # the measured totals also hold the "ok" calls inside calls of their group that are not (a wrap risk): what
    # they moved is the least their group moved, and no "ok" call of it holds them
    alone = None
    if inner is not None and "parent" in attributed and attributed["h2d_bytes"].isna().any():
        has = attributed["h2d_bytes"].notna().to_numpy()
        parent = attributed["parent"].to_numpy()
        covered = nesting.inside_own_group(parent if parent.dtype.kind in "iu" else parent.astype(np.int64), ids,
                                           by=has, rows=np.flatnonzero(inner & has))
        alone = np.flatnonzero(inner & has & ~covered & (ids >= 0))
    out["unknown_calls"] = calls - measured
    # totals that are unknown (NaN) where any call's figure is (one fitted floor serves every call: its error
    # adds up, it does not average out)
    for name, col in (("h2d_bytes", "h2d_bytes"), ("d2h_bytes", "d2h_bytes"), ("excl_h2d_bytes", "excl_h2d_bytes"),
                      ("h2d_floor_err_bytes", "h2d_floor_err_bytes"), ("d2h_floor_err_bytes", "d2h_floor_err_bytes"),
                      ("eager_launches", "eager_launches"), ("graph_launches", "graph_launches"),
                      ("captured_launches", "captured_launches"), ("graph_savings_ms", "graph_savings_ms"),
                      ("gpu_busy_ms", "gpu_busy_ns")):
        if col not in at:  # (a figure no instance has: NaN for every group, no column of NaN per instance)
            out[name] = np.nan
            continue
        total = g[col].sum().to_numpy()  # (over the calls with a figure)
        bytes_ok = name in ("h2d_bytes", "d2h_bytes")
        if bytes_ok:  # the "ok" calls' own total: what they measured, where any were
            least = total if alone is None or not alone.size else \
                total + np.bincount(ids[alone], attributed[col].to_numpy(float)[alone], len(out))
            out[name.replace("_bytes", "_measured_bytes")] = np.where(measured > 0, least, np.nan)
        if at[col].isna().any():
            total = np.where((measured if bytes_ok else g[col].count().to_numpy()) < calls, np.nan, total)
        out[name] = total / 1e6 if name == "gpu_busy_ms" else total
    # each group's GPUs, a sorted list as each instance's (instances share their lists: each distinct one read once)
    which, distinct = by_object(at["gpus"].to_numpy(object))
    pairs = pairs_of(known, which, len(distinct))
    # the totals' edge errors below their estimates: a call's counter change is at least 0, so its estimate lies
    # at most min(its change, its edge error) above what it could be (NaN changes: the edge error)
    down = {}
    for d in DIRECTIONS:
        above = np.fmin(at[f"{d}_raw_bytes"].to_numpy(float), at[f"{d}_edge_bytes"].to_numpy(float))
        down[d] = np.bincount(ids[known], above[known], len(out)) if not known.all() else \
            np.bincount(ids, above, len(out))
        del above
    del ids, known, which
    gpus: list[set[int]] = [set() for _ in range(len(out))]
    for k, j in zip(*np.divmod(pairs, len(distinct))):
        gpus[k].update(int(i) for i in distinct[j])
    out["gpus"] = [sorted(s) for s in gpus]
    for c in ("domain", "group"):  # (a small table: plain strings again)
        if isinstance(out[c].dtype, pd.CategoricalDtype):
            out[c] = out[c].astype(str)
    shared = None if shared is None else \
        shared.set_index(["domain", "group"]).reindex(pd.MultiIndex.from_arrays([out["domain"], out["group"]]))
    for d in DIRECTIONS:  # (the edge errors above the estimates less the edges consecutive calls share)
        less = 0.0 if shared is None else shared[f"{d}_shared_bytes"].fillna(0.0).to_numpy()
        out[f"{d}_edge_bytes"] = np.maximum(np.maximum(out[f"{d}_edge_bytes"].to_numpy() - less, down[d]), 0.0)
    out = out.rename(columns={"group": "name"})
    out["status"] = out.pop("status_rank").map(dict(enumerate(STATUSES)))
    out["incl_ms"] /= 1e6
    out["excl_ms"] /= 1e6
    launches = out["eager_launches"] + out["graph_launches"]
    out["h2d_bytes_per_launch"] = np.where(launches > 0, out["h2d_bytes"] / launches.where(launches > 0, 1), np.nan)
    if costs:
        out["launch_overhead_ms"] = (out["eager_launches"] * costs["host_us_per_eager_launch"]
                                     + out["graph_launches"] * costs["host_us_per_graph_launch"]) / 1e3
    else:
        out["launch_overhead_ms"] = np.nan
    # (parent_domain, parent_name, level, parent_calls: where the caller places the groups in a tree,
    # names.group_tree)
    return out.reindex(columns=SUMMARY_COLUMNS).sort_values("incl_ms", ascending=False, kind="stable").reset_index(drop=True)


def within_parents(table: pd.DataFrame) -> pd.DataFrame:
    """The ranges table (:func:`summarize`, with :func:`pcietrace.analysis.names.group_tree`'s ``parent_domain``,
    ``parent_name``, ``level`` and ``within_parent``) with each group's stated error no wider than its parent
    group's bounds allow: where every call of a group sits directly in a call of its parent group on the same
    GPUs, its bytes lie between 0 and the parent's upper bound (estimate + stated error), so its half-width is at
    most the farther of those from its estimate. The edge part takes the cut (the floor's interval stays whole);
    parents are bounded first (by level), so a chain of groups narrows down it."""
    t = table.copy()
    pos = {k: i for i, k in enumerate(zip(t["domain"], t["name"]))}
    parent = np.array([pos.get(k, -1) for k in zip(t["parent_domain"], t["parent_name"])], np.int64)
    ok = t["within_parent"].fillna(False).to_numpy(bool) & (parent >= 0)
    level = t["level"].to_numpy()
    for at in np.unique(level[ok]):
        rows = np.flatnonzero(ok & (level == at))
        p = parent[rows]
        for d in DIRECTIONS:
            est, edge = t[f"{d}_bytes"].to_numpy(float), t[f"{d}_edge_bytes"].to_numpy(float).copy()
            stated = t[f"{d}_floor_err_bytes"].to_numpy(float)
            floor_err = np.nan_to_num(stated)
            err = edge[rows] + floor_err[rows]
            lo = np.maximum(est[rows] - err, 0.0)  # (bytes moved are never below 0)
            # (nor above the parent's bound; a parent whose floor error is unknown states none: no cut)
            hi = np.fmin(est[rows] + err, est[p] + edge[p] + stated[p])
            half = np.maximum(est[rows] - lo, hi - est[rows])
            keep = ~np.isfinite(half) | (hi < lo)  # (no figure, or bounds that disagree: the error as it was)
            edge[rows] = np.where(keep, edge[rows], np.minimum(edge[rows], np.maximum(half - floor_err[rows], 0.0)))
            t[f"{d}_edge_bytes"] = edge
    return t


#: The instances' figures that hold their nested calls' (summed over a group's outermost calls only, where calls
#: of a group nest in one another: :func:`summarize`).
INCLUSIVE_SUMS = ("duration_ns", "h2d_raw_bytes", "d2h_raw_bytes", "h2d_edge_bytes", "d2h_edge_bytes", "h2d_bytes",
                  "d2h_bytes", "h2d_floor_err_bytes", "d2h_floor_err_bytes", "eager_launches", "graph_launches",
                  "captured_launches", "graph_savings_ms", "gpu_busy_ns", "stalls")

SUMMARY_COLUMNS = ["domain", "name", "calls", "names", "gpus", "incl_ms", "excl_ms", "h2d_bytes", "d2h_bytes", "excl_h2d_bytes",
                   "h2d_raw_bytes", "d2h_raw_bytes", "h2d_edge_bytes", "d2h_edge_bytes", "h2d_floor_err_bytes",
                   "d2h_floor_err_bytes", "status", "unknown_calls", "h2d_measured_bytes", "d2h_measured_bytes", "stalls",
                   "eager_launches", "graph_launches", "captured_launches", "short_calls", "h2d_bytes_per_launch",
                   "launch_overhead_ms", "graph_savings_ms", "gpu_busy_ms", "parent_domain", "parent_name", "level",
                   "parent_calls"]


def launches_by_gpu(events: pd.DataFrame, gpus: list[dict[str, Any]]) -> pd.DataFrame:
    """Kernel launches made on each GPU of ``gpus`` (the session's GPU records): ``nvml_index``,
    ``eager_launches``, ``graph_launches``. A thread's launches between two of its events go to the GPU that
    the later event's ``devmask`` names (a "cudevice" event also names the ordinal whose first launch it
    announces). A process that launched on one GPU only (its "cudevice" events name every device it ever
    launched on) has all its launches on that GPU, also those of threads with no event of their own after them
    (e.g. PyTorch's autograd threads). In a process that used several, launches of an interval that names
    several GPUs or none, and those no event accounts for, are in no row; so are launches on a GPU not in
    ``gpus``.
    Without device information (recordings made before it was recorded) every count is NaN."""
    out = pd.DataFrame({"nvml_index": sorted(int(g["nvml_index"]) for g in gpus)})
    for mode in ("eager", "graph"):
        out[f"{mode}_launches"] = 0.0 if len(events) and "devmask" in events.columns else np.nan
    if out["eager_launches"].isna().all() or not len(out):
        return out
    # (the columns read here only; events come in time order already, CUPTI's kernel records aside)
    cols = [c for c in ("t_ns", "pid", "tid", "event", "id", "message", "devmask", "eager_thread", "graph_thread",
                        "eager_process", "graph_process") if c in events]
    host = (events["event"] != "kernel").to_numpy()
    ev = events[cols] if host.all() else events.loc[host, cols]
    if not ev["t_ns"].is_monotonic_increasing:
        ev = ev.sort_values("t_ns", kind="stable")
    named = (ev["event"] == "cudevice").to_numpy() & ev["id"].between(0, 63).to_numpy()
    announces = np.left_shift(np.uint64(1), ev["id"].to_numpy()[named].astype(np.uint64))  # (the named rows' ordinal)
    to_nvml = _ordinals_to_nvml(ev, gpus)
    row = {int(i): k for k, i in enumerate(out["nvml_index"])}

    def place(pid: int, mask: int, n: int, mode: str) -> int:
        where = to_nvml(pid, mask)  # leaves out ordinals of no GPU in ``gpus``: one bit only
        if n > 0 and mask.bit_count() == 1 and len(where) == 1 and where[0] in row:
            out.loc[row[where[0]], f"{mode}_launches"] += n
            return n
        return 0

    # per thread (its events in time order) the launches since its previous event, summed per process and device
    # set: each sum placed once (a thread's counts never run backwards, so no per-thread sum is negative)
    pid = ev["pid"].to_numpy()
    thread = nesting.codes(pid, ev["tid"].to_numpy())
    order = nesting.stable_order(thread)
    thread = thread[order]
    first = np.r_[True, thread[1:] != thread[:-1]] if order.size else np.zeros(0, bool)
    del thread
    steps = {}
    for mode in ("eager", "graph"):
        c = ev[f"{mode}_thread"].to_numpy()[order]  # (gathered as held, the steps widened as they are taken)
        # (counts held in 32 bits, none negative: their steps fit 32 bits too)
        narrow = c.dtype == np.int32 and not (c.size and c.min() < 0)
        d = np.empty(c.size, np.int32 if narrow else np.int64)
        d[:1] = c[:1]
        np.subtract(c[1:], c[:-1], out=d[1:], dtype=d.dtype, casting="unsafe")  # (as astype would)
        # a forked child's thread kept its parent's count (older injection libraries); its process count starts at 0
        d[first] = np.minimum(c[first], ev[f"{mode}_process"].to_numpy()[order[first]])
        steps[mode] = d
        del c, d
    del first
    # (only the events after which a count moved are placed: the (process, device set) codes of those alone)
    moved = np.flatnonzero((steps["eager"] != 0) | (steps["graph"] != 0))
    steps = {mode: d[moved] for mode, d in steps.items()}
    rows = order[moved]
    del order, moved
    bits = ev["devmask"].to_numpy()[rows].astype(np.uint64)
    hit = named[rows]  # (the "cudevice" rows among them: each one's own ordinal added)
    bits[hit] |= announces[np.searchsorted(np.flatnonzero(named), rows[hit])]
    del hit
    procs = pd.unique(pid)
    last = np.flatnonzero(~pd.Series(pid).duplicated(keep="last").to_numpy())
    last = pd.Series(last, index=pid[last])  # (each process's last event)
    announced = pd.Series(announces).groupby(pid[named]).agg(np.bitwise_or.reduce).reindex(procs, fill_value=0)
    # (process, device set) of each such event, numbered in order of first appearance, and each one's first event
    pid_by_thread = pid[rows]
    del rows
    combo = nesting.codes(pid_by_thread, bits)
    at = np.full(int(combo.max()) + 1 if combo.size else 0, combo.size, np.int64)  # (each one's first event)
    np.minimum.at(at, combo, np.arange(combo.size, dtype=np.int64))
    combos = list(zip(pid_by_thread[at].tolist(), bits[at].tolist()))
    del bits, pid_by_thread, at
    for mode in ("eager", "graph"):
        sums = np.zeros(len(combos), np.int64)
        np.add.at(sums, combo, steps.pop(mode).astype(np.int64))  # (the sums' own type: NumPy's fast path)
        placed = dict.fromkeys(procs.tolist(), 0)
        for (p_id, mask), n in zip(combos, sums.tolist()):
            placed[int(p_id)] += place(int(p_id), int(mask), int(n), mode)
        # the rest (no event after them, or, in older recordings, an interval whose mask a "kernel" line took): on
        # the process's GPU if it ever launched on one only
        total = ev[f"{mode}_process"].to_numpy(np.int64)[last.reindex(procs).to_numpy()]
        for p_id, n in zip(procs.tolist(), total.tolist()):
            place(int(p_id), int(announced[p_id]), int(n) - placed[int(p_id)], mode)
    return out


#: Columns of :func:`whole_run` (the ``whole_run`` result table).
WHOLE_RUN_COLUMNS = ["nvml_index", "duration_ms", "h2d_bytes", "d2h_bytes", "h2d_floor_err_bytes", "d2h_floor_err_bytes",
                     "status", "eager_launches", "graph_launches", "program_eager_launches", "program_graph_launches",
                     "program_captured_launches", "processes", "ranges", "program_graph_savings_ms"]


def run_spans(sampled: list[int], t0: int, t1: int) -> pd.DataFrame:
    """The ranges :func:`whole_run` attributes: one per sampled GPU (``sampled``, NVML indices, ascending), from
    ``t0`` to ``t1`` (ns), holding that GPU only."""
    return pd.DataFrame({"t_start_ns": [t0] * len(sampled), "t_end_ns": [t1] * len(sampled), "kind": "start",
                         "pid": 0, "tid": 0, "depth": 0, "gpus": [[g] for g in sampled]})


def run_launches(events: pd.DataFrame, gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """What :func:`whole_run` reads from the events, made once (before a long run's range instances exist, so
    that its working copies of the events never lie beside them): ``by_gpu`` (:func:`launches_by_gpu` of
    ``gpus``, indexed by NVML index), the program's totals ``eager``, ``graph``, ``captured`` (each process's
    last event), ``processes`` and ``ranges``."""
    last = with_captured(events.iloc[np.flatnonzero(~events["pid"].duplicated(keep="last").to_numpy())]
                         if len(events) else events)  # (each process's last event)
    out: dict[str, Any] = {m: int(last[f"{m}_process"].sum()) if len(last) else 0 for m in ("eager", "graph", "captured")}
    out["by_gpu"] = launches_by_gpu(events, gpus).set_index("nvml_index")
    out["processes"] = int(events["pid"].nunique()) if len(events) else 0
    out["ranges"] = int(events["event"].isin(["push", "start"]).sum()) if len(events) else 0
    return out


def whole_run(cum: pd.DataFrame | None, launches: dict[str, Any], t0: int, t1: int, floor: pd.DataFrame,
              counters: dict[int, dict[str, Any]] | None = None,
              gaps: dict[int, dict[str, Any]] | None = None, sums: dict[str, Any] | None = None) -> pd.DataFrame:
    """One row per sampled GPU for the whole program run: duration, H2D/D2H bytes (floor removed; NaN with
    the reason in ``status`` where that GPU has no floor or no data) with the floor's 95 % half-width
    (``{d}_floor_err_bytes``: over a whole run the floor's error outweighs the edges'), the launches made on it
    (``launches``: :func:`run_launches`; without device information, the program's own where one GPU was sampled),
    and the program's totals, the same on every row: ``program_eager_launches``, ``program_graph_launches``,
    ``program_captured_launches`` (into streams being captured: graph nodes, in neither of the other two),
    ``processes``, ``ranges``, and ``program_graph_savings_ms`` (NaN here: what capturing the outermost ranges into
    graphs could save, :func:`pcietrace.analysis.savings.outermost_ms`, filled in where launch costs are known).
    Columns: :data:`WHOLE_RUN_COLUMNS`. ``counters``: see
    :func:`attribute`; ``gaps``: :func:`sampling_gaps` of ``cum`` where made already (its wrap risks are the
    same; default: made here); ``sums``: :func:`gpu_sums` of :func:`run_spans` made already, a GPU's samples at
    a time (``cum`` then unused: None)."""
    sampled = sorted(sums["sampled"]) if sums is not None else sorted(int(i) for i, _ in per_gpu(cum))
    span = run_spans(sampled, t0, t1)
    # (one span per GPU: its status reads the gaps that could hide a wrap; stalls and the median gap are not shown)
    if gaps is None and sums is None:
        gaps = {int(idx): {"t": g["t_ns"].to_numpy(np.int64), "median_ns": 0.0,
                           "stall": np.zeros(max(len(g) - 1, 0), bool),
                           "wrap": could_hide_wrap(g["t_ns"].to_numpy(np.int64), read_ns_of(g),
                                                   (counters or {}).get(int(idx))) | jumps(g)} for idx, g in per_gpu(cum)}
    at = attribute(span, cum, floor, counters, gaps, sums) if sampled else span
    mine = launches["by_gpu"].reindex(sampled)
    if len(sampled) == 1 and mine["eager_launches"].isna().all():
        mine.loc[:, ["eager_launches", "graph_launches"]] = [launches["eager"], launches["graph"]]
    out = pd.DataFrame({"nvml_index": sampled, "duration_ms": (t1 - t0) / 1e6,
                        "h2d_bytes": at.get("h2d_bytes", []), "d2h_bytes": at.get("d2h_bytes", []),
                        "h2d_floor_err_bytes": at.get("h2d_floor_err_bytes", []),
                        "d2h_floor_err_bytes": at.get("d2h_floor_err_bytes", []), "status": at.get("status", []),
                        "eager_launches": mine["eager_launches"].to_numpy(float),
                        "graph_launches": mine["graph_launches"].to_numpy(float),
                        "program_eager_launches": launches["eager"], "program_graph_launches": launches["graph"],
                        "program_captured_launches": launches["captured"],
                        "processes": launches["processes"], "ranges": launches["ranges"]})
    return out.reindex(columns=WHOLE_RUN_COLUMNS)  # (program_graph_savings_ms: NaN)


#: Columns of :func:`whole_run_bounds` (the ``whole_run_bounds`` result table).
WHOLE_RUN_BOUND_COLUMNS = ["nvml_index", "h2d_seen_bytes", "d2h_seen_bytes", "hidden_max_bytes", "gaps"]


def whole_run_bounds(cum: pd.DataFrame, t0: int, t1: int, floor: pd.DataFrame,
                     counters: dict[int, dict[str, Any]] | None = None) -> pd.DataFrame:
    """Per GPU whose whole run is "wrap risk" (sampling gaps that could hide a counter wrap): the run's bytes
    as far as they can be known. ``{d}_seen_bytes``: the counters' change over the run, floor removed, as if no
    wrap was hidden: the least the run moved; ``hidden_max_bytes``: the most a hidden wrap could add in either
    direction, whole wraps (``2**bits`` bytes) that a saturated link could move in each such gap
    (:func:`pcietrace.analysis.counters.movable_bytes`); ``gaps``: how many gaps. Counter jumps (resets) are
    not bounded this way: GPUs with one are left out. Columns: :data:`WHOLE_RUN_BOUND_COLUMNS`."""
    rows = []
    models = floor.set_index("nvml_index") if len(floor) else pd.DataFrame()
    for idx, g in per_gpu(cum):
        t, read_ns = g["t_ns"].to_numpy(np.int64), read_ns_of(g)
        if t.size < 2 or t[0] > t0 or t[-1] < t1 or jumps(g).any() or int(idx) not in models.index:
            continue
        c = (counters or {}).get(int(idx), {})
        inside = (t[1:] > t0) & (t[:-1] < t1)
        hide = could_hide_wrap(t, read_ns, c) & inside
        if not hide.any():
            continue
        wrap = 2.0 ** int(c.get("bits") or 32)
        hidden = float((np.floor(movable_bytes(t, read_ns, link_bps(c))[hide] / wrap) * wrap).sum())
        reads = int(((t > t0) & (t < t1)).sum())
        row: dict[str, Any] = {"nvml_index": int(idx), "hidden_max_bytes": hidden, "gaps": int(hide.sum())}
        for d, col in DIRECTIONS.items():
            y = g[f"{col}_bytes"].to_numpy(float)
            seen = float(np.interp(t1, t, y) - np.interp(t0, t, y))
            row[f"{d}_seen_bytes"] = seen - float(floor_bytes(models.loc[int(idx)], d, np.array(reads), np.array(t1 - t0)))
        rows.append(row)
    return pd.DataFrame(rows, columns=WHOLE_RUN_BOUND_COLUMNS)


#: Columns of :func:`launch_rate`'s table (the attach result ``launch_rates``).
LAUNCH_RATE_COLUMNS = ["pid", "t_ns", "eager_per_ms", "graph_per_ms"]


def launch_rate(events: pd.DataFrame, bin_ns: int = 1_000_000) -> pd.DataFrame:
    """Launches per ms per process over time (for timelines): ``pid``, ``t_ns`` (bin start), ``eager_per_ms``,
    ``graph_per_ms`` (from the process-wide launch counters carried by every event, interpolated at bin edges)."""
    parts = []
    pid_of = events["pid"].to_numpy() if len(events) else np.zeros(0, np.int64)
    for pid in np.unique(pid_of):  # (one process's rows at a time, in their own order: no order of every event's)
        mine = np.flatnonzero(pid_of == pid)
        t = events["t_ns"].to_numpy()[mine].astype(np.int64, copy=False)
        if t.size < 2 or t[-1] - t[0] < bin_ns:
            continue
        edges = np.arange(t[0], t[-1], bin_ns, dtype=np.int64)
        part = {"pid": int(pid), "t_ns": edges[:-1]}
        for mode in ("eager", "graph"):
            y = np.interp(edges, t, events[f"{mode}_process"].to_numpy()[mine].astype(float))
            part[f"{mode}_per_ms"] = np.diff(y) / (bin_ns / 1e6)
        parts.append(pd.DataFrame(part))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=LAUNCH_RATE_COLUMNS)
