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
from pcietrace.analysis import gpu_time
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
    if len(s.samples):
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
    if len(s.latency):
        _finite(s.latency, "latency", ("value_us",))
    if len(s.events):
        _finite(s.events, "events", ("t_ns",))
        # attach saves them sorted by time (record/attach.py: read_traces) and ranges pair pushes with pops in
        # that order; CUPTI's kernel records and "gputime" markers are not paired (gpu_time sorts the kernels)
        host = gpu_time.host_events(s.events)
        t = host.loc[host["event"] != "gputime", "t_ns"].to_numpy(np.int64)
        back = np.flatnonzero(np.diff(t) < 0)
        if back.size:
            raise DataError(f"events: not in time order (t_ns {t[back[0] + 1]} follows t_ns {t[back[0]]})")
    meta = s.meta
    if meta.get("kind") == "attach" and not meta["t_app_end_ns"] >= meta["t_app_start_ns"]:
        raise DataError(f"meta: the program ended (t_app_end_ns {meta['t_app_end_ns']}) before it started "
                        f"(t_app_start_ns {meta['t_app_start_ns']})")


def _samples(samples: pd.DataFrame, counters: dict[int, dict[str, Any]]) -> None:
    _non_negative(samples, "samples", ("t_ns", "read_ns", "tx_raw", "rx_raw"))
    for idx, g in samples.groupby("nvml_index", sort=True):
        c = counters.get(int(idx), {"mode": "fields", "bits": 32})
        if c.get("mode") not in COUNTER_MODES:
            raise DataError(f"meta.gpus: GPU {idx} has samples but an unknown counter mode {c.get('mode')!r} "
                            f"(known: {', '.join(COUNTER_MODES)})")
        t = g["t_ns"].to_numpy(np.float64)
        back = np.flatnonzero(np.diff(t) < 0)
        if back.size:
            i = g.index[back[0] + 1]
            raise DataError(f"samples: GPU {idx}'s samples are not in time order (row {i} goes back in time)")
        if c["mode"] == "fields":
            bits = c.get("bits")
            if not isinstance(bits, int) or not 1 <= bits <= 64:
                raise DataError(f"meta.gpus: GPU {idx}'s counter width {bits!r} is not 1..64 bits")
            for col in ("tx_raw", "rx_raw"):
                if (g[col].to_numpy(np.float64) >= 2.0 ** bits).any():
                    raise DataError(f"samples.{col}: GPU {idx} has values beyond its {bits}-bit counter")


def _finite(df: pd.DataFrame, table: str, columns: Any) -> None:
    for col in columns:
        v = pd.to_numeric(df[col], errors="coerce").to_numpy(np.float64)
        bad = np.flatnonzero(~np.isfinite(v))
        if bad.size:
            raise DataError(f"{table}.{col}: row {df.index[bad[0]]} is {_value(df[col].iloc[bad[0]])}, not a finite number")


def _non_negative(df: pd.DataFrame, table: str, columns: Any) -> None:
    _finite(df, table, columns)
    for col in columns:
        bad = np.flatnonzero(df[col].to_numpy(np.float64) < 0)
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
