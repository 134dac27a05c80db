"""The declared shape of a saved report: ``report.json``'s metadata keys and types, and each table's
columns. :func:`check_doc` and :func:`check_table` raise :class:`Invalid` naming the field;
:meth:`pcietrace.session.Session.load` turns that into a :class:`~pcietrace.errors.ReportError` naming
the file too. Unknown extra keys are allowed (a later schema-1 writer may add some)."""

from __future__ import annotations

import codecs
import collections
import ctypes
import json
import math
import numbers
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, NamedTuple

import numpy as np
import pandas as pd

from pcietrace.collectors.sampler import SAMPLE_COLUMNS

#: `pcietrace graphs` strategies, in display order; their index is the C enum in pt_graphs.c.
STRATEGIES = ("eager", "recapture", "exec_update", "node_update", "recognize")

#: What each iteration counts (C int32 fields of pt_iter, in order).
COUNT_COLUMNS = ("captures", "instantiations", "updates", "node_updates", "cache_hits", "update_failures", "evictions",
                 "graph_launches", "eager_launches")


#: Columns that count things (calls, launches, processes...): written as JSON integers, null where unknown.
COUNTS = ("calls", "short_calls", "unknown_calls", "stalls", "launches", "processes", "ranges", "samples", "windows", "dof",
          "quiet_intervals", "gpu_kernels")


def is_count(column: str) -> bool:
    """Whether ``column`` holds a count (:data:`COUNTS`, or launches: ``*_launches``, ``*_launches_process``)."""
    return column in COUNTS or column.endswith(("_launches", "_launches_process"))


def counts_as_ints(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its float count columns whose values are all whole (a column that may hold NaN is float in
    pandas, e.g. launches per GPU, unknown without device information) as nullable integers: 18018, not 18018.0,
    and null where unknown. A fractional value leaves its column as it is."""
    whole = {}
    for c in df.columns:
        if is_count(str(c)) and df[c].dtype.kind == "f":
            v = df[c].dropna().to_numpy()
            if (np.abs(v) < 2**63).all() and (v == np.round(v)).all():  # (NaN-free; inf fails the first)
                whole[c] = "Int64"
    return df.astype(whole) if whole else df


#: Event columns of small counts and indices, never offset by a constant: held in 8 or 16 bits where their values
#: allow (:func:`narrow_int`).
SMALL_INTS = ("depth", "dev", "captured_thread", "captured_process")


def narrow_int(dtype: Any, lo: Any, hi: Any, column: str = "") -> np.dtype:
    """``dtype``, or a narrower kind where a 64-bit integer ``column``'s values (``lo`` ... ``hi``) all fit it: 32
    bits, or for one of :data:`SMALL_INTS` (64 or 32 bits) 8 or 16 bits where they lie within a quarter of that
    range (two of them still add or subtract within it). A long recording's samples and events held in less memory, their values
    unchanged (analysis widens what it computes with)."""
    dtype = np.dtype(dtype)
    if dtype in (np.int64, np.int32) and column in SMALL_INTS:
        for narrow in (np.int8, np.int16):
            quarter = 2 ** (np.iinfo(narrow).bits - 2)
            if -quarter <= lo and hi < quarter:
                return np.dtype(narrow)
    if dtype == np.int64 and -2**31 <= lo and hi < 2**31:
        return np.dtype(np.int32)
    if dtype == np.uint64 and hi < 2**32:
        return np.dtype(np.uint32)
    return dtype


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """A table as JSON-ready records: NaN -> null, counts as integers (:func:`counts_as_ints`); [] if empty."""
    return [json.loads(line) for line in json_lines(counts_as_ints(df))]  # (as write_json writes them)


#: Rows of a table converted to JSON at a time by :func:`write_json` (bounds its memory).
JSON_CHUNK_ROWS = 20_000
#: Chunks of rows made at once (on threads) for a file's bytes.
JSON_THREADS = 4


def write_json(doc: Any, out: Any, default: Callable[[Any], Any] = str, allow_nan: bool = False) -> None:
    """``doc`` as strict JSON into ``out`` (a text file), its DataFrames (at any depth) as :func:`records` written
    :data:`JSON_CHUNK_ROWS` rows at a time, one record a line: a table of millions of rows never becomes one
    string; a DataFrame written to Parquet (``attrs["parquet"]``: its path) as ``{"parquet": PATH, "rows": N}``.
    The rest as ``json.dumps(indent=1)``."""
    if isinstance(doc, pd.DataFrame) and "parquet" in doc.attrs:  # its rows are in a file of their own
        out.write(json.dumps({"parquet": doc.attrs["parquet"], "rows": len(doc)}))
    elif isinstance(doc, pd.DataFrame):
        if not len(doc):
            out.write("[]")
            return
        doc = counts_as_ints(doc)
        out.write("[\n")
        rows = RowTexts(doc, ",\n")  # (how a row's text is made: planned once for the whole table)
        raw = _utf8_bytes_of(out)  # (a text file's bytes: the rows' UTF-8 goes there as Arrow made it)
        if raw is not None:
            out.flush()  # (the text written so far, ahead of the rows)
        starts = range(0, len(doc), JSON_CHUNK_ROWS)
        if raw is None:
            for i in starts:
                text = bytes(rows.joined(i, min(i + JSON_CHUNK_ROWS, len(doc)))).decode()
                out.write((",\n" if i else "") + text)
        else:
            # chunks made on threads, a few ahead, and written in order: Arrow's casts and joins, most of the
            # time, run with Python's lock released
            ahead, raw_rows = max(1, min(os.cpu_count() or 1, JSON_THREADS)), False
            with ThreadPoolExecutor(ahead) as pool:
                made: collections.deque[Any] = collections.deque()
                for n, i in enumerate(starts):
                    made.append(pool.submit(rows.joined, i, min(i + JSON_CHUNK_ROWS, len(doc))))
                    while len(made) > (ahead if n < len(starts) - 1 else 0):
                        raw.write(b",\n" if raw_rows else b"")
                        raw.write(made.popleft().result())
                        raw_rows = True
        out.write("\n]")
    elif isinstance(doc, dict) and _holds_table(doc):
        out.write("{")
        for i, (k, v) in enumerate(doc.items()):
            out.write(("," if i else "") + f"\n{json.dumps(str(k))}: ")
            write_json(v, out, default, allow_nan)
        out.write("\n}")
    else:
        out.write(json.dumps(doc, indent=1, default=default, allow_nan=allow_nan))


def _utf8_bytes_of(out: Any) -> Any:
    """The binary file under text stream ``out`` where it encodes as UTF-8 (or ASCII, of which the rows' text is:
    json.dumps escapes the rest), else None (a string buffer, UTF-16...: the rows are written as text)."""
    raw, encoding = getattr(out, "buffer", None), getattr(out, "encoding", None)
    try:
        return raw if raw is not None and encoding and codecs.lookup(encoding).name in ("utf-8", "ascii") else None
    except LookupError:
        return None


def json_lines(df: pd.DataFrame, sep: str | None = None) -> Any:
    """Each row of ``df`` as one JSON object's text (a list of str; with ``sep``, one str of them joined by it),
    keys in column order, made a column at a time in Arrow (a long run's range instances: millions of rows):
    numbers as numbers (floats keep a decimal point), null for NaN, NA and infinities, and any other value
    (strings, lists, bools among NaN) as ``json.dumps`` writes it, each distinct value encoded once."""
    if not len(df):
        return [] if sep is None else ""
    rows = RowTexts(df, sep)
    return rows.texts(0, len(df)).to_pylist() if sep is None else bytes(rows.joined(0, len(df))).decode()


#: Adjacent columns of few values are written as one part of each row's text, the text of each combination of
#: their values made once (a long run's instances: 18 of their 35 columns): at most this many combinations a
#: part, and this many bytes of their text. Arrow joins a row's parts at ~10 ns each, and takes a made text
#: quicker than it casts a number.
JSON_COMBINATIONS = 1 << 16
JSON_COMBINATION_BYTES = 1 << 23
#: An integer column whose values lie within this many of each other is written by value, each value's text made
#: once, instead of cast.
JSON_INT_SPAN = 1024
#: A float column is written from an earlier one's text where at least this share of their values are the same
#: (a range's exclusive bytes are its bytes where it has no children: most of a dense recording's ranges).
JSON_LIKE_SHARE = 0.25

#: The codes of rows lo..hi into a column's values' texts.
Codes = Callable[[int, int], np.ndarray]


class RowText:
    """How :class:`RowTexts` writes a row: JSON objects (this class), or another text format of one row a line
    (a subclass: :class:`pcietrace.report.csv.CsvRow`)."""

    #: A missing value's text (NaN, NA, None).
    missing = "null"
    #: False's and True's.
    bools = ("false", "true")

    def key(self, k: int, column: Any) -> str:
        """The text before column ``k``'s value."""
        return ("{" if not k else ",") + json.dumps(str(column)) + ":"

    def end(self, columns: int) -> str:
        """The text after a row's last value (before the line's separator)."""
        return "}" if columns else "{}"

    def value(self, u: Any) -> str:
        """A value's text (one of a column's distinct values: not missing, not a float column's)."""
        if isinstance(u, float) and not math.isfinite(u):
            return self.missing
        return json.dumps(u.item() if isinstance(u, np.generic) else u, default=_plain)

    def floats(self, v: np.ndarray) -> list[Any]:
        """A float column's text for some rows (one or two parts: :func:`_float_texts`)."""
        return _float_texts(v, self.missing)


JSON_ROWS = RowText()


class _Run(NamedTuple):
    """Adjacent columns of few values, one part of each row's text: the text of each combination of their values
    (the keys, and the text after the run, folded in), and each column's codes of rows lo..hi."""
    texts: Any  # (an Arrow large_string array)
    coders: list[Codes]
    sizes: list[int]

    def taken(self, lo: int, hi: int) -> Any:
        at = self.coders[0](lo, hi) if len(self.coders) == 1 else \
            np.ravel_multi_index([codes(lo, hi) for codes in self.coders], self.sizes)
        return self.texts.take(at)


class _Floats(NamedTuple):
    """A float column, one part of each row's text (:func:`_float_texts`); ``like``: the part of an earlier float
    column of mostly the same values, whose text those rows take, only the others cast."""
    values: np.ndarray
    like: int | None


class RowTexts:
    """A table's rows as text, JSON objects (:func:`json_lines`) or another row format (:class:`RowText`), made a
    chunk of rows at a time (on threads: nothing changes after ``__init__``) from a plan made once for the whole
    table. Each part of a row's text is text between values, a column of integers cast (:func:`_cast`), a column
    of :class:`_Floats`, or a :class:`_Run` of columns of few values (:func:`_coder`)."""

    def __init__(self, df: pd.DataFrame, sep: str | None, row: RowText = JSON_ROWS) -> None:
        self.sep_bytes, self.row = len((sep or "").encode()), row
        few = max(len(df), 16)  # (a few rows: no more texts made for a column or a run than rows)
        runs: list[list[tuple[list[str], Codes]]] = []  # (each run's columns: their values' texts and codes)
        plan: list[str | list[tuple[list[str], Codes]] | _Floats | Callable[[int, int], list[Any]]] = []
        for k, c in enumerate(df.columns):
            key = row.key(k, c)
            if df[c].dtype.kind == "f":
                plain = isinstance(df[c].dtype, np.dtype)  # (else pandas' nullable floats: NA as NaN)
                plan += [key, _Floats(df[c].to_numpy() if plain else df[c].to_numpy(np.float64, na_value=np.nan),
                                      None)]
                continue
            coder = _coder(df[c], key, min(JSON_INT_SPAN, few), row)
            if coder is None:
                plan += [key, _cast(df[c], row.missing)]
            elif runs and plan[-1] is runs[-1] and _fits(runs[-1] + [coder], min(JSON_COMBINATIONS, few)):
                runs[-1].append(coder)
            else:
                runs.append([coder])
                plan.append(runs[-1])
        plan.append(row.end(len(df.columns)) + ("" if sep is None else sep))
        self.parts: list[str | _Run | _Floats | Callable[[int, int], list[Any]]] = []
        for part in plan:
            if isinstance(part, str) and self.parts and isinstance(self.parts[-1], _Run):  # (folded into the run)
                run = self.parts[-1]
                self.parts[-1] = run._replace(texts=_join([run.texts, part]))
            elif isinstance(part, list):
                self.parts.append(_combined(part))
            elif isinstance(part, _Floats):
                self.parts.append(part._replace(like=self._like(part.values)))
            else:
                self.parts.append(part)

    def _like(self, values: np.ndarray) -> int | None:
        """The earlier float part with the most values the same as ``values`` (bit for bit: -0.0 is not 0.0), if
        at least :data:`JSON_LIKE_SHARE` of them, on 10,000 rows drawn across the table."""
        rows = np.random.default_rng(0).integers(0, len(values), min(len(values), 10_000))
        mine, best, like = _float64(values[rows]).view(np.int64), JSON_LIKE_SHARE, None
        for i, part in enumerate(self.parts):
            if isinstance(part, _Floats) and len(rows):
                share = float(np.mean(mine == _float64(part.values[rows]).view(np.int64)))
                if share >= best:
                    like, best = i, share
        return like

    def texts(self, lo: int, hi: int) -> Any:
        """Rows ``lo``..``hi``'s text, each ending in ``sep``, as an Arrow large_string array."""
        import pyarrow as pa

        made: list[Any] = []
        floats: dict[int, list[Any]] = {}  # (each float part's text, for the float parts like it)
        for i, part in enumerate(self.parts):
            if isinstance(part, str):
                pieces: list[Any] = [part]
            elif isinstance(part, _Run):
                pieces = [part.taken(lo, hi)]
            elif isinstance(part, _Floats):
                pieces = floats[i] = self._float_text(part, lo, hi, floats)
            else:
                pieces = part(lo, hi)
            for piece in pieces:  # (text next to text: one part)
                if isinstance(piece, str) and made and isinstance(made[-1], str):
                    made[-1] += piece
                else:
                    made.append(piece)
        if len(made) == 1 and isinstance(made[0], str):  # (a table of no columns)
            return pa.array([made[0]] * (hi - lo), pa.large_string())
        return made[0] if len(made) == 1 else _join(made)

    def _float_text(self, part: _Floats, lo: int, hi: int, floats: dict[int, list[Any]]) -> list[Any]:
        """A float part's text for rows lo..hi: :func:`_float_texts`, or the text of the part it is like where
        their values are the same."""
        import pyarrow as pa
        import pyarrow.compute as pc

        v = _float64(part.values[lo:hi])
        if part.like is None:
            return self.row.floats(v)
        other = self.parts[part.like]
        assert isinstance(other, _Floats)
        same = v.view(np.int64) == _float64(other.values[lo:hi]).view(np.int64)
        if same.all():
            return floats[part.like]
        if not same.any():
            return self.row.floats(v)
        theirs = floats[part.like]
        mine = self.row.floats(v[~same])
        return [pc.replace_with_mask(_join(theirs) if len(theirs) > 1 else theirs[0], pa.array(~same),
                                     _join(mine) if len(mine) > 1 else mine[0])]

    def joined(self, lo: int, hi: int) -> memoryview:
        """:meth:`texts` back to back, as the UTF-8 bytes Arrow made (no Python string per row or for the
        whole: a long run's range instances are gigabytes of text), less the last row's ``sep``."""
        rows = self.texts(lo, hi)
        at = np.frombuffer(rows.buffers()[1], np.int64)[rows.offset:rows.offset + len(rows) + 1]
        return memoryview(rows.buffers()[2])[int(at[0]):int(at[-1]) - self.sep_bytes]


def _float64(v: np.ndarray) -> np.ndarray:  # (a float32 column widened a chunk at a time, not whole)
    return v if v.dtype == np.float64 else v.astype(np.float64)


def _fits(columns: list[tuple[list[str], Codes]], most: int) -> bool:
    """Whether these columns' combinations of values are at most ``most``, and their text at most
    :data:`JSON_COMBINATION_BYTES` (a long text among few values is in many of them)."""
    count = math.prod(len(texts) for texts, _ in columns)
    return count <= most and \
        sum(sum(map(len, texts)) * (count // len(texts)) for texts, _ in columns) <= JSON_COMBINATION_BYTES


def _combined(columns: list[tuple[list[str], Codes]]) -> _Run:
    """A run of columns: the text of each combination of their values, the first column's code varying slowest."""
    import pyarrow as pa

    sizes = [len(texts) for texts, _ in columns]
    grid = np.indices(sizes).reshape(len(sizes), -1)
    each = [pa.array(texts, pa.large_string()).take(g) for (texts, _), g in zip(columns, grid)]
    return _Run(each[0] if len(each) == 1 else _join(each), [codes for _, codes in columns], sizes)


def _lit(text: str) -> Any:
    import pyarrow as pa

    return pa.scalar(text, pa.large_string())


def _join(parts: list[Any]) -> Any:
    """Arrow arrays of text and str, each row's parts joined."""
    import pyarrow.compute as pc

    return pc.binary_join_element_wise(*(_lit(p) if isinstance(p, str) else p for p in parts), _lit(""))


def _coder(col: pd.Series, key: str, span: int, row: RowText) -> tuple[list[str], Codes] | None:
    """Each distinct value's text after ``key`` (the missing last, "null"), and the codes of rows lo..hi into
    them: for a column of anything but numbers, or of integers within ``span`` of each other; None for a column
    of integers to cast a chunk at a time."""
    plain = isinstance(col.dtype, np.dtype)  # (not pandas' nullable types: NA among the values)
    if plain and col.dtype == bool:
        flags = col.to_numpy()
        return [key + row.bools[0], key + row.bools[1]], lambda lo, hi: flags[lo:hi].view(np.int8)
    if col.dtype.kind in "iu":
        values = col.to_numpy() if plain else None
        least, most = (int(values.min()), int(values.max())) if values is not None and len(values) else (0, 0)
        if values is None or most - least >= span:
            return None
        texts = [key + str(v) for v in range(least, most + 1)]
        if values.dtype.kind == "u":  # (subtracted in its own type: it may pass int64's range, and never goes below 0)
            base = values.dtype.type(least)
            return texts, lambda lo, hi: (values[lo:hi] - base).astype(np.intp)
        return texts, lambda lo, hi: values[lo:hi].astype(np.int64) - least
    if isinstance(col.dtype, pd.CategoricalDtype):
        uniques, codes = list(col.cat.categories), col.cat.codes.to_numpy()
    else:  # by value (strings, bools among NaN: NaN and None are -1)
        try:
            codes, found = pd.factorize(col)
            uniques = list(found)
        except TypeError:  # lists
            codes, uniques = by_object(col.to_numpy(object))
        if _numeric(uniques):  # (then by type and value: each keeps its own text)
            values = col.to_numpy(object)
            codes, _ = pd.factorize(np.array([f"{type(v).__name__}:{v!r}" for v in values], object))
            uniques = [values[i] for i in np.unique(codes, return_index=True)[1]]
            codes = np.where(pd.isna(values), -1, codes)
    texts = [key + row.value(u) for u in uniques]
    if len(codes) and codes.min() < 0:  # (the missing: "null", last)
        codes = np.where(codes < 0, len(texts), codes)
        texts.append(key + row.missing)
    codes = codes.astype(np.min_scalar_type(len(texts)), copy=False)
    return texts, lambda lo, hi: codes[lo:hi]


def _numeric(uniques: list[Any]) -> bool:
    """Whether an object column's distinct values hold numbers or bools, which ``pd.factorize`` may have taken
    as one where their text differs (True, 1 and 1.0; 0.0 and -0.0): rare, and then worked out a value at a
    time."""
    return any(isinstance(u, (bool, np.bool_, numbers.Number)) and not pd.isna(u) for u in uniques)


def _cast(col: pd.Series, missing: str) -> Callable[[int, int], list[Any]]:
    """A column of integers' text for rows lo..hi, ``missing`` where missing (converted to Arrow once: no pandas
    on the threads)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    numbers = pa.array(col, from_pandas=True)
    if not numbers.null_count:
        return lambda lo, hi: [pc.cast(numbers.slice(lo, hi - lo), pa.large_string())]
    return lambda lo, hi: [pc.fill_null(pc.cast(numbers.slice(lo, hi - lo), pa.large_string()), _lit(missing))]


def _float_texts(v: np.ndarray, missing: str = "null") -> list[Any]:
    """Each value's shortest text, a whole number's with ".0" (Arrow writes 3.0 as "3"), ``missing`` where not
    finite (the parts of the row text: where every value is whole, ".0" is a part of its own)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    finite = np.isfinite(v)
    # whole numbers below 1e10 (from there on Arrow writes an exponent) cast as integers, which is quicker
    whole = finite & (np.abs(v) < 1e10) & (v == np.trunc(v)) & ~((v == 0) & np.signbit(v))
    if whole.all():
        return [pc.cast(pa.array(v.astype(np.int64)), pa.large_string()), ".0"]
    every = bool(finite.all())
    text = pc.cast(pa.array(v, mask=None if every else ~finite), pa.large_string())  # (null: not finite)
    fix = finite & (v == np.trunc(v))  # (whole: ".0" where Arrow wrote no point nor exponent; -0.0 too)
    if fix.any():  # (the few rows that need it, made apart and put back in one pass)
        some = text.filter(pa.array(fix))
        dotted = pc.binary_join_element_wise(some, _lit(".0"), _lit(""))
        some = dotted if whole[fix].all() else pc.if_else(pc.match_substring_regex(some, "[.eE]"), some, dotted)
        text = pc.replace_with_mask(text, pa.array(fix), some)
    return [text if every else pc.fill_null(text, _lit(missing))]


#: Values :func:`by_object` looks up at a time (its working arrays: ~30 B a value).
BY_OBJECT_CHUNK = 1_000_000


def _identities(objects: np.ndarray) -> np.ndarray:
    """Each value's ``id``: in CPython an object array holds its objects' addresses, which ``id`` returns, so a
    contiguous one's buffer is read as integers (a tenth of ``id`` called per value: 60 ns each)."""
    if sys.implementation.name == "cpython" and objects.dtype == object and objects.flags.c_contiguous:
        held = (ctypes.c_ssize_t * len(objects)).from_address(objects.ctypes.data) if len(objects) else []
        return np.array(held, np.int64)  # (a copy: ``objects`` may go while the codes are made)
    return np.fromiter(map(id, objects), np.int64, len(objects))


def by_object(values: np.ndarray) -> tuple[np.ndarray, list[Any]]:
    """``values`` (unhashable ones: lists) factorized by identity: each one's code, and one value per distinct
    object, in first-seen order (the instances of one range share their ``gpus`` list: a few distinct lists). The
    codes are of the narrowest signed type that also holds their count. A chunk of values at a time: a long run's
    instances hold millions."""
    codes = np.empty(len(values), np.int64 if len(values) > 2**31 - 2 else np.int32)
    code_of: dict[int, int] = {}  # (each distinct object's id -> its code)
    distinct: list[Any] = []
    for lo in range(0, len(values), BY_OBJECT_CHUNK):
        part = values[lo:lo + BY_OBJECT_CHUNK]
        local, ids = pd.factorize(_identities(part))
        first = np.flatnonzero(~pd.Series(local, copy=False).duplicated().to_numpy())  # (codes count up as first seen)
        for i, at in zip(ids.tolist(), first.tolist()):
            if i not in code_of:
                code_of[i] = len(distinct)
                distinct.append(part[at])
        codes[lo:lo + len(part)] = np.array([code_of[i] for i in ids.tolist()], codes.dtype)[local]
    return codes.astype(np.min_scalar_type(-len(distinct) - 1), copy=False), distinct


def _plain(value: Any) -> Any:
    """A value json cannot write as it is: a numpy number as the number, anything else as its text."""
    return value.item() if isinstance(value, np.generic) else str(value)


def _holds_table(doc: Any) -> bool:
    return isinstance(doc, pd.DataFrame) or isinstance(doc, dict) and any(_holds_table(v) for v in doc.values())


def normalize_bus_id(bus_id: str) -> str:
    """'00000000:1A:00.0' / '0000:1a:00.0' -> '0000:1a:00.0' (the sysfs spelling, lower case), as reports key GPUs."""
    domain, rest = bus_id.strip().lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


#: The event attach adds to a process's events where its trace file filled up (``id``: the file's size in
#: bytes, ``t_ns``: its last event; what came later was lost).
TRACE_FULL = "tracefull"

#: The event a second copy of the injection library (loaded from another path into the same process) writes
#: into the trace of the copy that records (``message``: the second copy's path): it only forwarded to it.
SECOND_COPY = "copy"

#: ``meta["launch_counter"]`` of `attach --no-count-launches` (also the C library's PCIETRACE_COUNT): launches
#: were not counted, so their counts are unknown (NaN), not 0.
NO_LAUNCH_COUNTER = "none"

SCHEMA_NAME = "pcietrace.report"
SCHEMA_VERSION = 1
SCHEMA = f"{SCHEMA_NAME}/{SCHEMA_VERSION}"


class Invalid(Exception):
    """``where``: the field (``meta.gpus[0].nvml_index``); the message says what was wrong."""

    def __init__(self, where: str, what: str) -> None:
        self.where, self.what = where, what
        super().__init__(f"{where}: {what}")


Check = Callable[[Any, str], None]


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _type(name: str, ok: Callable[[Any], bool]) -> Check:
    def check(v: Any, where: str) -> None:
        if not ok(v):
            raise Invalid(where, f"expected {name}, got {_show(v)}")
    return check


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_num64(v: Any) -> bool:
    """A number a 64-bit column holds (an int beyond 64 bits is not)."""
    return _is_num(v) and (isinstance(v, float) or -2**63 <= v < 2**63)


INT = _type("a 64-bit integer", lambda v: isinstance(v, int) and _is_num64(v))
NUM = _type("a number", _is_num64)
FINITE = _type("a finite number >= 0", lambda v: _is_num(v) and math.isfinite(v) and v >= 0)
STR = _type("a string", lambda v: isinstance(v, str))
#: A sampling interval: the parser's widest bound (--sample-interval-ms 0..60000); beyond it bins overflow.
INTERVAL_MS = _type("a number of ms in 0..60000", lambda v: _is_num(v) and 0 <= v <= 60_000)
RANGE = _type("[MIN, MAX] finite numbers", lambda v: isinstance(v, list) and len(v) == 2
              and all(_is_num(x) and math.isfinite(x) for x in v))
BOOL = _type("true or false", lambda v: isinstance(v, bool))
#: A process's exit code as a shell gives it (128 + a signal's number for a signal death).
EXIT_CODE = _type("an exit code in 0..255", lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255)


def opt(check: Check) -> Check:
    """``check``, or null."""
    return lambda v, where: None if v is None else check(v, where)


def list_of(check: Check) -> Check:
    def run(v: Any, where: str) -> None:
        if not isinstance(v, list):
            raise Invalid(where, f"expected a list, got {_show(v)}")
        for i, x in enumerate(v):
            check(x, f"{where}[{i}]")
    return run


def obj(required: dict[str, Check], optional: dict[str, Check] | None = None) -> Check:
    def run(v: Any, where: str) -> None:
        if not isinstance(v, dict):
            raise Invalid(where, f"expected an object, got {_show(v)}")
        for key, check in required.items():
            if key not in v:
                raise Invalid(f"{where}.{key}", "missing")
            check(v[key], f"{where}.{key}")
        for key, check in (optional or {}).items():
            if key in v:
                check(v[key], f"{where}.{key}")
    return run


COUNTER = obj({"mode": STR, "bits": INT})
GPU = obj({"nvml_index": INT}, {"cuda_ordinal": opt(INT), "name": STR, "bus_id": STR, "uuid": opt(STR),
                                "counter": COUNTER, "pcie_gen_current": opt(INT), "pcie_gen_max": opt(INT),
                                "pcie_width_current": opt(INT), "pcie_width_max": opt(INT), "numa_node": opt(INT),
                                "timing_cpu": opt(INT), "timed_beside_others": BOOL})
HOP = obj({"bdf": STR, "role": STR, "vendor": STR, "device": STR, "link_speed": opt(STR), "link_width": opt(INT),
           "max_link_speed": opt(STR), "max_link_width": opt(INT)}, {"pci_class": STR})
TOPOLOGY = obj({"gpus": list_of(obj({"bdf": STR, "host_bridge": STR, "hops": list_of(HOP), "switch_levels": opt(INT)},
                                    {"numa_node": opt(INT), "local_cpulist": opt(STR), "nvml_index": opt(INT),
                                     "name": opt(STR)}))},
               {"source": STR, "sysfs_root": opt(STR), "labels": list_of(STR), "matrix": list_of(list_of(STR)),
                "nvlinks": list_of(list_of(INT)), "notes": list_of(STR)})
LAUNCH_COSTS = obj({"host_us_per_eager_launch": NUM, "host_us_per_graph_launch": NUM, "wall_us_per_kernel_eager": NUM,
                    "wall_us_per_kernel_graph": NUM, "source": STR})
PROCESS = obj({"pid": INT, "nvtx": BOOL, "cupti": STR, "ranges": INT},
              {"devices": list_of(STR), "edges": INT, "edge_ns": FINITE, "edges_ms": FINITE, "ranges_unrecorded": INT})
META = obj({"gpus": list_of(GPU)},
           {"simulated": BOOL, "status": STR, "kind": STR, "topology": opt(TOPOLOGY), "launch_costs": opt(LAUNCH_COSTS),
            "t_app_start_ns": INT, "t_app_end_ns": INT, "exit_code": opt(EXIT_CODE), "processes": list_of(PROCESS),
            "sample_interval_ms": INTERVAL_MS, "driver": opt(STR), "host": STR, "created": STR, "sim_source": STR,
            "plan": obj({}), "command": list_of(STR), "failed_reads": obj({}), "exact_edges": BOOL,
            "sampler_duty": FINITE, "idle_sample_interval_ms": INTERVAL_MS,
            "quiet_sample_interval_ms": INTERVAL_MS, "slow_domains": STR, "max_depth": opt(INT),
            "graphs_plan": obj({"kernel_us": RANGE}, {"sync": BOOL, "param_sets": INT, "order": STR}), "timing": STR,
            "trace_bad": obj({"lines": _type("a count >= 0", lambda v: isinstance(v, int) and not isinstance(v, bool)
                                             and 0 <= v < 2**63), "files": list_of(STR)}),
            # a recording whose process died before saving it (pcietrace/store.py: salvage)
            "interrupted": obj({"how": STR, "lost_at_most_s": FINITE},
                               {"recovered_from": STR, "last_sample_ns": opt(INT), "saved_as": STR})})
ATTACH_META = obj({"t_app_start_ns": INT, "t_app_end_ns": INT})
GRAPHS_META = obj({"graphs_plan": obj({"kernel_us": RANGE})})
#: What each kind of session's metadata must hold beyond :data:`META` (an attach whose program never ran,
#: "attach-failed", has no program times).
KIND_META = {"attach": ATTACH_META, "graphs": GRAPHS_META}
#: ``meta.kind`` of every kind of session (none: a run's).
KINDS = ("run", "latency", "attach", "attach-failed", "graphs")
DOC = obj({"schema": STR, "meta": META, "tables": obj({})}, {"results": obj({})})

#: Column kinds: "int" (integers, no nulls), "pos" (integers >= 1, no nulls: graph sizes, which analyses divide
#: by), "num" (numbers, nulls allowed), "str" (strings, nulls allowed), "bool" (true/false, no nulls).
WINDOW_COLUMNS = {"nvml_index": "int", "mode": "str", "t_start_ns": "int", "t_end_ns": "int"}
TABLE_COLUMNS: dict[str, dict[str, str]] = {
    "samples": {c: "int" if c in ("nvml_index", "t_ns") else "num" for c in SAMPLE_COLUMNS},
    "windows": WINDOW_COLUMNS,
    "bursts": {"nvml_index": "int", "mode": "str", "graph_k": "pos", "kernel_us": "num", "calls": "num",
               "launches": "num", "host_ns": "num", "cpu_ns": "num", "gpu_ns": "num", "saturated": "bool"},
    "contexts": {"nvml_index": "int", "context": "int", "mode": "str", "kernel_us": "num", "launches": "num",
                 "gpu_ns": "num", "saturated": "bool"},
    "e2e": {"nvml_index": "int", "mode": "str", "graph_k": "pos", "kernel_us": "num", "launches": "num",
            "wall_ns": "num"},
    "calibration": {"nvml_index": "int", "kernel_us": "num", "measured_us": "num", "min_us": "num", "max_us": "num"},
    "latency": {"nvml_index": "int", "test": "str", "peer": "int", "value_us": "num"},
    "events": {"t_ns": "int", "tid": "int", "event": "str", "domain": "str", "id": "int", "depth": "int",
               "eager_thread": "int", "graph_thread": "int", "eager_process": "int", "graph_process": "int",
               "message": "str", "pid": "int"},
    # `pcietrace graphs`: one row per timed iteration (see pcietrace.record.graphs)
    "graphs": {"kernels": "pos", "strategy": "str", "round": "int", "iteration": "int", "wall_ns": "num",
               "cpu_ns": "num", "prep_ns": "num", "submit_ns": "num", **{c: "int" for c in COUNT_COLUMNS}},
}
#: Launches into a stream being captured into a graph (counted apart from eager/graph since they were recorded).
CAPTURED_COLUMNS = ("captured_thread", "captured_process")
#: Cumulative ns inside eager launch calls and inside synchronize calls (-1: not timed; interpose mode times them).
TIMING_COLUMNS = ("call_ns_thread", "call_ns_process", "wait_ns_thread", "wait_ns_process")
#: Groups of columns a table has all of or none of (each group on its own): events recorded before device
#: tracking lack ``dev`` and ``devmask``; those recorded before captured launches were told apart lack
#: ``captured_thread`` and ``captured_process``; those recorded before launch and synchronize calls were timed
#: lack the ``call_ns_*`` and ``wait_ns_*`` columns. Bursts of `run` name the launch path (Python, native...)
#: since the native core; older ones lack ``path``.
OPTIONAL_COLUMNS: dict[str, list[dict[str, str]]] = {
    "bursts": [{"path": "str"}],
    "events": [{"dev": "int", "devmask": "int"}, dict.fromkeys(CAPTURED_COLUMNS, "int"),
               dict.fromkeys(TIMING_COLUMNS, "int")]}
#: The windows of `pcietrace graphs` carry the workload size and round.
GRAPHS_WINDOW_COLUMNS = {**WINDOW_COLUMNS, "kernels": "pos", "round": "int", "iterations": "int"}
#: The windows of `pcietrace run` (not attach) carry the launch plan too.
RUN_WINDOW_COLUMNS = {**WINDOW_COLUMNS, "purpose": "str", "graph_k": "pos", "calls": "num", "launches": "num",
                      "kernel_us": "num", "target_rate_hz": "num", "achieved_rate_hz": "num"}


#: The windows' columns of each kind of session (``meta["kind"]``; none, or a kind not listed: a run's, which
#: carry the launch plan); an attach's windows are its idle windows, with no more than :data:`WINDOW_COLUMNS`.
WINDOW_COLUMNS_BY_KIND = {"graphs": GRAPHS_WINDOW_COLUMNS, "attach": WINDOW_COLUMNS, "attach-failed": WINDOW_COLUMNS}


def table_columns(name: str, meta: dict[str, Any]) -> dict[str, str]:
    """The declared columns of table ``name`` in a session with ``meta`` (run windows carry the plan)."""
    if name == "windows":
        return WINDOW_COLUMNS_BY_KIND.get(str(meta.get("kind")), RUN_WINDOW_COLUMNS)
    return TABLE_COLUMNS[name]


def schema_version(schema: Any) -> int | None:
    """The version number of a ``pcietrace.report/N`` schema string, else None."""
    if not isinstance(schema, str) or not schema.startswith(SCHEMA_NAME + "/"):
        return None
    tail = schema[len(SCHEMA_NAME) + 1:]
    return int(tail) if tail.isdigit() else None


#: The deepest nesting of lists and objects read from a JSON file (a report nests about 6 deep, a topology
#: fixture about 5): deeper input is refused before anything recurses into it.
MAX_JSON_DEPTH = 64


def load_json(raw: bytes | str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``raw`` parsed as JSON, refused with :class:`ValueError` ("nested too deeply") beyond ``max_depth`` levels
    (the depth is counted on the text, outside strings, before the parser or anything after it recurses)."""
    text = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
    if json_depth(text) > max_depth:
        raise ValueError(f"nested too deeply (more than {max_depth} levels)")
    doc = json.loads(raw)
    # a lone surrogate (an escape JSON allows, text no encoder writes) becomes U+FFFD: pandas, Parquet and every
    # output would fail on it; (the depth is limited above, so the walk below cannot recurse too deep)
    return _no_surrogates(doc) if re.search(rb"\\u[dD][89a-fA-F]", text) else doc


_SURROGATE = re.compile("[\ud800-\udfff]")


def _no_surrogates(o: Any) -> Any:
    if isinstance(o, str):
        return _SURROGATE.sub("\ufffd", o)
    if isinstance(o, list):
        return [_no_surrogates(v) for v in o]
    if isinstance(o, dict):
        return {_no_surrogates(k): _no_surrogates(v) for k, v in o.items()}
    return o


def json_depth(text: bytes) -> int:
    """The deepest nesting of ``[``/``{`` in JSON ``text``, brackets inside strings not counted (vectorised:
    quotes not escaped by an odd run of backslashes toggle "inside a string")."""
    b = np.frombuffer(text, np.uint8)
    if not b.size:
        return 0
    bs = b == 92  # backslash
    quote = b == 34
    # a quote is escaped if the run of backslashes right before it is odd
    idx = np.arange(b.size)
    last_non_bs = np.maximum.accumulate(np.where(~bs, idx, -1))
    run = idx - np.concatenate(([-1], last_non_bs[:-1])) - 1  # backslashes immediately before each byte
    real_quote = quote & (run % 2 == 0)
    inside = (np.cumsum(real_quote) - real_quote) % 2 == 1
    step = np.where(~inside & ((b == 91) | (b == 123)), 1, 0) - np.where(~inside & ((b == 93) | (b == 125)), 1, 0)
    return int(np.cumsum(step).max(initial=0))


def check_doc(doc: Any) -> None:
    """The parsed ``report.json``: schema version, metadata keys and types, tables as lists of records."""
    if not isinstance(doc, dict):
        raise Invalid("top level", f"expected an object, got {_show(doc)}")
    version = schema_version(doc.get("schema"))
    if version is None:
        raise Invalid("schema", f"not a {SCHEMA} report (schema: {_show(doc.get('schema'))})")
    if version > SCHEMA_VERSION:
        raise Invalid("schema", f"written by a newer pcietrace ({doc['schema']}); this version reads {SCHEMA}: upgrade it")
    if version < SCHEMA_VERSION:
        raise Invalid("schema", f"{doc['schema']} is older than {SCHEMA} and cannot be read")
    DOC(doc, "report")
    kind = doc["meta"].get("kind")
    if kind is not None and kind not in KINDS:  # (else a missing table of another kind was what it said)
        raise Invalid("meta.kind", f"unknown kind {_show(kind)} (one of {', '.join(KINDS)})")
    KIND_META.get(str(kind), obj({}))(doc["meta"], "meta")
    seen: set[int] = set()
    for i, g in enumerate(doc["meta"]["gpus"]):  # tables are keyed by nvml_index: one GPU record each
        if g["nvml_index"] in seen:
            raise Invalid(f"meta.gpus[{i}].nvml_index", f"GPU {g['nvml_index']} is listed twice")
        seen.add(g["nvml_index"])
    for name, records in doc["tables"].items():
        list_of(obj({}))(records, f"tables.{name}")


def check_table(df: pd.DataFrame, name: str, columns: dict[str, str]) -> pd.DataFrame:
    """``df`` with its declared ``columns`` present and of their kind; a numeric column that came back as
    objects only because all its values are null becomes float. An empty table passes, given the declared
    columns (the analysis then finds none of its rows rather than none of its columns)."""
    if not len(df):
        return empty_table(columns) if not len(df.columns) else df
    for optional in OPTIONAL_COLUMNS.get(name, []):
        if any(c in df.columns for c in optional):
            columns = {**columns, **optional}
    for col, kind in columns.items():
        where = f"{name}.{col}"
        if col not in df.columns:
            raise Invalid(where, "missing column")
        s = df[col]
        if kind in ("int", "pos", "num"):
            if s.dtype == object and s.isna().all():
                df[col] = s = s.astype(float)
            if not pd.api.types.is_numeric_dtype(s) or pd.api.types.is_bool_dtype(s):
                raise Invalid(where, f"expected 64-bit numbers, got {_show(_odd(s, _is_num64))}")
            if kind != "num" and (s.isna().any() or (s.dtype.kind in "fu" and not (s.abs() < 2**63).all())
                                  or (s.dtype.kind == "f" and not (s == s.round()).all())):
                raise Invalid(where, "expected whole numbers (64-bit) with no nulls")
            if kind == "pos" and (s < 1).any():
                raise Invalid(where, f"expected whole numbers >= 1, got {_show(s[s < 1].iloc[0].item())}")
        elif kind == "str" and not (isinstance(s.dtype, pd.StringDtype) and not s.isna().any()) \
                and not pd.Series(s.cat.categories if isinstance(s.dtype, pd.CategoricalDtype) else s, dtype=object).map(
                    lambda v: v is None or isinstance(v, str)).all():  # (a string column passes at once; codes: their names)
            raise Invalid(where, f"expected strings, got {_show(_odd(s, lambda v: isinstance(v, str)))}")
        elif kind == "bool" and not pd.api.types.is_bool_dtype(s):
            raise Invalid(where, f"expected true/false, got {_show(_odd(s, lambda v: isinstance(v, bool)))}")
    return df


def empty_table(columns: dict[str, str]) -> pd.DataFrame:
    """No rows, the declared ``columns`` of their kinds."""
    dtypes = {"int": "int64", "pos": "int64", "num": "float64", "bool": "bool", "str": "object"}
    return pd.DataFrame({c: pd.Series(dtype=dtypes[k]) for c, k in columns.items()})


def _odd(s: pd.Series, ok: Callable[[Any], bool]) -> Any:
    """The first value of ``s`` that is not what was expected (for the error message)."""
    return next((v for v in s if not ok(v)), s.dtype)
