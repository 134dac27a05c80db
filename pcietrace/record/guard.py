"""Never lose a run: a recording's way out, the same for every measuring command.

:class:`Saving` wraps a recording: SIGTERM and SIGHUP stop it like Ctrl-C (:class:`pcietrace.signals.Interrupts`);
whatever happened, the run is analysed, saved into its :class:`pcietrace.store.RunFolder` (the raw data alone if
the analysis fails) and published, one line says where, and :meth:`Saving.end` gives the exit code. Where the
run folder lives and how it is published is :mod:`pcietrace.store`; signal handling is :mod:`pcietrace.signals`.

What comes from the layers above (the results' JSON form: ``pcietrace.report.saved.to_jsonable``; the status
line as rich prints it: ``pcietrace.report.console.tell``) is passed in by the command, as ``analyze`` is:
record/ imports neither (tests/test_layers.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

from pcietrace.errors import OutOfMemory, one_line
from pcietrace.signals import Interrupts, Terminated, critical, exit_code  # noqa: F401  (the commands' names)
from pcietrace.store import (RunFolder, default_folder, discard_on_error, is_run,  # noqa: F401  (the same)
                             sweep_leftovers)
from pcietrace.text import clean


def finish(session: Any, folder: RunFolder | None, analyze: Callable[[], Any], to_jsonable: Callable[[Any], Any],
           say: Callable[[str], None]) -> tuple[Any, Path | None]:
    """Run ``analyze`` (None: nothing to analyse), save ``session`` with the results into ``folder``'s
    staging folder, then publish it. Returns ``(results, saved path or None)``. If ``analyze`` fails the
    raw data are saved and published before its error propagates; a save that fails is one line through
    ``say`` and the results are returned all the same; nothing half-written is left behind, but for a streamed
    recording whose save a signal cut short: it stays to be recovered (``folder.left``)."""
    where, results, cut, short = None, None, False, False
    try:
        try:
            results = analyze()
        except MemoryError:  # the recording is saved all the same (below), and said in one line, not a traceback
            short = True
        finally:
            if folder is not None:
                where = _save(session, folder, results, to_jsonable, say)
    except KeyboardInterrupt:
        cut = True
        raise
    finally:
        if folder is not None and where is None and folder.published is None:
            if cut and folder.holds_recording:
                folder.leave()  # (a long recording given up on while saving: `report` makes a run of it later)
            else:
                folder.discard()  # a half-written staging folder never stays behind
    if short:
        saved = f"the recording is saved to {where}: `pcietrace report {where}` on a machine with more memory" \
            if where is not None else "nothing saved"
        raise OutOfMemory(f"out of memory analysing the run; {saved}")
    return results, where


def _save(session: Any, folder: RunFolder, results: Any, to_jsonable: Callable[[Any], Any],
          say: Callable[[str], None]) -> Path | None:
    try:
        session.save(folder.staging, to_jsonable(results) if results is not None else None)
        return folder.publish(replace=session.meta.get("status") == "complete")
    except Exception as exc:  # disk full, folder removed under us...: say so, the results still print
        say(f"pcietrace: error: could not save the run to {folder.target}: {one_line(exc)}")
        return None


def say(line: str) -> None:
    """One line on stderr (what a measuring command says about its run)."""
    print(clean(line), file=sys.stderr)  # (paths and commands from outside: no escape reaches the terminal)


def interrupted_line(folder: RunFolder | None, out_dir: Path | None, what: str) -> str:
    """The one line a signal ends a measuring command with: ``what`` was saved, and where."""
    if folder is None:
        return "pcietrace: interrupted: nothing saved (--no-save)"
    if out_dir is None and folder.left is not None:
        return (f"pcietrace: interrupted while saving: the recording is kept unsaved in {folder.left}; "
                f"`pcietrace report {folder.target}` saves and shows it")
    if out_dir is None:  # the save failed (said above), or the signal came before it
        return "pcietrace: interrupted: nothing saved" + (f" ({folder.target} is as it was)" if folder.force else "")
    kept = (f"; the complete run in {folder.kept} was kept (--force replaces a run with a complete one only)"
            if folder.kept is not None else "")
    return f"pcietrace: interrupted: saved {what} to {out_dir}; `pcietrace report {out_dir}` shows it{kept}"


def run_saved(complete: bool) -> str:
    """What a run, graphs run or latency suite interrupted by a signal saved."""
    return "the whole run (the signal came while saving)" if complete else "what was recorded (status: interrupted)"


class SaveSteps:
    """What a recorder does around its save, as methods a recorder overrides (attach: the samplers stopped and
    the traces read before, the Perfetto trace once the report is shown). Each is called with the :class:`Saving`."""

    def before(self, saving: "Saving") -> None:
        """Before the analysis and the save, with signals held."""

    def after(self, saving: "Saving") -> None:
        """After the save, with signals held."""

    def later(self, saving: "Saving") -> None:
        """Once the results are shown (what the user need not wait for); a signal meanwhile stops it."""

    def left(self, saving: "Saving") -> str:
        """What a signal before :meth:`later` left undone, said after the interrupted line ("" where nothing)."""
        return ""

    def saved_line(self, saving: "Saving") -> str:
        """The line said once the run is saved."""
        return f"saved to {saving.out_dir}"

    def what(self, saving: "Saving") -> str:
        """What a run interrupted by a signal saved (for :func:`interrupted_line`)."""
        return run_saved(saving.session.meta.get("status") == "complete")


class PartialRun(SaveSteps):
    """`run`'s save: a run interrupted before it was analysed is said to be saved as a partial run."""

    def saved_line(self, saving: "Saving") -> str:
        return f"saved {'partial ' if saving.results is None else ''}run to {saving.out_dir}"


class ReleaseFirst(SaveSteps):
    """A save that first releases what the recording held (the latency suite's GPUs), with signals held."""

    def __init__(self, release: Callable[[], None]) -> None:
        self.release = release

    def before(self, saving: "Saving") -> None:
        self.release()


class Saving:
    """A recording's way out, one home for every measuring command: a context manager around the recording.

    Entering installs :class:`Interrupts` (SIGTERM/SIGHUP stop it like Ctrl-C). Leaving, whatever happened:
    a :class:`KeyboardInterrupt` from the recording is kept in ``interrupted`` and swallowed (with
    ``partial_if_interrupted``, the default, the session's status becomes "interrupted" and it is not
    analysed); then, with signals held (:meth:`Interrupts.finishing`), ``steps.before``, :func:`finish`
    (``analyze()``, save, publish: ``results``, ``out_dir``) and ``steps.after``; a signal held meanwhile is
    kept in ``interrupted`` once the run is saved; ``steps.saved_line`` is said unless interrupted.
    Any other error still propagates after the save. Then :meth:`end` says the one interrupted line or
    renders and runs :meth:`later`, and gives the exit code::

        saving = Saving(session, folder, lambda: analyze(session), to_jsonable=to_jsonable, tell=tell)
        with saving:
            record(session, ...)
        return saving.end(lambda results: render(session.meta, results))

    ``to_jsonable``: the results as saved in ``report.json`` (:func:`finish`); ``tell``: how the ``saved to``
    line is said (both from the command: record/ imports neither analysis nor rich); ``steps``: the
    recorder's :class:`SaveSteps` (default: nothing before or after, "saved to DIR").
    """

    def __init__(self, session: Any, folder: RunFolder | None, analyze: Callable[[], Any], *,
                 to_jsonable: Callable[[Any], Any], tell: Callable[[str], None],
                 partial_if_interrupted: bool = True, steps: SaveSteps | None = None) -> None:
        self.session, self.folder, self.analyze = session, folder, analyze
        self.to_jsonable, self.tell = to_jsonable, tell
        self.partial_if_interrupted = partial_if_interrupted
        self.steps = steps or SaveSteps()
        self.results: Any = None
        self.out_dir: Path | None = None
        self.interrupted: KeyboardInterrupt | None = None
        self.save_error: str | None = None  # the line said when the save failed
        self._intr = Interrupts()
        self._later_done = False

    def __enter__(self) -> "Saving":
        self._intr.__enter__()  # active until the save ends (a second signal waits for it)
        return self

    def __exit__(self, typ: Any, exc: BaseException | None, tb: Any) -> bool:
        partial = isinstance(exc, KeyboardInterrupt) and self.partial_if_interrupted
        if isinstance(exc, KeyboardInterrupt):
            self.interrupted = exc
            if partial:
                self.session.meta["status"] = "interrupted"  # (also where it came as the recording ended)
        self._save(None if partial else self.analyze)
        return isinstance(exc, KeyboardInterrupt)

    def _save(self, analyze: Callable[[], Any] | None) -> None:
        """Analyse (None: not) and save with signals held; whatever happened, keep what was recorded: an
        analysis error still saves (and publishes) the raw data."""
        try:
            with self._intr.finishing():
                self.steps.before(self)
                self.results, self.out_dir = finish(self.session, self.folder, analyze or (lambda: None),
                                                    self.to_jsonable, self._say)
                self.steps.after(self)
        except KeyboardInterrupt as exc:  # a signal held while saving comes out here, once the run is saved
            self.interrupted = self.interrupted or exc
        if self.out_dir is None and self.folder is not None:  # (a third signal after the run was published)
            self.out_dir = self.folder.published
        if self.out_dir is not None and self.interrupted is None:
            self.tell(self.steps.saved_line(self))

    def _say(self, line: str) -> None:
        self.save_error = line
        say(line)

    def later(self) -> None:
        """``steps.later`` once (not after a signal): a signal meanwhile stops it and is kept in ``interrupted``
        (the step says what it left)."""
        if self.interrupted is not None or self._later_done:
            return
        self._later_done = True
        try:
            with Interrupts():
                self.steps.later(self)
        except KeyboardInterrupt as exc:
            self.interrupted = exc

    def end(self, render: Callable[[Any], None], rc: int = 0) -> int:
        """Interrupted (before, or while the results are shown): the one line saying what was saved and where,
        and 128 + the signal. Else ``render(results)``, :meth:`later` (128 + a signal that stopped it), and ``rc``
        (the recording's own exit code), but never 0 when the save failed."""
        if self.interrupted is None:
            try:
                render(self.results)
            except KeyboardInterrupt as exc:  # (while the results are shown: the later steps are not run)
                self.interrupted = exc
            except (Exception, SystemExit):  # (stdout gone: `attach ... | head`, where rich exits 1) the later
                # steps are still the run's
                self.later()
                raise
            else:
                self.later()
                if self.interrupted is not None:  # (stopped in the later steps, which said what they left)
                    return exit_code(self.interrupted)
                return rc if self.folder is None or self.out_dir is not None else rc or 2  # a failed save never reads as success
        say(interrupted_line(self.folder, self.out_dir, self.steps.what(self)) + self.steps.left(self))
        return exit_code(self.interrupted)
