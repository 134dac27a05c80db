"""Range edges as a wake-up signal shared between the traced program and the samplers.

A one-page file (normally under /dev/shm) holds five 32-bit words. The injection library maps it
(``PCIETRACE_EDGE_FILE``), increments the sequence number (word 0) at every NVTX push/pop/start/end and, where
a sampler should read (a range opening in a process with none open in it; see ``edge_signal`` in
pt_inject_edges.c), word 4 too, waking every waiter on it (a shared futex); an idle sampler, or one at its quiet
pace inside a range, waits on that futex instead of sleeping, so a range is read right after it opens without
the program ever waiting for a read, and nested edges wake nobody. Word 1 is
how many threads have a push range open, plus the start ranges open, right now over every traced process
(kept by the injection library, never below 0: a thread counts once however deep its ranges nest), so a
sampler can read fast only while a range is open; the library sets word 3 when it maps
the page, to say it keeps that count (an older library does not: then the samplers never slow down). Word 2
is pcietrace's own: non-zero while the recording process wants the fast rate with no range open (attach's
idle calibration windows).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import tempfile
import time
from typing import Any

PAGE = 4096  # (pt_abi.h: PT_EDGE_PAGE_BYTES)
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1  # shared (not FUTEX_PRIVATE_FLAG): waker and waiters live in different processes
SEQ, OPEN_RANGES, FORCE_FAST, COUNTING, WAKES = 0, 1, 2, 3, 4  # 32-bit words of the page (pt_abi.h: PT_EDGE_*)
_SHORT_SLEEP_NS = 2_000_000  # below this a plain sleep: an Event's wait costs more than the sleep's precision


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def create() -> str:
    """A fresh zeroed edge file; returns its path (the caller removes it)."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    # (the pid: a page a killed run left is removed at the next start, pcietrace/store.py: sweep_leftovers)
    fd, path = tempfile.mkstemp(prefix=f"pcietrace-edges-{os.getpid()}-", dir=base)
    os.write(fd, b"\0" * PAGE)
    os.close(fd)
    return path


class EdgeWaiter:
    """Waits until the next range edge or a deadline, whichever comes first. Without a file it waits on
    ``stop`` (a threading/multiprocessing Event) if given, else sleeps, so a stop still cuts a wait short."""

    def __init__(self, path: str | None, stop: Any = None) -> None:
        self._mm = self._words = None
        self._libc = None
        self._stop = stop
        if path and _SYS_FUTEX is not None:
            with open(path, "r+b") as f:
                self._mm = mmap.mmap(f.fileno(), PAGE)
            self._words = (ctypes.c_uint32 * 5).from_buffer(self._mm)
            self._libc = ctypes.CDLL(None, use_errno=True)

    @property
    def mapped(self) -> bool:
        """Whether an edge file is mapped (without one there are no edges and no open-range count)."""
        return self._words is not None

    @property
    def seq(self) -> int:
        """Edges signalled so far (modulo 2**32)."""
        return self._words[SEQ] if self._words is not None else 0

    @property
    def wakes(self) -> int:
        """Edges that woke the samplers so far (modulo 2**32; 0 without a file)."""
        return self._words[WAKES] if self._words is not None else 0

    @property
    def open_ranges(self) -> int:
        """Threads with a push range open plus start ranges open, right now over every traced process (0 without a
        file): above 0 while any range is open."""
        return self._words[OPEN_RANGES] if self._words is not None else 0

    @property
    def counting(self) -> bool:
        """Whether an injection library that keeps :attr:`open_ranges` has mapped the page (until then, or
        with an older library, the open-range count says nothing)."""
        return bool(self._words[COUNTING]) if self._words is not None else False

    @property
    def force_fast(self) -> bool:
        """Whether pcietrace itself asks for the fast rate although no range is open."""
        return bool(self._words[FORCE_FAST]) if self._words is not None else False

    @force_fast.setter
    def force_fast(self, on: bool) -> None:
        if self._words is not None:
            self._words[FORCE_FAST] = int(on)
            self.signal()  # a sampler in a long idle wait takes the new rate at once

    def signal(self) -> None:
        """Wake every waiter now, as a range edge would (pcietrace's own wake-ups: rate change, pause, stop).
        Not atomic against the injection library's increments (Python has no atomics): at worst an edge at
        the same instant swallows this wake-up and the waiter wakes at its own deadline instead."""
        if self._words is None:
            return
        for w in (SEQ, WAKES):
            self._words[w] = (self._words[w] + 1) & 0xFFFFFFFF
        self._libc.syscall(_SYS_FUTEX, ctypes.byref(self._words, 4 * WAKES), _FUTEX_WAKE, 2**31 - 1, None, None, 0)

    def sleep_until(self, deadline_ns: int) -> None:
        """Return at ``deadline_ns`` (CLOCK_MONOTONIC) whatever the edges; a stop still cuts a long sleep short."""
        left = deadline_ns - time.monotonic_ns()
        if left <= 0:
            return
        if self._stop is not None and left > _SHORT_SLEEP_NS:
            self._stop.wait(left / 1e9)
        else:
            time.sleep(left / 1e9)

    def wait_until(self, deadline_ns: int, seen: int | None = None, woken: int | None = None) -> None:
        """Return at ``deadline_ns`` (CLOCK_MONOTONIC), at an edge that wakes the samplers, or at once where the
        sequence differs from ``seen`` (any edge since) or :attr:`wakes` from ``woken`` (a waking edge since)."""
        if woken is None and self._words is not None:
            woken = self._words[WAKES]
        while True:
            left = deadline_ns - time.monotonic_ns()
            if left <= 0:
                return
            if self._words is None:
                if self._stop is not None:
                    self._stop.wait(left / 1e9)
                else:
                    time.sleep(left / 1e9)
                return
            wakes = self._words[WAKES]
            if wakes != woken or (seen is not None and self._words[SEQ] != seen):
                return
            ts = _Timespec(left // 1_000_000_000, left % 1_000_000_000)
            # (a waking edge after ``wakes`` was read: the call returns at once, and the loop sees it)
            self._libc.syscall(_SYS_FUTEX, ctypes.byref(self._words, 4 * WAKES), _FUTEX_WAIT,
                               ctypes.c_uint32(wakes), ctypes.byref(ts), None, 0)

    def close(self) -> None:
        self._words = None  # release the buffer export before closing the map
        if self._mm is not None:
            self._mm.close()
            self._mm = None
