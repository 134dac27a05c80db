"""The native timing loops (``pcietrace/native/pt_*.c``, built by pip as ``pcietrace._pt_native``), loaded
with ctypes. Python sets things up (modules, graphs, buffers through :mod:`pcietrace.device.cuda`) and
hands raw handles to C, which loops and timestamps on CLOCK_MONOTONIC, so host-side figures are what a
C/C++ program pays.

Handles are plain integers (``int(CUfunction)``, ``int(CUstream)``, ``int(CUgraphExec)``, device pointers,
the address of a kernel's ``void*[]`` parameter block). Every loop returns a CUresult or a ``PT_ERR_*``
code, turned into :class:`~pcietrace.errors.CudaError` here.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import importlib.util
import os
import sys
from dataclasses import dataclass

import numpy as np

from pcietrace.errors import CudaError, NoGpuError, UsageError

ABI = 2

#: Launch kinds (pt_loops.c): one cuLaunchKernel of a kernel, or one cuGraphLaunch of an executable graph.
EAGER, GRAPH = 0, 1
#: pt_loops.c's own error codes (CUresults are >= 0).
ERR_NO_ENTRY, ERR_TIMEOUT, ERR_ARG = -1, -2, -3

_i64, _vp, _i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
_I64P = ctypes.POINTER(ctypes.c_int64)
_SIGNATURES = {
    "pt_native_abi": ([], _i32),
    "pt_loops_init": ([], _i32),
    "pt_error_name": ([_i32], ctypes.c_char_p),
    "pt_launch_for": ([_i32, _vp, _vp, _vp, _i64, _i64, _I64P], _i32),
    "pt_launch_n": ([_i32, _vp, _vp, _vp, _i64, _i32, _I64P], _i32),
    "pt_launch_sync_each": ([_i32, _vp, _vp, _vp, _i64, _I64P], _i32),
    "pt_copy_sync_each": ([_i32, ctypes.c_uint64, _vp, _i64, _vp, _i64, _I64P], _i32),
    "pt_flag_each": ([_vp, _vp, _vp, _vp, _vp, ctypes.c_uint32, _i64, _i64, _I64P, _I64P], _i32),
}


def built(module: str) -> str:
    """Path of one of pcietrace's built C libraries (``_pt_native``, ``_pt_inject``). Run from a source checkout
    whose ``pcietrace/`` comes first on sys.path (``python3 -m pytest`` in its root) while the package is
    installed elsewhere, the libraries are those of the installed copy."""
    spec = importlib.util.find_spec(f"pcietrace.{module}")
    if spec is not None and spec.origin and os.path.exists(spec.origin):
        return spec.origin
    for entry in sys.path:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(entry or ".", "pcietrace", module + suffix)
            if os.path.exists(path):
                return path
    raise UsageError(f"pcietrace's C library {module} is not built; reinstall pcietrace where a C compiler is available")


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The loaded native library; raises UsageError if the package was installed without it."""
    lib = ctypes.CDLL(built("_pt_native"))
    if lib.pt_native_abi() != ABI:
        raise UsageError(f"pcietrace's native library is stale (ABI {lib.pt_native_abi()}, want {ABI}); reinstall")
    for name, (args, res) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return lib


def check(rc: int, call: str) -> None:
    """Raise the error a native loop's return code stands for (0 = success)."""
    if rc == 0:
        return
    if rc == ERR_NO_ENTRY:
        raise NoGpuError(f"{call}: the CUDA driver's entry points could not be resolved (no driver, or too old)")
    if rc == ERR_TIMEOUT:
        raise CudaError(call, rc, "PT_ERR_TIMEOUT", "a kernel's store never reached host memory")
    if rc == ERR_ARG:
        raise UsageError(f"{call}: bad argument to the native loop")
    name = library().pt_error_name(rc)
    raise CudaError(call, rc, name.decode() if name else "CUDA error")


def _out(n: int) -> np.ndarray:
    return np.zeros(n, np.int64)


def _ptr(a: np.ndarray) -> ctypes._Pointer:  # type: ignore[type-arg]
    return a.ctypes.data_as(_I64P)


@dataclass(frozen=True)
class NativeLoops:
    """Launch loops in C for one launch: ``kind`` :data:`EAGER` (``handle`` = CUfunction, ``params`` =
    its parameter block's address) or :data:`GRAPH` (``handle`` = CUgraphExec) on ``stream``. The
    calling thread must have the GPU's context current. Implements :class:`pcietrace.device.base.Loops`."""

    kind: int
    handle: int
    stream: int
    params: int = 0
    path: str = "native"

    def for_duration(self, duration_ns: int, period_ns: int | None) -> tuple[int, int, int]:
        """Launch for ``duration_ns`` as fast as possible (``period_ns`` None) or one call per ``period_ns``;
        returns (calls, t_start_ns, t_end_ns) with t_end after the last call (no synchronize)."""
        out = _out(4)
        rc = library().pt_launch_for(self.kind, self.handle, self.stream, self.params, int(period_ns or 0),
                                     int(duration_ns), _ptr(out))
        check(rc, "pt_launch_for")
        return int(out[0]), int(out[1]), int(out[2])

    def calls(self, n: int, sync: bool = False) -> tuple[int, int, int, int]:
        """``n`` calls back to back (then a stream synchronize if ``sync``); returns (t_before_ns,
        t_after_calls_ns, t_after_sync_ns, the thread's CPU ns over the calls, read around them in C)."""
        out = _out(4)
        check(library().pt_launch_n(self.kind, self.handle, self.stream, self.params, int(n), int(sync), _ptr(out)),
              "pt_launch_n")
        return int(out[0]), int(out[1]), int(out[2]), int(out[3])

    def sync_each(self, repeats: int) -> np.ndarray:
        """Per repeat: one call + stream synchronize, host-timed (ns, int64 array)."""
        out = _out(repeats)
        check(library().pt_launch_sync_each(self.kind, self.handle, self.stream, self.params, int(repeats), _ptr(out)),
              "pt_launch_sync_each")
        return out


def copy_sync_each(h2d: bool, dev: int, host: int, nbytes: int, stream: int, repeats: int) -> np.ndarray:
    """Per repeat: an async copy of ``nbytes`` between pinned ``host`` and device ``dev`` (direction by
    ``h2d``) plus stream synchronize, host-timed (ns, int64 array)."""
    out = _out(repeats)
    check(library().pt_copy_sync_each(int(h2d), dev, host, int(nbytes), stream, int(repeats), _ptr(out)),
          "pt_copy_sync_each")
    return out


def flag_each(func: int, stream: int, params: int, value_arg: int, flags: int, first_value: int, repeats: int,
              timeout_ns: int = 2_000_000_000) -> tuple[np.ndarray, np.ndarray]:
    """The pt_flag kernel per repeat (see pt_loops.c): (launch -> first instruction seen by the host,
    kernel end seen -> stream reported done), ns int64 arrays. ``value_arg``: address of the kernel's
    ``value`` argument storage; ``flags``: host address of the two host-mapped uint32 flags."""
    first, end = _out(repeats), _out(repeats)
    check(library().pt_flag_each(func, stream, params, value_arg, flags, first_value & 0xFFFFFFFF, int(repeats),
                                 int(timeout_ns), _ptr(first), _ptr(end)), "pt_flag_each")
    return first, end
