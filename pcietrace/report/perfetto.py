"""Chrome trace JSON (opens in Perfetto / chrome://tracing): a PCIe counter track per GPU, a launches-per-ms
track per process, and NVTX ranges under their process and thread.

Bounded whatever the run's length: each counter track has at most :data:`MAX_POINTS` points (longer bins over
a longer run), at most :data:`MAX_RANGES` ranges are drawn (outermost first, then the longest of the level
that overflows; ``otherData`` says how many of how many), and the file is written a chunk of events at a time."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pandas as pd

from pcietrace.schema import JSON_ROWS, by_object

#: Points per counter track (a GPU's PCIe rates, a process's launch rate) at most.
MAX_POINTS = 20_000
#: Ranges drawn at most (~300 B each in the file).
MAX_RANGES = 1_000_000
#: Events turned into JSON at a time.
CHUNK = 50_000
#: The range instances' columns a trace's range events are made of (:func:`_range_lines`, :func:`shown_ranges`).
RANGE_FIELDS = ["pid", "tid", "name", "domain", "t_start_ns", "duration_ns", "depth", "eager_launches", "graph_launches",
                "captured_launches", "gpus", "status", "h2d_bytes", "d2h_bytes"]


def _count(x: float) -> int | None:
    """A launch count, or None where launches were not counted (NaN)."""
    return None if pd.isna(x) else int(x)


def coarser(rates: pd.DataFrame, max_points: int = MAX_POINTS, track: str = "nvml_index") -> pd.DataFrame:
    """``rates`` (a timeline of equal bins per ``track``: a GPU's PCIe rates, :func:`pcietrace.analysis.counters.rates`,
    or a process's launch rates) with at most ``max_points`` bins per track: each run of k consecutive bins
    becomes one, its rates their mean (NaN bins left out of it)."""
    if not len(rates):
        return rates
    per_track = rates.groupby(track)["t_ns"].transform("size").to_numpy()
    k = -(-per_track // max_points)
    if (k <= 1).all():
        return rates
    slot = rates.groupby(track).cumcount().to_numpy() // k
    g = rates.assign(slot=slot).groupby([track, "slot"], sort=False)
    means = {c: (c, "mean") for c in rates.columns if c not in (track, "t_ns")}
    return g.agg(t_ns=("t_ns", "min"), **means).reset_index()[list(rates.columns)]


def shown_ranges(ranges: pd.DataFrame, max_ranges: int = MAX_RANGES) -> pd.DataFrame:
    """At most ``max_ranges`` of ``ranges``: every outermost one first, then each deeper level while it fits,
    of the level that does not fit its longest; in their own order."""
    if len(ranges) <= max_ranges:
        return ranges
    if max_ranges <= 0:
        return ranges.iloc[:0]
    depth = ranges["depth"].to_numpy()
    # (whole levels first, by depth: only the last level shown in part is ordered by duration)
    cut = np.sort(depth)[max_ranges - 1]
    keep = depth < cut
    at = np.flatnonzero(depth == cut)
    longest = np.argsort(-ranges["duration_ns"].to_numpy(np.int64)[at], kind="stable")[:max_ranges - int(keep.sum())]
    keep[at[longest]] = True
    return ranges[keep]


def _t0(rates: pd.DataFrame, ranges: pd.DataFrame) -> int:
    """The first sample's or range's time."""
    return min((int(df[c].min()) for df, c in ((rates, "t_ns"), (ranges, "t_start_ns")) if len(df)), default=0)


def _text(values: pd.Series) -> "pa.Array":
    """Each value as JSON text (``str(value)`` quoted and escaped as :func:`json.dumps` writes it), each distinct
    value encoded once (the categories of a categorical column)."""
    import pyarrow as pa

    if isinstance(values.dtype, pd.CategoricalDtype):
        codes = values.cat.codes.to_numpy().astype(np.int64)
        text = [json.dumps(str(v)) for v in values.cat.categories] + [json.dumps(str(np.nan))]
        return pa.array(text, pa.large_string()).take(np.where(codes < 0, len(text) - 1, codes))  # (-1: no value)
    codes, uniques = pd.factorize(values.to_numpy(object), use_na_sentinel=False)
    return pa.array([json.dumps(str(v)) for v in uniques], pa.large_string()).take(codes)


def _s(text: str) -> "pa.Scalar":
    """A literal of the lines (Arrow's element-wise join takes one string type throughout)."""
    import pyarrow as pa

    return pa.scalar(text, pa.large_string())


def _whole(values: np.ndarray, missing: np.ndarray | None = None) -> "pa.Array":
    """Integers as JSON text; ``null`` where ``missing``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    text = pc.cast(pa.array(values, pa.int64()), pa.large_string())
    return text if missing is None or not missing.any() else pc.if_else(pa.array(missing), _s("null"), text)


def _micros(ns: np.ndarray) -> "pa.Array":
    """Nanoseconds as microseconds' JSON text, to the nanosecond ("12.345", "-0.005", "7.000")."""
    import pyarrow as pa
    import pyarrow.compute as pc

    mag = np.abs(ns)
    sign = pc.if_else(pa.array(ns < 0), _s("-"), _s(""))
    frac = pc.utf8_lpad(pc.cast(pa.array(mag % 1000), pa.large_string()), 3, "0")
    return pc.binary_join_element_wise(sign, pc.cast(pa.array(mag // 1000), pa.large_string()), _s("."), frac, _s(""))


def _counts(values: Any, n: int) -> "pa.Array":
    """Launch counts as JSON text: whole numbers, null where not counted (NaN); ``values`` a column or a scalar."""
    v = pd.Series(values) if not np.isscalar(values) else pd.Series(np.full(n, values))
    missing = v.isna().to_numpy()
    return _whole(v.fillna(0).to_numpy(np.float64 if v.dtype.kind == "f" else np.int64).astype(np.int64), missing)


def _range_lines(ranges: pd.DataFrame, t0: int) -> bytes:
    """:func:`_events`' range events of ``ranges`` as JSON text, one event a line, joined by commas (as
    the trace's other events are) and made column by column in Arrow, the text never a Python string per event
    (the same fields and values as ``json.dumps`` of each event's dict; times to the nanosecond, bytes rounded
    half to even)."""
    import pyarrow as pa

    n = len(ranges)
    if not n:
        return b""
    which, gpus = by_object(ranges["gpus"].to_numpy(object) if "gpus" in ranges else np.full(n, None, object))
    gpus_text = pa.array([json.dumps([int(g) for g in (g if g is not None else [])]) for g in gpus],
                         pa.large_string()).take(which)
    status = _text(ranges["status"]) if "status" in ranges else _s('"ok"')
    parts = ['{"ph": "X", "pid": ', _whole(ranges["pid"].to_numpy(np.int64)),
             ', "tid": ', _whole(ranges["tid"].to_numpy(np.int64)),
             ', "name": ', _text(ranges["name"]), ', "cat": ', _text(ranges["domain"]),
             ', "ts": ', _micros(ranges["t_start_ns"].to_numpy(np.int64) - t0),
             ', "dur": ', _micros(np.maximum(ranges["duration_ns"].to_numpy(np.int64), 0)),
             ', "args": {"eager launches": ', _counts(ranges["eager_launches"], n),
             ', "graph launches": ', _counts(ranges["graph_launches"], n),
             ', "captured launches": ', _counts(ranges["captured_launches"] if "captured_launches" in ranges else 0, n),
             ', "gpus": ', gpus_text, ', "status": ', status]
    for d in ("h2d", "d2h"):
        v = ranges[f"{d}_bytes"].to_numpy(float)
        parts += [f', "{d.upper()} bytes": ', _whole(np.round(np.nan_to_num(v)).astype(np.int64), np.isnan(v))]
    parts.append("}}")
    return _lines(parts)


def _joined(parts: list[Any]) -> "pa.Array":
    """Text parts (literals, or arrays of a text a row) joined row by row."""
    import pyarrow.compute as pc

    return pc.binary_join_element_wise(*(_s(p) if isinstance(p, str) else p for p in parts), _s(""))


def _lines(parts: list[Any]) -> bytes:
    """Events' text parts (:func:`_joined`) as one :class:`bytes`, an event a line, joined by commas."""
    lines = _joined([*parts, ",\n"])  # (each line ends with the separator; the last one's is cut below)
    offsets = np.frombuffer(lines.buffers()[1], np.int64)[lines.offset:lines.offset + len(lines) + 1]
    return memoryview(lines.buffers()[2])[int(offsets[0]):int(offsets[-1]) - 2].tobytes()


def _rounded(values: np.ndarray, digits: int) -> list[Any]:
    """Floats rounded to ``digits`` decimals as JSON numbers' text parts (NaN: null)."""
    return JSON_ROWS.floats(np.round(values, digits))


def _counter_lines(rates: pd.DataFrame, t0: int) -> bytes:
    """:func:`_events`' counter events of ``rates`` (a GPU's PCIe MB/s) as JSON text, as :func:`_range_lines`
    (a rate that is NaN, over a counter reset, left out of its event's args)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not len(rates):
        return b""
    gpu = _whole(rates["nvml_index"].to_numpy(np.int64))
    args = []
    for key, col in (("H2D (RX)", "rx_Bps"), ("D2H (TX)", "tx_Bps")):
        mbps = rates[col].to_numpy(np.float64) / 1e6
        has = mbps == mbps
        args.append((pc.if_else(pa.array(has), _joined([f'"{key}": ', *_rounded(mbps, 3)]), _s("")), has))
    (rx, has_rx), (tx, has_tx) = args
    comma = pc.if_else(pa.array(has_rx & has_tx), _s(", "), _s(""))
    return _lines(['{"ph": "C", "pid": 0, "tid": ', gpu, ', "name": "GPU', gpu, ' PCIe MB/s", "ts": ',
                   _micros(rates["t_ns"].to_numpy(np.int64) - t0), ', "args": {', rx, comma, tx, "}}"])


def _launch_lines(launches: pd.DataFrame, t0: int) -> bytes:
    """:func:`_events`' launch-rate events of ``launches`` as JSON text, as :func:`_range_lines`."""
    if not len(launches):
        return b""
    return _lines(['{"ph": "C", "pid": ', _whole(launches["pid"].to_numpy(np.int64)),
                   ', "name": "launches per ms", "ts": ', _micros(launches["t_ns"].to_numpy(np.int64) - t0),
                   ', "args": {"eager": ', *_rounded(launches["eager_per_ms"].to_numpy(np.float64), 2),
                   ', "graph": ', *_rounded(launches["graph_per_ms"].to_numpy(np.float64), 2), "}}"])


def _events(meta: dict[str, Any], rates: pd.DataFrame, ranges: pd.DataFrame,
            launches: pd.DataFrame, t0_ns: int | None = None, as_text: bool = False) -> Iterator[list[Any] | bytes]:
    """The trace's events, a chunk at a time (timestamps in microseconds from ``t0_ns``, default the first
    sample or range); ``as_text``: the counter and range events as JSON text already, a chunk's in one
    :class:`bytes` (:func:`_counter_lines`, :func:`_launch_lines`, :func:`_range_lines`)."""
    t0 = _t0(rates, ranges) if t0_ns is None else t0_ns
    ev: list[dict[str, Any]] = [{"ph": "M", "pid": 0, "name": "process_name", "args": {"name": "PCIe counters (NVML)"}}]
    for idx in sorted(set(rates["nvml_index"])) if len(rates) else []:
        ev.append({"ph": "M", "pid": 0, "tid": int(idx), "name": "thread_name", "args": {"name": f"GPU{idx}"}})
    program = meta.get("command", ["app"])[0]
    pids = sorted(set(ranges["pid"]) | set(launches["pid"])) if len(ranges) or len(launches) else []
    for pid in pids:
        ev.append({"ph": "M", "pid": int(pid), "name": "process_name", "args": {"name": f"{program} (pid {pid})"}})
    for pid, tid in sorted(set(zip(ranges["pid"], ranges["tid"]))) if len(ranges) else []:
        name = "main thread" if pid == tid else f"thread {tid}"
        ev.append({"ph": "M", "pid": int(pid), "tid": int(tid), "name": "thread_name", "args": {"name": name}})
    yield ev
    for i in range(0, len(rates), CHUNK):
        if as_text:
            yield _counter_lines(rates.iloc[i:i + CHUNK], t0)
            continue
        ev = []
        for r in rates.iloc[i:i + CHUNK].itertuples():
            mbps = {"H2D (RX)": r.rx_Bps / 1e6, "D2H (TX)": r.tx_Bps / 1e6}  # NaN (over a counter reset): left out
            ev.append({"ph": "C", "pid": 0, "tid": int(r.nvml_index), "name": f"GPU{r.nvml_index} PCIe MB/s",
                       "ts": (r.t_ns - t0) / 1e3, "args": {k: round(v, 3) for k, v in mbps.items() if v == v}})
        yield ev
    for i in range(0, len(launches), CHUNK):
        if as_text:
            yield _launch_lines(launches.iloc[i:i + CHUNK], t0)
            continue
        yield [{"ph": "C", "pid": int(r.pid), "name": "launches per ms", "ts": (r.t_ns - t0) / 1e3,
                "args": {"eager": round(float(r.eager_per_ms), 2), "graph": round(float(r.graph_per_ms), 2)}}
               for r in launches.iloc[i:i + CHUNK].itertuples()]
    for i in range(0, len(ranges), CHUNK):
        if as_text:
            yield _range_lines(ranges.iloc[i:i + CHUNK], t0)
            continue
        ev = []
        for r in ranges.iloc[i:i + CHUNK].itertuples():
            args = {"eager launches": _count(r.eager_launches), "graph launches": _count(r.graph_launches),
                    "captured launches": _count(getattr(r, "captured_launches", 0)),
                    "gpus": [int(g) for g in getattr(r, "gpus", [])], "status": getattr(r, "status", "ok")}
            for d in ("h2d", "d2h"):
                v = float(getattr(r, f"{d}_bytes"))
                args[f"{d.upper()} bytes"] = None if v != v else round(v)  # NaN (no floor, no data) -> null
            ev.append({"ph": "X", "pid": int(r.pid), "tid": int(r.tid), "name": str(r.name), "cat": str(r.domain),
                       "ts": (r.t_start_ns - t0) / 1e3, "dur": max(r.duration_ns, 0) / 1e3, "args": args})
        yield ev


def _other(meta: dict[str, Any], shown: int, recorded: int) -> dict[str, Any]:
    return {"tool": "pcietrace", "command": " ".join(meta.get("command", [])), "simulated": meta.get("simulated", False),
            "ranges_shown": shown, "ranges_recorded": recorded}


def chrome_trace(meta: dict[str, Any], rates: pd.DataFrame, ranges: pd.DataFrame,
                 launches: pd.DataFrame | None = None, t0_ns: int | None = None) -> dict[str, Any]:
    """``rates``: :func:`pcietrace.analysis.counters.rates`; ``ranges``: attributed ranges
    (:func:`pcietrace.analysis.attribution.attribute`); ``launches``:
    :func:`pcietrace.analysis.attribution.launch_rate`. Timestamps are microseconds from ``t0_ns`` (default: the
    first sample). Every point and range given (:func:`write_trace` bounds them)."""
    launches = launches if launches is not None else pd.DataFrame(columns=["pid", "t_ns", "eager_per_ms", "graph_per_ms"])
    ev = [e for chunk in _events(meta, rates, ranges, launches, t0_ns) for e in chunk]
    return {"traceEvents": ev, "displayTimeUnit": "ms", "otherData": _other(meta, len(ranges), len(ranges))}


#: Process ids of one node in a merged trace: its own (Linux's pid_max is at most 2^22) above ``node << PID_BITS``.
PID_BITS = 22


def node_events(meta: dict[str, Any], node: str, k: int, rates: pd.DataFrame, ranges: pd.DataFrame,
                launches: pd.DataFrame | None, t0_ns: int) -> list[dict[str, Any]]:
    """One node's part of a merged report's trace (:mod:`pcietrace.multinode`): its :func:`chrome_trace` from
    the merge's shared start ``t0_ns`` (every node's times on the wall clock), its counters and processes as
    processes of their own above ``k << PID_BITS``, named and sorted by node."""
    base = k << PID_BITS
    events: list[dict[str, Any]] = []
    for e in chrome_trace(meta, rates, ranges, launches, t0_ns)["traceEvents"]:
        e["pid"] = base + int(e["pid"])
        if e.get("name") == "process_name":
            e["args"] = {"name": f"{node}: {e['args']['name']}"}
            events.append({"ph": "M", "pid": e["pid"], "name": "process_sort_index", "args": {"sort_index": e["pid"]}})
        events.append(e)
    return events


def merged_header(meta: dict[str, Any]) -> dict[str, Any]:
    """A merged report's trace less its events (the nodes' parts, :func:`node_events`, go in ``traceEvents``)."""
    return {"displayTimeUnit": "ms",
            "otherData": {"tool": "pcietrace", "command": " ".join(meta.get("command") or []),
                          "nodes": [n["node"] for n in meta["merged"]["nodes"]], "simulated": meta.get("simulated", False)}}


def write_trace(session: Any, results: dict[str, pd.DataFrame], path: Path, max_points: int = MAX_POINTS,
                max_ranges: int = MAX_RANGES) -> dict[str, int]:
    """An attach run's Perfetto trace written to ``path`` as it is made: ``results`` from
    :func:`pcietrace.analysis.analyze` (its ``rates`` made :func:`coarser`, its ``range_instances``
    :func:`shown_ranges`), its ``launch_rates`` as the launch tracks (as many points).
    Returns the file's ``bytes``, ``ranges_shown`` and ``ranges_recorded``."""
    launches = coarser(results["launch_rates"], max_points, "pid")
    inst = results["range_instances"]
    ranges = shown_ranges(inst[[c for c in RANGE_FIELDS if c in inst]], max_ranges)  # (only the columns drawn)
    path = Path(path)
    # whole or not at all: a full disk leaves no truncated trace (nor a file another one had there); a device or
    # a pipe (/dev/full, a FIFO) is written in place, never renamed over
    tmp = path.with_name(f".{path.name[:200]}.{os.getpid()}.tmp") if path.is_file() or not path.exists() else path
    try:
        with open(tmp, "wb") as f:
            size = f.write(b'{"traceEvents": [')  # (bytes counted: a pipe has no position to tell)
            first = True
            for chunk in _events(session.meta, coarser(results["rates"], max_points), ranges, launches, as_text=True):
                if chunk:
                    size += f.write(b"" if first else b",\n")
                    size += f.write(chunk if isinstance(chunk, bytes) else ",\n".join(map(json.dumps, chunk)).encode())
                    first = False
            other = json.dumps(_other(session.meta, len(ranges), len(inst)))
            size += f.write(f'],\n"displayTimeUnit": "ms",\n"otherData": {other}}}\n'.encode())
            f.flush()
            if tmp != path:
                os.fsync(f.fileno())
        if tmp != path:
            os.replace(tmp, path)
    finally:
        if tmp != path:
            tmp.unlink(missing_ok=True)
    return {"bytes": size, "ranges_shown": len(ranges), "ranges_recorded": len(inst)}
