"""The injection library's side of attach: its interface version, and the trace files it writes.

Each traced process writes ``trace-<pid>.bin`` in the trace folder: binary event records and their strings
(``pcietrace/native/pt_abi.h`` gives the layout, ``pt_inject.c`` the fields); older libraries wrote text lines,
``trace-<pid>.tsv``. :func:`read_traces` turns a folder of either into one frame of events.
"""

from __future__ import annotations

import io
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pcietrace.errors import UsageError
from pcietrace.memory import release_freed
from pcietrace.schema import CAPTURED_COLUMNS, TIMING_COLUMNS, narrow_int

#: The injection library's interface version this pcietrace expects (pt_abi.h: PT_ABI_VERSION); the library
#: carries it as the string :data:`INJECT_ABI_TAG`, so it is checked without loading the library.
INJECT_ABI = 5
INJECT_ABI_TAG = b"pcietrace-inject-abi %d\0" % INJECT_ABI
#: A trace file's first line: ``TRACE_MAGIC VERSION`` (pt_abi.h: PT_TRACE_MAGIC, PT_TRACE_VERSION).
TRACE_MAGIC = b"#pcietrace-trace"
EVENT_COLUMNS = ["t_ns", "tid", "event", "domain", "id", "depth", "eager_thread", "graph_thread",
                 "eager_process", "graph_process", "dev", "devmask", "captured_thread", "captured_process",
                 "call_ns_thread", "call_ns_process", "wait_ns_thread", "wait_ns_process", "message"]
#: The columns of traces written before launch and synchronize calls were timed.
EVENT_COLUMNS_V3 = [c for c in EVENT_COLUMNS if c not in TIMING_COLUMNS]
#: The columns of traces written before captured launches were told apart (they counted them as eager).
EVENT_COLUMNS_V2 = [c for c in EVENT_COLUMNS_V3 if c not in CAPTURED_COLUMNS]
#: The columns of traces written before device tracking (no ``dev``/``devmask``).
EVENT_COLUMNS_V1 = [c for c in EVENT_COLUMNS_V2 if c not in ("dev", "devmask")]
#: Each trace version's columns. Traces from version 4 on name it in their first line; older ones are told apart
#: by their field count. Version 5 is binary (:data:`EVENT_DTYPE`), the others text.
TRACE_COLUMNS = {1: EVENT_COLUMNS_V1, 2: EVENT_COLUMNS_V2, 3: EVENT_COLUMNS_V3, 4: EVENT_COLUMNS, 5: EVENT_COLUMNS}
#: The version the injection library writes (pt_abi.h: PT_TRACE_VERSION).
TRACE_VERSION = 5
#: A binary trace's header (pt_abi.h: struct pt_trace_header, PT_TRACE_HEADER_BYTES).
HEADER_DTYPE = np.dtype([("line", "S64")] + [(n, "<u8") for n in (
    "events_at", "events_cap", "strings_at", "strings_cap", "events_taken", "strings_taken", "timed_edges",
    "timed_ns", "unrecorded_ranges")])
#: One range edge in this many of each thread's is timed by the library (pt_abi.h: PT_EDGE_TIMED_EVERY).
EDGE_TIMED_EVERY = 61
#: One event record (pt_abi.h: struct pt_event).
EVENT_DTYPE = np.dtype(
    [(n, "<u8") for n in ("t_ns", "id", "eager_thread", "graph_thread", "eager_process", "graph_process", "devmask",
                          "captured_thread", "captured_process")]
    + [(n, "<i8") for n in ("call_ns_thread", "call_ns_process", "wait_ns_thread", "wait_ns_process")]
    + [("str_at", "<u8"), ("tid", "<i4"), ("depth", "<i4"), ("dev", "<i2"), ("message_bytes", "<u2"),
       ("event_bytes", "u1"), ("domain_bytes", "u1"), ("reserved", "u1"), ("commit", "u1")])


def injection_library() -> str:
    """Path of the built injection library (installed with the package), once it is known to speak this
    pcietrace's interface (:data:`INJECT_ABI`): a library left from another version's build is refused."""
    from pcietrace.device.native import built

    path = built("_pt_inject")
    if INJECT_ABI_TAG not in Path(path).read_bytes():
        raise UsageError(f"pcietrace's injection library {path} was built from other sources (it lacks interface "
                         f"version {INJECT_ABI}): rebuild it (pip install ., or python3 setup.py build_ext --inplace)")
    return path


#: Bytes the injection library keeps free at the end of a trace file (a text trace) or of its strings (a binary
#: one) for its "tracefull" event (pt_abi.h: PT_TRACE_RESERVE).
TRACE_RESERVE_BYTES = 256


#: sync_file_range(2) flags: start writing the range's dirty pages and wait for them (linux/fs.h)
_SYNC_RANGE = 1 | 2 | 4  # SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER


def write_through(trace_dir: Path) -> None:
    """The part of every binary trace in ``trace_dir`` that its writers have taken, handed to the disk (the file
    system makes it durable at its next commit: ext4's is every 5 s). Only that part: the library maps its pages a
    few MB ahead of the writers, and an fsync of the whole file wrote those back too, so the program took a
    write fault on each again as it went on. Never fails; text traces and systems without sync_file_range get an
    fsync."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    ranged = getattr(libc, "sync_file_range", None)
    for f in Path(trace_dir).glob("trace-*.*"):
        try:
            fd = os.open(f, os.O_RDONLY)
        except OSError:
            continue
        try:
            head = os.pread(fd, HEADER_DTYPE.itemsize, 0)
            if ranged is None or f.suffix != ".bin" or len(head) < HEADER_DTYPE.itemsize:
                os.fsync(fd)
                continue
            h = np.frombuffer(head, HEADER_DTYPE, count=1)[0]
            taken = ((0, int(h["events_at"]) + int(h["events_taken"])), (int(h["strings_at"]), int(h["strings_taken"])))
            for at, n in taken:  # (the header, with the events taken; the strings taken)
                ranged(fd, ctypes.c_int64(at), ctypes.c_int64(n), ctypes.c_uint(_SYNC_RANGE))
        except OSError:
            pass
        finally:
            os.close(fd)
    try:  # (the folder's entries: the files' names)
        fd = os.open(trace_dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def _trace_lines(f: Path) -> bytes:
    """A trace file's whole lines. The file was preallocated (sparse): lines, zeros, and, where it filled up, a
    "tracefull" line in the last :data:`TRACE_RESERVE_BYTES`. The file is cut to those lines."""
    with open(f, "r+b") as fh:
        size = os.fstat(fh.fileno()).st_size
        if not size:
            return b""
        with mmap.mmap(fh.fileno(), 0) as mm:
            end = mm.find(b"\0")  # stops at the first zero: the unwritten part is never read
            if end < 0:  # already cut (read before) or from an older library
                return mm[:]
            tail = max(size - TRACE_RESERVE_BYTES, 0)  # lines may end right where the reserve begins
            # a line cut short (its process killed while copying it in: SIGKILL, OOM, torchrun ending a rank)
            # is dropped whole: its fields are missing, and a part of a number would be a wrong number
            lines = b"".join(_whole_lines(part) for part in (mm[:min(end, tail)], mm[tail:].strip(b"\0")))
        fh.seek(0)
        fh.write(lines)
        fh.truncate(len(lines))
    return lines


def _whole_lines(text: bytes) -> bytes:
    """``text`` up to and including its last newline."""
    return text[:text.rfind(b"\n") + 1]


#: Text columns of a trace line; every other column is an integer (``devmask`` unsigned 64-bit).
TEXT_COLUMNS = ("event", "domain", "message")
_LAYOUTS = (EVENT_COLUMNS, EVENT_COLUMNS_V3, EVENT_COLUMNS_V2, EVENT_COLUMNS_V1)
#: Decimal integers that fit int64 (and uint64 for ``devmask``) without overflow.
_INT64 = r"-?(?:\d{1,18}|[0-8]\d{18})"
_UINT64 = r"\d{1,19}|1[0-7]\d{18}"


def read_traces(trace_dir: Path) -> pd.DataFrame:
    """All ``trace-<pid>.bin`` and ``trace-<pid>.tsv`` files of a folder as one frame (:data:`EVENT_COLUMNS` plus ``pid``; traces
    from older libraries keep :data:`EVENT_COLUMNS_V3`, :data:`EVENT_COLUMNS_V2` or :data:`EVENT_COLUMNS_V1`).

    Never fails on what a file holds: a line that is not a trace line (wrong field count, a number that is not
    one, a file that is not a trace: another name, not a regular file, unreadable) is left out and counted in
    ``attrs["bad_lines"]`` (``attrs["bad_files"]``: the files left out whole), the rest kept. Text that is not
    UTF-8 (a name the library cut inside a character) is decoded with U+FFFD; a CR stays inside its field.
    ``attrs["edge_timing"]``: per pid, the range edges its library timed and the ns they took
    (:data:`EDGE_TIMED_EVERY`; binary traces of a library that times them only); ``attrs["unrecorded_ranges"]``:
    per pid, the push ranges its library left unrecorded (attach ``--max-depth``; where there were any)."""
    parts, bad_lines, bad_files, timing, unrecorded = [], 0, [], {}, {}
    files = sorted([*Path(trace_dir).glob("trace-*.bin"), *Path(trace_dir).glob("trace-*.tsv")])
    # the files read at once (one per process under torchrun): their gathers, casts and string work run in numpy
    # and pyarrow, which release the GIL
    with ThreadPoolExecutor(max(min(len(files), os.cpu_count() or 1, 8), 1)) as pool:
        for f, (cols, bad, counts) in zip(files, pool.map(_read_file, files)):
            if cols is None:
                bad_files.append(f.name)
                continue
            bad_lines += bad
            pid = int(f.stem[len("trace-"):])
            if counts is not None and counts[0]:
                timing[pid] = counts[:2]
            if counts is not None and counts[2]:
                unrecorded[pid] = counts[2]
            if cols:
                parts.append(cols)
    if not parts:
        out = pd.DataFrame(columns=EVENT_COLUMNS + ["pid"])
    elif any(list(c) != list(parts[0]) for c in parts):  # traces of several versions: their columns differ
        out = pd.concat([pd.DataFrame({k: v.to_numpy(zero_copy_only=False) if hasattr(v, "to_numpy") else v
                                       for k, v in c.items()}) for c in parts], ignore_index=True)
        out = out.sort_values("t_ns", kind="stable").reset_index(drop=True)
    else:  # one column at a time, in time order (a long run's events: a copy of the whole frame less at a time)
        import pyarrow as pa

        order = np.argsort(np.concatenate([c["t_ns"] for c in parts]), kind="stable")
        data = {}
        for name in list(parts[0]):
            chunks = [c.pop(name) for c in parts]
            if name in TEXT_COLUMNS:
                data[name] = _strings_in_order(chunks, order)
            else:
                v = np.concatenate(chunks)[order]
                data[name] = v.astype(narrow_int(v.dtype, v.min(), v.max(), name), copy=False) if v.size else v
            del chunks
            release_freed()  # (the files' columns came from the reading threads' own malloc arenas, which this
            # thread cannot reuse: kept, the merge held a long run's events almost twice over)
        # columns as they are, none copied into a block of all (pandas' own constructor stacked every integer
        # column into one 2-D block: a second copy of the events at the peak); held as Session.load holds them
        # (integers in 32 bits where they fit, names as categories)
        out = pa.table(data).to_pandas(split_blocks=True, self_destruct=True)
        del data
        pa.default_memory_pool().release_unused()  # (Arrow's pool keeps the files' strings and takes: hand them back)
        release_freed()
    if parts and "devmask" in out.columns and out["devmask"].dtype.kind == "i":  # (a text trace's parser: int64)
        out["devmask"] = out["devmask"].astype(np.uint64)
    out.attrs.update(bad_lines=bad_lines, bad_files=bad_files, edge_timing=timing, unrecorded_ranges=unrecorded)
    return out


def _read_file(f: Path) -> tuple[dict[str, Any] | None, int, tuple[int, int, int] | None]:
    """One trace file's columns with its ``pid`` (none where it holds no event; None where it is left out whole),
    the number of its lines left out and its header's counts (:func:`_read_binary`; None: a text trace; see
    :func:`read_traces`)."""
    counts = None
    pid = f.stem[len("trace-"):]
    try:
        if not (pid.isdecimal() and f.is_file() and not f.is_symlink()):
            raise OSError("not a trace file")
        if f.suffix == ".bin":
            cols, bad, counts = _read_binary(f)
        else:
            df, bad = _parse_trace(_trace_lines(f))
            cols = {c: df[c].to_numpy() for c in df.columns}
    except OSError:
        return None, 0, None
    n = len(next(iter(cols.values()), ()))
    return ({**cols, "pid": np.full(n, int(pid), np.int64)} if n else {}), bad, counts


def _strings_in_order(chunks: list, order: np.ndarray) -> "pa.Array":
    """One text column of every file (a binary trace's: an Arrow dictionary array; a text trace's: str objects)
    in ``order``: binary traces' as one dictionary array (a category per distinct string), else strings."""
    import pyarrow as pa

    if all(isinstance(x, pa.DictionaryArray) for x in chunks):
        unified = pa.chunked_array(chunks).unify_dictionaries().chunks
        codes = pa.concat_arrays([x.indices.cast(pa.int32()) for x in unified]).take(order)
        return pa.DictionaryArray.from_arrays(codes, unified[0].dictionary)
    return pa.concat_arrays([x.dictionary.take(x.indices) if isinstance(x, pa.DictionaryArray) else
                             pa.array(x, pa.large_string()) for x in chunks]).take(order)


#: Records gathered from a mapped binary trace at a time: each batch's pages are let go once read, so a file being
#: read keeps a few MB of its mapping resident, not all of it (files read at once would each hold theirs whole).
GATHER_RECORDS = 1 << 16


def _read_binary(f: Path) -> tuple[dict[str, np.ndarray], int, tuple[int, int, int]]:
    """A binary trace (version 5) as its columns (:data:`EVENT_COLUMNS`), the number of records left out
    (records taken but never committed: a process killed while writing one; or whose strings lie outside the
    strings taken), and the range edges its library timed with the ns they took and the ranges it left unrecorded
    (0, 0, 0: none, or an older library's trace). Raises OSError for a file that is not one (too short, another
    version: nothing read as if it were this one). Records are read from the mapped file a batch at a time (:func:`_gather`)."""
    with open(f, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        if len(mm) < HEADER_DTYPE.itemsize:
            raise OSError("not a trace file")
        h = np.frombuffer(mm, HEADER_DTYPE, count=1).copy()[0]
        if h["line"].split(b"\n")[0] != b"%s %d" % (TRACE_MAGIC, TRACE_VERSION):
            raise OSError("not a trace of this version")
        ev_at, ev_cap, str_at, str_cap = (int(h[k]) for k in ("events_at", "events_cap", "strings_at", "strings_cap"))
        size = EVENT_DTYPE.itemsize
        if not (ev_cap >= size and ev_cap % size == 0 and ev_at + ev_cap <= str_at and str_at + str_cap <= len(mm)
                and str_cap >= TRACE_RESERVE_BYTES):
            raise OSError("not a trace file")
        slots = ev_cap // size
        view = np.frombuffer(mm, EVENT_DTYPE, count=slots, offset=ev_at)  # (the last slot: the "tracefull" event)
        n = min(int(h["events_taken"]), ev_cap - size) // size
        idx = np.arange(n, dtype=np.int64)
        if view["commit"][slots - 1] == 1:
            idx = np.append(idx, slots - 1)
        rec = _gather(mm, ev_at, view, idx)
        del view
        start = rec["str_at"].astype(np.int64)
        lengths = rec["event_bytes"].astype(np.int64) + rec["domain_bytes"] + rec["message_bytes"]
        used = min(int(h["strings_taken"]), str_cap - TRACE_RESERVE_BYTES)
        in_reserve = (start >= str_cap - TRACE_RESERVE_BYTES) & (start + lengths <= str_cap)
        ok = (rec["commit"] == 1) & (((start >= 0) & (start + lengths <= used)) | in_reserve)
        # a record never begun (its thread took a block of them and wrote fewer; pt_inject.c, block_take) is no loss
        unused = int(((rec["commit"] == 0) & (rec["t_ns"] == 0) & (rec["tid"] == 0) & (rec["event_bytes"] == 0)).sum())
        order = np.argsort(np.where(ok, start, np.iinfo(np.int64).max), kind="stable")[:int(ok.sum())]
        ends = (start + lengths)[order]  # strings of two records never overlap; where they do, the later is left out
        overlap = np.zeros(len(order), bool)
        overlap[1:] = start[order][1:] < np.maximum.accumulate(ends)[:-1]
        keep = np.sort(order[~overlap])  # the records kept (their places in idx), in file order
        bad = len(idx) - len(keep) - unused
        if len(keep) < len(idx):
            rec = {c: v[keep] for c, v in rec.items()}
        del start, lengths, ends, order, idx
        del keep
        cols = _binary_strings(mm, str_at, rec)
    counts = int(h["timed_edges"]), int(h["timed_ns"]), int(h["unrecorded_ranges"])
    return {c: cols[c] if c in cols else rec[c] for c in EVENT_COLUMNS}, bad, counts


def _gather(mm: mmap.mmap, at: int, view: np.ndarray, idx: np.ndarray) -> dict[str, np.ndarray]:
    """The fields of records ``idx`` (ascending) of ``view``, mapped from ``mm`` at byte ``at``: the event columns
    as int64 (``devmask`` uint64), the others as stored. :data:`GATHER_RECORDS` at a time, each batch's pages let
    go once read (they stay in the page cache)."""
    out = {c: np.empty(len(idx), np.uint64 if c == "devmask" else np.int64 if c in EVENT_COLUMNS else view.dtype[c])
           for c in view.dtype.names if c != "reserved"}
    size = view.dtype.itemsize
    for lo in range(0, len(idx), GATHER_RECORDS):
        part = view[idx[lo:lo + GATHER_RECORDS]]
        for c, v in out.items():
            v[lo:lo + len(part)] = part[c]
        begin = (at + int(idx[lo]) * size) // mmap.PAGESIZE * mmap.PAGESIZE
        mm.madvise(mmap.MADV_DONTNEED, begin, at + (int(idx[lo + len(part) - 1]) + 1) * size - begin)
    return out


def _binary_strings(mm: mmap.mmap, str_at: int, rec: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The event, domain and message of each record (Arrow dictionary arrays), cut from the strings part in one
    pass: the records' strings, in the order they lie, are the elements of one Arrow binary array (event,
    domain, message, then the gap to the next record's), taken back into the records' order."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(rec["str_at"])
    if not n:
        return {c: pa.array([], pa.large_string()).dictionary_encode() for c in TEXT_COLUMNS}
    order = np.argsort(rec["str_at"], kind="stable")
    offsets = np.empty(4 * n + 1, np.int64)  # (each record's event, domain and message end where the next begins)
    offsets[0:4 * n:4] = rec["str_at"][order]
    for k, c in enumerate(("event_bytes", "domain_bytes", "message_bytes")):
        offsets[k + 1:4 * n:4] = offsets[k:4 * n:4] + rec[c][order]
    offsets[4 * n] = offsets[4 * n - 1]
    data = pa.py_buffer(memoryview(mm)[str_at:str_at + int(offsets[4 * n])])
    whole = pa.LargeBinaryArray.from_buffers(pa.large_binary(), 4 * n, [None, pa.py_buffer(offsets), data])
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)
    del order
    out = {}
    for k, c in enumerate(TEXT_COLUMNS):  # (event, domain, message: their order in the strings part)
        # each distinct string decoded and cleaned once (a training loop's million ranges hold a few dozen names)
        enc = whole.take(pa.array(4 * rank + k)).dictionary_encode()
        names = enc.dictionary
        try:
            names = names.cast(pa.large_string())
        except pa.ArrowInvalid:  # a name the library cut inside a UTF-8 character
            names = pa.array([b.decode("utf-8", "replace") for b in names.to_pylist()], pa.large_string())
        # a tab or newline in a name becomes a space, so that it prints on one line (as text traces had it)
        names = pc.replace_substring_regex(names, "[\t\n]", " ")
        out[c] = pa.DictionaryArray.from_arrays(enc.indices, names)
        del enc, names
    del whole, data
    return out


def _parse_trace(raw: bytes) -> tuple[pd.DataFrame, int]:
    """One trace file's whole lines as a frame, and the number of lines left out (see :func:`read_traces`).
    The layout is the one its first line names (``TRACE_MAGIC VERSION``: :data:`TRACE_COLUMNS`), or, in a trace
    without that line (an older library's), the one most lines have; a trace of a version this pcietrace does
    not know (a newer library's) is left out whole, every line counted. Lines are split on LF only."""
    cut = version = 0
    if raw.startswith(TRACE_MAGIC):
        head, _, raw = raw.partition(b"\n")
        tail = head[len(TRACE_MAGIC):].strip()
        if not (tail.isdigit() and int(tail) in TRACE_COLUMNS):
            return pd.DataFrame(), 1 + raw.count(b"\n") + (bool(raw) and not raw.endswith(b"\n"))
        version = int(tail)
    if raw and not raw.endswith(b"\n"):  # (a file read before, or written by another program: a last line cut)
        raw, cut = raw[:raw.rfind(b"\n") + 1], 1
    if not raw:
        return pd.DataFrame(), cut
    buf = np.frombuffer(raw, np.uint8)
    ends = np.flatnonzero(buf == 10)
    starts = np.concatenate(([0], ends[:-1] + 1))
    tabs = np.concatenate(([0], np.cumsum(buf == 9)))
    fields = tabs[ends] - tabs[starts] + 1
    counts = {len(n): int((fields == len(n)).sum()) for n in _LAYOUTS}
    names = TRACE_COLUMNS[version] if version > 0 else max(_LAYOUTS, key=lambda n: counts[len(n)])
    keep = fields == len(names)
    bad = int((~keep).sum()) + cut
    if not keep.any():
        return pd.DataFrame(), bad
    if bad:  # the kept lines' bytes, in order
        raw = buf[np.repeat(keep, ends - starts + 1)].tobytes()
    read = dict(sep="\t", names=names, header=None, quoting=3, lineterminator="\n", keep_default_na=False,
                encoding_errors="replace")
    ints = [c for c in names if c not in TEXT_COLUMNS]
    try:  # the usual trace: every line whole and numeric, typed by the parser
        df = pd.read_csv(io.BytesIO(raw), dtype={c: str for c in TEXT_COLUMNS}, **read)
        if all(df[c].dtype.kind in "iu" for c in ints):
            return df, bad
    except (ValueError, OverflowError):  # (pandas' ParserError is a ValueError)
        pass
    df = pd.read_csv(io.BytesIO(raw), dtype=str, **read)
    ok = np.ones(len(df), bool)
    for c in ints:
        ok &= df[c].str.fullmatch(_UINT64 if c == "devmask" else _INT64).fillna(False).to_numpy(bool)
    df = df[ok].reset_index(drop=True)
    return df.astype({c: np.uint64 if c == "devmask" else np.int64 for c in ints}), bad + int((~ok).sum())


def edge_samples(events: pd.DataFrame) -> pd.DataFrame:
    """The counter reads the injection library made at range edges (``--exact-edges``: "ctr" events,
    message "t_mid_ns read_ns tx rx") as samples (``SAMPLE_COLUMNS``), to merge with the sampler's."""
    from pcietrace.collectors import empty_samples

    ctr = events[events["event"] == "ctr"] if len(events) else events
    if not len(ctr):
        return empty_samples()
    parts = ctr["message"].str.split(" ", expand=True).astype(np.uint64)
    return pd.DataFrame({"nvml_index": ctr["id"].astype(np.int64).to_numpy(), "t_ns": parts[0].astype(np.int64).to_numpy(),
                         "read_ns": parts[1].astype(np.int64).to_numpy(), "tx_raw": parts[2].to_numpy(),
                         "rx_raw": parts[3].to_numpy()})
