"""Recording every GPU at once: one worker process per GPU, results merged into one Session.

NVML reads serialize across the threads of one process (pynvml holds a lock per call), not across
processes, so each worker owns its GPU's counter sampler and boundary probe, its CUDA context, launch
loops and latency suite; GPUs then run side by side and a box of 8 takes about as long as one.
Peer round trips need every worker's own suite to be over first (a peer chase reads another GPU's
memory): the workers meet at a barrier, then each chases into its peers.

Byte windows run side by side; timed steps take turns (:class:`Turns`). With everything side by side on
4x H200 (2026-11-22, 12 GPU-round pairs against the same GPU alone), bytes per launch moved <= 0.1 %, but
the host cost of a launch from Python rose +7.0 % [95 % CI +1.0, +14.0] and the GPU time per eager kernel
+4.1 % [+2.1, +8.8] (eager kernels are fetched from host memory, through the root complex the GPUs
share). So each worker, its windows done, waits until every worker's are, then times its host and GPU
(bursts, end-to-end loops, latency suite) while the others wait, on a CPU core of its own near its GPU
(:func:`pcietrace.collectors.sysfs.timing_cpu`: the same core alone and beside others). Taking turns, no
figure moved beyond its noise (bench/parallel_vs_alone.py); a run on 4 GPUs takes ~34 s instead of ~27 s.

Workers are started with ``spawn`` (CUDA contexts do not survive fork). What a worker opens is given by
an *opener*: a picklable callable returning a :class:`GpuWorker` -- :func:`open_cuda` for a real GPU,
:func:`open_sim` for the SIMULATED device -- so the recording here knows no backend. ``processes=False``
runs the same workers one after another in this process (the simulator, tests).

Ctrl-C: the terminal's SIGINT reaches every worker; each stops, keeps what it recorded (status
"interrupted") and sends it back. A worker the signal did not reach gets it forwarded. The merged,
partial session is kept and KeyboardInterrupt re-raised, as in a single-GPU run.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import pandas as pd

from pcietrace.collectors import merge_samples
from pcietrace.device.base import Backend
from pcietrace.device.gpus import GpuRecord
from pcietrace.errors import PcietraceError
from pcietrace import signals
from pcietrace.signals import Terminated
from pcietrace.record.run import RunPlan, record
from pcietrace.session import TABLES, Session

#: Seconds a worker waits for one other GPU's part: the slowest GPU's byte windows (side by side), or one
#: GPU's timed turn (its lock and the peer barrier wait for every turn ahead: up to this many seconds each).
BARRIER_TIMEOUT_S = 300.0
#: Seconds the parent waits, after Ctrl-C, for workers to send what they recorded.
INTERRUPT_GRACE_S = 30.0

Note = Callable[[str], None]


@dataclass
class GpuWorker:
    """What one worker measures with: its GPU (:class:`~pcietrace.device.gpus.GpuRecord`), its backend, its
    own counter sampler and boundary probe, and (real GPUs) the latency suite:
    ``device_latency(repeats, note)`` -> rows of the chases in the GPU's own memory (timed on the GPU: before
    its turn), ``latency(repeats, note)`` -> the other rows for this GPU, ``peer_latency(ordinals, repeats,
    note, ready)`` -> rows from this GPU into the others, calling ``ready()`` once they are set up, before the
    chases (all :data:`pcietrace.record.latency.LATENCY_COLUMNS` tuples)."""

    gpu: GpuRecord
    backend: Backend
    sampler: Any
    probe: Any
    latency: Callable[[int, Note], list[tuple[Any, ...]]] | None = None
    peer_latency: Callable[[list[int], int, Note, Callable[[], None]], list[tuple[Any, ...]]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    device_latency: Callable[[int, Note], list[tuple[Any, ...]]] | None = None
    pin: Callable[[], int | None] = lambda: None  # pins the calling thread for timing; returns the CPU


class Turns:
    """Timed steps one GPU at a time: :meth:`take` waits until every worker has reached it (their byte
    windows are over; a worker that failed breaks the wait, it does not hold the others) and then holds a
    lock shared by all workers until :meth:`give` (or the worker ends). ``holder``: the pid of the worker
    holding the lock (0: none), so the parent can free a turn whose worker died in it (:meth:`release_dead`).
    ``wait_s``: how long a worker waits for the turns ahead of it (the lock, the peer barrier): turns are
    taken one after another, so up to :data:`BARRIER_TIMEOUT_S` for each of the ``n`` workers."""

    def __init__(self, ctx: Any, n: int) -> None:
        self.ready, self.lock, self.held, self.met = ctx.Barrier(n), ctx.Lock(), False, False
        self.holder = ctx.Value("i", 0)
        self.wait_s = BARRIER_TIMEOUT_S * n

    def take(self) -> bool:
        """Wait for every worker, then for this worker's turn; False when the turn did not come within
        :attr:`wait_s` (the worker then times beside the others, and says so)."""
        if self.held:
            return True
        if not self.met:  # once: a second wait there would wait for workers that already passed
            self.met = True
            try:
                self.ready.wait(BARRIER_TIMEOUT_S)
            except threading.BrokenBarrierError:
                pass  # another worker failed before its turn; the rest still time one at a time
        return self.hold()

    def hold(self) -> bool:
        """The lock alone (no meeting); whether this worker holds it. A worker that died holding it is freed
        by the parent (:meth:`release_dead`); should that not happen, the others go on without it after
        :attr:`wait_s` (False)."""
        if not self.held and self.lock.acquire(timeout=self.wait_s):
            with self.holder.get_lock():
                self.holder.value, self.held = os.getpid(), True
        return self.held

    def give(self) -> None:
        if self.held:
            with self.holder.get_lock():
                self.holder.value, self.held = 0, False
                self.lock.release()

    def abandon(self) -> None:
        """A worker ends: release its turn, and stop the others waiting for it at the meeting point."""
        self.give()
        self.ready.abort()

    def release_dead(self, pid: int) -> None:
        """(The parent.) Worker ``pid`` died without a word (a crash in C, SIGKILL): free the turn it held,
        and stop the others waiting for it at the meeting point."""
        mutex = self.holder.get_lock()
        if mutex.acquire(timeout=5.0):  # (one killed inside hold()/give() would leave it held: do not hang here)
            try:
                if self.holder.value == pid:
                    self.holder.value = 0
                    self.lock.release()
            finally:
                mutex.release()
        self.ready.abort()


def open_cuda(gpu: GpuRecord, force_throughput: bool = False, interval_ns: int = 10_000_000) -> GpuWorker:
    """A worker on ``gpu`` (:func:`pcietrace.device.gpus.select`), sampling its counters every
    ``interval_ns`` (fields 197/198, or the throughput API if forced)."""
    from pcietrace.collectors import BoundaryProbe, CounterSampler, nvml, sysfs
    from pcietrace.device.backend import open_gpus
    from pcietrace.schema import normalize_bus_id
    from pcietrace.device.cuda import Gpu
    from pcietrace.record.latency import LatencyProbe, measure_device_memory, measure_gpu, measure_peers

    (gpu, be), = open_gpus([gpu])
    idx, ordinal = gpu.nvml_index, gpu.cuda_ordinal
    probes: list[LatencyProbe] = []

    def latency_probe() -> LatencyProbe:
        if not probes:
            probes.append(LatencyProbe(be))
        return probes[0]

    def device_latency(repeats: int, note: Note) -> list[tuple[Any, ...]]:
        return measure_device_memory(idx, latency_probe(), repeats, progress=note)

    def latency(repeats: int, note: Note) -> list[tuple[Any, ...]]:
        return measure_gpu(idx, latency_probe(), repeats, progress=note, device_memory=False)

    def peer_latency(ordinals: list[int], repeats: int, note: Note, ready: Callable[[], None]) -> list[tuple[Any, ...]]:
        opened: list[Gpu] = []
        try:
            for o in ordinals:
                if o != ordinal:
                    opened.append(Gpu(o))  # (inside the try: a peer that fails to open releases those before it)
            peers = {nvml.index_for_bus_id(g.bus_id): g for g in opened}
            be.activate()
            return measure_peers(idx, latency_probe(), peers, repeats, progress=note, ready=ready)
        finally:
            for g in opened:
                if probes:
                    probes[0].forget(g)
                with contextlib.suppress(Exception):  # the chases' figures (or their error) matter more
                    g.close()
            be.activate()

    def pin() -> int | None:
        cpu = sysfs.timing_cpu(normalize_bus_id(gpu.bus_id), idx, os.sched_getaffinity(0))
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})  # Linux: the calling thread only; the sampler runs in its own process
        return cpu

    try:
        return GpuWorker(gpu, be, CounterSampler([idx], force_throughput=force_throughput, interval_ns=interval_ns),
                         BoundaryProbe(idx, force_throughput), latency, peer_latency, pin=pin,
                         device_latency=device_latency)
    except BaseException:  # (NVML failing in the probe, Ctrl-C) the worker never gets the GPU to close
        with contextlib.suppress(Exception):
            be.close()
        raise


def cuda_openers(gpus: list[GpuRecord], force_throughput: bool = False,
                 sample_interval_ms: float = 10.0) -> list[Callable[[], GpuWorker]]:
    """One :func:`open_cuda` opener per GPU (picklable, for the worker processes)."""
    return [functools.partial(open_cuda, g, force_throughput, int(sample_interval_ms * 1e6)) for g in gpus]


def open_sim(slot: int, seed: int = 0) -> GpuWorker:
    """A worker on a SIMULATED GPU number ``slot`` (NVML index and CUDA ordinal = slot; each its own
    device model, seeded ``seed + slot``). No latency suite."""
    from pcietrace.device.sim import SimBackend, SimDevice, SimParams, SimSampler, gpu_records

    params = SimParams.default()
    device = SimDevice(params, seed=seed + slot)
    gpu = gpu_records(params, slot + 1)[slot]
    sampler = SimSampler({slot: device})
    return GpuWorker(gpu, SimBackend(device), sampler, sampler.probe(slot))


def _work(opener: Callable[[], GpuWorker], slot: int, plan: RunPlan, latency_repeats: int | None,
          ordinals: list[int], send: Callable[[tuple[Any, ...]], None], barrier: Any, turns: Turns | None = None) -> None:
    """One GPU's whole measurement; sends ("step"|"note", slot, label) while it runs and ("done", slot,
    Session) at the end, whatever happened (an interrupted or failed session keeps what it recorded).
    ``turns``: timed steps wait for this worker's turn (workers running side by side)."""
    session = Session(meta={"gpus": [], "status": "starting"})
    met = False
    note: Note = lambda label: send(("note", slot, label))  # noqa: E731
    w: GpuWorker | None = None
    try:
        w = opener()
        session.meta["gpus"] = [w.gpu.meta()]
        saved = session.meta["gpus"][0]  # where this GPU's notes go (its timing CPU, a missed turn)

        def beside_others(g: dict[str, Any], what: str) -> None:
            g["timed_beside_others"] = True  # the report marks this GPU's timed figures
            note(f"GPU {g['cuda_ordinal']}: no turn within {turns.wait_s:.0f} s: {what} beside other GPUs' work")

        rows: list[tuple[Any, ...]] = []
        suite = latency_repeats is not None and w.latency is not None
        ahead = suite and w.device_latency is not None  # the chases in the GPU's own memory: before the turn

        def my_turn(g: dict[str, Any]) -> None:
            nonlocal ahead
            if ahead:
                ahead = False
                rows.extend(w.device_latency(latency_repeats, note))
                session.latency = _latency_frame(rows)
            if turns is not None and not turns.held:
                note(f"GPU {g['cuda_ordinal']}: waiting to time (one GPU at a time)")
                if not turns.take():
                    beside_others(g, "timing")
            if "timing_cpu" not in g:  # (called again before the latency suite: the thread is pinned already)
                g["timing_cpu"] = w.pin()

        record(session, plan, [(w.gpu, w.backend)], w.sampler, {w.gpu.nvml_index: w.probe},
               progress=lambda label: send(("step", slot, label)), before_timing=my_turn)
        if suite:
            session.meta["status"] = "running latency"
            my_turn(saved)
            rows += w.latency(latency_repeats, note)
            session.latency = _latency_frame(rows)
            if turns is not None:
                turns.give()
            if barrier is not None and w.peer_latency is not None:
                # every GPU's own suite is over (one after another): chase into the peers
                barrier.wait(BARRIER_TIMEOUT_S if turns is None else turns.wait_s)
                met = True

                def chase_in_turn() -> None:  # (peers opened and chains built, side by side)
                    if turns is not None and not turns.hold():  # the chases read other GPUs: one at a time too
                        beside_others(saved, "peer chases")

                rows += w.peer_latency(ordinals, latency_repeats, note, chase_in_turn)
                session.latency = _latency_frame(rows)
            session.meta["status"] = "complete"
    except KeyboardInterrupt:
        session.meta["status"] = "interrupted"
    except threading.BrokenBarrierError:
        session.meta["status"] = "complete"  # another worker failed: this GPU's figures stand, no peer reads
        session.meta["peer_latency"] = "skipped: another GPU's worker did not reach the barrier"
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, never lost
        session.meta["status"] = f"failed: {type(exc).__name__}: {exc}"
    finally:
        if barrier is not None and not met:
            barrier.abort()  # nobody waits for a worker that will not come
        if turns is not None:
            turns.abandon()
        send(("done", slot, session))
        if w is not None:  # after sending: a failed or interrupted (Ctrl-C) release must not lose the figures
            with contextlib.suppress(Exception, KeyboardInterrupt):
                w.backend.close()


def _latency_frame(rows: list[tuple[Any, ...]]) -> pd.DataFrame:
    from pcietrace.record.latency import LATENCY_COLUMNS

    return pd.DataFrame(rows, columns=LATENCY_COLUMNS)


def _worker_main(opener: Callable[[], GpuWorker], slot: int, plan: RunPlan, latency_repeats: int | None,
                 ordinals: list[int], out: Any, barrier: Any, turns: Turns | None) -> None:
    signals.first_only()
    _work(opener, slot, plan, latency_repeats, ordinals, out.put, barrier, turns)


def merge(session: Session, parts: dict[int, Session]) -> Session:
    """Fill ``session`` with the workers' sessions (slot order): tables concatenated, samples sorted per
    GPU, GPU records replaced by the workers' own (each with its ``status``); the run's status is
    "complete" only if every worker's is."""
    ordered = [parts[k] for k in sorted(parts)]
    gpus = {g["nvml_index"]: g for g in session.meta.get("gpus", [])}
    statuses = []
    for p in ordered:
        statuses.append(p.meta.get("status", "unknown"))
        for g in p.meta.get("gpus", []):
            gpus[g["nvml_index"]] = {**gpus.get(g["nvml_index"], {}), **g, "status": statuses[-1]}
        for k, v in p.meta.get("failed_reads", {}).items():
            session.meta.setdefault("failed_reads", {})[k] = v
        if "peer_latency" in p.meta:
            session.meta["peer_latency"] = p.meta["peer_latency"]
    session.meta["gpus"] = [gpus[k] for k in sorted(gpus)]
    session.meta["status"] = next((s for s in statuses if s != "complete"), "complete") if ordered else "interrupted"
    session.meta["parallel_workers"] = len(ordered)
    session.samples = merge_samples([p.samples for p in ordered])
    for t in TABLES:
        got = [getattr(p, t) for p in ordered if len(getattr(p, t))]
        if got:
            setattr(session, t, pd.concat(got, ignore_index=True))
    return session


def record_all(session: Session, plan: RunPlan, openers: list[Callable[[], GpuWorker]],
               latency_repeats: int | None = None, progress: Note = lambda _: None, note: Note = lambda _: None,
               processes: bool = True, ordinals: list[int] | None = None) -> Session:
    """Run ``plan`` (and, with ``latency_repeats``, the latency suite) on every opener's GPU at once and
    merge the results into ``session``. ``progress`` gets one label per plan step of any GPU, ``note``
    the latency suite's labels. ``processes=False``: one GPU after another in this process.
    ``ordinals``: the CUDA ordinals of the openers' GPUs (for peer round trips between them).

    KeyboardInterrupt (Ctrl-C) is re-raised after the partial results are merged; a failed worker
    raises :class:`~pcietrace.errors.PcietraceError` (one line) after the merge."""
    n = len(openers)
    ordinals = list(range(n)) if ordinals is None else list(ordinals)
    parts: dict[int, Session] = {}

    def handle(msg: tuple[Any, ...]) -> None:
        kind, slot, payload = msg
        if kind == "step":
            progress(payload)
        elif kind == "note":
            note(payload)
        else:
            parts[slot] = payload

    if not processes:
        cpus = os.sched_getaffinity(0)
        for slot, opener in enumerate(openers):
            try:
                _work(opener, slot, plan, latency_repeats, ordinals, handle, None)
            finally:
                os.sched_setaffinity(0, cpus)  # a worker pins the thread it times on: this is the caller's
            if parts[slot].meta.get("status") == "interrupted":
                merge(session, parts)
                raise KeyboardInterrupt
        merge(session, parts)
        _raise_failures(parts)
        return session

    ctx = mp.get_context("spawn")
    # a queue per worker: one that dies while its feeder thread holds its queue's lock wedges that queue only
    outs = [ctx.Queue() for _ in openers]
    barrier = ctx.Barrier(n) if latency_repeats is not None and n > 1 else None
    turns = Turns(ctx, n) if n > 1 else None
    procs = [ctx.Process(target=_worker_main,
                         args=(opener, slot, plan, latency_repeats, ordinals, outs[slot], barrier, turns),
                         name=f"pcietrace-gpu{slot}") for slot, opener in enumerate(openers)]
    for p in procs:
        p.start()

    def on_death(pid: int) -> None:  # it never reaches its finally: free what it held, break what it would meet
        if turns is not None:
            turns.release_dead(pid)
        if barrier is not None:
            barrier.abort()

    interrupted: KeyboardInterrupt | None = None
    try:
        _collect(outs, procs, parts, handle, deadline=None, on_death=on_death)
    except KeyboardInterrupt as exc:  # (signals.Terminated for SIGTERM/SIGHUP: re-raised as is, for the exit code)
        interrupted = exc
        if not isinstance(exc, Terminated):
            time.sleep(1.0)  # a terminal's Ctrl-C reached the workers too; forward it to any it did not
        for slot, p in enumerate(procs):
            if slot not in parts and p.is_alive():
                try:
                    os.kill(p.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
        _collect(outs, procs, parts, handle, deadline=time.monotonic() + INTERRUPT_GRACE_S, on_death=on_death)
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    merge(session, parts)
    if interrupted is not None:
        session.meta["status"] = "interrupted"  # even where every worker had finished before the signal came
        raise interrupted
    if any(p.meta.get("status") == "interrupted" for p in parts.values()):
        raise KeyboardInterrupt  # a worker interrupted on its own: the run is partial
    _raise_failures(parts)
    return session


def _raise_failures(parts: dict[int, Session]) -> None:
    """A failed worker fails the run, as an exception in a one-GPU run would (the merged session keeps
    every GPU's figures, so the caller can still save them)."""
    failed = [f"GPU slot {k}: {p.meta['status'][len('failed: '):]}" for k, p in sorted(parts.items())
              if str(p.meta.get("status", "")).startswith("failed")]
    if failed:
        raise PcietraceError("; ".join(failed))


def _collect(outs: list[Any], procs: list[Any], parts: dict[int, Session], handle: Callable[[tuple[Any, ...]], None],
             deadline: float | None, on_death: Callable[[int], None] = lambda pid: None) -> None:
    """Handle worker messages (``outs``: each worker's queue) until every worker has sent its result, died
    without one, or the deadline. ``on_death(pid)``: a worker died without its result (the others must not
    wait for it)."""

    def drain(q: Any) -> bool:
        got = False
        while True:
            try:
                handle(q.get_nowait())
                got = True
            except queue.Empty:
                return got

    while len(parts) < len(procs):
        if deadline is not None and time.monotonic() > deadline:
            return
        if any([drain(q) for q in outs]):
            continue
        for slot, p in enumerate(procs):
            if slot not in parts and not p.is_alive() and p.exitcode is not None and not drain(outs[slot]) \
                    and slot not in parts:
                # Died without a word (killed, crashed in C): say so rather than wait forever.
                parts[slot] = Session(meta={"gpus": [], "status": f"failed: worker exited with code {p.exitcode}"})
                on_death(p.pid)
        time.sleep(0.05)
