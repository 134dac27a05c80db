"""Recording a run: the plan of windows, and the loop that executes it while the collector samples."""

from __future__ import annotations

import contextlib
import getpass
import platform
import socket
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Iterator

import pandas as pd

from pcietrace import __version__, signals
from pcietrace.collectors import merge_samples
from pcietrace.device.gpus import GpuRecord
from pcietrace.errors import ConfigError, CudaError
from pcietrace.record.generate import Backend, LaunchConfig, LaunchGenerator
from pcietrace.session import Session


@dataclass(frozen=True)
class RunPlan:
    """What ``pcietrace run`` measures on each GPU.

    ``durations_us``: kernel durations for the speedup and bytes-vs-duration tables; ``graph_ks``:
    graph sizes; ``rate_fractions``: paced rates, as fractions of the measured max rate, for the fits;
    ``window_s``: length of each counter window; ``burst_kernels``: kernels queued behind a blocker
    (keep under the ~1000-launch queue); ``e2e_kernels``: kernels per end-to-end loop, fewer at long
    kernels so a loop takes about ``e2e_loop_ms`` (:meth:`e2e_kernels_at`);
    ``language_repeats``: empty-kernel bursts per launch path (native, Python, PyTorch) for the
    host cost by language; ``gpu_time_contexts``: CUDA contexts the GPU time per empty eager kernel is
    measured in (the primary context and fresh ones, :data:`CONTEXT_BURSTS` bursts each): each context draws
    its own level (H200: 1.29-1.45 us; H100: 1.65-1.69 or 1.84-1.89 us; bench/eager_gpu_truth.py), so one
    context is one draw.
    """

    durations_us: tuple[float, ...] = (0, 2, 5, 10, 20, 50)
    graph_ks: tuple[int, ...] = (1, 10, 100, 1000)
    rate_fractions: tuple[float, ...] = (1.0, 0.5, 0.25, 0.1)
    window_s: float = 0.4
    idle_windows: int = 3
    burst_kernels: int = 900
    e2e_kernels: int = 2000
    e2e_graph_k: int = 100
    e2e_loop_ms: float = 20.0
    e2e_repeats: int = 5
    # 15: one GPU's bursts of 900 launches spread ±15 % inside a run (H100, 4x H200); a median of 7 moved
    # 10-25 % between runs
    language_repeats: int = 15
    # 5: on the H100 30 % of contexts drew a level 11 % below the rest; 5 contexts miss that group 17 % of the
    # time, 3 contexts 34 % (bench/eager_gpu_truth.py)
    gpu_time_contexts: int = 5

    def __post_init__(self) -> None:
        if not self.durations_us or any(d < 0 or d > 1e6 for d in self.durations_us):
            raise ConfigError("durations_us", "must be 0..1e6 us")
        if not self.graph_ks or any(k < 1 or k > 100_000 for k in self.graph_ks):
            raise ConfigError("graph_ks", "must be 1..100000")
        if not self.rate_fractions or self.rate_fractions[0] != 1.0 or any(not 0 < f <= 1 for f in self.rate_fractions):
            raise ConfigError("rate_fractions", "must start with 1.0 (max rate) and lie in (0, 1]")
        positive = ("window_s", "idle_windows", "burst_kernels", "e2e_kernels", "e2e_loop_ms", "gpu_time_contexts")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ConfigError(name, "must be > 0")
        if self.language_repeats < 0:
            raise ConfigError("language_repeats", "must be >= 0")

    def e2e_kernels_at(self, kernel_us: float) -> int:
        """Kernels per end-to-end loop at ``kernel_us``: ``e2e_kernels``, capped so a loop of long kernels
        takes about ``e2e_loop_ms`` (GPU-bound: the first launch and the final sync are then < 0.1 % of it,
        and a GPU's timed turn stays short); whole graphs of ``e2e_graph_k``, at least one."""
        if kernel_us <= 0:
            return self.e2e_kernels
        cap = int(self.e2e_loop_ms * 1e3 / kernel_us) // self.e2e_graph_k * self.e2e_graph_k
        return max(self.e2e_graph_k, min(self.e2e_kernels, cap))

    def steps(self) -> int:
        """Number of progress steps one GPU takes (for the progress bar)."""
        return sum(1 for _ in _steps(self, None))  # type: ignore[arg-type]  # thunks are not called


Progress = Callable[[str], None]


def _steps(plan: RunPlan, gen: LaunchGenerator) -> Iterable[tuple[str, str, Callable[[], Any]]]:
    """The plan as (table, label, thunk) steps, in order; a thunk returns a record, a list of them, or None.
    Paced rates follow the max-rate window."""
    w = plan.window_s
    for d in plan.durations_us:
        yield "calibration", f"calibrate {d:g} us", lambda d=d: gen.calibrate(d)
    def idle() -> dict[str, Any]:
        return gen.window(LaunchConfig("idle", duration_s=w, purpose="floor"))

    measured: dict[Any, float] = {}

    def fit_window(mode: str, k: int, frac: float) -> dict[str, Any]:
        rate = None if frac == 1.0 else frac * measured[(mode, k)]
        rec = gen.window(LaunchConfig(mode, 0.0, k, rate, w, "fit" if mode == "eager" else "graph"))
        if frac == 1.0:
            measured[(mode, k)] = rec["achieved_rate_hz"]
        return rec

    # Idle windows bracket the launch windows (start, middle, end) so a drifting floor shows up.
    yield "windows", "idle (floor)", idle
    for f in plan.rate_fractions:
        yield "windows", f"eager fit x{f:g}", lambda f=f: fit_window("eager", 1, f)
    for d in plan.durations_us:
        if d:
            yield "windows", f"eager {d:g} us", lambda d=d: gen.window(LaunchConfig("eager", d, 1, None, w, "duration"))
    if plan.idle_windows > 1:
        yield "windows", "idle (floor)", idle
    for k in plan.graph_ks:
        for f in plan.rate_fractions:
            yield "windows", f"graph K={k} x{f:g}", lambda k=k, f=f: fit_window("graph", k, f)
    for _ in range(plan.idle_windows - 2):
        yield "windows", "idle (floor)", idle
    def load_torch() -> None:  # a step that records nothing
        _torch_loops(gen)

    # PyTorch's import and CUDA set-up (4.6 s on the H100) before the timed steps, not in a GPU's timed turn
    yield "setup", "load PyTorch", load_torch
    # Likewise the fresh contexts' making (~130 ms each, H100): their bursts open the turn, each closed after
    # its own (docs/lab/bench/context_idle_probe.py: idle contexts left the GPU time per kernel within 0.1 %)
    fresh: list[Backend | None] = []
    try:
        if plan.gpu_time_contexts > 1:
            yield ("setup", f"make {plan.gpu_time_contexts - 1} CUDA contexts",
                   lambda: fresh.extend(_new_context(gen) for _ in range(1, plan.gpu_time_contexts)))
        d0 = min(plan.durations_us)
        for c in range(1, plan.gpu_time_contexts):
            yield ("contexts", f"GPU time: context {c + 1} of {plan.gpu_time_contexts}",
                   lambda c=c: _context_bursts(gen, c, d0, plan, _take(fresh, c - 1)))
    finally:
        _close_unused(fresh, gen)  # (Ctrl-C or an error before their bursts)
    for d in plan.durations_us:
        yield "bursts", f"burst eager {d:g} us", lambda d=d: gen.burst("eager", d, 1, plan.burst_kernels)
        k = plan.e2e_graph_k
        yield "bursts", f"burst graph {d:g} us", lambda d=d, k=k: gen.burst("graph", d, k, max(1, plan.burst_kernels // k))
    # What the language adds: the same burst at the shortest kernel from each launch path, interleaved.
    python = LaunchGenerator(gen.b, path="python") if gen is not None else None
    for _ in range(plan.language_repeats):
        yield "bursts", "host cost: native", lambda: gen.burst("eager", d0, 1, plan.burst_kernels)
        yield "bursts", "host cost: Python", lambda: python.burst("eager", d0, 1, plan.burst_kernels)
        yield "bursts", "host cost: PyTorch", lambda: _torch_burst(gen, d0, plan.burst_kernels)
    for _ in range(plan.e2e_repeats):
        for d in plan.durations_us:
            n = plan.e2e_kernels_at(d)
            yield "e2e", f"e2e eager {d:g} us", lambda d=d, n=n: gen.end_to_end("eager", d, 1, n)
            yield "e2e", f"e2e graph {d:g} us", lambda d=d, n=n: gen.end_to_end("graph", d, plan.e2e_graph_k, n)


#: Eager bursts per fresh context: inside one context bursts agree within 0.1 % (H200), so a few suffice.
CONTEXT_BURSTS = 3


def _new_context(gen: LaunchGenerator) -> Backend | None:
    """A fresh CUDA context on the generator's GPU (:meth:`Backend.in_new_context`), or None where it cannot be
    made (e.g. a nearly full GPU: a context takes ~0.5 GB); the generator's own context is current again."""
    try:
        return gen.b.in_new_context()
    except CudaError:
        return None
    finally:
        gen.b.activate()


def _take(fresh: list[Backend | None], slot: int) -> Backend | None:
    """The context made ahead in ``fresh[slot]``, handed over: its slot is None after, so :func:`_close_unused`
    leaves it to the step that took it."""
    made, fresh[slot] = fresh[slot], None
    return made


def _close_unused(fresh: list[Backend | None], gen: LaunchGenerator) -> None:
    """Close the contexts still in ``fresh`` (no step took them: Ctrl-C or an error came first); the generator's
    own context is current again after any was closed."""
    left = [b for b in fresh if b is not None]
    fresh[:] = [None] * len(fresh)
    try:
        for b in left:
            with contextlib.suppress(Exception):  # the error or interrupt that got here is the one to report
                b.close()
    finally:
        if left:
            gen.b.activate()


def _context_bursts(gen: LaunchGenerator, context: int, kernel_us: float, plan: RunPlan,
                    made: Backend | None) -> list[dict[str, Any]] | None:
    """:data:`CONTEXT_BURSTS` eager bursts of ``kernel_us`` kernels in ``made``, a fresh CUDA context on the
    generator's GPU (:func:`_new_context`), closed after whatever happens; the generator's own context is made
    current again. Records as :meth:`LaunchGenerator.burst`'s, plus ``context`` (1, 2, ...: 0 is the run's own
    context). None where the context could not be made: the figure then rests on fewer contexts and says how
    many, and the run goes on."""
    if made is None:
        return None
    try:
        made.activate()
        other = LaunchGenerator(made)
        recs = [{**other.burst("eager", kernel_us, 1, plan.burst_kernels), "context": context}
                for _ in range(CONTEXT_BURSTS)]
        made.close()  # (idempotent: the clean-up below does nothing after it)
        return recs
    except BaseException:
        with contextlib.suppress(Exception):  # the error that got here (Ctrl-C included) is the one to report
            made.close()
        raise
    finally:
        gen.b.activate()  # whatever happened, the run's own context is current again


def _torch_loops(gen: LaunchGenerator) -> Any:
    """The backend's PyTorch launch loops (made once), or None where torch does not import (or the backend
    has no CUDA stream to share with it, e.g. the SIMULATED device)."""
    torch_loops = getattr(gen.b, "torch_loops", None)
    return torch_loops() if torch_loops is not None else None


def _torch_burst(gen: LaunchGenerator, kernel_us: float, calls: int) -> dict[str, Any] | None:
    """A burst launched through PyTorch, or None without PyTorch (:func:`_torch_loops`)."""
    loops = _torch_loops(gen)
    return None if loops is None else gen.burst("eager", kernel_us, 1, calls, loops=loops)


#: How a saved run's ``created`` is written (local time with its UTC offset).
CREATED_FORMAT = "%Y-%m-%dT%H:%M:%S%z"


def base_meta(plan: RunPlan, simulated: bool, argv: list[str] | None = None) -> dict[str, Any]:
    """The metadata every saved run starts with: tool and version, host, user, time, command line, the plan;
    ``status`` "running" and no GPUs yet (the recording fills them in)."""
    return {"tool": "pcietrace", "version": __version__, "simulated": simulated, "status": "running",
            "created": time.strftime(CREATED_FORMAT), "host": socket.gethostname(),
            "user": getpass.getuser(), "python": platform.python_version(), "argv": argv or sys.argv[1:],
            "plan": asdict(plan), "gpus": []}


@contextlib.contextmanager
def recording_status(session: Session) -> Iterator[None]:
    """Sets ``session.meta["status"]`` to how the recording inside ended: "complete", "interrupted" or
    "failed: <error>" (the error propagates; the caller's ``finally`` keeps what was recorded)."""
    try:
        yield
    except KeyboardInterrupt:
        session.meta["status"] = "interrupted"
        raise
    except BaseException as exc:
        session.meta["status"] = f"failed: {type(exc).__name__}: {exc}"
        raise
    session.meta["status"] = "complete"


#: Plan tables whose steps time the host or the GPU (host cost, GPU time per kernel, end-to-end loops),
#: as opposed to counting bytes: the steps that must not share the machine with another GPU's work.
TIMED_TABLES = ("bursts", "contexts", "e2e")


def record(session: Session, plan: RunPlan, gpus: list[tuple[GpuRecord, Backend]],
           sampler: Any, probes: dict[int, Any] | None = None, progress: Progress = lambda _: None,
           before_timing: Callable[[dict[str, Any]], None] = lambda _: None) -> Session:
    """Run ``plan`` on each ``(gpu, backend)`` while ``sampler`` samples; fill ``session`` (whose
    ``meta["gpus"]`` holds each GPU's saved record, :meth:`GpuRecord.meta`).

    ``probes`` (per NVML index, optional): :class:`pcietrace.collectors.BoundaryProbe` objects that read
    the counters exactly at each window's start and end; their reads join the samples.
    ``before_timing(gpu's saved record)`` is called before a GPU's first timed step (:data:`TIMED_TABLES`;
    they come after its byte windows): parallel workers wait there for their turn (and note it there).

    ``session.meta["status"]`` says how it ended. Whatever was recorded before an exception (including
    KeyboardInterrupt) stays in the session, so the caller can still save it.
    """
    tables: dict[str, list[dict[str, Any]]] = {"windows": [], "bursts": [], "contexts": [], "e2e": [], "calibration": []}
    sampler.start()
    for g in session.meta.get("gpus", []):
        g["counter"] = sampler.modes.get(g["nvml_index"], {"mode": "unknown", "bits": 0})
    for idx, probe in (probes or {}).items():
        if hasattr(probe, "agree") and idx in sampler.modes:
            probe.agree(sampler.modes[idx]["mode"])  # edge reads and samples in one counter mode
    saved = {g["nvml_index"]: g for g in session.meta.get("gpus", [])}
    try:
        with recording_status(session):
            for g, backend in gpus:
                backend.activate()
                gen = LaunchGenerator(backend, (probes or {}).get(g.nvml_index))
                timing = False
                with contextlib.closing(_steps(plan, gen)) as steps:  # (at once on error: contexts made ahead close)
                    for table, label, thunk in steps:
                        if table in TIMED_TABLES and not timing:
                            timing = True
                            before_timing(saved.get(g.nvml_index, {}))
                        progress(f"GPU {g.cuda_ordinal}: {label}")
                        t0 = time.monotonic_ns()
                        got = thunk()
                        if got is None:  # a step this machine cannot measure (e.g. no PyTorch)
                            continue
                        t1 = time.monotonic_ns()
                        for rec in got if isinstance(got, list) else [got]:
                            rec.update(nvml_index=g.nvml_index, cuda_ordinal=g.cuda_ordinal)
                            if table in TIMED_TABLES:  # when it was timed (windows carry their own edges)
                                rec.update(t_start_ns=t0, t_end_ns=t1)
                            tables[table].append(rec)
    finally:
        with signals.deferred():  # a signal here lost every table and sample (the run saved as complete, empty)
            session.samples = merge_samples([sampler.stop()] + [p.frame() for p in (probes or {}).values()])
            session.meta["failed_reads"] = {str(k): v for k, v in getattr(sampler, "failed_reads", {}).items()}
            for t, rows in tables.items():
                setattr(session, t, pd.DataFrame(rows))
    return session
