"""SIGTERM and SIGHUP from the first line of ``main``, and whether a command's own handling had taken over.

Python turns SIGINT into :class:`KeyboardInterrupt` but lets SIGTERM and SIGHUP end it on the spot, without
a word: so it was for the imports and set-up of a command (about half a second of `pcietrace run --simulate`)
until :class:`pcietrace.record.guard.Interrupts` took over to save what the recording held. Under
:func:`caught` they raise :class:`Terminated` from the start, and ``main`` says in one line what became of
the run. Only the interpreter's own start (before ``main``) is left to the default. Imports nothing heavy:
it is the first thing ``main`` runs.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from types import FrameType
from typing import Iterator

#: What `kill`, `timeout` and a closed terminal send (SIGINT is Python's KeyboardInterrupt already).
TERMINATING = tuple(s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)

_took_over = [False]  # a command's own Interrupts were entered during this ``caught`` block


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, delivered like Ctrl-C so the same code saves what was recorded."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


@contextmanager
def caught() -> Iterator[None]:
    """While active (in the main thread): SIGTERM and SIGHUP raise :class:`Terminated`, unless they are
    ignored (`nohup pcietrace run` must outlive the terminal) or someone else handles them already; the
    previous handlers come back after."""
    _took_over[0] = False
    old = {}
    if threading.current_thread() is threading.main_thread():
        old = {s: signal.signal(s, _raise) for s in TERMINATING if signal.getsignal(s) is signal.SIG_DFL}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


@contextmanager
def deferred() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP that arrive inside wait until it ends, then go to the handlers that were in
    place (which raise as usual): for handing recorded data over, which a signal cut in half would lose
    whole. Main thread only (elsewhere it defers nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    old = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in (signal.SIGINT, *TERMINATING)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        if got:
            handler = old[got[0]]
            if callable(handler):
                handler(got[0], None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(got[0])


def take_over() -> None:
    """A command's own signal handling begins (it keeps what is recorded from here on, or says so itself)."""
    _took_over[0] = True


def interrupted_line(saves: bool) -> str:
    """What ``main`` says of an interrupt that reached it; ``saves``: the command saves a run."""
    if saves and not _took_over[0]:
        return "interrupted before anything was recorded: nothing saved"
    return "interrupted"
