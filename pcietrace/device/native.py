"""The native timing loops (``pcietrace/native/pt_*.c``, built by pip as ``pcietrace._pt_native``), loaded
with ctypes. Python sets things up (modules, graphs, buffers through :mod:`pcietrace.device.cuda`) and
hands raw handles to C, which loops and timestamps on CLOCK_MONOTONIC, so host-side figures are what a
C/C++ program pays."""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os

from pcietrace.errors import UsageError

ABI = 1


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The loaded native library; raises UsageError if the package was installed without it."""
    spec = importlib.util.find_spec("pcietrace._pt_native")
    if spec is None or not spec.origin or not os.path.exists(spec.origin):
        raise UsageError("pcietrace's native library is not built; reinstall pcietrace where a C compiler is available")
    lib = ctypes.CDLL(spec.origin)
    if lib.pt_native_abi() != ABI:
        raise UsageError(f"pcietrace's native library is stale (ABI {lib.pt_native_abi()}, want {ABI}); reinstall")
    return lib
