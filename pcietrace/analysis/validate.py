"""The invariants the analysis relies on, checked once before any figure is computed.

A session that breaks one (samples out of time order, NaN or negative counters, an unknown counter mode,
windows that end before they start, bursts (or bursts in fresh contexts) of zero launches) would otherwise come
out as confident wrong numbers (0 B/launch, a floor of GB/s, negative bytes per launch). :func:`check` refuses
it with one line (:class:`~pcietrace.errors.DataError`) instead. No I/O, no rich.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from pcietrace import schema
from pcietrace.analysis import counters as counters_analysis
from pcietrace.analysis import gpu_time, nesting
from pcietrace.schema import STRATEGIES
from pcietrace.errors import DataError

#: Counter sources the analysis knows how to turn into bytes (see ``collectors/nvml.py: CounterReader``).
COUNTER_MODES = ("fields", "throughput")
#: Window modes written by the launch generator and by attach's idle windows; `pcietrace graphs` names its
#: windows after the strategy that ran in them.
WINDOW_MODES = ("idle", "eager", "graph") + STRATEGIES


def check(session: Any) -> None:
    """Raise :class:`DataError` naming the table, column and GPU/row if ``session`` breaks an invariant."""
    s = session
    for name in schema.TABLE_COLUMNS:
        try:
            schema.check_table(getattr(s, name), name, schema.table_columns(name, s.meta))
        except schema.Invalid as exc:
            raise DataError(str(exc)) from None
    counters = s.counters
    _magnitudes(s)
    _gpus(s)
    if len(s.samples):  # (samples left on disk are checked as each GPU's are read: gpu_samples)
        _samples(s.samples, counters)
    if len(s.windows):
        _finite(s.windows, "windows", ("t_start_ns", "t_end_ns"))
        bad = s.windows[~(s.windows["t_end_ns"] > s.windows["t_start_ns"])]
        if len(bad):
            r = bad.iloc[0]
            raise DataError(f"windows: row {bad.index[0]} ends before it starts (t_start_ns {_value(r['t_start_ns'])}, "
                            f"t_end_ns {_value(r['t_end_ns'])})")
        unknown = sorted(set(s.windows["mode"].dropna()) - set(WINDOW_MODES))
        if unknown:
            raise DataError(f"windows: unknown mode {unknown[0]!r} (known: {', '.join(WINDOW_MODES)})")
        _non_negative(s.windows, "windows", [c for c in ("calls", "launches", "graph_k") if c in s.windows])
        _windows_apart(s.windows)
    if len(s.bursts):
        _positive(s.bursts, "bursts", ("calls", "launches", "graph_k"))
        _non_negative(s.bursts, "bursts", ("host_ns", "cpu_ns", "gpu_ns", "kernel_us"))
    if len(s.contexts):  # (context 0 is the run's own, in bursts: fresh ones count from 1)
        _positive(s.contexts, "contexts", ("launches", "context"))
        _non_negative(s.contexts, "contexts", ("gpu_ns", "kernel_us"))
    if len(s.e2e):
        _positive(s.e2e, "e2e", ("launches", "graph_k"))
        _non_negative(s.e2e, "e2e", ("wall_ns", "kernel_us"))
    if len(s.calibration):
        _non_negative(s.calibration, "calibration", ("kernel_us", "measured_us", "min_us", "max_us"))
    if len(s.latency):  # (round trips and latencies: a negative one is a damaged file, not a fast machine)
        _non_negative(s.latency, "latency", ("value_us",))
    if len(s.graphs):
        _graphs(s.graphs)
    span = None  # (the host events' first and last time, as the order check reads them)
    if len(s.events):
        _finite(s.events, "events", ("t_ns",))
        # attach saves them sorted by time (record/trace.py: read_traces) and ranges pair pushes with pops in
        # that order; CUPTI's kernel records and "gputime" markers are not paired (gpu_time sorts the kernels)
        host = gpu_time.host_events(s.events)
        t = host.loc[host["event"] != "gputime", "t_ns"].to_numpy(np.int64)
        back = np.flatnonzero(np.diff(t) < 0)
        if back.size:
            raise DataError(f"events: not in time order (t_ns {t[back[0] + 1]} follows t_ns {t[back[0]]})")
        span = (int(t[0]), int(t[-1])) if t.size else None
        _events(host)
    meta = s.meta
    costs = meta.get("launch_costs") or {}
    for k, v in costs.items():
        if k != "source" and not (isinstance(v, (int, float)) and 0 <= v < MAX_US):
            raise DataError(f"meta.launch_costs.{k}: {_value(v)} us is not a per-launch cost (0..{MAX_US:.0e} us)")
    if meta.get("kind") == "attach" and not meta["t_app_end_ns"] >= meta["t_app_start_ns"]:
        raise DataError(f"meta: the program ended (t_app_end_ns {meta['t_app_end_ns']}) before it started "
                        f"(t_app_start_ns {meta['t_app_start_ns']})")
    if meta.get("kind") == "attach":
        _within_samples(s, span)
    if meta.get("kind") == "attach-failed" and "event" in s.events:  # (only such a run's events counted here)
        opened = int(s.events["event"].isin(["push", "start"]).sum())
        if opened:  # (its ranges were listed, then "no NVTX ranges were seen")
            raise DataError(f"meta.kind: 'attach-failed' says the program never ran, but its events open {opened:,} "
                            "NVTX ranges")


#: How far (ns) the program and its events may lie outside the counter samples' span: attach samples idle windows
#: before and after the program (0.5 s each by default; recorded margins 0.3-2.3 s inside), so none lies outside.
SPAN_SLACK_NS = 1_000_000_000


def _within_samples(s: Any, events_ns: tuple[int, int] | None) -> None:
    """An attach run's program (``meta.t_app_*``) and events (``events_ns``: the first and last host event's time)
    lie within its samples' span (an edited time made every range "no data", or a 79.88 s run of a 12.8 s program,
    without a word)."""
    if s.sample_file is not None:
        first, last = s.sample_file.t_min_ns, s.sample_file.t_max_ns
    elif len(s.samples):
        t = s.samples["t_ns"].to_numpy(np.int64)
        first, last = int(t.min()), int(t.max())
    else:
        return
    lo, hi = first - SPAN_SLACK_NS, last + SPAN_SLACK_NS
    times = [("meta.t_app_start_ns", s.meta["t_app_start_ns"]), ("meta.t_app_end_ns", s.meta["t_app_end_ns"])]
    if events_ns is not None:  # (the host's: the GPU's kernel records keep its clock)
        times += [("events' first t_ns", events_ns[0]), ("events' last t_ns", events_ns[1])]
    for what, t in times:
        if not lo <= t <= hi:
            raise DataError(f"{what} {t} lies {'before' if t < lo else 'after'} the counter samples "
                            f"({first}..{last} ns) by more than {SPAN_SLACK_NS / 1e9:g} s")


#: No figure a report holds comes near this (ns: three years; us, calls, launches: more): a larger one is a
#: damaged file, which would print as a wall of digits.
MAX_MAGNITUDE = 1e17
#: The largest per-launch cost (us) a report may state: a minute.
MAX_US = 6e7
#: Launch counts a trace line carries cumulatively per thread: they never go down within one thread.
THREAD_COUNTS = ("eager_thread", "graph_thread", "captured_thread")


def _magnitudes(s: Any) -> None:
    """No float in any table beyond :data:`MAX_MAGNITUDE` (raw counters have their own bound: their width)."""
    for name in schema.TABLE_COLUMNS:
        df = getattr(s, name)
        for col in df.columns if len(df) else ():
            if df[col].dtype.kind != "f" or (name == "samples" and col in ("tx_raw", "rx_raw")):
                continue
            v = df[col].to_numpy(np.float64)
            bad = np.flatnonzero(np.abs(v) > MAX_MAGNITUDE)  # (NaN compares False: left to the checks of each)
            if bad.size:
                raise DataError(f"{name}.{col}: row {df.index[bad[0]]} is {_value(v[bad[0]])}, beyond any figure a run "
                                f"holds (|x| <= {MAX_MAGNITUDE:.0e})")


def _gpus(s: Any) -> None:
    """The GPUs the tables hold are the GPUs meta describes, and every GPU meta describes has rows somewhere:
    otherwise its figures would be printed under another GPU's name, or dropped without a word."""
    named = {int(g["nvml_index"]) for g in s.meta.get("gpus", [])}
    held: set[int] = set()
    on_disk = getattr(s, "sample_file", None)  # (samples left in their file: its GPUs)
    for name in schema.TABLE_COLUMNS:
        df = getattr(s, name)
        idx = set(pd.unique(df["nvml_index"]).tolist()) if len(df) and "nvml_index" in df else set()
        if name == "samples" and on_disk is not None:
            idx |= set(on_disk.gpus)
        extra = sorted(idx - named)
        if extra:
            raise DataError(f"{name}: rows of GPU {extra[0]}, which meta.gpus does not describe "
                            f"(it describes {', '.join(map(str, sorted(named))) or 'none'})")
        held |= idx
    recorded = on_disk is not None or any(len(getattr(s, t)) for t in ("samples", "windows", "latency", "bursts",
                                                                       "e2e", "calibration"))
    missing = sorted(named - held)
    if recorded and missing and s.meta.get("status", "complete") == "complete" and s.meta.get("kind") != "graphs":
        raise DataError(f"meta.gpus: GPU {missing[0]} is described but no table holds a row of it")


def _windows_apart(windows: pd.DataFrame) -> None:
    """One GPU's windows never overlap: each one's bytes are the counter's difference across it alone."""
    w = windows.sort_values(["nvml_index", "t_start_ns"], kind="stable")
    same = w["nvml_index"].to_numpy()[1:] == w["nvml_index"].to_numpy()[:-1]
    over = np.flatnonzero(same & (w["t_start_ns"].to_numpy()[1:] < w["t_end_ns"].to_numpy()[:-1]))
    if over.size:
        a, b = w.index[over[0]], w.index[over[0] + 1]
        raise DataError(f"windows: rows {a} and {b} overlap on GPU {w['nvml_index'].iloc[over[0]]} (a window's "
                        "bytes are the counter's difference across it alone)")


#: The deepest NVTX nesting a recording may hold: the injection library writes a depth in 32 bits, so deeper is a
#: damaged file (a pop forgotten in a loop nests a range a step: millions deep are real).
MAX_DEPTH = 2**31 - 1


def _events(host: pd.DataFrame) -> None:
    """NVTX depths are never negative nor deeper than :data:`MAX_DEPTH`; a thread's launch counts never go down."""
    depth = host["depth"].to_numpy() if "depth" in host else np.zeros(0, np.int8)
    if ((depth < 0) | (depth > MAX_DEPTH)).any():
        i = np.flatnonzero((depth < 0) | (depth > MAX_DEPTH))[0]
        raise DataError(f"events.depth: row {host.index[i]} is " + ("negative" if depth[i] < 0 else
                        f"deeper than the {MAX_DEPTH:,} levels a trace holds") + f" ({_value(host['depth'].iloc[i])})")
    cols = [c for c in THREAD_COUNTS if c in host]
    if not cols or not len(host):
        return
    # (CUPTI's "gputime" lines carry no launch counts; stable: each thread's events stay in time order; row
    # positions sorted, not a sorted copy of every column; a long run's events are tens of millions of rows)
    counted = (host["event"] != "gputime").to_numpy()
    rows = None if counted.all() else np.flatnonzero(counted)
    pid, tid = (host[c].to_numpy() if rows is None else host[c].to_numpy()[rows] for c in ("pid", "tid"))
    # (whether any thread counts backwards: its events put together by a radix sort of thread codes; only then
    # the (pid, tid) order, which names the first such thread)
    thread = nesting.codes(pid, tid)
    thread = thread.astype(np.min_scalar_type(int(thread.max())))
    order = nesting.stable_order(thread)
    thread = thread[order]
    same = thread[1:] == thread[:-1]
    del thread
    if rows is not None:
        order = rows[order]
    # (compared, not subtracted: no wider copy of a column)
    if not any((same & (v[1:] < v[:-1])).any() for v in (host[col].to_numpy()[order] for col in cols)):
        return
    rows = np.arange(len(host)) if rows is None else rows
    del same
    order = np.lexsort((tid, pid))
    rows, pid, tid = rows[order], pid[order], tid[order]
    same = (pid[1:] == pid[:-1]) & (tid[1:] == tid[:-1])
    for col in cols:
        v = host[col].to_numpy(np.int64)[rows]
        back = np.flatnonzero(same & (np.diff(v) < 0))
        if back.size:
            i = back[0]
            raise DataError(f"events.{col}: thread {tid[i]} of process {pid[i]} counts "
                            f"launches backwards (row {host.index[rows[i + 1]]}: {host[col].iloc[rows[i + 1]]} after "
                            f"{host[col].iloc[rows[i]]})")


def _graphs(graphs: pd.DataFrame) -> None:
    """`pcietrace graphs` iterations: numbered from 0, each (size, strategy, round, iteration) once, times >= 0."""
    _non_negative(graphs, "graphs", [c for c in ("round", "iteration", "wall_ns", "cpu_ns", "prep_ns", "submit_ns",
                                                 *schema.COUNT_COLUMNS) if c in graphs])
    dup = graphs.duplicated(["kernels", "strategy", "round", "iteration"])
    if dup.any():
        r = graphs[dup].iloc[0]
        raise DataError(f"graphs: iteration {r['iteration']} of {r['strategy']} (round {r['round']}, {r['kernels']} "
                        "kernels) is listed twice")


def _samples(samples: pd.DataFrame, counters: dict[int, dict[str, Any]]) -> None:
    _non_negative(samples, "samples", ("t_ns", "read_ns", "tx_raw", "rx_raw"))
    for idx, g in counters_analysis.per_gpu(samples):
        _gpu_samples(idx, g, counters)


def gpu_samples(idx: int, samples: pd.DataFrame, counters: dict[int, dict[str, Any]]) -> pd.DataFrame:
    """One GPU's samples read from a file a GPU at a time (:class:`pcietrace.session.SampleFile`), checked as
    :func:`check` checks samples held; raises :class:`DataError`."""
    _non_negative(samples, "samples", ("t_ns", "read_ns", "tx_raw", "rx_raw"))
    _gpu_samples(idx, samples, counters)
    return samples


def _gpu_samples(idx: int, g: pd.DataFrame, counters: dict[int, dict[str, Any]]) -> None:
    c = counters.get(int(idx), {"mode": "fields", "bits": 32})
    if c.get("mode") not in COUNTER_MODES:
        raise DataError(f"meta.gpus: GPU {idx} has samples but an unknown counter mode {c.get('mode')!r} "
                        f"(known: {', '.join(COUNTER_MODES)})")
    t = g["t_ns"].to_numpy(np.int64 if g["t_ns"].dtype.kind == "i" else np.float64)
    step = np.diff(t)
    back = np.flatnonzero(step < 0)
    if back.size:
        i = g.index[back[0] + 1]
        raise DataError(f"samples: GPU {idx}'s samples are not in time order (row {i} goes back in time)")
    same = np.flatnonzero(step == 0)
    if same.size:  # (a sample is one read at one time: two at one time are a row written twice)
        raise DataError(f"samples: GPU {idx} has {same.size} sample(s) at the time of the one before "
                        f"(row {g.index[same[0] + 1]}): duplicated rows")
    if c["mode"] == "throughput":  # KB/s no link could move: raw counter values under a throughput meta
        top = 2 * counters_analysis.link_bps(c) / 1e3
        for col in ("tx_raw", "rx_raw"):
            if (g[col].to_numpy(np.float64) > top).any():
                raise DataError(f"samples.{col}: GPU {idx}'s throughput values exceed what its link can move "
                                f"(> {top:,.0f} KB/s): raw counter values under a throughput-mode meta?")
    if c["mode"] == "fields":
        bits = c.get("bits")
        if not isinstance(bits, int) or not 1 <= bits <= 64:
            raise DataError(f"meta.gpus: GPU {idx}'s counter width {bits!r} is not 1..64 bits")
        for col in ("tx_raw", "rx_raw"):
            whole = g[col].dtype.kind in "iu" and bits <= 53  # (as integers: the same answer, no float copy)
            if ((g[col].to_numpy() >= 2 ** bits) if whole else (g[col].to_numpy(np.float64) >= 2.0 ** bits)).any():
                raise DataError(f"samples.{col}: GPU {idx} has values beyond its {bits}-bit counter")


def _finite(df: pd.DataFrame, table: str, columns: Any) -> None:
    for col in columns:
        if df[col].dtype.kind in "iu":  # (whole numbers: finite, nothing to convert)
            continue
        v = pd.to_numeric(df[col], errors="coerce").to_numpy(np.float64)
        bad = np.flatnonzero(~np.isfinite(v))
        if bad.size:
            raise DataError(f"{table}.{col}: row {df.index[bad[0]]} is {_value(df[col].iloc[bad[0]])}, not a finite number")


def _non_negative(df: pd.DataFrame, table: str, columns: Any) -> None:
    _finite(df, table, columns)
    for col in columns:
        if df[col].dtype.kind == "u":
            continue
        bad = np.flatnonzero(df[col].to_numpy(np.int64 if df[col].dtype.kind == "i" else np.float64) < 0)
        if bad.size:
            raise DataError(f"{table}.{col}: row {df.index[bad[0]]} is negative ({_value(df[col].iloc[bad[0]])})")


def _positive(df: pd.DataFrame, table: str, columns: Any) -> None:
    _finite(df, table, columns)
    for col in columns:
        bad = np.flatnonzero(~(df[col].to_numpy(np.float64) > 0))
        if bad.size:
            raise DataError(f"{table}.{col}: row {df.index[bad[0]]} is {_value(df[col].iloc[bad[0]])}, must be > 0")


def _value(v: Any) -> str:
    return repr(v.item() if hasattr(v, "item") else v)
