"""The C heap's policy for long runs (glibc's malloc; elsewhere these do nothing): large arrays served from the
heap and what is freed kept for the next (:func:`keep_freed`), and handed back to the system where a phase of
work ends (:func:`release_freed`)."""

from __future__ import annotations

import ctypes
from typing import Any


def _libc_function(name: str) -> Any:  # (None: no such function, as on a libc other than glibc)
    try:
        return getattr(ctypes.CDLL(None), name, None)
    except OSError:
        return None


def keep_freed() -> None:
    """Large arrays from the heap, and what is freed kept there for the next one: an analysis makes and drops
    arrays of a GPU's samples or of every range many times, and each fresh mapping cost the kernel a page fault
    per 4 kB (3-8 s of system time in a 4e6-range report) at the same peak."""
    mallopt = _libc_function("mallopt")
    if mallopt is not None:
        mallopt(-4, 0)  # M_MMAP_MAX: no allocation mapped on its own
        mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD: freed memory at the heap's top kept


def release_freed() -> None:
    """The heap's free pages handed back to the system (malloc_trim), where one phase's arrays are gone and the
    next phase's differ in size: kept, their holes stay resident beside what comes next (a 1e7-range report's
    events left 1.5 GB of them, and its peak was those holes plus the savings' arrays)."""
    trim = _libc_function("malloc_trim")
    if trim is not None:
        trim(0)
