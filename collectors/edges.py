"""Range edges as a wake-up signal shared between the traced program and the samplers.

A one-page file (normally under /dev/shm) holds a 32-bit sequence number. The injection library maps it
(``PCIETRACE_EDGE_FILE``), increments the number at every NVTX push/pop/start/end and wakes every waiter
with a shared futex; each sampler process waits on that futex instead of sleeping between reads, so the
counters are read right after each range edge without the program ever waiting for a read.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import tempfile
import time

PAGE = 4096
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_FUTEX_WAIT = 0  # shared (not FUTEX_PRIVATE_FLAG): waker and waiters live in different processes


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def create() -> str:
    """A fresh zeroed edge file; returns its path (the caller removes it)."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    fd, path = tempfile.mkstemp(prefix="pcietrace-edges-", dir=base)
    os.write(fd, b"\0" * PAGE)
    os.close(fd)
    return path


class EdgeWaiter:
    """Waits until the next range edge or a deadline, whichever comes first (plain sleep without a file)."""

    def __init__(self, path: str | None) -> None:
        self._mm = self._word = None
        self._libc = None
        if path and _SYS_FUTEX is not None:
            with open(path, "r+b") as f:
                self._mm = mmap.mmap(f.fileno(), PAGE)
            self._word = ctypes.c_uint32.from_buffer(self._mm)
            self._libc = ctypes.CDLL(None, use_errno=True)

    @property
    def seq(self) -> int:
        """Edges signalled so far (modulo 2**32)."""
        return self._word.value if self._word is not None else 0

    def wait_until(self, deadline_ns: int, seen: int) -> None:
        """Return at ``deadline_ns`` (CLOCK_MONOTONIC) or as soon as the sequence differs from ``seen``."""
        while True:
            left = deadline_ns - time.monotonic_ns()
            if left <= 0:
                return
            if self._word is None:
                time.sleep(left / 1e9)
                return
            if self._word.value != seen:
                return
            ts = _Timespec(left // 1_000_000_000, left % 1_000_000_000)
            self._libc.syscall(_SYS_FUTEX, ctypes.byref(self._word), _FUTEX_WAIT, ctypes.c_uint32(seen),
                               ctypes.byref(ts), None, 0)

    def close(self) -> None:
        self._word = None  # release the buffer export before closing the map
        if self._mm is not None:
            self._mm.close()
            self._mm = None
