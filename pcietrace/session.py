"""A recorded run: metadata plus raw tables. The seam between recording and analysis/rendering.

On disk a session is a folder: ``report.json`` (schema-versioned: metadata, the small tables as
records, and the analysis results) and ``samples.parquet`` (raw counter samples). Loading needs no GPU,
so any saved run can be re-analysed and re-rendered anywhere.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pcietrace import schema
from pcietrace.schema import narrow_int
from pcietrace.errors import ReportError, one_line

SCHEMA = schema.SCHEMA
TABLES = ("windows", "bursts", "contexts", "e2e", "calibration", "latency", "graphs")
REPORT_FILE = "report.json"
SAMPLES_FILE = "samples.parquet"
EVENTS_FILE = "events.parquet"


def recording_files(path: Path) -> list[Path]:
    """The files a saved session at ``path`` (its folder or its ``report.json``) is read from."""
    path = Path(path)
    report = path / REPORT_FILE if path.is_dir() else path
    return [report, report.parent / SAMPLES_FILE, report.parent / EVENTS_FILE]


#: Where a saved run's ``range_instances`` go when they are more than :data:`INLINE_INSTANCES` rows.
INSTANCES_FILE = "range_instances.parquet"
#: Range instances a saved report.json holds inline at most (~1 kB each there); more go to :data:`INSTANCES_FILE`.
INLINE_INSTANCES = 100_000


def write_instances(instances: pd.DataFrame, path: Path) -> pd.DataFrame:
    """Write a ``range_instances`` table to ``path`` as Parquet; returns it marked so (``attrs["parquet"]``) that
    the JSON names the file and its rows instead of holding them (:func:`pcietrace.schema.write_json`)."""
    fixed = {c: "boolean" for c in instances.columns if instances[c].dtype == object
             and _bools(instances[c])}  # (launch_bound: True/False/NaN)
    # dictionaries for the names, kinds and GPU lists only: a float column's values rarely repeat, and the writer
    # tried a dictionary for each before giving up (3.6e6 instances: 2.4 -> 1.6 s to write, 4.9 -> 3.7 s to read)
    numbers = {c for c in instances.columns if instances[c].dtype.kind in "biuf" or c in fixed}
    _to_parquet(instances.astype(fixed), path, use_dictionary=[c for c in instances.columns if c not in numbers])
    out = instances.copy(deep=False)
    out.attrs["parquet"] = str(path)
    return out


def write_parquet(df: pd.DataFrame, path: Path) -> None:
    """``df`` to ``path`` as Parquet, its integer columns delta-encoded and not compressed (sample times and
    counters step by little: an 8-GPU hour's samples take ~0.3 GB against ~0.9 GB with snappy, and read back in
    half the CPU time), the others dictionary-encoded and compressed as pyarrow does by default."""
    ints = [c for c in df.columns if df[c].dtype.kind in "iu"]
    _to_parquet(df, path, use_dictionary=[c for c in df.columns if c not in ints],
                column_encoding={c: "DELTA_BINARY_PACKED" for c in ints},
                compression={c: "none" if c in ints else "snappy" for c in df.columns})


#: Rows per Parquet row group at most (pyarrow's default), each converted to Arrow as it is written; wide tables
#: (range instances: ~200 B a row) in groups of about :data:`GROUP_BYTES` (smaller groups cost more CPU: 32 MB ones
#: took 1.5x as long to save a 3.6e6-range run).
ROWS_PER_GROUP = 1 << 20
GROUP_BYTES = 128 << 20


def _to_parquet(df: pd.DataFrame, path: Path, **options: Any) -> None:
    """``df`` to ``path`` as ``df.to_parquet(index=False)`` writes it, a row group at a time: a long run's events
    or range instances are never all converted to Arrow at once (a second copy of them at the save's peak).
    ``options``: :class:`pyarrow.parquet.ParquetWriter`'s."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.Schema.from_pandas(df, preserve_index=False)
    row_bytes = df.memory_usage(index=False).sum() / max(len(df), 1)
    rows = int(min(ROWS_PER_GROUP, max(1 << 16, GROUP_BYTES // max(row_bytes, 1))))
    # (a save cut short leaves no file that reads as whole; a device or a pipe, e.g. /dev/null, is written in
    # place: renamed over, the device's node would become a file)
    path = Path(path)
    partial = path if path.exists() and not path.is_file() else path.with_name(path.name + ".partial")
    try:
        # (opened here: a path Arrow cannot encode, e.g. a non-UTF-8 name, opens as any file does)
        with open(partial, "wb") as f:
            if not f.seekable():  # (a pipe: refused, as Arrow's own open refuses it)
                raise OSError(errno.ESPIPE, f"{path} is a pipe; Parquet is written to a file")
            with pq.ParquetWriter(f, schema, **options) as writer:
                for at in range(0, max(len(df), 1), rows):
                    writer.write_table(pa.Table.from_pandas(df.iloc[at:at + rows], schema=schema,
                                                            preserve_index=False))
        if partial != path:
            os.replace(partial, path)
    finally:
        if partial != path:
            partial.unlink(missing_ok=True)


def _bools(col: pd.Series) -> bool:
    """Whether every cell of an object column is a bool or NaN (inferred in one pass, not a call per cell)."""
    kind = pd.api.types.infer_dtype(col, skipna=True)
    if kind == "empty":  # (all missing: NaN counts as a bool's absence, None does not)
        return bool(col.map(lambda v: v != v).all())
    return kind == "boolean"


def _empty() -> pd.DataFrame:
    return pd.DataFrame()


@dataclass
class Session:
    """``meta``: tool version, host, command, ``simulated``, ``status`` ("complete" / "interrupted" /
    "failed: ..."), ``gpus`` (list of dicts with ``nvml_index``, ``cuda_ordinal``, name, bus id, PCIe
    link, ``counter`` mode/bits) and ``plan``. Tables: ``samples`` (raw counters, see
    ``pcietrace.collectors.SAMPLE_COLUMNS``), ``windows``, ``bursts``, ``contexts`` (bursts in fresh CUDA
    contexts, with ``context``), ``e2e``, ``calibration`` (records from :class:`pcietrace.record.generate.LaunchGenerator`, each with ``nvml_index``), ``latency``
    (:data:`pcietrace.record.latency.LATENCY_COLUMNS`), ``events`` (attach: NVTX/launch events,
    :data:`pcietrace.record.trace.EVENT_COLUMNS` + ``pid``), ``graphs`` (``pcietrace graphs``: one row per
    iteration, :data:`pcietrace.record.graphs.ITERATION_FIELDS`); ``meta["topology"]`` holds the machine's topology.
    As loaded, ``samples`` and ``events`` hold integers in 32 bits where every value fits (the samples' GPU index
    in 8) and strings as categories (the same values; widen a column before arithmetic that could leave its
    range)."""

    meta: dict[str, Any]
    samples: pd.DataFrame = field(default_factory=_empty)
    windows: pd.DataFrame = field(default_factory=_empty)
    bursts: pd.DataFrame = field(default_factory=_empty)
    contexts: pd.DataFrame = field(default_factory=_empty)  # eager bursts in fresh CUDA contexts
    e2e: pd.DataFrame = field(default_factory=_empty)
    calibration: pd.DataFrame = field(default_factory=_empty)
    latency: pd.DataFrame = field(default_factory=_empty)
    events: pd.DataFrame = field(default_factory=_empty)
    graphs: pd.DataFrame = field(default_factory=_empty)  # `pcietrace graphs`: one row per iteration
    #: Where :meth:`release_events` writes the events before letting them go (attach: its staging folder's
    #: events.parquet), for :meth:`save` to keep from there; None: they are let go unwritten.
    events_file: Path | None = None
    #: An attach run's samples left on disk, read a GPU at a time by the analysis (``samples`` then holds none):
    #: :meth:`load` with ``samples_on_disk``.
    sample_file: SampleFile | None = None

    @property
    def counters(self) -> dict[int, dict[str, Any]]:
        """Per NVML index: the counter source (``mode``: fields/throughput, ``bits``) and the GPU's link
        (``pcie_gen_max``, ``pcie_width_max``; None where not recorded)."""
        return {int(g["nvml_index"]): {**(g.get("counter") or {"mode": "fields", "bits": 32}),
                                       "pcie_gen_max": g.get("pcie_gen_max"), "pcie_width_max": g.get("pcie_width_max")}
                for g in self.meta.get("gpus", [])}

    def save(self, directory: Path, results: dict[str, Any] | None = None) -> Path:
        """Write the session (and, if given, analysis results as JSON-ready data: records, or DataFrames written
        as records) to ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        inst = (results or {}).get("range_instances")
        big = isinstance(inst, pd.DataFrame) and len(inst) > INLINE_INSTANCES  # (a long run: its own file)
        # the Parquet files written at once: pyarrow converts and encodes them with the GIL released
        with ThreadPoolExecutor(3) as pool:
            written = [pool.submit(write_instances, inst, directory / INSTANCES_FILE)] if big else []
            written.append(pool.submit(write_parquet, self.samples, directory / SAMPLES_FILE))
            if len(self.events):
                written.append(pool.submit(write_parquet, self.events, directory / EVENTS_FILE))
            elif self.events_file is not None and self.events_file.is_file() and self.events_file != directory / EVENTS_FILE:
                written.append(pool.submit(shutil.copyfile, self.events_file, directory / EVENTS_FILE))
            done = [w.result() for w in written]  # (an error raised here: report.json is never written)
        if big:
            results = {**results, "range_instances": done[0]}
            results["range_instances"].attrs["parquet"] = INSTANCES_FILE  # (named relative to report.json)
        doc = {"schema": SCHEMA, "meta": self.meta,
               "tables": {t: _records(getattr(self, t)) for t in TABLES}, "results": results or {}}
        tmp = directory / (REPORT_FILE + ".tmp")
        with open(tmp, "w") as f:  # (results may hold tables: written a chunk of rows at a time)
            schema.write_json(doc, f, _json_default, allow_nan=True)
            f.write("\n")
        os.replace(tmp, directory / REPORT_FILE)  # never leave a half-written report
        return directory / REPORT_FILE

    def release_events(self) -> None:
        """Let ``events`` go (an analysis that has read what it needs of them; their columns are kept), written
        first to :attr:`events_file` where one is set: a long run's events (~90 B each, two a range) are not held
        beside its range instances."""
        if self.events_file is not None and len(self.events):
            write_parquet(self.events, self.events_file)
        self.events = self.events.iloc[:0].copy()  # (a copy: an empty slice would keep the columns it views alive)

    def release_samples(self) -> None:
        """Let ``samples`` go (an analysis that has read them; their columns are kept): an 8-GPU hour's are ~1 GB."""
        self.samples = self.samples.iloc[:0].copy()

    @classmethod
    def load(cls, path: Path, samples_on_disk: bool = False) -> "Session":
        """Load a saved session from its folder or its ``report.json``, checked against
        :mod:`pcietrace.schema`. Anything damaged, missing or from a newer schema raises
        :class:`~pcietrace.errors.ReportError` naming the file and the field. ``samples_on_disk``: an attach
        run's samples stay in their file (:attr:`sample_file`), read a GPU at a time by the analysis, where the
        file holds them by GPU (as saved)."""
        path = Path(path)
        try:
            report, samples_file, events_file = recording_files(path)
            found = report.is_file()
        except OSError as exc:  # (a name too long for the file system, a loop of links...)
            raise ReportError(f"no pcietrace report at {path} ({exc.strerror or exc})") from None
        if not found:
            from pcietrace import store

            staging = store.interrupted_recording(path)  # (a recording whose process died before saving it)
            if staging is None:
                raise ReportError(f"no pcietrace report at {path}")
            return store.load_interrupted(staging)
        try:
            doc = schema.load_json(report.read_bytes())
        except RecursionError:
            raise ReportError(f"{report} is not a readable JSON report (nested too deeply)") from None
        except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise ReportError(f"{report} is not a readable JSON report ({one_line(exc)})") from None
        try:
            schema.check_doc(doc)
        except schema.Invalid as exc:
            raise ReportError(f"{report}: {exc}") from None
        tables = {t: _table(report, t, pd.DataFrame.from_records(doc["tables"].get(t, [])), doc["meta"]) for t in TABLES}
        on_disk = _sample_file(samples_file, doc["meta"]) if samples_on_disk and doc["meta"].get("kind") == "attach" \
            else None
        if on_disk is None:
            samples = _gpu_bytes(_parquet(samples_file, doc["meta"], required=True))
            counts = samples["nvml_index"].value_counts() if len(samples) else pd.Series(dtype=int)
        else:
            samples = _table(samples_file, "samples", pd.DataFrame(), doc["meta"])
            counts = pd.Series({g: n for g, (_, n) in on_disk.gpus.items()}, dtype=int)
        events = _parquet(events_file, doc["meta"], required=False)
        _check_ranges(events_file, doc["meta"], events)
        _check_samples(samples_file, doc["meta"], counts, tables["windows"])
        return cls(meta=doc["meta"], samples=samples, events=events, sample_file=on_disk, **tables)


def _table(file: Path, name: str, df: pd.DataFrame, meta: dict[str, Any]) -> pd.DataFrame:
    """``df`` checked against the declared columns of table ``name`` (errors name ``file``)."""
    try:
        return schema.check_table(df, name, schema.table_columns(name, meta))
    except schema.Invalid as exc:
        raise ReportError(f"{file}: {exc}") from None


def _parquet(file: Path, meta: dict[str, Any], required: bool) -> pd.DataFrame:
    if not file.is_file():
        if required:
            raise ReportError(f"{file} is missing: the report's raw samples are needed to analyse it")
        return _empty()
    try:
        with open(file, "rb") as f:  # (a path pyarrow cannot encode, e.g. a non-UTF-8 folder name, opens here)
            df = _read_parquet(f)
    except Exception as exc:  # pyarrow raises its own types for truncated or garbage files; all mean "damaged"
        raise ReportError(f"{file} is not a readable Parquet table ({one_line(exc)})") from None
    return _table(file, file.stem, df, meta)


def _read_parquet(f: Any, only: tuple[str, int, int] | None = None) -> pd.DataFrame:
    """A Parquet table read a row group at a time: its numeric columns copied into arrays of their full length as
    each group is decoded, so a long recording's samples are held once (not as Arrow's buffers and pandas' too);
    64-bit integers that fit 32 bits held in 32, the events' small counts and indices in 8 or 16
    (:func:`pcietrace.schema.narrow_int`), strings as categories (millions of events repeat a few kinds, domains and
    range names). ``only``: (column, value, rows): just the ``rows`` rows whose ``column`` holds ``value``, from
    the groups whose statistics may hold it (:meth:`SampleFile.read`: one GPU's samples)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(f)
    strings = [c.name for c in pf.schema_arrow if pa.types.is_string(c.type) or pa.types.is_large_string(c.type)]
    meta = pf.metadata
    if meta.num_row_groups <= 1 and only is None:
        df = pd.read_parquet(f, read_dictionary=strings)
        pa.default_memory_pool().release_unused()
        return _narrowed(df)
    pf = pq.ParquetFile(f, read_dictionary=strings)
    schema = pf.schema_arrow
    groups, rows = list(range(meta.num_row_groups)), meta.num_rows
    leaf = _top_level_leaves(meta)

    def column_stats(name: str, of: list[int]) -> list[Any]:
        k = leaf.get(name)
        return [None if k is None else meta.row_group(i).column(k).statistics for i in of]

    whole: set[int] = set()  # (groups whose statistics say every row holds ``only``'s value: read unfiltered)
    if only is not None:
        stats = dict(zip(groups, column_stats(only[0], groups)))
        groups = [i for i in groups if (st := stats[i]) is None or not st.has_min_max or st.min <= only[1] <= st.max]
        whole = {i for i in groups if (st := stats[i]) is not None and st.has_min_max and st.has_null_count
                 and st.null_count == 0 and st.min == st.max == only[1]}
        rows = only[2]

    def fixed(j: int) -> bool:  # (numbers with no nulls in any group: the same array as pandas reads)
        t = schema.field(j).type
        stats = column_stats(schema.field(j).name, groups)
        return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)) and \
            all(st is not None and st.has_null_count and st.null_count == 0 for st in stats)

    def held(j: int, dtype: np.dtype) -> np.dtype:  # (what the groups' statistics say each column's values fit)
        stats = column_stats(schema.field(j).name, groups)
        if dtype.kind not in "iu" or not all(st is not None and st.has_min_max for st in stats):
            return dtype
        return narrow_int(dtype, min(st.min for st in stats), max(st.max for st in stats), schema.field(j).name)

    numbers = {schema.field(j).name for j in range(len(schema)) if fixed(j)}
    column = {name: j for j, name in enumerate(schema.names)}
    arrays: dict[str, np.ndarray] = {}
    chunks: dict[str, list[Any]] = {name: [] for name in schema.names if name not in numbers}
    at = 0
    for i in groups:
        table = pf.read_row_group(i)
        if only is not None:
            if i not in whole:
                table = table.filter(pc.equal(table.column(only[0]), only[1]))
            if at + table.num_rows > rows:
                raise ValueError(f"more rows of {only[0]} {only[1]} than {rows}: changed since it was opened")
        for name in schema.names:
            col = table.column(name)
            if name in numbers:
                v = col.to_numpy()
                if name not in arrays:
                    arrays[name] = np.empty(rows, held(column[name], v.dtype))
                a = arrays[name]
                fits = np.iinfo(a.dtype) if a.dtype != v.dtype and v.size else None
                if fits is not None and not (fits.min <= v.min() and v.max() <= fits.max):
                    raise ValueError(f"column {name}: its statistics do not hold its values")
                a[at:at + v.size] = v
            else:
                chunks[name].extend(col.chunks)
        at += table.num_rows
        del table
    cols = {name: arrays[name][:at] if name in numbers else pa.chunked_array(chunks.pop(name), schema.field(name).type)
            .to_pandas() for name in schema.names}
    pa.default_memory_pool().release_unused()  # (Arrow's pool keeps the groups' decoded buffers: hand them back)
    return pd.DataFrame(cols, copy=False)


def _top_level_leaves(meta: Any) -> dict[str, int]:
    """Each top-level primitive column's leaf column number in a Parquet file's ``meta`` (its statistics are found
    by it): a nested column before it shifts the leaves' numbers, and a nested leaf's path (its parents' names, a
    dot and its own) is never its own name, where a top-level column's is, dots and all."""
    return {c.path: k for k in range(meta.num_columns) if (c := meta.schema.column(k)).path == c.name}


def _narrowed(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with each integer column in the narrowest kind its values fit (:func:`pcietrace.schema.narrow_int`)."""
    for c in df.columns:
        if df[c].dtype in (np.int64, np.uint64, np.int32) and len(df):
            v = df[c].to_numpy()
            df[c] = v.astype(narrow_int(v.dtype, v.min(), v.max(), c), copy=False)
    return df


@dataclass
class SampleFile:
    """A saved attach run's counter samples left in their Parquet file (rows by GPU, as saved) and read a GPU at a
    time (:meth:`read`): an 8-GPU hour's are ~1 GB held, one GPU's an eighth. ``gpus``: how many samples each GPU
    has, in GPU order, with the row its samples start at; ``t_min_ns``, ``t_max_ns``: the first and last sample's
    times (the file's statistics)."""

    path: Path
    gpus: dict[int, tuple[int, int]]
    t_min_ns: int
    t_max_ns: int
    #: The samples' declared columns and kinds (:func:`pcietrace.schema.table_columns`), checked on each GPU's read
    #: as a whole file's are on load.
    columns: dict[str, str] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        """Samples in the file, of every GPU."""
        return sum(n for _, n in self.gpus.values())

    @classmethod
    def open(cls, path: Path, columns: dict[str, str] | None = None) -> "SampleFile | None":
        """The file's GPUs and span, or None where its rows are not by GPU or lack a declared column (then it is
        read whole, which says so)."""
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        meta, names = pf.metadata, pf.schema_arrow.names
        if any(c not in names for c in ("nvml_index", "t_ns", *(columns or {}))) or not meta.num_rows:
            return None
        leaf = _top_level_leaves(meta)
        gpu_col, t_col = leaf.get("nvml_index"), leaf.get("t_ns")
        if gpu_col is None or t_col is None:
            return None
        counts: dict[int, int] = {}
        last = -1
        for i in range(meta.num_row_groups):  # (a group's GPU column alone: a few MB)
            idx = pf.read_row_group(i, columns=["nvml_index"]).column(0).to_numpy()
            if idx.size and (idx[0] < last or (idx[1:] < idx[:-1]).any()):
                return None
            last = int(idx[-1]) if idx.size else last
            for g, n in zip(*np.unique(idx, return_counts=True)):
                counts[int(g)] = counts.get(int(g), 0) + int(n)
        stats = [meta.row_group(i).column(t_col).statistics for i in range(meta.num_row_groups)]
        if not all(st is not None and st.has_min_max for st in stats) or \
                not all(meta.row_group(i).column(gpu_col).statistics is not None for i in range(meta.num_row_groups)):
            return None
        starts = np.r_[0, np.cumsum(list(counts.values()))[:-1]]
        return cls(Path(path), {g: (int(a), n) for (g, n), a in zip(counts.items(), starts)},
                   int(min(st.min for st in stats)), int(max(st.max for st in stats)), dict(columns or {}))

    def read(self, gpu: int) -> pd.DataFrame:
        """GPU ``gpu``'s samples, as :meth:`Session.load` holds samples, indexed by their rows in the file: only the
        row groups that hold them are read (:func:`_read_parquet`), so one GPU's samples are never held twice."""
        start, n = self.gpus[int(gpu)]
        try:
            with open(self.path, "rb") as f:
                df = _read_parquet(f, only=("nvml_index", int(gpu), n))
        except Exception as exc:  # pyarrow raises its own types for a damaged group; all mean "damaged"
            raise ReportError(f"{self.path} is not a readable Parquet table ({one_line(exc)})") from None
        if len(df) != n:  # (changed since it was opened)
            raise ReportError(f"{self.path} changed while it was read (GPU {gpu}: {len(df)} samples, not {n})")
        df.index = pd.RangeIndex(start, start + n)
        if self.columns:
            try:
                df = schema.check_table(df, "samples", self.columns)
            except schema.Invalid as exc:
                raise ReportError(f"{self.path}: {exc}") from None
        return _gpu_bytes(df)


def _gpu_bytes(samples: pd.DataFrame) -> pd.DataFrame:
    """``samples`` with their GPU column in 8 bits where every index fits (an index per counter sample: 3 bytes a
    sample less than 32 bits, the same values)."""
    gpu = samples["nvml_index"].to_numpy() if "nvml_index" in samples and len(samples) else None
    if gpu is not None and gpu.dtype.kind in "iu" and gpu.itemsize > 1 and 0 <= gpu.min() and gpu.max() < 128:
        samples["nvml_index"] = gpu.astype(np.int8)
    return samples


def _check_ranges(file: Path, meta: dict[str, Any], events: pd.DataFrame) -> None:
    """Refuse an attach run whose events are missing or cut short: ``meta.processes[].ranges`` counts the
    range openings the saved events held (record/attach.py: processes), and without them the ranges and
    launches would be reported as none, not as unknown; or that hold more than it counts."""
    procs = meta.get("processes")
    counted = [p["ranges"] for p in procs if isinstance(p, dict) and isinstance(p.get("ranges"), int)] \
        if isinstance(procs, list) else []
    want = sum(counted)
    have = int(events["event"].isin(["push", "start"]).sum()) if "event" in events else 0
    if have < want:
        what = "is missing" if not file.is_file() else f"holds {have} of the {want} range openings report.json counts"
        raise ReportError(f"{file} {what}: the attach run's NVTX ranges and launches are needed to analyse it")
    if counted and len(counted) == len(procs) and have > want:  # (every process counted: more is a copy's rows)
        raise ReportError(f"{file} holds {have} range openings, report.json counts {want}: its events were changed "
                          "(rows repeated?) since the run saved them")


def _sample_file(file: Path, meta: dict[str, Any]) -> SampleFile | None:
    """``file``'s samples to be read a GPU at a time (None: missing, not by GPU, or read whole)."""
    if not file.is_file():
        return None
    try:
        return SampleFile.open(file, schema.table_columns("samples", meta))
    except Exception:  # (a damaged file: read whole, which says how)
        return None


def _check_samples(file: Path, meta: dict[str, Any], counts: pd.Series, windows: pd.DataFrame) -> None:
    """Refuse a run with fewer than two counter samples of a GPU whose counter windows (or, in a finished
    attach run, whose ranges) were sampled: byte figures are differences of two readings, so with 0 or 1
    every one of them would be left out without a word. The sampler runs before the first window and reads
    its edges, so such a file was emptied or cut. `latency` runs sample nothing and have no windows. ``counts``:
    samples per GPU."""
    attach = meta.get("kind") == "attach" and meta.get("status") == "complete"
    sampled = set(windows["nvml_index"]) if len(windows) else set()
    if attach:
        sampled |= {g["nvml_index"] for g in meta.get("gpus", [])}
    for gpu in sorted(sampled):
        n = int(counts.get(gpu, 0))
        if n < 2:
            raise ReportError(f"{file} holds {'no samples' if n == 0 else '1 sample'} of GPU {gpu}'s counters: "
                              "its byte figures are differences of two readings, so at least two are needed")


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return json.loads(df.to_json(orient="records")) if len(df) else []


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    if isinstance(o, float) and math.isnan(o):
        return None
    return str(o)
