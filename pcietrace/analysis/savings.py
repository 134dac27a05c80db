"""Attach's "graph saves" prediction checked: an eager attach run against the same program run with its
kernels captured into graphs. Stateless: the two runs' range tables in, one table out.

The prediction set beside the measured saving (eager minus graphed range time) is what attach prints
(``graph_savings_ms``), :func:`predict_ms` summed over the range's calls:

- :func:`predict_ms`, per range instance, bottom-up through the nesting: a range's own
  (exclusive) eager launches and time decide whether it is *launch-bound* (its time per launch is within
  :data:`LAUNCH_BOUND_FACTOR` of the host cost of a launch: it did little but launch). A launch-bound range
  saves, per launch, what it spent per launch minus what a kernel still costs inside a graph (the GPU runs
  graph kernels back to back: ``wall_us_per_kernel_graph``). Otherwise the GPU sets the pace, and a launch
  saves only the GPU's per-kernel overhead difference (eager - graph GPU time per kernel, when the costs carry
  it; else the calibration's wall difference, an upper bound). A parent adds up its children's savings.

Where the injection library timed the calls (interpose mode: ``sync_wait_ns``), how long the host waited for
the GPU inside synchronize calls is known: a range whose host waited at most half its own time is launch-bound
up to :data:`TIMED_LAUNCH_BOUND_FACTOR` x the host cost per launch (a slow host no longer reads as a busy
GPU), and saves per launch its own host time (waits left out) minus a graph kernel's time. A launch call that
waited for a full queue is not told apart from one slowed by the host (both are long; measured on the H100
with a busy loop on the app's CPU, 2026-11-23), so such waits count as host time: kernels that run longer than
the host takes to launch them, but under 4x a launch's host cost, with no synchronize call in the range, read
as launch-bound (factor 2 read them so too, up to 2x); ``--gpu-time`` tells.

What the model cannot know from launch counts alone is how busy the GPU was: a PyTorch range whose host
spends ~10-30 us per operator looks GPU-bound by its time per launch, yet a graph removes most of that host
time. Where an instance carries ``gpu_busy_ns`` (``attach --gpu-time``: the GPU's busy time inside the range
from CUPTI kernel records, :mod:`pcietrace.analysis.gpu_time`), :func:`predict_ms` uses it instead: captured
whole into a graph, the range's own part takes what its kernels take on the GPU -- its busy time, each kernel
at least a graph kernel's time (``gpu_short_ns``) -- and the rest of its time is saved. That is an upper
bound where the range also does host work a graph would not replace (the figure is "graph saves <= X"). The
kernel records cost the program 1-3 us per launch (H100), which the recorded range times and so the prediction
include: it predicts the saving of the run as recorded.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from pcietrace.analysis import nesting

#: A range whose time per eager launch is at most this many times the host cost of a launch is launch-bound.
#: 2, not less: the host's own speed moves between attach's calibration and a range of the same run. On the
#: H100 (2026-11-22) the Python demo's 20,000-launch range took 3.8-8.0 us per launch over 6 runs, and once
#: ~1.7x the calibration's host cost of seconds before; at 1.5 it was called GPU-bound (prediction -48 %;
#: docs/lab/reports/h100-savings-20261122/savings-demo-py-3-runs.log holds 3 of those runs).
LAUNCH_BOUND_FACTOR = 2.0
#: Where the library timed the range's synchronize calls and its host waited for the GPU at most half its time:
#: launch-bound up to this many times the host cost of a launch. The host's own time per launch beyond the
#: launch call is then program work between launches (a Python loop: ~1.5 us on the H100, ~3.6 us with the CPU
#: shared), which a graph replaces; 4 keeps PyTorch operators (~18-27 us each, their GPU time unknown without
#: --gpu-time) out. On the H100 with the app's CPU shared with a busy loop (2026-11-23, docs/lab/bench/savings_timed.py)
#: the demo ranges took 8.4-12.4 us per launch against a 3.4 us host cost: factor 2 called 3 of 6 GPU-bound.
TIMED_LAUNCH_BOUND_FACTOR = 4.0

SAVINGS_COLUMNS = ["domain", "name", "calls_eager", "calls_graphed", "eager_ms", "graphed_ms", "eager_launches",
                   "graph_launches_graphed", "launch_bound", "measured_ms", "predicted_ms", "error_pct"]


def per_launch_saving_us(us_per_launch: float, costs: dict[str, Any], waited_us: float = math.nan) -> tuple[float, bool]:
    """What capturing one eager launch into a graph saves (us), for a range that spends ``us_per_launch``
    of its own time per eager launch, ``waited_us`` of it inside synchronize calls (NaN: not timed); and whether
    that range is launch-bound. ``costs``: attach's launch
    costs (:data:`pcietrace.analysis.costs.LAUNCH_COST_KEYS`; optional ``gpu_us_per_kernel_eager`` /
    ``gpu_us_per_kernel_graph``: the GPU's own time per empty kernel, from a run's ``gpu_time``)."""
    host = max(costs["host_us_per_eager_launch"], costs["wall_us_per_kernel_eager"])
    graph = costs["wall_us_per_kernel_graph"]
    if math.isnan(waited_us):
        if us_per_launch <= LAUNCH_BOUND_FACTOR * host:
            return max(0.0, us_per_launch - graph), True
    elif waited_us <= us_per_launch / 2 and us_per_launch - waited_us <= TIMED_LAUNCH_BOUND_FACTOR * host:
        return max(0.0, us_per_launch - waited_us - graph), True
    if "gpu_us_per_kernel_eager" in costs and "gpu_us_per_kernel_graph" in costs:
        return max(0.0, costs["gpu_us_per_kernel_eager"] - costs["gpu_us_per_kernel_graph"]), False
    return max(0.0, min(us_per_launch, costs["wall_us_per_kernel_eager"]) - graph), False


def graphed_saving_ms(range_ms: float, gpu_busy_ms: float, gpu_short_ms: float) -> float:
    """Saving of a range that took ``range_ms`` while the GPU ran its kernels for ``gpu_busy_ms``, captured
    whole into a graph: the graph takes the kernels' busy time plus ``gpu_short_ms`` (what its kernels fall
    short of a graph kernel's minimum time, :func:`pcietrace.analysis.gpu_time.busy`)."""
    return max(0.0, range_ms - gpu_busy_ms - gpu_short_ms)


#: Range instances that :func:`predict_ms` works out, and whose parents :func:`parent_labels` checks, at a time
#: (their working arrays: ~100 B an instance).
PREDICT_CHUNK = 1_000_000


def parent_labels(instances: pd.DataFrame) -> pd.Series:
    """Each instance's parent's index label (NaN: none): from its ``parent`` row positions where they still
    name, in this frame, each push range's enclosing push range one level up on its thread
    (:func:`pcietrace.analysis.attribution.attribute` made them: the same nesting, not searched again), else
    (instances filtered or reordered since) :func:`pcietrace.analysis.nesting.parents`."""
    pos = instances["parent"] if "parent" in instances else None
    if pos is None or pos.dtype.kind not in "iu" or not len(instances) or pos.isna().any():
        return nesting.parents(instances)
    at = pos.to_numpy(np.int64)
    n = len(at)
    has = at >= 0
    push = (instances["kind"] == "push").to_numpy()
    if (at >= n).any() or (at < -1).any() or (has & ~push).any():
        return nesting.parents(instances)
    col = {c: instances[c].to_numpy() for c in ("pid", "tid", "depth", "t_start_ns", "t_end_ns")}
    for lo in range(0, n, PREDICT_CHUNK):  # (a long run's gathered columns a chunk at a time)
        rows = lo + np.flatnonzero(has[lo:lo + PREDICT_CHUNK])
        up = at[rows]
        if not (push[up] & (col["pid"][up] == col["pid"][rows]) & (col["tid"][up] == col["tid"][rows])
                & (col["depth"][up].astype(np.int64) == col["depth"][rows].astype(np.int64) - 1)
                & (col["t_start_ns"][up] <= col["t_start_ns"][rows])
                & (col["t_end_ns"][up] >= col["t_end_ns"][rows])).all():
            return nesting.parents(instances)
    labels = np.full(n, np.nan, float if instances.index.dtype.kind in "iu" else object)
    labels[has] = instances.index.take(at[has]).to_numpy()  # (take: a RangeIndex keeps no copy of itself)
    return pd.Series(labels, index=instances.index, copy=False)


def predict_ms(instances: pd.DataFrame, costs: dict[str, Any]) -> pd.DataFrame:
    """Per range instance (attach's ``range_instances``): ``parent`` (:func:`parent_labels`),
    ``own_eager_launches`` (minus direct children's),
    ``launch_bound`` and ``predicted_ms`` (own launches x :func:`per_launch_saving_us` at the instance's own
    time per launch, plus its direct children's predictions). Children are the push/pop ranges one level
    deeper on the same thread inside it; start/end ranges have none. With ``gpu_busy_ns``/``gpu_short_ns``
    columns, instances that have them use :func:`graphed_saving_ms` on their own part (minus children's).
    With ``sync_wait_ns`` (timed calls), its own part decides launch-boundness with the own time (see
    :func:`per_launch_saving_us`). Launch counts that are NaN (not counted) give NaN, and ``launch_bound`` NaN (unknown, not "no"): CUPTI's
    kernel records alone cannot tell a graph's kernels from eager ones, so they would predict savings for
    ranges that already launch graphs."""
    out = instances.copy(deep=False)  # (copy-on-write: the columns added are its own)
    out["parent"] = parent = parent_labels(out)
    parent_at = nesting.parent_rows(out.index, parent)  # (once: a long run's instances hold millions of rows)
    busy = "gpu_busy_ns" in out.columns

    def less_children(column: str) -> np.ndarray:  # (one column's children's sums held at a time)
        values = out[column].to_numpy(float, na_value=np.nan, copy=True)
        values -= nesting.children_sum(parent_at, values)  # (in place: one array of every instance the fewer)
        return values

    def put(column: str, values: np.ndarray) -> None:  # (as it is: pandas copies an array it is given)
        out[column] = pd.Series(values, index=out.index, copy=False)
    put("own_eager_launches", n_all := less_children("eager_launches"))
    ns_all = out["excl_ns"].to_numpy(float)
    # children are disjoint in time, so busy time and shortfall add up
    busy_all = (less_children("gpu_busy_ns"), less_children("gpu_short_ns")) if busy else None
    # NaN where not timed (and in recordings made before)
    waited = less_children("sync_wait_ns") if "sync_wait_ns" in out else np.broadcast_to(np.nan, len(out))
    own = np.empty(len(out))
    # launch-bound: 0 (no), 1 (yes), -1 where the launches are unknown (NaN in the column); a byte each, not an object
    bound_all = np.zeros(len(out), np.int8)
    for lo in range(0, len(out), PREDICT_CHUNK):  # (a long run's per-instance working arrays a chunk at a time)
        at = slice(lo, lo + PREDICT_CHUNK)
        n, own_ns = n_all[at], ns_all[at]
        launched = n > 0  # (NaN: unknown stays unknown; none: nothing to save)
        graphed = launched & (~np.isnan(busy_all[0][at]) if busy_all is not None else False)
        timed = launched & ~graphed
        with np.errstate(invalid="ignore", divide="ignore"):
            per_us, bound = per_launch_saving_us_array(own_ns / 1e3 / n, costs, waited[at] / 1e3 / n)
        part = np.where(timed, n * per_us / 1e3, np.where(np.isnan(n), np.nan, 0.0))
        if busy_all is not None:
            part = np.where(graphed, _at_least_0(own_ns / 1e6 - busy_all[0][at] / 1e6 - busy_all[1][at] / 1e6), part)
        own[at] = part
        chunk = bound_all[at]
        chunk[np.isnan(n)] = -1
        chunk[timed] = bound[timed]
    unknown = bound_all < 0
    if unknown.any():  # (Python bools and NaN, as the per-instance rule gives them)
        flags = bound_all.astype(bool).astype(object)
        flags[unknown] = math.nan
        put("launch_bound", flags)
    else:
        put("launch_bound", bound_all.astype(bool))
    del unknown
    del n_all, ns_all, busy_all, bound_all, waited  # (a long run's per-instance arrays, read)
    _add_children(own, parent_at, out["depth"].to_numpy())
    put("predicted_ms", own)
    return out


def _add_children(own: np.ndarray, parent_at: np.ndarray, depth: np.ndarray) -> None:
    """Each instance's ``own`` figure plus its children's (``parent_at``: each one's parent's row, -1 for none;
    ``depth``: its level), in place, children first: a parent adds those one level below it, summed in row order as
    children_sum does, a chunk of rows at a time into one array kept for every level (a child unknown, NaN, makes
    the sum unknown)."""
    below, parents = np.zeros(own.size), np.zeros(own.size, bool)
    levels = sorted(pd.unique(depth), reverse=True)
    if len(levels) > nesting.MANY_LEVELS:  # (deep: each level's rows alone, the same sums in the same order)
        for rows in reversed(nesting.by_level(depth)):
            done = rows[parents[rows]]
            own[done] += below[done]
            kids = rows[parent_at[rows] >= 0]
            np.add.at(below, parent_at[kids], own[kids])
            parents[parent_at[kids]] = True
        return
    for d in levels:
        for lo in range(0, own.size, PREDICT_CHUNK):
            at = slice(lo, lo + PREDICT_CHUNK)
            kids = lo + np.flatnonzero((depth[at] == d + 1) & (parent_at[at] >= 0))
            up = parent_at[kids]
            np.add.at(below, up, own[kids])
            parents[up] = True
            del kids, up
        at = np.flatnonzero(parents & (depth == d))
        own[at] += below[at]
        below[parents] = 0.0
        parents[:] = False
        del at


def _at_least_0(x: np.ndarray) -> np.ndarray:
    """``max(0.0, x)`` element by element as Python computes it (NaN -> 0)."""
    return np.where(x > 0, x, 0.0)


def per_launch_saving_us_array(us_per_launch: np.ndarray, costs: dict[str, Any],
                               waited_us: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`per_launch_saving_us` of many ranges at once (the same rule, element by element)."""
    host = max(costs["host_us_per_eager_launch"], costs["wall_us_per_kernel_eager"])
    graph = costs["wall_us_per_kernel_graph"]
    untimed = np.isnan(waited_us)
    plain = untimed & (us_per_launch <= LAUNCH_BOUND_FACTOR * host)
    timed = ~untimed & (waited_us <= us_per_launch / 2) & (us_per_launch - waited_us <= TIMED_LAUNCH_BOUND_FACTOR * host)
    if "gpu_us_per_kernel_eager" in costs and "gpu_us_per_kernel_graph" in costs:
        rest = np.full(us_per_launch.shape, max(0.0, costs["gpu_us_per_kernel_eager"] - costs["gpu_us_per_kernel_graph"]))
    else:
        wall = costs["wall_us_per_kernel_eager"]
        rest = _at_least_0(np.where(wall < us_per_launch, wall, us_per_launch) - graph)
    saved = np.where(plain, _at_least_0(us_per_launch - graph),
                     np.where(timed, _at_least_0(us_per_launch - waited_us - graph), rest))
    return saved, plain | timed


#: NVTX ranges (domain: name pattern) whose launches no CUDA graph captures: NCCL's communicator set-up and
#: tear-down, its own ranges in domain NCCL; the kernels it launches there build the communicator once (and
#: run before any capture could begin), they are not a training step's. Their launch overhead is real but no
#: graph saves it: the headline and the run's saving leave them out, and say so.
UNCAPTURABLE = {"NCCL": r"ncclComm(?:Init|Finalize|Destroy|Split|Abort|Shrink)"}


def capturable(ranges: pd.DataFrame) -> pd.Series:
    """Per range (``domain``, ``name``): False where a graph could not capture its launches (:data:`UNCAPTURABLE`)."""
    def per_row(column: str, test: Any) -> np.ndarray:  # (categorical names: each distinct one tested once)
        c = ranges[column]
        if isinstance(c.dtype, pd.CategoricalDtype):
            hit = np.asarray(test(pd.Series(c.cat.categories.astype(str))), bool)
            return np.append(hit, False)[c.cat.codes.to_numpy()]  # (code -1: no name, "nan" as str() writes)
        return np.asarray(test(c.astype(str)), bool)

    out = pd.Series(True, index=ranges.index)
    for domain, pattern in UNCAPTURABLE.items():
        out &= ~(per_row("domain", lambda s: s == domain) & per_row("name", lambda s: s.str.match(pattern)))
    return out


def outermost_capturable(instances: pd.DataFrame, parent: pd.Series) -> pd.Series:
    """Per push/pop instance: whether it is capturable (:func:`capturable`) and no range above it is (a range
    nested in NCCL's set-up counts where its set-up range does not). One step per nesting level."""
    ok = capturable(instances)
    okay = ok.to_numpy(bool)
    parent_at = nesting.parent_rows(instances.index, parent)
    above = np.zeros(len(instances), bool)
    depth = instances["depth"].to_numpy()
    if len(pd.unique(depth)) > nesting.MANY_LEVELS:  # (deep: a level at a time from the top, each from its parents)
        for rows in nesting.by_level(depth):
            kids = rows[parent_at[rows] >= 0]
            above[kids] = okay[parent_at[kids]] | above[parent_at[kids]]
        return (instances["kind"] == "push") & ok & ~above
    for lo in range(0, len(parent_at), PREDICT_CHUNK):  # (a long run's rows a chunk at a time, each chunk up to its tops)
        rows = lo + np.flatnonzero(parent_at[lo:lo + PREDICT_CHUNK] >= 0)
        up = parent_at[rows]
        while rows.size:  # (one step up per level, for the rows with a range above them still)
            above[rows] |= okay[up]
            up = parent_at[up]
            still = up >= 0
            rows, up = rows[still], up[still]
    return (instances["kind"] == "push") & ok & ~above


def outermost_ms(predicted: pd.DataFrame) -> float:
    """What capturing every range into graphs could save at most (ms): the ``predicted_ms`` of
    :func:`predict_ms`'s output summed over the outermost capturable push/pop ranges of each thread
    (:func:`outermost_capturable`: their children are inside their figures)."""
    outer = predicted.loc[outermost_capturable(predicted, predicted["parent"]), "predicted_ms"]
    return float(outer.sum(min_count=len(outer)))  # NaN where any is unknown


def _pct(pred: pd.Series, meas: pd.Series) -> pd.Series:
    return pd.Series(np.where(meas.abs() > 0, (pred - meas) / meas.abs() * 100, np.nan), index=pred.index)


def savings(eager: dict[str, pd.DataFrame], graphed: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Per (domain, name) present in both runs: calls and total inclusive time in each, the eager run's
    launches, the graphed run's graph launches, ``measured_ms`` (eager - graphed, scaled to the eager run's
    calls where the counts differ), ``predicted_ms`` (the eager run's "graphs save" figure) with ``error_pct``
    in % of the measured saving (NaN where nothing was saved), and ``launch_bound`` (any instance was, by
    launch counts; NaN where no instance's launches were counted). ``eager`` and ``graphed``: the analysis
    results of the two attach runs (``ranges`` and ``range_instances``, which carry attach's per-call
    prediction)."""
    e, g = eager.get("ranges", pd.DataFrame()), graphed.get("ranges", pd.DataFrame())
    if not len(e) or not len(g):
        return pd.DataFrame(columns=SAVINGS_COLUMNS)
    m = e.merge(g, on=["domain", "name"], suffixes=("_e", "_g"))
    out = pd.DataFrame({"domain": m["domain"], "name": m["name"], "calls_eager": m["calls_e"], "calls_graphed": m["calls_g"],
                        "eager_ms": m["incl_ms_e"], "graphed_ms": m["incl_ms_g"], "eager_launches": m["eager_launches_e"],
                        "graph_launches_graphed": m["graph_launches_g"]})
    out["measured_ms"] = out["eager_ms"] - out["graphed_ms"] * out["calls_eager"] / out["calls_graphed"]
    out["predicted_ms"] = m["graph_savings_ms_e"]  # attach's own figure: predict_ms summed over the calls
    out["error_pct"] = _pct(out["predicted_ms"], out["measured_ms"])
    inst = eager.get("range_instances", pd.DataFrame())
    if "launch_bound" in inst:  # set with the prediction (no launch costs: none)
        bound = inst.groupby(["domain", "name"])["launch_bound"].agg(
            lambda b: bool(b.dropna().any()) if b.notna().any() else math.nan).reset_index()
        out = out.merge(bound, on=["domain", "name"], how="left")
    else:
        out["launch_bound"] = False
    return out[SAVINGS_COLUMNS].sort_values("eager_ms", ascending=False, kind="stable").reset_index(drop=True)
