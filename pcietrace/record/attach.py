"""`pcietrace attach`: run an unmodified program under the counter sampler with the injection library.

The program inherits NVTX_INJECTION64_PATH pointing at pcietrace's injection library, and LD_PRELOAD
(launches counted by interposition, the default) or CUDA_INJECTION64_PATH (``--launch-counter cupti``) too
(:func:`injection_env`), so every process it starts (children included, unless they clear their environment)
writes its NVTX ranges and launch counts to ``trace-<pid>.tsv`` in a trace folder. See
``pcietrace/native/pt_inject.c`` for the record format.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pandas as pd

from pcietrace.errors import PcietraceError, UsageError
from pcietrace.schema import CAPTURED_COLUMNS, NO_LAUNCH_COUNTER, TIMING_COLUMNS, TRACE_FULL

if TYPE_CHECKING:
    from pcietrace.record.guard import RunFolder, Saving

#: The injection library's interface version this pcietrace expects (pt_abi.h: PT_ABI_VERSION); the library
#: carries it as the string :data:`INJECT_ABI_TAG`, so it is checked without loading the library.
INJECT_ABI = 1
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
#: by their field count.
TRACE_COLUMNS = {1: EVENT_COLUMNS_V1, 2: EVENT_COLUMNS_V2, 3: EVENT_COLUMNS_V3, 4: EVENT_COLUMNS}
#: Trace file size per process with ``--gpu-time`` (one line per kernel; sparse, so unused space costs nothing).
GPU_TIME_TRACE_BYTES = 1 << 30


def injection_library() -> str:
    """Path of the built injection library (installed with the package), once it is known to speak this
    pcietrace's interface (:data:`INJECT_ABI`): a library left from another version's build is refused."""
    from pcietrace.device.native import built

    path = built("_pt_inject")
    if INJECT_ABI_TAG not in Path(path).read_bytes():
        raise UsageError(f"pcietrace's injection library {path} was built from other sources (it lacks interface "
                         f"version {INJECT_ABI}): rebuild it (pip install ., or python3 setup.py build_ext --inplace)")
    return path


#: Bytes the injection library keeps free at the end of a trace file for its "tracefull" line (pt_abi.h:
#: PT_TRACE_RESERVE).
TRACE_RESERVE_BYTES = 256


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
    """All ``trace-<pid>.tsv`` files of a folder as one frame (:data:`EVENT_COLUMNS` plus ``pid``; traces
    from older libraries keep :data:`EVENT_COLUMNS_V3`, :data:`EVENT_COLUMNS_V2` or :data:`EVENT_COLUMNS_V1`).

    Never fails on what a file holds: a line that is not a trace line (wrong field count, a number that is not
    one, a file that is not a trace: another name, not a regular file, unreadable) is left out and counted in
    ``attrs["bad_lines"]`` (``attrs["bad_files"]``: the files left out whole), the rest kept. Text that is not
    UTF-8 (a name the library cut inside a character) is decoded with U+FFFD; a CR stays inside its field."""
    frames, bad_lines, bad_files = [], 0, []
    for f in sorted(Path(trace_dir).glob("trace-*.tsv")):
        pid = f.stem[len("trace-"):]
        try:
            if not (pid.isdecimal() and f.is_file() and not f.is_symlink()):
                raise OSError("not a trace file")
            raw = _trace_lines(f)
        except OSError:
            bad_files.append(f.name)
            continue
        df, bad = _parse_trace(raw)
        bad_lines += bad
        if len(df):
            frames.append(df.assign(pid=int(pid)))
    if not frames:
        out = pd.DataFrame(columns=EVENT_COLUMNS + ["pid"])
    else:
        out = pd.concat(frames, ignore_index=True).sort_values("t_ns", kind="stable").reset_index(drop=True)
        if "devmask" in out.columns:
            out["devmask"] = out["devmask"].astype(np.uint64)
    out.attrs.update(bad_lines=bad_lines, bad_files=bad_files)
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


def calibrate(ordinal: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The records of the per-launch costs, measured on the spot on one GPU (run in a child process, so no
    CUDA context stays open while the application runs): :func:`calibration_records` on a fresh context."""
    from pcietrace.device.backend import CudaBackend
    from pcietrace.record.generate import LaunchGenerator

    with contextlib.closing(CudaBackend(ordinal)) as backend:
        return calibration_records(LaunchGenerator(backend))


def calibration_records(gen: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(bursts, e2e)`` through ``gen`` (a :class:`~pcietrace.record.generate.LaunchGenerator`): bursts for the
    host us per eager launch / per graph launch (queue never full), end-to-end records for the wall us per
    kernel eager vs graph (K=100, empty kernels). :func:`pcietrace.analysis.costs.from_records` makes them the
    launch costs, in the command (record/ does not import analysis)."""
    bursts = [gen.burst("eager", 0.0, 1, 900), gen.burst("graph", 0.0, 100, 9)]
    e2e = [gen.end_to_end(mode, 0.0, k, 4000) for _ in range(3) for mode, k in (("eager", 1), ("graph", 100))]
    return bursts, e2e



#: How long attach waits for the per-launch cost measurement (it takes ~2 s on an H100).
CALIBRATE_TIMEOUT_S = 120.0


def _answer(conn: Any, fn: Callable[[int], Any], ordinal: int) -> None:
    """The calibration child: ``fn(ordinal)`` or the exception it raised, sent back through ``conn``."""
    try:
        conn.send((True, fn(ordinal)))
    except BaseException as exc:  # noqa: BLE001 -- the parent re-raises it
        try:
            conn.send((False, exc))
        except Exception:  # an exception that does not pickle: its text
            conn.send((False, PcietraceError(f"{type(exc).__name__}: {exc}")))


def calibrate_in_child(ordinal: int, timeout_s: float = CALIBRATE_TIMEOUT_S,
                       fn: Callable[[int], Any] = calibrate) -> Any:
    """``fn(ordinal)`` (default :func:`calibrate`) in a spawned child, so no CUDA context stays open in
    pcietrace while the program runs. A child that has not answered within ``timeout_s`` is killed and the
    measurement fails with one line (a hung driver call must not hang attach); one that dies without an
    answer (a crash in the driver) fails at once (a Pool would have waited out the timeout for it)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_answer, args=(send, fn, ordinal), daemon=True, name="pcietrace-calibrate")
    child.start()
    send.close()  # only the child holds the sending end: its death ends the pipe (EOF)
    try:
        if not recv.poll(timeout_s):
            raise PcietraceError(f"the per-launch cost measurement did not finish within {timeout_s:g} s "
                                 "(--no-calibrate skips it)")
        try:
            ok, value = recv.recv()
        except EOFError:
            child.join(5)
            raise PcietraceError(f"the per-launch cost measurement ended without an answer (exit code "
                                 f"{child.exitcode}; --no-calibrate skips it)") from None
    finally:
        if child.is_alive():
            child.kill()
        child.join()
        recv.close()
    if not ok:
        raise value
    return value


def run_program(cmd: list[str], env: dict[str, str], stdout: Any = None) -> tuple[int, int, int]:
    """Run ``cmd`` with ``env``; return (exit code, start and end on CLOCK_MONOTONIC in ns). Ctrl-C, SIGTERM and
    SIGHUP sent to pcietrace are passed on to the program and are not fatal to pcietrace, which waits for the
    program and then saves what was collected (``timeout``, ``kill`` and a closed terminal included); signals
    already ignored stay ignored. A SIGINT while pcietrace runs in a terminal's foreground is taken to be
    Ctrl-C, which the program got from the terminal itself, and is not passed on a second time. A signal death is reported as 128 + signal, like a shell. ``stdout``: where
    the program's output goes (default: ours)."""
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=stdout)
    except OSError as exc:
        raise UsageError(f"cannot start {cmd[0]!r}: {exc.strerror}") from None
    t0 = time.monotonic_ns()
    passed_on = [s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None))
                 if s is not None and signal.getsignal(s) is not signal.SIG_IGN]

    def pass_on(signum: int, _: Any) -> None:
        # Ctrl-C in a terminal reaches the whole foreground process group, the program included: passing it
        # on as well would interrupt the program twice (e.g. its clean-up after the first KeyboardInterrupt).
        # Asked at the signal, of the program's group: one that left ours (setsid) gets no Ctrl-C but ours.
        if not (signum == signal.SIGINT and _terminal_foreground(proc.pid)):
            proc.send_signal(signum)

    old = {s: signal.signal(s, pass_on) for s in passed_on}
    try:
        rc = proc.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    t1 = time.monotonic_ns()
    return (128 - rc if rc < 0 else rc), t0, t1


def _terminal_foreground(pid: int = 0) -> bool:
    """Whether the process group of ``pid`` (0: pcietrace's own, which the program it starts is in unless it
    leaves it) is the foreground group of pcietrace's controlling terminal, the group a Ctrl-C there reaches
    (asked of /dev/tty, not stdin: with stdin redirected the terminal still sends Ctrl-C to the group)."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:  # no controlling terminal (CI, a service, setsid)
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgid(pid)
    except OSError:
        return False
    finally:
        os.close(fd)


def injection_env(trace_dir: Path, launch_counter: str, edge_file: str | None, nvml_indices: list[int],
                  exact_edges: bool, gpu_time: bool = False, slow_domains: str = "") -> dict[str, str]:
    """The program's environment: NVTX (and CUDA, for CUPTI) injection, the trace folder, the edge file the
    samplers wait on, and whether the library reads the counters itself at range edges.
    ``launch_counter``: "interpose" (the library in LD_PRELOAD hands out counting trampolines for the launch
    entry points), "cupti" (CUDA_INJECTION64_PATH, CUPTI driver callbacks) or "none". ``gpu_time``: CUPTI
    kernel activity records too (each kernel's start and end on the GPU: "kernel" events). ``slow_domains``:
    comma-separated NVTX domains whose ranges do not keep the samplers at the fast rate."""
    lib = injection_library()
    env = dict(os.environ, NVTX_INJECTION64_PATH=lib, PCIETRACE_TRACE_DIR=str(trace_dir),
               PCIETRACE_NVML_INDICES=",".join(str(i) for i in nvml_indices))
    if edge_file:
        env["PCIETRACE_EDGE_FILE"] = edge_file
    if exact_edges:
        env["PCIETRACE_EXACT_EDGES"] = "1"
    if slow_domains:
        env["PCIETRACE_SLOW_DOMAINS"] = slow_domains
    if launch_counter == "cupti" or gpu_time:
        from pcietrace.device.cuda import cupti_library

        env["CUDA_INJECTION64_PATH"] = lib
        cupti = cupti_library()
        if cupti:
            env["PCIETRACE_CUPTI"] = cupti
    if gpu_time:
        env["PCIETRACE_GPU_TIME"] = "1"
        env.setdefault("PCIETRACE_TRACE_BYTES", str(GPU_TIME_TRACE_BYTES))
    env["PCIETRACE_COUNT"] = launch_counter  # "none" with --gpu-time: CUPTI is loaded, its launch callbacks are not
    if launch_counter == "interpose":
        env["LD_PRELOAD"] = " ".join(filter(None, [lib, os.environ.get("LD_PRELOAD")]))
    return env


def idle_windows(sampler: Any, nvml_indices: list[int], seconds: float, windows: list[dict[str, Any]]) -> None:
    """``seconds`` of idle time as four windows per GPU, the sampler alternately reading and paused, so the
    floor model can tell bytes per counter read from the remaining background (appends to ``windows``).
    No range is open then, so the sampler is held at its fast rate: the reading windows must span the read
    densities the program's ranges see, or the per-read term is fitted on idle-rate reads alone."""
    sampler.hold_fast(True)
    try:
        for sampling in ("on", "paused", "on", "paused"):
            sampler.pause(sampling == "paused")
            t = time.monotonic_ns()
            time.sleep(seconds / 4)
            windows.extend({"nvml_index": i, "mode": "idle", "sampling": sampling, "t_start_ns": t,
                            "t_end_ns": time.monotonic_ns()} for i in nvml_indices)
    finally:
        sampler.pause(False)
        sampler.hold_fast(False)


def processes(events: pd.DataFrame, launch_counter: str = "interpose") -> list[dict[str, Any]]:
    """Per process seen: pid, whether NVTX initialised, how its launches were counted (``launch_counter``
    "none": not at all), its ranges, the PCI bus ids of the CUDA devices it used, and whether its trace file
    filled up (later events lost)."""
    out = []
    for pid, g in events.groupby("pid"):
        cupti = g[g["event"].isin(["cupti", "interpose"])]["message"].tolist()
        how = ("off (--no-count-launches)" if launch_counter == NO_LAUNCH_COUNTER else
               cupti[-1] if cupti else "not loaded (process made no CUDA driver call)")
        out.append({"pid": int(pid), "nvtx": bool((g["event"] == "nvtx").any()), "cupti": how,
                    "ranges": int(g["event"].isin(["push", "start"]).sum()),
                    "devices": sorted(set(g.loc[g["event"] == "cudevice", "message"])),
                    "trace_full": bool((g["event"] == TRACE_FULL).any())})
    return out


class Recording:
    """What attach keeps beside the traced program: one sampling process per GPU (``sampler``), the edge page
    they wait on (``edge_file``) and the folder the injection library writes its traces to (``trace_dir``).
    A context manager: entering starts the samplers (a failed or interrupted start leaves nothing behind);
    leaving stops them if :meth:`collect` has not, and removes the page and the folder whatever happened."""

    def __init__(self, nvml_indices: list[int], interval_ns: int, max_duty: float, idle_interval_ns: int) -> None:
        from pcietrace.collectors import CounterSampler, edges

        self.trace_dir = Path(tempfile.mkdtemp(prefix=f"pcietrace-{os.getpid()}-"))  # (pid: see guard.sweep_leftovers)
        self.edge_file = ""
        self.collected = False
        try:  # no page, or a sampler refusing its settings: then no folder or page stays behind either
            self.edge_file = edges.create()
            self.sampler = CounterSampler(nvml_indices, interval_ns=interval_ns, edge_file=self.edge_file,
                                          max_duty=max_duty, idle_interval_ns=idle_interval_ns,
                                          spill_dir=self.trace_dir)  # (flat memory over a long run)
        except BaseException:
            self._remove()
            raise

    def __enter__(self) -> "Recording":
        self.start()
        return self

    def start(self) -> None:
        """Start the samplers; a failed or interrupted start leaves no page or folder behind."""
        try:
            self.sampler.start()
        except BaseException:
            self._remove()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            if not self.collected:
                self.sampler.stop()
        finally:
            self._remove()

    def collect(self, session: Any, windows: list[dict[str, Any]], launch_counter: str) -> None:
        """Into ``session``: the samplers' samples merged with the library's edge reads, the traces' events, the
        idle ``windows`` and the processes seen. The samplers are stopped first, so that none is left running
        if a trace cannot be read."""
        from pcietrace.collectors import merge_samples

        samples = self.sampler.stop()
        self.collected = True  # (after: a stop cut short by a signal is finished on leaving)
        session.events = read_traces(self.trace_dir)
        session.meta["trace_bad"] = {"lines": session.events.attrs["bad_lines"], "files": session.events.attrs["bad_files"]}
        session.samples = merge_samples([samples, edge_samples(session.events)])
        session.windows = pd.DataFrame(windows)
        session.meta["processes"] = processes(session.events, launch_counter)

    def _remove(self) -> None:
        shutil.rmtree(self.trace_dir, ignore_errors=True)
        if self.edge_file:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.edge_file)


def record_attach(session: Any, folder: RunFolder | None, idle_s: float, program_stdout: Any,
                  analyze: Callable[[], Any], write_trace: Callable[[Any, Any, Path], None], *,
                  to_jsonable: Callable[[Any], Any], tell: Callable[[str], None]) -> Saving:
    """Run the program ``session.meta["command"]`` under the samplers and the injection library, with the
    settings the command put in ``session.meta`` (GPUs, sampling, launch counter, edges, GPU time), between
    ``idle_s`` seconds of idle windows; then ``analyze()``, save into ``folder`` (a
    :class:`~pcietrace.record.guard.RunFolder`, None: not saved) and write the Perfetto trace beside the saved
    run (``write_trace(session, results, path)``). ``program_stdout``: where the program's output goes (None:
    ours). ``to_jsonable`` and ``tell`` go to :class:`~pcietrace.record.guard.Saving` (``tell`` also says the
    program is starting). Returns the Saving; its ``end`` gives the exit code (the program's, or 128 + a
    signal's). A program that could not start is a :class:`UsageError`, nothing saved."""
    from pcietrace import signals
    from pcietrace.record.guard import Saving, discard_on_error

    meta = session.meta
    with contextlib.ExitStack() as stack:  # the samplers, edge page and trace folder: released on every way out
        with discard_on_error(folder):  # nothing was recorded: no staging folder either
            with signals.deferred():  # made and owned in one step: a signal between would leave them behind
                rec = Recording([g["nvml_index"] for g in meta["gpus"]], int(meta["sample_interval_ms"] * 1e6),
                                meta["sampler_duty"], int(meta["idle_sample_interval_ms"] * 1e6))
                stack.push(rec)
            rec.start()
        for g in meta["gpus"]:
            g["counter"] = rec.sampler.modes.get(g["nvml_index"])
        end = _AttachEnd(rec, stack, write_trace)
        saving = Saving(session, folder, analyze, to_jsonable=to_jsonable, tell=tell, partial_if_interrupted=False,
                        before=end.collect, after=end.trace, saved_line=end.saved_line, what=end.what)
        with saving:  # before and after the program signals save like Ctrl-C; during it run_program passes them on
            try:
                _run_between_idle_windows(session, rec, end.windows, idle_s, program_stdout, tell)
            except UsageError:  # the program could not start (ENOEXEC...): refused like a missing one, nothing saved
                if saving.folder is not None and "t_app_start_ns" not in meta:
                    saving.folder.discard()
                    saving.folder = None
                raise
    return saving


def _run_between_idle_windows(session: Any, rec: Recording, windows: list[dict[str, Any]], idle_s: float,
                              program_stdout: Any, tell: Callable[[str], None]) -> None:
    """Idle windows, the program (its exit code and times into ``session.meta``), idle windows again."""
    meta = session.meta
    indices = [g["nvml_index"] for g in meta["gpus"]]
    idle_windows(rec.sampler, indices, idle_s, windows)
    tell(f"pcietrace: running {' '.join(meta['command'])}")
    env = injection_env(rec.trace_dir, meta["launch_counter"], rec.edge_file, indices, meta["exact_edges"],
                        gpu_time=meta["gpu_time"], slow_domains=meta["slow_domains"])
    rc, t0, t1 = run_program(meta["command"], env, stdout=program_stdout)
    meta.update(t_app_start_ns=t0, t_app_end_ns=t1, exit_code=rc, status="complete")
    idle_windows(rec.sampler, indices, idle_s, windows)


class _AttachEnd:
    """What attach does around its save, with signals held (:class:`~pcietrace.record.guard.Saving`'s hooks),
    and what it says after: the samplers stopped and the traces read before, the Perfetto trace after."""

    def __init__(self, rec: Recording, stack: contextlib.ExitStack,
                 write_trace: Callable[[Any, Any, Path], None]) -> None:
        self.rec, self.stack, self.write_trace = rec, stack, write_trace
        self.windows: list[dict[str, Any]] = []
        self.trace_failed = False
        self.trace_info: Any = None  # what write_trace says of the file it wrote

    def collect(self, saving: Saving) -> None:
        """Held from here: a signal while the samplers stop and the traces are read lost them all."""
        from pcietrace.record.guard import discard_on_error

        meta = saving.session.meta
        with discard_on_error(saving.folder):  # (an unreadable trace) nothing to save: no staging folder left either
            self.rec.collect(saving.session, self.windows, meta["launch_counter"])
        if "t_app_start_ns" not in meta:  # the program never ran: keep what exists, no attribution
            meta.update(kind="attach-failed", status="interrupted before the program ran")

    def trace(self, saving: Saving) -> None:
        """The Perfetto trace beside a saved attach run; one that cannot be written leaves the run saved, whole."""
        from pcietrace.errors import one_line
        from pcietrace.record.guard import say

        out_dir = saving.out_dir
        if out_dir is not None and saving.session.meta["kind"] == "attach" and saving.results is not None:
            try:
                self.trace_info = self.write_trace(saving.session, saving.results, out_dir / "trace.json")
            except Exception as exc:  # (disk full, out of memory) the run itself is saved: say so, keep it whole
                (out_dir / "trace.json").unlink(missing_ok=True)
                say(f"pcietrace: error: could not write the Perfetto trace into {out_dir} "
                    f"({one_line(exc) or type(exc).__name__}); the run is saved there and "
                    f"`pcietrace report {out_dir} --perfetto FILE` writes it later")
                self.trace_failed = True
        elif out_dir is not None and saving.session.meta["kind"] == "attach":
            self.trace_failed = True  # (the analysis failed: no figures to draw)
        self.stack.close()  # the edge page and trace folder go while signals still wait

    def saved_line(self, saving: Saving) -> str:
        written = saving.session.meta["kind"] == "attach" and not self.trace_failed
        return f"saved to {saving.out_dir}" + (f" (Perfetto trace: {saving.out_dir / 'trace.json'}{trace_size(self.trace_info)})"
                                               if written else "")

    def what(self, saving: Saving) -> str:
        """What an attach run interrupted by a signal saved."""
        meta = saving.session.meta
        return (f"the run (the program had ended, exit code {exit_code(meta)})" if meta["kind"] == "attach"
                else "what was recorded before the program ran")


def trace_size(info: Any) -> str:
    """", 12 MB, 1,000,000 of 4,200,000 ranges" from :func:`pcietrace.report.perfetto.write_trace`'s answer."""
    if not isinstance(info, dict):
        return ""
    left = (f", {info['ranges_shown']:,} of {info['ranges_recorded']:,} ranges (outermost first)"
            if info["ranges_shown"] < info["ranges_recorded"] else "")
    return f", {info['bytes'] / 1e6:,.1f} MB{left}"


def exit_code(meta: dict[str, Any]) -> int:
    """The program's exit code (1 until it has run: a signal can cut the collection short before a failed run
    is marked ``attach-failed``)."""
    return int(meta.get("exit_code", 1))
