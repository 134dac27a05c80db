"""Launch generator: fires the spin kernel eager or as CUDA graphs, paced or as fast as possible.

Works against a :class:`Backend` (the real GPU in :mod:`pcietrace.device.backend`, or the simulated one in
:mod:`pcietrace.device.sim`), so the same loops run in tests with a virtual clock. All times are on the
backend's clock, which for real GPUs is ``time.monotonic_ns()`` — the collector's clock.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator

import numpy as np

from pcietrace.device.base import Backend, Loops, PythonLoops
from pcietrace.errors import ConfigError

try:  # nvtx is a declared dependency, but a missing one must not stop a measurement
    import nvtx as _nvtx
except ImportError:  # pragma: no cover
    _nvtx = None

MODES = ("idle", "eager", "graph")
@dataclass(frozen=True)
class LaunchConfig:
    """One measured window, validated on construction.

    ``rate_hz`` counts launch calls: kernels in eager mode, graph launches in graph mode; ``None`` means
    as fast as possible. ``graph_k`` is the number of kernel nodes per graph (1 in eager mode).
    """

    mode: str
    kernel_us: float = 0.0
    graph_k: int = 1
    rate_hz: float | None = None
    duration_s: float = 0.25
    purpose: str = "bytes"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError("mode", f"must be one of {', '.join(MODES)}, not {self.mode!r}")
        if not (0 <= self.kernel_us <= 1_000_000) or math.isnan(self.kernel_us):
            raise ConfigError("kernel_us", f"(the kernel duration) must be 0..1e6 us, not {self.kernel_us}")
        if not (1 <= self.graph_k <= 100_000):
            raise ConfigError("graph_k", f"(the graph size) must be 1..100000, not {self.graph_k}")
        if self.mode != "graph" and self.graph_k != 1:
            raise ConfigError("graph_k", "(the graph size K) only applies to graph mode")
        if self.rate_hz is not None and not (0 < self.rate_hz <= 10_000_000):
            raise ConfigError("rate_hz", f"(launches/s): the rate must be > 0 and <= 1e7, not {self.rate_hz}")
        if not (0 < self.duration_s <= 3600):
            raise ConfigError("duration_s", f"(the window duration) must be 0..3600 s, not {self.duration_s}")

    @property
    def kernel_ns(self) -> int:
        return int(round(self.kernel_us * 1000))

    @property
    def label(self) -> str:
        rate = "max" if self.rate_hz is None else f"{self.rate_hz:.0f}/s"
        k = f" K={self.graph_k}" if self.mode == "graph" else ""
        return f"{self.purpose} {self.mode}{k} {self.kernel_us:g}us @{rate}"


@contextlib.contextmanager
def nvtx_range(message: str) -> Iterator[None]:
    """An NVTX push/pop range in the 'pcietrace' domain, so nsys timelines show our windows."""
    if _nvtx is None:
        yield
        return
    with _nvtx.annotate(message, domain="pcietrace"):
        yield


class LaunchGenerator:
    """Runs windows, bursts and end-to-end loops on one backend; each returns one record (a dict).

    Launch loops run on ``path`` (:data:`~pcietrace.device.base.PATHS`): "native" (the C loops of
    :mod:`pcietrace.device.native`, what a C/C++ program pays; the SIMULATED backend models them) or
    "python" (the same launches from a Python loop through cuda.bindings). Records say which."""

    def __init__(self, backend: Backend, probe: Callable[[], int] | None = None, path: str = "native") -> None:
        """``probe``: reads the PCIe counters once and returns the read's timestamp (ns). When given,
        every window starts and ends with a probe, and the window's ``t_start_ns``/``t_end_ns`` are
        those reads' times, so window bytes are exact counter differences (no interpolation)."""
        if path not in ("native", "python"):
            raise ConfigError("path", f"(the launch path) must be native or python, not {path!r}")
        self.b = backend
        self.probe = probe
        self.path = path
        # A simulated backend jumps its virtual clock instead of spinning on it (busy loops on a simulated
        # clock cost real seconds); real GPUs have no such hook and spin, keeping the host as busy as ever.
        self._wait_until: Callable[[int], None] | None = getattr(backend, "wait_until", None)
        self._events: tuple[Any, Any] | None = None  # one pair for every burst (made on the first)

    def _loops(self, cfg: LaunchConfig) -> Loops:
        if self.path == "native":
            return self.b.native_loops(cfg.mode, cfg.graph_k, cfg.kernel_ns)
        launch = self.b.graph_launcher(cfg.graph_k, cfg.kernel_ns) if cfg.mode == "graph" else self.b.launcher(cfg.kernel_ns)
        return PythonLoops(self.b, launch)

    # -- windows: traffic measured by the collector ------------------------------------------------
    def window(self, cfg: LaunchConfig) -> dict[str, Any]:
        """Launch for ``cfg.duration_s`` at ``cfg.rate_hz``, then synchronize.

        Record: ``t_start_ns``/``t_end_ns`` (before the first launch / after the stream drained; the
        probe reads' times where there is a probe),
        ``enqueue_ns`` (the launch loop's wall time), ``cpu_ns`` (its thread CPU time), ``calls``
        (launch calls), ``launches`` (kernels = calls x K), ``achieved_rate_hz`` (calls per second of
        the launch loop), ``path`` (which launch loop).
        """
        b = self.b
        loops = None if cfg.mode == "idle" else self._loops(cfg)
        if loops is not None:  # warm this launch path so first-call costs stay outside the window
            loops.calls(1, sync=True)
        dur_ns = int(cfg.duration_s * 1e9)
        period = None if cfg.rate_hz is None else int(1e9 / cfg.rate_hz)
        with nvtx_range(cfg.label):
            t_a = self.probe() if self.probe else None
            cpu0 = b.thread_time_ns()
            if loops is None:
                t0 = b.clock()
                calls = self._idle(t0 + dur_ns)
                t1 = b.clock()
            else:
                calls, t0, t1 = loops.for_duration(dur_ns, period)
            cpu1 = b.thread_time_ns()
            b.synchronize()
            t2 = self.probe() if self.probe else b.clock()
        k = cfg.graph_k if cfg.mode == "graph" else 1
        return {
            **asdict(cfg),
            "target_rate_hz": float("nan") if cfg.rate_hz is None else float(cfg.rate_hz),
            "t_start_ns": t0 if t_a is None else t_a, "t_end_ns": t2, "enqueue_ns": t1 - t0, "cpu_ns": cpu1 - cpu0,
            "calls": calls, "launches": calls * k if cfg.mode != "idle" else 0,
            "achieved_rate_hz": calls / ((t1 - t0) / 1e9) if t1 > t0 else 0.0,
            "path": self.path if loops is not None else "",
        }

    def _idle(self, deadline: int) -> int:
        if self._wait_until is not None:
            self._wait_until(deadline)
            return 0
        clock = self.b.clock
        while clock() < deadline:
            pass  # spin rather than sleep: the host stays as busy as in the launch windows
        return 0

    # -- bursts: host cost per call and GPU time per kernel with the queue full -------------------
    def burst(self, mode: str, kernel_us: float, graph_k: int, calls: int, blocker_ms: float = 20.0,
              loops: Loops | None = None) -> dict[str, Any]:
        """Queue ``calls`` launch calls behind a ``blocker_ms`` kernel, timing host and GPU separately.

        While the blocker runs, the GPU consumes nothing, so the host loop's wall time is the pure
        launch cost (``host_ns``), and the events after the blocker measure the GPU's own time to run
        the queued kernels back to back (``gpu_ns``). ``saturated`` is True when the blocker was still
        running after the last launch call (the measurement's precondition); keep ``calls`` below the
        queue depth (~1000 launches on H100) or the host blocks. ``loops``: launch through these
        instead of the generator's path (e.g. PyTorch; they must launch on the backend's stream);
        the record's ``path`` says which.
        """
        cfg = LaunchConfig(mode, kernel_us, graph_k, None, 1.0, "burst")
        b = self.b
        loops = loops or self._loops(cfg)
        loops.calls(1)  # warm up
        blocker = b.blocker(int(blocker_ms * 1e6))
        if self._events is None:  # one pair, reused: the Gpu holds what it creates until close()
            self._events = (b.event(), b.event())
        ev_a, ev_b = self._events
        b.synchronize()
        with nvtx_range(f"{cfg.label} ({loops.path})"):
            b.raise_launch_error(blocker())
            b.record(ev_a)
            # (the CPU time the loop itself read: read here, a burst of a few calls showed more CPU than wall
            # time, the Python around the loop counted in one and not the other)
            t0, t1, _, cpu_ns = loops.calls(calls)
            saturated = not b.done(ev_a)
            b.record(ev_b)
            gpu_ms = b.elapsed_ms(ev_a, ev_b)
            b.synchronize()
        k = graph_k if mode == "graph" else 1
        return {"mode": mode, "kernel_us": kernel_us, "graph_k": k, "calls": calls, "launches": calls * k,
                "host_ns": t1 - t0, "cpu_ns": cpu_ns, "gpu_ns": gpu_ms * 1e6, "saturated": saturated,
                "path": loops.path}

    # -- end to end: wall time per kernel, host launching as fast as it can ----------------------
    def end_to_end(self, mode: str, kernel_us: float, graph_k: int, kernels: int) -> dict[str, Any]:
        """Wall time for ``kernels`` kernels launched as fast as possible plus the final synchronize."""
        cfg = LaunchConfig(mode, kernel_us, graph_k, None, 1.0, "e2e")
        loops = self._loops(cfg)
        k = graph_k if mode == "graph" else 1
        calls = max(1, kernels // k)
        loops.calls(1, sync=True)
        with nvtx_range(cfg.label):
            t0, _, t2, _ = loops.calls(calls, sync=True)
        return {"mode": mode, "kernel_us": kernel_us, "graph_k": k, "launches": calls * k, "wall_ns": t2 - t0,
                "path": loops.path}

    # -- calibration -----------------------------------------------------------------------------
    def calibrate(self, kernel_us: float, repeats: int = 20) -> dict[str, Any]:
        """Requested vs measured kernel duration (the kernel times its own spin on the GPU timer)."""
        got = np.asarray(self.b.measure_kernel_ns(int(round(kernel_us * 1000)), repeats), dtype=float)
        return {"kernel_us": kernel_us, "measured_us": float(np.median(got)) / 1e3,
                "min_us": float(got.min()) / 1e3, "max_us": float(got.max()) / 1e3, "repeats": repeats}
