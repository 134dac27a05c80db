"""The run folder: where a recording is written while it runs, and how it is published.

- :class:`RunFolder` checks (and creates) where a run will go before anything is measured, so a read-only folder
  or a ``runs`` that is a file fails up front; the run is written into a hidden staging folder beside it and
  renamed into place in one step, so a folder is either a whole (possibly partial) report or absent, never empty
  or half-written; a taken name gets ``-2``, ``-3``...
- A streamed recording (attach) keeps its raw data in the staging folder's :data:`SCRATCH` folder while it runs,
  with a journal (:data:`JOURNAL_FILE`: the run's meta, rewritten as the run goes). A recording process that dies
  without saving (SIGKILL, a crash, a power cut) leaves that folder; :func:`recover` makes it a saved run marked
  ``interrupted``, the next time a command starts in that reports folder or when ``report`` is asked for it.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import secrets
import shutil
import tempfile
import time
import contextlib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from pcietrace.errors import ReportError, UsageError
from pcietrace.session import REPORT_FILE, SAMPLES_FILE, Session
from pcietrace.signals import critical

#: A folder holding either of these is a saved run.
RUN_FILES = (REPORT_FILE, SAMPLES_FILE)
#: In a staging folder: what a streamed recording writes while it runs (dropped when the run is published)...
SCRATCH = "recording"
#: ...and its journal: ``{"target": name, "pid", "flush_s", "meta", "windows"}``, rewritten whole as the run goes.
JOURNAL_FILE = "recording.json"


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
    process named in it is gone; a staging folder holding a streamed recording (its journal) is made a saved run
    instead (:func:`recover`). Returns what is no longer there. Never fails."""
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
                if pattern is STAGING and (path / JOURNAL_FILE).is_file():
                    recover(path)  # (a recording cut short is kept, as a run marked interrupted)
                elif path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
                gone.append(path)
            except Exception:  # (unreadable, no room to save it: left where it is)
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
        self.left: Path | None = None  # a streamed recording left unsaved, to be recovered (leave)
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

    @property
    def scratch(self) -> Path:
        """Where a streamed recording keeps its raw data until it is saved (:data:`SCRATCH`)."""
        return self.staging / SCRATCH

    def journal(self, meta: dict[str, Any], **more: Any) -> None:
        """Write (or rewrite) the recording's journal: what :func:`recover` needs to make a run of the scratch
        folder should this process die before saving (``more``: ``windows``, ``flush_s``)."""
        write_journal(self.staging, {"target": self.target.name, "pid": os.getpid(), "meta": meta, **more})

    def publish(self, replace: bool = True) -> Path:
        """Move the staged run into place in one rename and return where it went. The target taken by
        now (another run finished first) -> the next free ``-2``, ``-3``...; ``force`` replaces a run there,
        unless ``replace`` is False (an interrupted run never replaces a run: it goes beside it, ``kept``).
        The renames are one :func:`critical` step: a signal never leaves the old run aside and the new one
        staged, and ``published`` says where the run is even if a signal cuts in right after."""
        try:
            _drop_scratch(self.staging)  # (the saved run holds it all by now)
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
        return _rename_free(self.staging, self.target)

    @property
    def holds_recording(self) -> bool:
        """Whether the staging folder holds a streamed recording (its journal), which :func:`recover` can save."""
        return (self.staging / JOURNAL_FILE).is_file()

    def leave(self) -> None:
        """Give up saving, but leave the staging folder for :func:`recover` (``left``)."""
        self.left = self.staging
        self._release()

    def discard(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
        self._release()

    def _release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None


@contextmanager
def discard_on_error(folder: RunFolder | None) -> Iterator[None]:
    """For a step before anything is recorded: if it fails (a signal included), no staging folder stays."""
    try:
        yield
    except BaseException:
        if folder is not None:
            folder.discard()
        raise




def _rename_free(staging: Path, target: Path) -> Path:
    """Rename ``staging`` to ``target``, or the first free ``target-2``, ``target-3``...; where it went."""
    for n in range(1, 1000):
        dest = target if n == 1 else target.with_name(f"{target.name}-{n}")
        try:
            os.rename(staging, dest)  # replaces only an empty folder; fails on a non-empty one or a file
            return dest
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG):
                raise
    raise UsageError(f"no free folder name next to {target}")


def _drop_scratch(staging: Path) -> None:
    shutil.rmtree(staging / SCRATCH, ignore_errors=True)
    (staging / JOURNAL_FILE).unlink(missing_ok=True)


def write_journal(staging: Path, doc: dict[str, Any]) -> None:
    """``doc`` as ``staging/``:data:`JOURNAL_FILE`, replaced in one rename and written through to the disk."""
    tmp = staging / (JOURNAL_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, default=lambda o: o.item() if hasattr(o, "item") else str(o))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, staging / JOURNAL_FILE)
    for folder in (staging, staging.parent):  # (the journal's name, and the staging folder's)
        _sync(folder)


def _sync(path: Path) -> None:
    """``path`` (a file, or a folder's entries) written through to the disk. Never fails."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _check_journal(doc: dict[str, Any]) -> None:
    """ValueError naming the first field of a journal that :func:`salvage` and :func:`recover` cannot use: the
    target a folder's plain name (published beside the staging folder, never elsewhere), the times whole ns."""
    target = doc["target"]
    if target in ("", ".", "..") or "/" in target or "\0" in target:
        raise ValueError(f"target {target!r} is not a folder's name")
    flush = doc.get("flush_s", 0.0)
    if isinstance(flush, bool) or not isinstance(flush, (int, float)) or not 0 <= flush < math.inf:
        raise ValueError(f"flush_s {flush!r} is not a number of seconds")
    windows = doc.get("windows") or []
    if not (isinstance(windows, list) and all(isinstance(w, dict) for w in windows)):
        raise ValueError("windows is not a list of records")
    for key in ("t_app_start_ns", "t_app_end_ns"):
        t = doc["meta"].get(key, 0)
        if isinstance(t, bool) or not isinstance(t, int):
            raise ValueError(f"meta.{key} {t!r} is not a whole number of ns")


def read_journal(staging: Path) -> dict[str, Any]:
    """A staging folder's journal; :class:`~pcietrace.errors.ReportError` naming it if unreadable."""
    file = Path(staging) / JOURNAL_FILE
    try:
        doc = json.loads(file.read_text())
        if not (isinstance(doc, dict) and isinstance(doc.get("meta"), dict) and isinstance(doc.get("target"), str)):
            raise ValueError("not a recording journal")
        _check_journal(doc)
    except (OSError, ValueError) as exc:
        raise ReportError(f"{file} is not a readable recording journal ({exc})") from None
    return doc


def interrupted_recording(path: Path) -> Path | None:
    """The staging folder of an unsaved recording that ``path`` names: ``path`` itself (a staging folder with a
    journal and no report), or the one beside ``path`` that was to be published as ``path``; None if neither."""
    path = Path(path)
    if (path / JOURNAL_FILE).is_file() and not (path / REPORT_FILE).exists():
        return path
    if path.exists() or path.name in ("", ".", ".."):
        return None
    try:
        names = sorted(os.listdir(path.parent))
    except OSError:
        return None
    for name in names:  # (its name starts with the target's, which may have been cut: the journal says)
        staging = path.parent / name
        if STAGING.match(name) and name.startswith(f".{path.name[:8]}") and (staging / JOURNAL_FILE).is_file():
            try:
                if read_journal(staging)["target"] == path.name:
                    return staging
            except ReportError:
                continue
    return None


def salvage(staging: Path) -> Session:
    """The session an unsaved recording's staging folder holds (its journal, its streamed samples, its traces).
    A recording cut short is status "interrupted"; ``meta["interrupted"]`` says how it ended and how much may be
    missing: its last ``lost_at_most_s`` (the flush period: samples are streamed, and traces written through to
    the disk, that often). Its ranges are those the traces held up to the last sample, whose time is taken as
    the program's end unless it had ended before. A recording that had ended (its process died while analysing
    or saving it) is whole, as it would have been saved."""
    import pandas as pd

    from pcietrace.collectors import merge_samples
    from pcietrace.collectors.sampler import read_stream
    from pcietrace.record.attach import processes
    from pcietrace.record.trace import edge_samples, read_traces

    staging = Path(staging)
    doc = read_journal(staging)
    pid = doc.get("pid")
    if isinstance(pid, int) and _alive(pid) and pid != os.getpid():
        raise ReportError(f"{staging} is still being recorded (pcietrace process {pid}): report it once it ends")
    meta = dict(doc["meta"])
    events = read_traces(staging / SCRATCH / "traces")
    meta["trace_bad"] = {"lines": events.attrs["bad_lines"], "files": events.attrs["bad_files"]}
    samples = merge_samples([read_stream(staging / SCRATCH / "samples"), edge_samples(events)])
    windows = pd.DataFrame(doc.get("windows") or [])
    if doc.get("whole"):  # (died while analysing or saving: the recording itself had ended, all on disk)
        meta["processes"] = processes(events, meta.get("launch_counter", "interpose"))
        return Session(meta=meta, samples=samples, events=events, windows=windows)
    last = int(samples["t_ns"].max()) if len(samples) else None
    if last is not None and len(events):  # (the program may have gone on: what no sample covers is not measured)
        events = events[events["t_ns"] <= last].reset_index(drop=True)
    meta["processes"] = processes(events, meta.get("launch_counter", "interpose"))
    meta["interrupted"] = {"how": "the recording process ended without saving (killed, crashed or powered off)",
                           "recovered_from": staging.name, "lost_at_most_s": float(doc.get("flush_s", 0.0)),
                           "last_sample_ns": last}
    if "t_app_start_ns" not in meta:
        meta.update(kind="attach-failed", status="interrupted before the program ran")
    elif last is None or last < int(meta["t_app_start_ns"]):  # (the samples are flushed every flush_s)
        meta.update(kind="attach-failed", status="interrupted before any counter sample of the program was saved")
    else:
        meta.update(status="interrupted", t_app_end_ns=min(int(meta.get("t_app_end_ns", last)), last))
    return Session(meta=meta, samples=samples, events=events, windows=windows)


def recover(staging: Path) -> Path:
    """Make an unsaved recording's staging folder (:func:`salvage`) a saved run, published under the name it was
    to have (``-2``... if taken; a run already there is never replaced); where it went."""
    staging = Path(staging)
    session = salvage(staging)
    target = staging.parent / read_journal(staging)["target"]
    session.save(staging)
    with critical():
        _drop_scratch(staging)
        where = _rename_free(staging, target)
    with contextlib.suppress(UsageError, OSError):  # its lock, unless another run holds it now
        _Lock(target).release()
    return where


def load_interrupted(staging: Path) -> Session:
    """The run an unsaved recording's staging folder holds, made a saved run (:func:`recover`) and loaded
    (``meta["interrupted"]["saved_as"]`` says where a recording cut short went); where it cannot be saved (a read-only folder), read
    as it is (:func:`salvage`)."""
    try:
        where = recover(staging)
    except OSError:
        return salvage(staging)
    session = Session.load(where)
    if isinstance(session.meta.get("interrupted"), dict):
        session.meta["interrupted"]["saved_as"] = str(where)
    return session
