"""Background sampler of NVML PCIe byte counters.

One child process per GPU: NVML field reads serialize between the threads of one process (measured on 4x
H200: 1,410 reads/s in total with one thread per GPU) but not between processes (10,094/s with one process
per GPU), and a child never competes with the launch loop for the parent's GIL. Timestamps are
``time.monotonic_ns()`` (CLOCK_MONOTONIC, shared by all processes), the clock the launch generator and the
injection library use too. Every GPU is read once before :meth:`CounterSampler.start` returns and once more
when it stops, so windows at either end are always covered. Samples stream back in chunks while the run
goes on, so a crash or Ctrl-C in the parent loses at most the last chunk.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pcietrace.errors import NvmlError, UsageError

#: Columns of the raw sample frame. ``t_ns``: midpoint of the read on CLOCK_MONOTONIC (ns);
#: ``read_ns``: how long the read took (ns); ``tx_raw``/``rx_raw``: the counters as NVML returned
#: them (fields mode: cumulative bytes modulo 2**bits; throughput mode: KB/s over ~20 ms).
SAMPLE_COLUMNS = ["nvml_index", "t_ns", "read_ns", "tx_raw", "rx_raw"]


def empty_samples() -> pd.DataFrame:
    """A sample frame with no rows, in the dtypes of real samples (raw counters uint64: an int64 empty
    frame concatenated with real samples turns the counters into float64)."""
    return pd.DataFrame({c: pd.Series(dtype="uint64" if c.endswith("_raw") else "int64") for c in SAMPLE_COLUMNS})


def merge_samples(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Sample frames from several readers (background samplers, boundary probes, edge reads) as one,
    sorted by GPU and time; no rows gives :func:`empty_samples`."""
    frames = [f for f in frames if len(f)]
    if not frames:
        return empty_samples()
    return (pd.concat(frames, ignore_index=True)
            .sort_values(["nvml_index", "t_ns"], kind="stable").reset_index(drop=True))


_CHUNK_NS = 20_000_000  # send samples to the parent every 20 ms
#: Most of the time one GPU's sampler may spend inside NVML reads (1 = no cap). Each read is an RPC to the
#: GPU's firmware (GSP) that queues with the program's own driver work. Measured on 4x H200 under torchrun
#: (2026-11-22): reading every 0.5 ms slowed NCCL's collectives outside the ranges (the loop +42 %, with a bare
#: sampler beside the app as with attach) while the ranges themselves ran at full speed; a cap of 0.25 cut
#: that to +17-23 % but stretched the sampling gap to 2.5 ms and put copies 20-50 % off. So no cap by
#: default; `attach --sampler-duty` trades accuracy for less interference where that matters more.
DEFAULT_MAX_DUTY = 1.0
MAX_REST_NS = 5_000_000
#: Idle-aware sampling (attach): with an edge file, a GPU is read every ``interval_ns`` only while a range is
#: open (at most, see ``quiet_interval_ns`` below; or pcietrace holds the fast rate, as in attach's idle
#: windows, or no injection library that counts open ranges has mapped the page yet), else every
#: ``idle_interval_ns``; a range that opens in a process with none open wakes the sampler,
#: which reads right after its push, though never sooner than ``interval_ns`` after its last read (so a GPU is
#: read at most every ``interval_ns`` whatever the range density). Measured on 4x
#: H200 under torchrun (2026-11-22): 0.5 ms reads slowed NCCL's collectives outside the ranges by 40-48 %,
#: 10 ms reads by -1...+14 %. attach's default idle interval is 5 ms (`--idle-sample-interval-ms`); the longest
#: allowed stays far below a counter wrap (~67 ms at 64 GB/s for 32 bits; `analysis.counters.could_hide_wrap`).
MAX_IDLE_INTERVAL_NS = 20_000_000
#: While a range is open but the counters moved slower than :data:`BUSY_BPS` over the last interval (launches,
#: small copies), a GPU is read every ``quiet_interval_ns`` (attach: 2 ms, `--quiet-sample-interval-ms`): each
#: read moves tens of kB itself, so at 0.5 ms the reads outweigh a launch stream's own bytes and the floor's cost
#: per read decides the range; read every 2 ms throughout, copy ranges of a few ms right after each other lose
#: their edges (docs/method.md, "Dense NVTX ranges", has both measured). So a bulk copy brings back
#: ``interval_ns`` from the read that sees it until ``FAST_HOLD_NS`` past the last such read (copies a few
#: hundred us apart stay read fast throughout), and a range opening in a process with none open ends a quiet
#: wait at once (a copy range may follow a launch-only one), nested edges never.
FAST_HOLD_NS = 5_000_000
#: While no range is open, a GPU whose counters moved faster than this over the last interval (both directions,
#: B/s) is still read at the fast rate: a copy outside any range would otherwise put up to one idle interval
#: of its bytes into the edge of a range opening right after it (2x H200: the first idle call
#: after an app's warm-up copies read 14-39 MB D2H, truth 31 kB, with 5 ms reads). Above what the reads themselves
#: move at the fast rate (30-39 kB per read: 50-70 MB/s at 0.5 ms, real H100/H200 idle windows) plus a launch-only
#: stream, with room for one launching twice as fast (2x H200 threads recording, cuda.bindings at 113,000
#: launches/s with the fast reads: up to 0.63 GB/s per interval, which held 500 MB/s), so neither holds the
#: fast rate; a bulk copy does (8-78 GB/s in the same recording's copy ranges). A copy slower than this over one
#: idle interval (< 10 MB in 5 ms) stays in the edge error it causes.
BUSY_BPS = 2e9


def _busy(mode: str, bits: int, before: tuple[int, int, int] | None, after: tuple[int, int, int]) -> bool:
    """Whether the counters moved faster than :data:`BUSY_BPS` between two reads ``(t_ns, tx, rx)``: raw
    counters that wrap at ``2**bits`` ("fields"), or KB/s rates ("throughput")."""
    if mode == "throughput":
        return (after[1] + after[2]) * 1000 > BUSY_BPS
    if before is None or after[0] <= before[0]:
        return False
    moved = ((after[1] - before[1]) % (1 << bits)) + ((after[2] - before[2]) % (1 << bits))
    return bool(faster_than_busy(moved, after[0] - before[0]))


def faster_than_busy(moved_bytes: Any, dt_ns: Any) -> Any:
    """Whether ``moved_bytes`` (both directions together) over ``dt_ns`` (> 0) is faster than :data:`BUSY_BPS`:
    the sampler's rule for the fast pace (numbers or arrays)."""
    return moved_bytes * 1e9 > BUSY_BPS * dt_ns


def _child_main(index: int, mode: str | None, interval_ns: int, edge_file: str | None, max_duty: float,
                out: "mp.Queue[Any]", stop: Any, pause: Any, idle_interval_ns: int = 0,
                quiet_interval_ns: int = 0) -> None:
    """One GPU's sampling loop (runs in its own process). ``idle_interval_ns`` (0 = off): the least time
    between reads while no range is open; ``quiet_interval_ns`` (0 = off): while a range is open and the link
    is not busy (:data:`BUSY_BPS`); both need ``edge_file`` and are never shorter than ``interval_ns``."""
    from pcietrace import signals

    signals.leave_to_parent()  # (the samples after a Ctrl-C, the last read and the "done" message are not lost)
    from pcietrace.collectors.edges import EdgeWaiter
    from pcietrace.collectors.nvml import CounterReader  # imported in the child: NVML is per process

    try:
        reader = CounterReader(index, mode)
        waiter = EdgeWaiter(edge_file, stop)  # a stop cuts any wait short, edge file or not
    except Exception as exc:  # report any failure to the parent as one line
        out.put(("error", index, f"{type(exc).__name__}: {exc}"))
        return
    now, read = time.monotonic_ns, reader.read
    t, d, tx, rx = [], [], [], []
    failed = 0
    parent = os.getppid()

    quiet = 1 / max_duty - 1  # after a read of d ns, stay out of NVML for quiet x d
    idle_ns = max(int(idle_interval_ns), interval_ns) if idle_interval_ns > 0 and waiter.mapped else 0
    quiet_ns = max(int(quiet_interval_ns), interval_ns) if quiet_interval_ns > 0 and waiter.mapped else interval_ns
    busy_at = -(2**62)  # when a read last saw the link busy

    last: list[Any] = [None, False]  # the last good read (t_ns, tx, rx), and whether the link moved > BUSY_BPS since

    def sample() -> tuple[int, int]:
        nonlocal failed
        t0 = now()
        v = read()
        t1 = now()
        if v is None:
            failed += 1
            last[1] = False  # a failed read says nothing of the link: no fast rate for as long as reads fail
        else:
            t.append((t0 + t1) // 2)
            d.append(t1 - t0)
            tx.append(v[0])
            rx.append(v[1])
            last[1] = _busy(reader.mode, reader.bits, last[0], (t[-1], v[0], v[1]))
            last[0] = (t[-1], v[0], v[1])
        return t0, t1

    def send() -> None:
        out.put(("chunk", index, np.array(t, np.int64), np.array(d, np.int64), np.array(tx, np.uint64),
                 np.array(rx, np.uint64)))
        t.clear(), d.clear(), tx.clear(), rx.clear()

    for _ in range(3):  # a first sample before anyone measures
        sample()
        if t:
            break
    out.put(("ready", index, {"mode": reader.mode, "bits": reader.bits}))
    next_send = now() + _CHUNK_NS
    while not stop.is_set():
        if pause.is_set():
            time.sleep(0.0005)
            continue
        seen, woken = waiter.seq, waiter.wakes
        t0, t1 = sample()
        # the rest never outgrows MAX_REST_NS: a gap long enough to hide a counter wrap (~67 ms at 64 GB/s)
        # would cost every range over it its figure
        rest = t1 + min(int(quiet * (t1 - t0)), MAX_REST_NS)
        # Edges never bring a read sooner than interval_ns after the last one began: the reads (each PCIe
        # traffic of its own) stay bounded by time however dense the ranges are; an edge meanwhile (seq !=
        # seen) shares the next read, and nested ranges share their parents'.
        waiter.sleep_until(max(t0 + interval_ns, rest))
        # the rate is chosen after that: an edge since the read began changed seq, so an idle wait ends at once
        # (fast: a copy lately, pcietrace's idle windows, or no library that counts open ranges)
        if last[1]:
            busy_at = t1
        if not (t1 - busy_at < FAST_HOLD_NS or waiter.force_fast or not waiter.counting):
            if waiter.open_ranges > 0:
                # only a waking edge (a range opening in a process with none open, an edge of a --slow-domains
                # range, pcietrace's own) cuts this wait short: nested edges do not (the reads stay bounded by
                # time at any density)
                waiter.wait_until(t0 + quiet_ns, woken=woken)
            elif idle_ns:
                waiter.wait_until(t0 + idle_ns, seen)
        if now() >= next_send:
            if os.getppid() != parent:  # the recording process died (SIGKILL, crash): stop reading NVML
                return
            send()
            next_send = now() + _CHUNK_NS
    sample()  # a last sample after everything measured
    send()
    waiter.close()
    out.put(("done", index, failed))


#: The longest :meth:`CounterSampler.stop` waits for its children's last samples before killing them.
STOP_TIMEOUT_S = 10.0


def _bounded(call: Any, timeout_s: float = 2.0) -> bool:
    """``call()`` on a daemon thread, waited for at most ``timeout_s``: a multiprocessing Event's set/clear takes
    a lock shared with the children, which a child killed while holding it never gives back. Whether it ran."""
    th = threading.Thread(target=call, daemon=True)
    th.start()
    th.join(timeout_s)
    return not th.is_alive()


class BoundaryProbe:
    """In-process counter reads at window boundaries, merged later with the background samples.

    Calling the probe reads one GPU's counters (in the caller's process, ~0.16 ms) and returns the
    read's midpoint on CLOCK_MONOTONIC; :meth:`frame` gives the reads in ``SAMPLE_COLUMNS`` form.
    """

    def __init__(self, nvml_index: int, force_throughput: bool = False) -> None:
        from pcietrace.collectors.nvml import CounterReader

        self.reader = CounterReader(nvml_index, "throughput" if force_throughput else None)
        self.rows: list[tuple[int, int, int, int, int]] = []

    def agree(self, mode: str) -> None:
        """Read in the sampler's counter mode (the two must never mix in one run)."""
        if mode != self.reader.mode:
            from pcietrace.collectors.nvml import CounterReader

            self.reader = CounterReader(self.reader.index, mode)

    def __call__(self) -> int:
        for _ in range(3):  # a failed read (its own return code) is retried, never papered over
            t0 = time.monotonic_ns()
            v = self.reader.read()
            t1 = time.monotonic_ns()
            if v is not None:
                self.rows.append((self.reader.index, (t0 + t1) // 2, t1 - t0, v[0], v[1]))
                return (t0 + t1) // 2
        raise NvmlError(f"PCIe counter read failed 3 times on GPU {self.reader.index}")

    def frame(self) -> pd.DataFrame:
        df = pd.DataFrame(self.rows, columns=SAMPLE_COLUMNS)
        return df.astype({"tx_raw": np.uint64, "rx_raw": np.uint64})


#: Samples the parent holds at most with a ``spill_dir`` (~8 MB; 8 GPUs at 1.7 kHz fill it every ~15 s).
SPILL_ROWS = 200_000
#: With a ``spill_dir``, the longest the parent holds samples before they go to disk (and so the most of the
#: recording a crash, SIGKILL or power cut of the recording process loses).
FLUSH_S = 1.0
#: The samples' file in a ``spill_dir``: an Arrow IPC stream, one record batch per flush.
STREAM_FILE = "samples.arrows"


def _chunks_frame(chunks: list[tuple[Any, ...]]) -> pd.DataFrame:
    """Chunks as the samplers send them (index, t_ns, read_ns, tx_raw, rx_raw) as one frame, in arrival order."""
    return pd.DataFrame({
        "nvml_index": np.concatenate([np.full(len(c[1]), c[0], np.int64) for c in chunks]),
        "t_ns": np.concatenate([c[1] for c in chunks]),
        "read_ns": np.concatenate([c[2] for c in chunks]),
        "tx_raw": np.concatenate([c[3] for c in chunks]),
        "rx_raw": np.concatenate([c[4] for c in chunks]),
    })


class SampleStream:
    """Sample frames appended to ``folder/``:data:`STREAM_FILE` as they come, each one record batch, written
    through to the disk (fsync): whatever ends the writing process, :func:`read_stream` gets every batch written
    before (a stream, unlike a Parquet file, needs no footer written at the end)."""

    def __init__(self, folder: str | Path) -> None:
        import pyarrow as pa

        self.path = Path(folder) / STREAM_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.batches = 0
        self._file = open(self.path, "wb")
        try:
            self._writer = pa.ipc.new_stream(self._file, pa.Schema.from_pandas(empty_samples(), preserve_index=False))
            self._sync()
        except BaseException:
            self._file.close()
            raise

    def _sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def write(self, samples: pd.DataFrame) -> None:
        import pyarrow as pa

        self._writer.write_batch(pa.RecordBatch.from_pandas(samples[SAMPLE_COLUMNS], preserve_index=False))
        self._sync()
        self.batches += 1

    def close(self) -> None:
        if not self._file.closed:
            try:
                self._writer.close()
            finally:
                self._file.close()


def read_stream(folder: str | Path) -> pd.DataFrame:
    """The samples a :class:`SampleStream` wrote into ``folder`` (none: :func:`empty_samples`), in the order
    written. A stream cut short (its writer killed mid-batch) gives the batches before the cut."""
    import pyarrow as pa

    path = Path(folder) / STREAM_FILE
    batches = []
    try:
        with pa.memory_map(str(path)) as source:
            reader = pa.ipc.open_stream(source)
            while True:
                try:
                    batches.append(reader.read_next_batch())
                except StopIteration:
                    break
                except (pa.ArrowInvalid, OSError):  # a batch cut by the writer's death
                    break
            # (copied out of the mapping before it closes)
            table = pa.Table.from_batches(batches, schema=reader.schema).combine_chunks() if batches else None
            frame = table.to_pandas() if table is not None else None
    except (FileNotFoundError, pa.ArrowInvalid, ValueError):  # no file, or cut inside its first message
        return empty_samples()
    if frame is None:
        return empty_samples()
    return frame.astype({c: empty_samples()[c].dtype for c in SAMPLE_COLUMNS})


class CounterSampler:
    """Samples the PCIe TX/RX counters of the given NVML indices until :meth:`stop`, one process per GPU.

    ``modes`` (after :meth:`start`): per NVML index, ``{"mode": "fields"|"throughput", "bits": 32|64}``.
    ``failed_reads``: per NVML index, reads whose own return code was an error (dropped).
    ``interval_ns``: least time between reads of one GPU (0 = as fast as the duty cap allows).
    ``edge_file``: a :mod:`pcietrace.collectors.edges` file; a signalled edge cuts the wait short.
    ``max_duty``: the largest share of time one GPU's sampler spends in NVML reads (:data:`DEFAULT_MAX_DUTY`).
    ``idle_interval_ns``: with ``edge_file``, the least time between reads while no range is open (0 = off:
    always ``interval_ns``; at most :data:`MAX_IDLE_INTERVAL_NS`; never shorter than ``interval_ns``).
    ``quiet_interval_ns``: with ``edge_file``, the least time between reads while a range is open but the link
    is not busy (:data:`BUSY_BPS`; 0 = off: ``interval_ns``; same bounds as the idle interval).
    ``spill_dir``: a folder the samples stream to as they arrive (:class:`SampleStream`), every :data:`FLUSH_S`
    or :data:`SPILL_ROWS` samples, whichever comes first: this process holds at most that many however long the
    run, and a crash of it loses at most the last :data:`FLUSH_S`; None: all kept in memory. :meth:`frame` reads
    them back.
    """

    def __init__(self, nvml_indices: list[int], force_throughput: bool = False, interval_ns: int = 0,
                 edge_file: str | None = None, max_duty: float = DEFAULT_MAX_DUTY, idle_interval_ns: int = 0,
                 spill_dir: str | Path | None = None, quiet_interval_ns: int = 0) -> None:
        if not 0 < max_duty <= 1:
            raise NvmlError(f"sampler duty must be in (0, 1], not {max_duty}")
        for what, ns in (("idle", idle_interval_ns), ("quiet", quiet_interval_ns)):
            if not 0 <= ns <= MAX_IDLE_INTERVAL_NS:
                raise UsageError(f"{what} sampling interval must be 0 (off) or in (0, {MAX_IDLE_INTERVAL_NS / 1e6:g}] "
                                 f"ms, not {ns / 1e6:g} ms")
        self.idle_interval_ns, self.quiet_interval_ns = int(idle_interval_ns), int(quiet_interval_ns)
        self.max_duty = max_duty
        self.indices = list(nvml_indices)
        self.mode = "throughput" if force_throughput else None
        self.interval_ns = int(interval_ns)
        self.edge_file = edge_file
        self.modes: dict[int, dict[str, Any]] = {}
        self.failed_reads: dict[int, int] = {}
        self._chunks: list[tuple[Any, ...]] = []
        self.spill_dir = Path(spill_dir) if spill_dir is not None else None
        self._stream: SampleStream | None = None
        self._held = 0  # samples in self._chunks
        self._flushed_at = time.monotonic()
        self._lock = threading.Lock()  # the drainer adds chunks while frame() may read them
        self._procs: list[Any] = []
        self._drainer: threading.Thread | None = None
        self._page: Any = None  # the edge page, to wake the samplers and hold the fast rate
        self._stop_sent = False

    def start(self, timeout_s: float = 30.0) -> None:
        """Start one sampling process per GPU; returns once every GPU has been read once."""
        ctx = mp.get_context("spawn")
        self._q = ctx.Queue()
        self._stop, self._pause = ctx.Event(), ctx.Event()
        if self.edge_file and self._page is None:
            from pcietrace.collectors.edges import EdgeWaiter

            self._page = EdgeWaiter(self.edge_file)
        self._procs = [ctx.Process(target=_child_main, daemon=True, name=f"pcietrace-sampler-{i}",
                                   args=(i, self.mode, self.interval_ns, self.edge_file, self.max_duty, self._q,
                                         self._stop, self._pause, self.idle_interval_ns, self.quiet_interval_ns))
                       for i in self.indices]
        try:  # a failure or a signal while starting leaves no sampler process behind
            for p in self._procs:
                p.start()
            deadline = time.monotonic() + timeout_s
            while len(self.modes) < len(self.indices):
                try:
                    msg = self._q.get(timeout=max(0.01, deadline - time.monotonic()))
                except queue.Empty:
                    raise NvmlError(f"counter sampler did not start within {timeout_s:.0f} s") from None
                if msg[0] == "error":
                    raise NvmlError(f"counter sampler failed on GPU {msg[1]}: {msg[2]}")
                if msg[0] == "ready":
                    self.modes[int(msg[1])] = msg[2]
                elif msg[0] == "chunk":
                    self._take(msg[1:])
        except BaseException:
            self._kill()
            raise
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()

    def _drain(self) -> None:
        done = 0
        while done < len(self.indices):
            try:
                msg = self._q.get(timeout=0.5)
            except queue.Empty:
                # all gone, or one killed before its "done" (SIGKILL, OOM): none will come from it
                if not any(p.is_alive() for p in self._procs) or (self._stop_sent and any(
                        p.exitcode is not None and p.exitcode < 0 for p in self._procs)):
                    return
                continue
            except (EOFError, OSError, ValueError):  # (the queue closed under it, or a message cut by a kill)
                return
            if msg[0] == "chunk":
                self._take(msg[1:])
            elif msg[0] == "done":
                self.failed_reads[msg[1]] = msg[2]
                done += 1

    def _take(self, chunk: tuple[Any, ...]) -> None:
        """A sampler's chunk (index, t_ns, read_ns, tx_raw, rx_raw); with a spill folder, to disk every
        :data:`FLUSH_S` or :data:`SPILL_ROWS` samples."""
        with self._lock:
            self._chunks.append(chunk)
            self._held += len(chunk[1])
            if self.spill_dir is not None and (self._held >= SPILL_ROWS
                                               or time.monotonic() - self._flushed_at >= FLUSH_S):
                self._flush()

    def _flush(self) -> None:
        """The chunks held, to the spill folder's stream (under ``_lock``)."""
        self._flushed_at = time.monotonic()
        if not self._chunks or self.spill_dir is None:
            return
        try:
            if self._stream is None:
                self._stream = SampleStream(self.spill_dir)
            self._stream.write(_chunks_frame(self._chunks))
        except OSError:  # (disk full, folder gone) keep them here from now on, as without a spill folder
            self.spill_dir = None
            return
        self._chunks, self._held = [], 0

    def _wake(self) -> None:
        if self._page is not None:
            self._page.signal()

    def _kill(self) -> None:
        _bounded(self._stop.set)
        self._wake()
        for p in self._procs:
            if p.pid is None:  # never started (a failure or signal between two starts): nothing to reap
                continue
            p.join(2)
            if p.is_alive():
                p.kill()
                p.join(1)  # reaped now, not left a zombie until multiprocessing gets to it
        self._procs = []
        if self._page is not None:
            self._page.close()
            self._page = None

    def pause(self, paused: bool = True) -> None:
        """Stop (or resume) reading without stopping the sampler processes (benchmarks and attach's
        floor windows toggle this)."""
        (self._pause.set if paused else self._pause.clear)()
        self._wake()  # a sampler in a long idle wait pauses now, not at its deadline

    def hold_fast(self, on: bool = True) -> None:
        """Read at ``interval_ns`` although no range is open (attach's idle windows, which calibrate the
        floor per read: their reading windows must read at the program's in-range rate), or release that."""
        if self._page is not None:
            self._page.force_fast = on

    def frame(self) -> pd.DataFrame:
        """Samples received so far (also usable after a crash), sorted by GPU and time."""
        with self._lock:
            chunks, stream = list(self._chunks), self._stream
        frames = [read_stream(stream.path.parent)] if stream is not None else []
        return merge_samples(frames + ([_chunks_frame(chunks)] if chunks else []))

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> pd.DataFrame:
        """Stop sampling and return all samples (columns: :data:`SAMPLE_COLUMNS`). Returns within about
        ``timeout_s`` whatever the children do: one killed while it held the stop event's lock (which then
        stays taken: setting the event would wait for good), or one that never says "done", is killed with the
        others and the samples received so far are returned."""
        if self._procs:
            deadline = time.monotonic() + timeout_s
            self._stop_sent = True
            _bounded(self._stop.set, timeout_s / 4)
            _bounded(self._pause.clear, timeout_s / 4)
            self._wake()  # without the edge file the children wait on the stop event itself
            if self._drainer is not None:
                self._drainer.join(max(0.0, deadline - time.monotonic()))
            self._kill()
        with self._lock:  # the last samples to disk too, and the stream ended
            self._flush()
            if self._stream is not None:
                self._stream.close()
                self.spill_dir = None  # (a drainer still running keeps any later chunk here)
        return self.frame()

    def __enter__(self) -> "CounterSampler":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
