"""Devices for ``pcietrace graphs``: the real GPU, whose iterations run in C (``pcietrace/native/pt_graphs.c``),
and the SIMULATED one (:mod:`pcietrace.device.graphs_sim`). Both hand out one runner per strategy whose
``run(order)`` returns one :data:`ITERATION_DTYPE` record per iteration."""

from __future__ import annotations

import ctypes
import time
from typing import Any, Protocol

import numpy as np

from pcietrace.errors import CudaError, UsageError
from pcietrace.schema import COUNT_COLUMNS, STRATEGIES  # noqa: F401 - the C enum and pt_iter fields, named once


#: One iteration (mirrors pt_iter). Times in ns on CLOCK_MONOTONIC: ``t_start_ns``; ``prep_ns`` (capture +
#: instantiate / update / node updates; 0 for eager and cache hits); ``submit_ns`` (start -> work submitted);
#: ``wall_ns`` (start -> next iteration's start, or -> its own synchronize with ``sync``); ``cpu_ns`` (the
#: thread's CPU time until submitted).
ITERATION_DTYPE = np.dtype([("t_start_ns", np.int64), ("prep_ns", np.int64), ("submit_ns", np.int64),
                            ("wall_ns", np.int64), ("cpu_ns", np.int64), ("param_set", np.int32)]
                           + [(c, np.int32) for c in COUNT_COLUMNS], align=True)

#: Bound on recognize's cache (executable graphs kept); only "all-new" orders exceed it.
CACHE_CAP = 256


class Runner(Protocol):
    def run(self, order: np.ndarray) -> np.ndarray: ...  # ITERATION_DTYPE records, one per order entry
    def close(self) -> None: ...


class GraphsDevice(Protocol):
    simulated: bool
    timing: str  # where iterations are timed, for the output

    def clock(self) -> int: ...  # ns, CLOCK_MONOTONIC (the counter sampler's clock)
    def idle(self, ns: int) -> None: ...  # let ``ns`` pass with no GPU work (host spinning)
    def runner(self, strategy: str, durations_ns: np.ndarray, sync: bool) -> Runner: ...
    def close(self) -> None: ...  # release the GPU (idempotent)


def _lib() -> ctypes.CDLL:
    from pcietrace.device.native import library

    lib = library()
    if not hasattr(lib, "pt_graphs_create"):
        raise UsageError("pcietrace's native library lacks the graph loops; reinstall pcietrace")
    if lib.pt_graphs_iter_size() != ITERATION_DTYPE.itemsize:
        raise UsageError(f"native iteration record is {lib.pt_graphs_iter_size()} B, Python expects "
                         f"{ITERATION_DTYPE.itemsize} B; reinstall pcietrace")
    lib.pt_graphs_create.restype = ctypes.c_void_p
    lib.pt_graphs_create.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int, ctypes.c_int,
                                     ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.pt_graphs_run.restype = ctypes.c_int
    lib.pt_graphs_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                  ctypes.c_char_p, ctypes.c_int]
    lib.pt_graphs_destroy.restype = ctypes.c_int
    lib.pt_graphs_destroy.argtypes = [ctypes.c_void_p]
    return lib


def _error(code: int, err: bytes) -> CudaError:
    """The C side reports "call|ERROR_NAME"."""
    call, _, name = err.split(b"\0", 1)[0].decode(errors="replace").partition("|")
    return CudaError(call or "pt_graphs", int(code), name or "?")


class NativeRunner:
    """One strategy's C state (its graphs live across :meth:`run` calls); ``durations_ns``: parameter sets x
    kernels, kept alive here because C reads it in place."""

    def __init__(self, lib: ctypes.CDLL, strategy: str, func: int, stream: int, durations_ns: np.ndarray,
                 sync: bool) -> None:
        self.lib, self.sync = lib, sync
        self.durations = np.ascontiguousarray(durations_ns, dtype=np.uint64)
        err = ctypes.create_string_buffer(256)
        p, n = self.durations.shape
        self.h = lib.pt_graphs_create(STRATEGIES.index(strategy), func, stream, n, p, self.durations.ctypes.data,
                                      min(CACHE_CAP, p), err, len(err))
        if not self.h:
            raise _error(-1, err.raw)

    def run(self, order: np.ndarray) -> np.ndarray:
        order = np.ascontiguousarray(order, dtype=np.int32)
        out = np.zeros(order.size, ITERATION_DTYPE)
        err = ctypes.create_string_buffer(256)
        rc = self.lib.pt_graphs_run(self.h, order.ctypes.data, order.size, int(self.sync), out.ctypes.data, err, len(err))
        if rc:
            raise _error(rc, err.raw)
        return out

    def close(self) -> None:
        if self.h:
            rc = self.lib.pt_graphs_destroy(self.h)
            self.h = None
            if rc:
                raise CudaError("pt_graphs_destroy (cuStreamSynchronize)", rc, "?")


class CudaGraphsDevice:
    """The spin kernel on a real GPU; iterations run and are timed in C. It owns the backend it is given:
    :meth:`close` (or leaving ``with``) closes it, and with it the GPU's context."""

    simulated = False
    timing = "native (C loop, CLOCK_MONOTONIC)"
    clock = staticmethod(time.monotonic_ns)

    def __init__(self, backend: Any) -> None:
        """``backend``: a :class:`pcietrace.device.backend.CudaBackend`, whose spin kernel (already loaded in
        its context) the strategies launch: the module is not loaded a second time."""
        self.backend, self.gpu = backend, backend.gpu
        self.lib = _lib()
        self.func = backend.spin_function

    def __enter__(self) -> "CudaGraphsDevice":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the backend: its GPU's module, memory, stream and context (idempotent)."""
        self.backend.close()

    def idle(self, ns: int) -> None:
        deadline = time.monotonic_ns() + ns
        while time.monotonic_ns() < deadline:
            pass  # spin rather than sleep: the host stays as busy as in the strategy windows

    def runner(self, strategy: str, durations_ns: np.ndarray, sync: bool) -> NativeRunner:
        self.gpu.make_current()
        return NativeRunner(self.lib, strategy, int(self.func), int(self.gpu.stream), durations_ns, sync)
