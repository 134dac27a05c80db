"""Never lose a run: the output folder is settled before measuring, saved atomically, and kept through
signals.

- :class:`RunFolder` checks (and creates) where a run will go before anything is measured, so a
  read-only folder or a ``runs`` that is a file fails up front; the run is written into a hidden
  staging folder beside it and renamed into place in one step, so a folder is either a whole (possibly
  partial) report or absent, never empty or half-written; a taken name gets ``-2``, ``-3``...
- :class:`Interrupts` turns SIGTERM and SIGHUP (``timeout``, ``kill``, a closed terminal) into the same
  :class:`KeyboardInterrupt` as Ctrl-C, and holds a second signal while the recording is being saved.
- :func:`finish` analyses, saves (the raw data alone if the analysis fails) and publishes; if saving
  fails it says so in one line and the results are still returned for printing.
- :class:`Saving` puts these together around a recording, the one way out of every measuring command:
  record, then save whatever happened, say one line, and give the exit code.

What comes from the layers above (the results' JSON form: ``pcietrace.analysis.to_jsonable``; the status
line as rich prints it: ``pcietrace.report.console.tell``) is passed in by the command, as ``analyze`` is:
record/ imports neither (tests/test_layers.py).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import secrets
import signal
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Iterator

from pcietrace.errors import UsageError, one_line
from pcietrace.session import REPORT_FILE, SAMPLES_FILE
from pcietrace.signals import TERMINATING, Terminated, take_over
from pcietrace.text import clean

#: A folder holding either of these is a saved run.
RUN_FILES = (REPORT_FILE, SAMPLES_FILE)
SIGNALS = (signal.SIGINT, *TERMINATING)


def exit_code(exc: BaseException) -> int:
    """The shell's code for a run ended by ``exc``: 128 + the signal (130 for Ctrl-C)."""
    return 128 + (exc.signum if isinstance(exc, Terminated) else signal.SIGINT)


def default_folder(meta: dict[str, Any], ordinals: list[int], suffix: str = "") -> Path:
    """``runs/<time>-<gpu model>-gpu<ordinals>[-simulated]<suffix>``: runs on different GPUs of one box
    started in the same second get different names (and :meth:`RunFolder.publish` adds ``-2``... on top)."""
    name = meta["gpus"][0].get("name", "gpu") if meta.get("gpus") else "gpu"
    slug = re.sub(r"[^a-z0-9]+", "-", str(name).lower()).strip("-") or "gpu"
    sel = "gpu" + "-".join(str(o) for o in ordinals) if ordinals else "gpu"
    sim = "-simulated" if meta.get("simulated") and "simulated" not in slug else ""
    return Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{slug}-{sel}{sim}{suffix}"


def is_run(path: Path) -> bool:
    """Whether ``path`` holds a saved run (:data:`RUN_FILES`)."""
    return any((path / f).exists() for f in RUN_FILES)


#: The longest file name most file systems take (bytes).
NAME_MAX = 255
#: The hidden names of a run's staging folder and lock beside its target (with the pid that made them, so a
#: later start can tell a dead run's leftovers from a running one's).
STAGING = re.compile(r"^\..*\.(?:partial|replaced)-(\d+)-[0-9a-f]{8}$")
#: Leftovers of attach and the sampler outside the reports folder (trace folders, edge pages), with their pid.
TEMP_LEFTOVERS = ((Path(tempfile.gettempdir()), re.compile(r"^pcietrace-(?:edges-)?(\d+)-.{8}$")),
                  (Path("/dev/shm"), re.compile(r"^pcietrace-edges-(\d+)-.{8}$")))


def hidden_name(name: str, kind: str) -> str:
    """``.NAME.KIND-<pid>-<random>``, the name cut (at a character) so the whole fits :data:`NAME_MAX` bytes:
    a legal 250-byte folder name still gets a staging folder."""
    tail = f".{kind}-{os.getpid()}-{secrets.token_hex(4)}"
    room = NAME_MAX - 1 - len(tail)
    short = name.encode("utf-8", "surrogateescape")[:room].decode("utf-8", "ignore")
    return f".{short}{tail}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):  # (another user's, or a number no pid is)
        return pid < 2**22 and pid > 0
    return True


def sweep_leftovers(parent: Path | None = None) -> list[Path]:
    """Remove what runs killed outright (SIGKILL, OOM, power) left: staging folders in ``parent`` (the reports
    folder), attach's trace folders in the temporary folder and its edge pages in /dev/shm, each only if the
    process named in it is gone. Returns what was removed. Never fails."""
    places = list(TEMP_LEFTOVERS) + ([(parent, STAGING)] if parent is not None else [])
    gone = []
    for folder, pattern in places:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            m = pattern.match(name)
            if not m or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
                continue
            path = folder / name
            try:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
                gone.append(path)
            except OSError:
                pass
    return gone


class _Lock:
    """An exclusive lock on a run's target (a hidden ``.NAME.lock`` file beside it, flock'd: released when the
    process dies, however): two runs into one folder cannot both save there. :meth:`release` removes the file."""

    def __init__(self, target: Path) -> None:
        import fcntl
        import hashlib

        self.fd: int | None = None
        digest = hashlib.sha1(target.name.encode("utf-8", "surrogateescape")).hexdigest()[:8]
        short = target.name.encode("utf-8", "surrogateescape")[:NAME_MAX - 16].decode("utf-8", "ignore")
        self.path = target.parent / f".{short}.{digest}.lock"
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise UsageError(f"cannot save to {target}: another pcietrace run is saving there now "
                                 "(choose another -o, or wait for it to end)") from None
            try:  # the file we locked is still the one at the path (a releasing run may have just removed it)
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                return
            os.close(fd)

    def release(self) -> None:
        if self.fd is not None:
            try:
                os.unlink(self.path)  # (while still held: a run waiting to open it finds a fresh file)
            except OSError:
                pass
            os.close(self.fd)
            self.fd = None

    def __del__(self) -> None:
        self.release()


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


def _new_folder(parent: Path, prefix: str) -> Path:
    """A new folder ``parent/prefix<random>`` made as mkdir makes any folder (the umask's mode, the parent's
    setgid group); tempfile.mkdtemp's would be 0700, and a saved run unreadable to anyone else."""
    while True:
        path = parent / hidden_name(prefix, "partial")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


class RunFolder:
    """Where a run will be saved, settled before measuring.

    ``target``: the folder asked for (``-o``) or the default name; ``explicit``: it came from ``-o``
    (an existing run there is refused unless ``force``; a default name just takes the next suffix).
    ``staging``: the hidden sibling folder the run is written into until :meth:`publish`.
    """

    def __init__(self, target: Path, explicit: bool = True, force: bool = False) -> None:
        target = Path(target)
        if target.is_symlink() and target.is_dir():  # -o LINK saves into the folder it points at, not LINK-2
            target = target.resolve()
        absolute = Path(os.path.abspath(target))
        try:
            here = Path.cwd()
        except OSError:  # (the current folder was removed: nothing is above it)
            here = None
        if absolute.parent == absolute or (here is not None and here.is_relative_to(absolute)):
            raise UsageError(f"cannot save to {target}: it is the current folder or one above it (a run is saved "
                             "as a folder of its own: give -o a new name)")
        self.target, self.explicit, self.force = target, explicit, force
        self.published: Path | None = None  # where publish put the run (said even if a signal cut in after)
        self.kept: Path | None = None  # a complete run --force did not replace with an interrupted one
        self.lock: _Lock | None = None
        t = self.target
        sweep_leftovers(t.parent)
        if t.exists() or t.is_symlink():
            if not t.is_dir():
                raise UsageError(f"cannot save to {t}: it exists and is not a folder")
            if explicit and is_run(t) and not force:
                raise UsageError(f"{t} already holds a pcietrace run: pass --force to replace it, or choose another -o")
            if explicit and not is_run(t) and any(t.iterdir()):
                raise UsageError(f"cannot save to {t}: the folder is not empty and holds no pcietrace run")
        try:
            t.parent.mkdir(parents=True, exist_ok=True)
            if explicit:  # (default names never collide: the next free -2, -3... is taken)
                self.lock = _Lock(t)
            self.staging = _new_folder(t.parent, t.name)
        except OSError as exc:
            self._release()
            raise UsageError(f"cannot save to {t}: {exc.strerror or exc} ({exc.filename or t.parent})") from None

    def publish(self, replace: bool = True) -> Path:
        """Move the staged run into place in one rename and return where it went. The target taken by
        now (another run finished first) -> the next free ``-2``, ``-3``...; ``force`` replaces a run there,
        unless ``replace`` is False (an interrupted run never replaces a run: it goes beside it, ``kept``).
        The renames are one :func:`critical` step: a signal never leaves the old run aside and the new one
        staged, and ``published`` says where the run is even if a signal cuts in right after."""
        try:
            with critical():
                self.published = self._publish(replace)
            return self.published
        finally:
            self._release()

    def _publish(self, replace: bool) -> Path:
        if self.force and self.target.is_dir() and is_run(self.target):
            if not replace:
                self.kept = self.target
            else:
                old = _new_folder(self.target.parent, self.target.name)  # (named as a staging folder: swept if left)
                os.replace(self.target, old / "run")  # aside first: the new run lands in one rename below
                try:
                    os.replace(self.staging, self.target)
                except OSError:
                    os.replace(old / "run", self.target)  # the old run stays where it was
                    raise
                shutil.rmtree(old, ignore_errors=True)
                return self.target
        for n in range(1, 1000):
            dest = self.target if n == 1 else self.target.with_name(f"{self.target.name}-{n}")
            try:
                os.rename(self.staging, dest)  # replaces only an empty folder; fails on a non-empty one or a file
                return dest
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG):
                    raise
        raise UsageError(f"no free folder name next to {self.target}")

    def discard(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
        self._release()

    def _release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None


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


def finish(session: Any, folder: RunFolder | None, analyze: Callable[[], Any], to_jsonable: Callable[[Any], Any],
           say: Callable[[str], None]) -> tuple[Any, Path | None]:
    """Run ``analyze`` (None: nothing to analyse), save ``session`` with the results into ``folder``'s
    staging folder, then publish it. Returns ``(results, saved path or None)``. If ``analyze`` fails the
    raw data are saved and published before its error propagates; a save that fails is one line through
    ``say`` and the results are returned all the same; nothing half-written is left behind."""
    where, results = None, None
    try:
        try:
            results = analyze()
        finally:
            if folder is not None:
                where = _save(session, folder, results, to_jsonable, say)
    finally:
        if folder is not None and where is None and folder.published is None:
            folder.discard()  # a half-written staging folder never stays behind
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


@contextmanager
def discard_on_error(folder: RunFolder | None) -> Iterator[None]:
    """For a step before anything is recorded: if it fails (a signal included), no staging folder stays."""
    try:
        yield
    except BaseException:
        if folder is not None:
            folder.discard()
        raise


def interrupted_line(folder: RunFolder | None, out_dir: Path | None, what: str) -> str:
    """The one line a signal ends a measuring command with: ``what`` was saved, and where."""
    if folder is None:
        return "pcietrace: interrupted: nothing saved (--no-save)"
    if out_dir is None:  # the save failed (said above), or the signal came before it
        return "pcietrace: interrupted: nothing saved" + (f" ({folder.target} is as it was)" if folder.force else "")
    kept = (f"; the complete run in {folder.kept} was kept (--force replaces a run with a complete one only)"
            if folder.kept is not None else "")
    return f"pcietrace: interrupted: saved {what} to {out_dir}; `pcietrace report {out_dir}` shows it{kept}"


def run_saved(complete: bool) -> str:
    """What a run, graphs run or latency suite interrupted by a signal saved."""
    return "the whole run (the signal came while saving)" if complete else "what was recorded (status: interrupted)"


class Saving:
    """A recording's way out, one home for every measuring command: a context manager around the recording.

    Entering installs :class:`Interrupts` (SIGTERM/SIGHUP stop it like Ctrl-C). Leaving, whatever happened:
    a :class:`KeyboardInterrupt` from the recording is kept in ``interrupted`` and swallowed (with
    ``partial_if_interrupted``, the default, the session's status becomes "interrupted" and it is not
    analysed); then, with signals held (:meth:`Interrupts.finishing`), ``before()``, :func:`finish`
    (``analyze()``, save, publish: ``results``, ``out_dir``) and ``after()``; a signal held meanwhile is kept
    in ``interrupted`` once the run is saved; ``saved to DIR`` (``saved_line``) is said unless interrupted.
    Any other error still propagates after the save. Then :meth:`end` says the one interrupted line or
    renders, and gives the exit code::

        saving = Saving(session, folder, lambda: analyze(session), to_jsonable=to_jsonable, tell=tell)
        with saving:
            record(session, ...)
        return saving.end(lambda results: render(session.meta, results))

    ``to_jsonable``: the results as saved in ``report.json`` (:func:`finish`); ``tell``: how the ``saved to``
    line is said (both from the command: record/ imports neither analysis nor rich). The hooks are called
    with this object: ``before``/``after`` (signals held), ``saved_line`` and ``what`` (what an interrupted
    run saved; default :func:`run_saved` of the session's status).
    """

    def __init__(self, session: Any, folder: RunFolder | None, analyze: Callable[[], Any], *,
                 to_jsonable: Callable[[Any], Any], tell: Callable[[str], None],
                 partial_if_interrupted: bool = True, before: Callable[["Saving"], None] | None = None,
                 after: Callable[["Saving"], None] | None = None, saved_line: Callable[["Saving"], str] | None = None,
                 what: Callable[["Saving"], str] | None = None) -> None:
        self.session, self.folder, self.analyze = session, folder, analyze
        self.to_jsonable, self.tell = to_jsonable, tell
        self.partial_if_interrupted = partial_if_interrupted
        self.before, self.after = before, after
        self.saved_line = saved_line or (lambda s: f"saved to {s.out_dir}")
        self.what = what or (lambda s: run_saved(s.session.meta.get("status") == "complete"))
        self.results: Any = None
        self.out_dir: Path | None = None
        self.interrupted: KeyboardInterrupt | None = None
        self.save_error: str | None = None  # the line said when the save failed
        self._intr = Interrupts()

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
                if self.before is not None:
                    self.before(self)
                self.results, self.out_dir = finish(self.session, self.folder, analyze or (lambda: None),
                                                    self.to_jsonable, self._say)
                if self.after is not None:
                    self.after(self)
        except KeyboardInterrupt as exc:  # a signal held while saving comes out here, once the run is saved
            self.interrupted = self.interrupted or exc
        if self.out_dir is None and self.folder is not None:  # (a third signal after the run was published)
            self.out_dir = self.folder.published
        if self.out_dir is not None and self.interrupted is None:
            self.tell(self.saved_line(self))

    def _say(self, line: str) -> None:
        self.save_error = line
        say(line)

    def end(self, render: Callable[[Any], None], rc: int = 0) -> int:
        """Interrupted: the one line saying what was saved and where, and 128 + the signal. Else
        ``render(results)`` and ``rc`` (the recording's own exit code), but never 0 when the save failed."""
        if self.interrupted is not None:
            say(interrupted_line(self.folder, self.out_dir, self.what(self)))
            return exit_code(self.interrupted)
        render(self.results)
        return rc if self.folder is None or self.out_dir is not None else rc or 2  # a failed save never reads as success
