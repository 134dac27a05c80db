"""`pcietrace attach`: run an unmodified program under the counter sampler with the injection library.

The program inherits NVTX_INJECTION64_PATH pointing at pcietrace's injection library, and LD_PRELOAD
(launches counted by interposition, the default) or CUDA_INJECTION64_PATH (``--launch-counter cupti``) too
(:func:`injection_env`), so every process it starts (children included, unless they clear their environment)
writes its NVTX ranges and launch counts to a trace file in a trace folder (read by :mod:`pcietrace.record.trace`). See
``pcietrace/native/pt_inject.c`` for the record format.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pandas as pd

from pcietrace.errors import PcietraceError, UsageError
from pcietrace.record.trace import edge_samples, injection_library, read_traces
from pcietrace.schema import NO_LAUNCH_COUNTER, TRACE_FULL

from pcietrace.record.guard import SaveSteps

if TYPE_CHECKING:
    from pcietrace.record.guard import Saving
    from pcietrace.store import RunFolder

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


def run_program(cmd: list[str], env: dict[str, str], stdout: Any = None,
                started: Callable[[int], None] = lambda t0: None) -> tuple[int, int, int]:
    """Run ``cmd`` with ``env``; return (exit code, start and end on CLOCK_MONOTONIC in ns). Signals sent to
    pcietrace meanwhile go to the program (:func:`pcietrace.signals.passed_on`): pcietrace waits for it and then
    saves what was collected. A signal death is reported as 128 + signal, like a shell. ``stdout``: where the
    program's output goes (default: ours); ``started(t0)``: called once it runs."""
    from pcietrace import signals

    try:
        proc = subprocess.Popen(cmd, env=env, stdout=stdout)
    except OSError as exc:
        raise UsageError(f"cannot start {cmd[0]!r}: {exc.strerror}") from None
    t0 = time.monotonic_ns()
    with signals.passed_on(proc):
        started(t0)
        rc = proc.wait()
    t1 = time.monotonic_ns()
    return (128 - rc if rc < 0 else rc), t0, t1


#: What attach tells the injection library per run by being set or left out: one inherited from attach's own
#: environment would change the recording without its meta saying so.
RUN_FLAGS = ("PCIETRACE_EDGE_FILE", "PCIETRACE_EXACT_EDGES", "PCIETRACE_SLOW_DOMAINS", "PCIETRACE_GPU_TIME",
             "PCIETRACE_MAX_DEPTH")


def injection_env(trace_dir: Path, launch_counter: str, edge_file: str | None, nvml_indices: list[int],
                  exact_edges: bool, gpu_time: bool = False, slow_domains: str = "",
                  max_depth: int | None = None) -> dict[str, str]:
    """The program's environment: NVTX (and CUDA, for CUPTI) injection, the trace folder, the edge file the
    samplers wait on, and whether the library reads the counters itself at range edges.
    ``launch_counter``: "interpose" (the library in LD_PRELOAD hands out counting trampolines for the launch
    entry points), "cupti" (CUDA_INJECTION64_PATH, CUPTI driver callbacks) or "none". ``gpu_time``: CUPTI
    kernel activity records too (each kernel's start and end on the GPU: "kernel" events). ``slow_domains``:
    comma-separated NVTX domains whose ranges do not keep the samplers at the fast rate; ``max_depth``: push ranges
    opened this many or more deep in their thread are not recorded (None: all are)."""
    # (every path absolute: a program that changes directory, or starts a child elsewhere, before its first range
    # opens them from there; a relative trace folder, the default runs/..., lost all of its ranges)
    lib = os.path.abspath(injection_library())
    env = {k: v for k, v in os.environ.items() if k not in RUN_FLAGS}
    env.update(NVTX_INJECTION64_PATH=lib, PCIETRACE_TRACE_DIR=os.path.abspath(trace_dir),
               PCIETRACE_NVML_INDICES=",".join(str(i) for i in nvml_indices))
    if edge_file:
        env["PCIETRACE_EDGE_FILE"] = os.path.abspath(edge_file)
    if exact_edges:
        env["PCIETRACE_EXACT_EDGES"] = "1"
    if slow_domains:
        env["PCIETRACE_SLOW_DOMAINS"] = slow_domains
    if max_depth:
        env["PCIETRACE_MAX_DEPTH"] = str(int(max_depth))
    if launch_counter == "cupti" or gpu_time:
        from pcietrace.device.cuda import cupti_library

        env["CUDA_INJECTION64_PATH"] = lib
        cupti = cupti_library()
        if cupti:
            env["PCIETRACE_CUPTI"] = cupti
    if gpu_time:
        env["PCIETRACE_GPU_TIME"] = "1"
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
    "none": not at all), its ranges, the PCI bus ids of the CUDA devices it used, whether its trace file
    filled up (later events lost), and where its library timed them (``events.attrs["edge_timing"]``,
    :func:`read_traces`) its range edges (``edges``: pushes, pops, starts and ends) and what they cost its
    threads: ``edge_ns`` each on average, ``edges_ms`` in all; ``ranges_unrecorded``: push ranges its library left
    out (attach ``--max-depth``; where there were any)."""
    out = []
    kind = events["event"]
    ranges = events.loc[kind.isin(["push", "start"]), "pid"].value_counts()
    edges = events.loc[kind.isin(["push", "pop", "start", "end"]), "pid"].value_counts()
    timing = events.attrs.get("edge_timing", {})
    unrecorded = events.attrs.get("unrecorded_ranges", {})
    # (the few rows these need, not a copy of each process's events: a long run's are gigabytes)
    said = events.loc[kind.isin(["cupti", "interpose", "nvtx", "cudevice", TRACE_FULL]), ["pid", "event", "message"]]
    for pid in sorted(events["pid"].unique()):
        g = said[said["pid"] == pid]
        cupti = g.loc[g["event"].isin(["cupti", "interpose"]), "message"].tolist()
        how = ("off (--no-count-launches)" if launch_counter == NO_LAUNCH_COUNTER else
               cupti[-1] if cupti else "not loaded (process made no CUDA driver call)")
        out.append({"pid": int(pid), "nvtx": bool((g["event"] == "nvtx").any()), "cupti": how,
                    "ranges": int(ranges.get(pid, 0)), "devices": sorted(set(g.loc[g["event"] == "cudevice", "message"])),
                    "trace_full": bool((g["event"] == TRACE_FULL).any())})
        if int(pid) in timing:
            timed, ns = timing[int(pid)]
            n = int(edges.get(pid, 0))
            out[-1].update(edges=n, edge_ns=ns / timed, edges_ms=n * ns / timed / 1e6)
        if unrecorded.get(int(pid)):
            out[-1]["ranges_unrecorded"] = int(unrecorded[int(pid)])
    return out


class Recording:
    """What attach keeps beside the traced program: one sampling process per GPU (``sampler``), the edge page
    they wait on (``edge_file``) and the folder the injection library writes its traces to (``trace_dir``).
    A context manager: entering starts the samplers (a failed or interrupted start leaves nothing behind);
    leaving stops them if :meth:`collect` has not, and removes the page and the folder whatever happened.
    ``scratch``: a folder for the traces (``traces/``) and the samples streamed as they come (``samples/``),
    which outlive this process if it dies (a run folder's :attr:`~pcietrace.store.RunFolder.scratch`); None:
    a temporary folder."""

    def __init__(self, nvml_indices: list[int], interval_ns: int, max_duty: float, idle_interval_ns: int,
                 scratch: Path | None = None, quiet_interval_ns: int = 0) -> None:
        from pcietrace.collectors import CounterSampler, edges

        if scratch is None:
            self.trace_dir = Path(tempfile.mkdtemp(prefix=f"pcietrace-{os.getpid()}-"))  # (pid: see store.sweep_leftovers)
            spill = self.trace_dir
        else:
            self.trace_dir, spill = Path(scratch) / "traces", Path(scratch) / "samples"
            self.trace_dir.mkdir(parents=True)
        self._syncing: threading.Event | None = threading.Event() if scratch is not None else None
        self._syncer: threading.Thread | None = None
        self.edge_file = ""
        self.collected = False
        try:  # no page, or a sampler refusing its settings: then no folder or page stays behind either
            self.edge_file = edges.create()
            self.sampler = CounterSampler(nvml_indices, interval_ns=interval_ns, edge_file=self.edge_file,
                                          max_duty=max_duty, idle_interval_ns=idle_interval_ns,
                                          quiet_interval_ns=quiet_interval_ns, spill_dir=spill)  # (flat memory over a long run)
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
        if self._syncing is not None:
            self._syncer = threading.Thread(target=self._sync_traces, daemon=True, name="pcietrace-sync-traces")
            self._syncer.start()

    def _sync_traces(self) -> None:
        """(A thread, with a scratch folder.) The traces handed to the disk every flush period, as the samples
        are: the library writes them through a shared mapping, whose pages a power cut would lose."""
        from pcietrace.collectors.sampler import FLUSH_S
        from pcietrace.record.trace import write_through

        while not self._syncing.wait(FLUSH_S):
            write_through(self.trace_dir)

    def _stop_syncing(self) -> None:
        if self._syncer is not None:
            self._syncing.set()
            self._syncer.join()
            self._syncer = None

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
        self._stop_syncing()  # (the traces are read now: nothing more to write through)
        session.events = read_traces(self.trace_dir)
        session.meta["trace_bad"] = {"lines": session.events.attrs["bad_lines"], "files": session.events.attrs["bad_files"]}
        session.samples = merge_samples([samples, edge_samples(session.events)])
        session.windows = pd.DataFrame(windows)
        session.meta["processes"] = processes(session.events, launch_counter)

    def _remove(self) -> None:
        self._stop_syncing()
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
    :class:`~pcietrace.store.RunFolder`, None: not saved) and write the Perfetto trace beside the saved
    run (``write_trace(session, results, path)``). ``program_stdout``: where the program's output goes (None:
    ours). ``to_jsonable`` and ``tell`` go to :class:`~pcietrace.record.guard.Saving` (``tell`` also says the
    program is starting). Returns the Saving; its ``end`` gives the exit code (the program's, or 128 + a
    signal's). A program that could not start is a :class:`UsageError`, nothing saved."""
    from pcietrace import signals
    from pcietrace.record.guard import Saving
    from pcietrace.store import discard_on_error

    meta = session.meta
    with contextlib.ExitStack() as stack:  # the samplers, edge page and trace folder: released on every way out
        with discard_on_error(folder):  # nothing was recorded: no staging folder either
            with signals.deferred():  # made and owned in one step: a signal between would leave them behind
                rec = Recording([g["nvml_index"] for g in meta["gpus"]], int(meta["sample_interval_ms"] * 1e6),
                                meta["sampler_duty"], int(meta["idle_sample_interval_ms"] * 1e6),
                                scratch=folder.scratch if folder is not None else None,
                                quiet_interval_ns=int(meta.get("quiet_sample_interval_ms", 0.0) * 1e6))
                stack.push(rec)
            rec.start()
        for g in meta["gpus"]:
            g["counter"] = rec.sampler.modes.get(g["nvml_index"])
        end = _AttachEnd(rec, stack, write_trace)
        end.journal = functools.partial(_journal, folder, meta, end.windows)
        end.journal()
        saving = Saving(session, folder, analyze, to_jsonable=to_jsonable, tell=tell, partial_if_interrupted=False,
                        steps=end)
        with saving:  # before and after the program signals save like Ctrl-C; during it run_program passes them on
            try:
                _run_between_idle_windows(session, rec, end.windows, idle_s, program_stdout, tell, end.journal)
            except UsageError:  # the program could not start (ENOEXEC...): refused like a missing one, nothing saved
                if saving.folder is not None and "t_app_start_ns" not in meta:
                    saving.folder.discard()
                    saving.folder = None
                raise
    return saving


def _journal(folder: RunFolder | None, meta: dict[str, Any], windows: list[dict[str, Any]], whole: bool = False,
             **more: Any) -> None:
    """The run so far into ``folder``'s journal (:meth:`~pcietrace.store.RunFolder.journal`), for a recovery should
    this process die before saving; ``more``: meta fields known by now; ``whole``: the recording is over and all on
    disk (the samplers stopped, the program ended). Not written (no room, folder gone): the run goes on, only a
    crash would lose more."""
    from pcietrace.collectors.sampler import FLUSH_S

    if folder is not None:
        with contextlib.suppress(OSError):
            folder.journal({**meta, **more}, windows=windows, flush_s=FLUSH_S, whole=whole)


def _run_between_idle_windows(session: Any, rec: Recording, windows: list[dict[str, Any]], idle_s: float,
                              program_stdout: Any, tell: Callable[[str], None],
                              journal: Callable[..., None] = lambda **more: None) -> None:
    """Idle windows, the program (its exit code and times into ``session.meta``), idle windows again;
    ``journal(**meta fields)`` once the program runs."""
    meta = session.meta
    indices = [g["nvml_index"] for g in meta["gpus"]]
    idle_windows(rec.sampler, indices, idle_s, windows)
    tell(f"pcietrace: running {' '.join(meta['command'])}")
    env = injection_env(rec.trace_dir, meta["launch_counter"], rec.edge_file, indices, meta["exact_edges"],
                        gpu_time=meta["gpu_time"], slow_domains=meta["slow_domains"], max_depth=meta.get("max_depth"))
    rc, t0, t1 = run_program(meta["command"], env, stdout=program_stdout,
                             started=lambda t: journal(t_app_start_ns=t))
    meta.update(t_app_start_ns=t0, t_app_end_ns=t1, exit_code=rc, status="complete")
    journal()  # (killed in the idle windows after: the program's end and exit code are known)
    idle_windows(rec.sampler, indices, idle_s, windows)


class _AttachEnd(SaveSteps):
    """What attach does around its save, with signals held, and what it says after (its
    :class:`~pcietrace.record.guard.SaveSteps`): the samplers stopped and the traces read before, the Perfetto
    trace once the report is shown (a long run's trace takes seconds the user need not wait on)."""

    def __init__(self, rec: Recording, stack: contextlib.ExitStack,
                 write_trace: Callable[[Any, Any, Path], None]) -> None:
        self.rec, self.stack, self.write_trace = rec, stack, write_trace
        self.windows: list[dict[str, Any]] = []
        self.journal: Callable[..., None] = lambda **more: None

    def before(self, saving: Saving) -> None:
        """Held from here: a signal while the samplers stop and the traces are read lost them all."""
        from pcietrace.store import discard_on_error

        meta = saving.session.meta
        with discard_on_error(saving.folder):  # (an unreadable trace) nothing to save: no staging folder left either
            self.rec.collect(saving.session, self.windows, meta["launch_counter"])
        if "t_app_start_ns" not in meta:  # the program never ran: keep what exists, no attribution
            meta.update(kind="attach-failed", status="interrupted before the program ran")
        self.journal(whole=True)  # (killed while analysing or saving a long run: recovered whole)

    def after(self, saving: Saving) -> None:
        self.stack.close()  # the edge page and trace folder go while signals still wait

    def later(self, saving: Saving) -> None:
        """The Perfetto trace beside a saved attach run; one that cannot be written (or is cut short by a signal)
        leaves the run saved, whole, and no partial trace.json."""
        from pcietrace import signals
        from pcietrace.errors import one_line
        from pcietrace.record.guard import say

        out_dir = _trace_dir(saving)
        if out_dir is None:
            return
        path = out_dir / "trace.json"
        later = f"the run is saved there and `pcietrace report {out_dir} --perfetto FILE` writes it later"
        try:
            info = self.write_trace(saving.session, saving.results, path)
        except KeyboardInterrupt:
            with signals.deferred():  # (a second signal must not cut the clean-up short)
                for f in (path, *out_dir.glob(f".{path.name}.*.tmp")):  # (and write_trace's own temporary file)
                    f.unlink(missing_ok=True)
                say(f"pcietrace: interrupted: the Perfetto trace was not written into {out_dir}; {later}")
            raise
        except Exception as exc:  # (disk full, out of memory) the run itself is saved: say so, keep it whole
            path.unlink(missing_ok=True)
            say(f"pcietrace: error: could not write the Perfetto trace into {out_dir} "
                f"({one_line(exc) or type(exc).__name__}); {later}")
            return
        saving.tell(f"Perfetto trace: {path}{trace_size(info)}")

    def left(self, saving: Saving) -> str:
        out_dir = _trace_dir(saving)
        return "" if out_dir is None else f"; no Perfetto trace (`pcietrace report {out_dir} --perfetto FILE` writes it)"

    def what(self, saving: Saving) -> str:
        """What an attach run interrupted by a signal saved."""
        meta = saving.session.meta
        return (f"the run (the program had ended, exit code {exit_code(meta)})" if meta["kind"] == "attach"
                else "what was recorded before the program ran")


def _trace_dir(saving: Saving) -> Path | None:
    """Where attach writes its Perfetto trace: a saved and analysed attach run's folder (None: no trace)."""
    drawn = saving.session.meta["kind"] == "attach" and saving.results is not None
    return saving.out_dir if drawn else None


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
