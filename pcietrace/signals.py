"""Every signal handler pcietrace installs: SIGINT, SIGTERM and SIGHUP stop a recording the same way, and
nothing recorded is lost to them.

- :func:`caught`, from the first line of ``main``: Python turns SIGINT into :class:`KeyboardInterrupt` but lets
  SIGTERM and SIGHUP end it on the spot, without a word; under it they raise :class:`Terminated` from the start,
  and ``main`` says in one line what became of the run (:func:`interrupted_line`).
- :class:`Interrupts`, around a recording and its save: the first signal stops the recording; one more waits
  for the save; :func:`critical` steps (the renames that publish a run) hold every signal.
- :func:`deferred`: signals wait while recorded data changes hands.
- :func:`passed_on`: while attach's program runs, signals go to the program, which ends, and the run is saved.
- :func:`first_only` (a recording worker) and :func:`leave_to_parent` (a sampler process): processes that get
  the terminal's Ctrl-C beside pcietrace stop once, or not at all, and let the parent decide.

Imports nothing heavy: it is the first thing ``main`` runs.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from types import FrameType
from typing import Any, Iterator

#: What `kill`, `timeout` and a closed terminal send (SIGINT is Python's KeyboardInterrupt already).
TERMINATING = tuple(s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)

_took_over = [False]  # a command's own Interrupts were entered during this ``caught`` block


#: Every signal that stops a recording.
SIGNALS = (signal.SIGINT, *TERMINATING)


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


def exit_code(exc: BaseException) -> int:
    """The shell's code for a run ended by ``exc``: 128 + the signal (130 for Ctrl-C)."""
    return 128 + (exc.signum if isinstance(exc, Terminated) else signal.SIGINT)


#: Signals arriving in a critical step (the renames that publish a run) wait for its end, the third too.
_critical = [0]


@contextmanager
def critical() -> Iterator[None]:
    """A step no signal may cut in two (:class:`Interrupts` holds every signal meanwhile)."""
    _critical[0] += 1
    try:
        yield
    finally:
        _critical[0] -= 1


class Interrupts:
    """While active (a context manager, main thread only): the first SIGINT, SIGTERM or SIGHUP raises
    :class:`KeyboardInterrupt` (:class:`Terminated` for the last two); inside :meth:`held` (saving) one
    more waits until the block ends instead of cutting the save short; a third gives up waiting."""

    def __init__(self) -> None:
        self.fired: BaseException | None = None
        self.pending: list[int] = []
        self._holding = False
        self._old: dict[int, Any] = {}

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        exc = KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)
        if self._holding and (len(self.pending) < 2 or _critical[0]):
            self.pending.append(signum)
            return
        if self.fired is None:
            self.fired = exc
        raise exc

    def __enter__(self) -> "Interrupts":
        if threading.current_thread() is threading.main_thread():
            # a signal already ignored stays ignored: `nohup pcietrace run` must outlive the terminal
            self._old = {s: signal.signal(s, self._handler) for s in SIGNALS
                         if signal.getsignal(s) is not signal.SIG_IGN}
            take_over()  # from here an interrupt is this run's to save or report (pcietrace/signals.py)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self._old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        self._old = {}

    @classmethod
    def install(cls) -> "Interrupts":
        """Active until :meth:`finishing` ends (for a ``try`` whose ``finally`` saves)."""
        return cls().__enter__()

    @contextmanager
    def finishing(self) -> Iterator[None]:
        """:meth:`held` for the save, then the previous handlers back."""
        try:
            with self.held():
                yield
        finally:
            self.__exit__()

    @contextmanager
    def held(self) -> Iterator[None]:
        """Signals wait while the block runs; one that arrived is raised after it (unless the run was
        already interrupted, which is being handled)."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
            if self.pending and self.fired is None:
                signum = self.pending[0]
                self.fired = KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)
                raise self.fired


@contextmanager
def passed_on(proc: Any) -> Iterator[None]:
    """While active: SIGINT, SIGTERM and SIGHUP sent to pcietrace go to the program ``proc`` (a Popen) and are
    not fatal to pcietrace, which waits for the program and then saves what was collected; signals already
    ignored stay ignored. A SIGINT while pcietrace runs in a terminal's foreground is taken to be Ctrl-C, which
    the program got from the terminal itself, and is not passed on a second time."""
    passed = [s for s in SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]

    def pass_on(signum: int, _: Any) -> None:
        # Ctrl-C in a terminal reaches the whole foreground process group, the program included: passing it
        # on as well would interrupt the program twice (e.g. its clean-up after the first KeyboardInterrupt).
        # Asked at the signal, of the program's group: one that left ours (setsid) gets no Ctrl-C but ours.
        if not (signum == signal.SIGINT and terminal_foreground(proc.pid)):
            proc.send_signal(signum)

    old = {s: signal.signal(s, pass_on) for s in passed}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def terminal_foreground(pid: int = 0) -> bool:
    """Whether the process group of ``pid`` (0: pcietrace's own, which the program it starts is in unless it
    leaves it) is the foreground group of pcietrace's controlling terminal, the group a Ctrl-C there reaches
    (asked of /dev/tty, not stdin: with stdin redirected the terminal still sends Ctrl-C to the group)."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:  # no controlling terminal (CI, a service, setsid)
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgid(pid)
    except OSError:
        return False
    finally:
        os.close(fd)


def first_only() -> None:
    """(A recording worker process.) The first SIGINT raises :class:`KeyboardInterrupt`; later ones (another
    Ctrl-C, or the parent's forwarded one) are ignored, so they cannot cut short the clean-up that keeps what
    was recorded (stopping the sampler, sending the result)."""
    def first_interrupt(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, first_interrupt)


def leave_to_parent() -> None:
    """(A sampler process.) Ctrl-C reaches the whole process group: the parent decides when sampling stops
    (its stop event, or its death), so the samples after the interrupt and the last read are not lost."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
