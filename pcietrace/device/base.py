"""What the launch generator needs from a device: the real GPU (:mod:`pcietrace.device.backend`) and the
SIMULATED one (:mod:`pcietrace.device.sim`) both provide it."""

from __future__ import annotations

from collections import deque
from itertools import repeat, starmap
from typing import Any, Callable, Protocol

#: One launch call; returns the binding's result tuple, whose first item is the error code (0 = success).
Launch = Callable[[], tuple[Any, ...]]

#: Launch paths a host-cost figure can come from: the native C loops, Python through cuda.bindings,
#: PyTorch (an elementwise op on a 1-element tensor).
PATHS = ("native", "python", "torch")


class Loops(Protocol):
    """Timed launch loops for one launch (eager kernel or graph). All times on the backend's clock (ns)."""

    path: str  # one of PATHS

    def for_duration(self, duration_ns: int, period_ns: int | None) -> tuple[int, int, int]: ...
    # (t before the calls, t after them, t after the synchronize, the thread's CPU ns over the calls)
    def calls(self, n: int, sync: bool = False) -> tuple[int, int, int, int]: ...


class Backend(Protocol):
    """What the generator needs from a device. Launch callables return ``(err,)``, 0 on success."""

    simulated: bool

    def activate(self) -> None: ...  # make this device current for the calling thread
    def clock(self) -> int: ...  # ns, monotonic
    def thread_time_ns(self) -> int: ...  # CPU time of the calling thread, ns
    def launcher(self, kernel_ns: int) -> Launch: ...
    def blocker(self, kernel_ns: int) -> Launch: ...
    def graph_launcher(self, nodes: int, kernel_ns: int) -> Launch: ...
    def native_loops(self, mode: str, nodes: int, kernel_ns: int) -> Loops: ...  # mode "eager" | "graph"
    def synchronize(self) -> None: ...
    def event(self) -> Any: ...
    def record(self, ev: Any) -> None: ...
    def done(self, ev: Any) -> bool: ...
    def elapsed_ms(self, a: Any, b: Any) -> float: ...
    def measure_kernel_ns(self, kernel_ns: int, repeats: int) -> list[int]: ...
    def raise_launch_error(self, result: tuple[Any, ...]) -> None: ...
    def in_new_context(self) -> "Backend": ...  # the same device in a context of its own (then current)
    def close(self) -> None: ...  # release the device's resources and context


class PythonLoops:
    """The launch loops in Python over a :data:`Launch` callable (what a Python program pays per call).

    ``checked``: the callable returns a CUDA result tuple to check (False for calls that raise on
    error themselves, e.g. PyTorch ops)."""

    #: launches issued between clock checks when running as fast as possible
    BATCH = 128

    def __init__(self, backend: Backend, launch: Callable[[], Any], path: str = "python", checked: bool = True) -> None:
        self.b, self.launch, self.path, self.checked = backend, launch, path, checked

    def _calls(self, n: int) -> None:
        """``n`` launch calls with no Python bytecode between them (starmap runs the loop in C); the
        distinct results are checked once afterwards."""
        if not self.checked:
            deque(starmap(self.launch, repeat((), n)), maxlen=0)  # consumed in C, results dropped
            return
        results = set(starmap(self.launch, repeat((), n)))
        if len(results) != 1 or next(iter(results))[0]:
            self.b.raise_launch_error(max(results, key=lambda r: int(r[0])))

    def for_duration(self, duration_ns: int, period_ns: int | None) -> tuple[int, int, int]:
        clock, calls = self.b.clock, 0
        t0 = clock()
        deadline = t0 + duration_ns
        if period_ns is None:
            while clock() < deadline:
                self._calls(self.BATCH)
                calls += self.BATCH
            return calls, t0, clock()
        launch, next_t = self.launch, t0
        wait_until = getattr(self.b, "wait_until", None)  # the SIMULATED clock jumps instead of spinning
        while True:
            now = clock()
            if now >= deadline:
                return calls, t0, now
            if now < next_t and wait_until is not None:
                wait_until(min(next_t, deadline))
            elif now >= next_t:
                r = launch()
                if self.checked and r[0]:
                    self.b.raise_launch_error(r)
                calls += 1
                # Keep the average rate, but never burst more than a few periods to catch up.
                next_t = max(next_t + period_ns, now - 4 * period_ns)

    def calls(self, n: int, sync: bool = False) -> tuple[int, int, int, int]:
        # (the CPU clock read right around the wall clock's reads: a burst of a few calls has no Python of ours
        # in its CPU time that its wall time leaves out)
        cpu0 = self.b.thread_time_ns()
        t0 = self.b.clock()
        self._calls(n)
        t1 = self.b.clock()
        cpu1 = self.b.thread_time_ns()
        if sync:
            self.b.synchronize()
        return t0, t1, self.b.clock() if sync else t1, cpu1 - cpu0
