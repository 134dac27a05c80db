"""Shared fixtures. Tests marked ``gpu`` skip cleanly unless a CUDA GPU and driver are present."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


@functools.lru_cache(maxsize=1)
def _gpu_reason() -> str | None:
    from pcietrace.device import cuda
    from pcietrace.errors import PcietraceError

    try:
        return None if cuda.device_count() > 0 else "no CUDA device"
    except PcietraceError as exc:
        return str(exc)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    reason = _gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: {reason}")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


@pytest.fixture(scope="session")
def h100():
    """The real run recorded on the lent H100 (see tests/data/README.md)."""
    from pcietrace.session import Session

    return Session.load(DATA / "h100_run")


#: The signals a terminal delivers (a job started in the background or under nohup inherits them ignored).
TERMINAL_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


def terminal_signals() -> None:
    """In a child process (``subprocess.Popen(..., preexec_fn=terminal_signals)``): SIGINT, SIGTERM and SIGHUP
    as a terminal delivers them, whatever the test runner inherited."""
    import signal

    for name in TERMINAL_SIGNALS:
        signal.signal(getattr(signal, name), signal.SIG_DFL)


@pytest.fixture()
def as_in_a_terminal():
    """This process handles SIGINT, SIGTERM and SIGHUP as under a terminal for the test, then as before."""
    import signal

    old = {s: signal.getsignal(getattr(signal, s)) for s in TERMINAL_SIGNALS}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    for name, handler in old.items():
        signal.signal(getattr(signal, name), handler)


@pytest.fixture()
def copy(tmp_path, data_dir):
    """A writable copy of a recorded report folder (tests/data stays untouched)."""
    def make(name: str = "h100_run") -> Path:
        dst = tmp_path / name.replace("/", "-")
        shutil.copytree(data_dir / name, dst)
        return dst
    return make


def one_line_exit_2(argv: list[str], capsys) -> str:
    """Run the CLI in-process; assert exit 2 with exactly one line and no traceback; return the line."""
    from pcietrace.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pcietrace: error:") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def edit_report(folder: Path, change) -> None:
    """Apply ``change(doc)`` to a copied recording's parsed report.json and write it back."""
    import json

    doc = json.loads((folder / "report.json").read_text())
    change(doc)
    (folder / "report.json").write_text(json.dumps(doc))


def notes_text(results) -> list[str]:
    """The notes of analysis ``results`` as a report words them (:func:`pcietrace.report.notes.with_sentences`)."""
    from pcietrace.report.notes import with_sentences

    notes = with_sentences(results)["notes"]
    return notes["note"].tolist() if "note" in notes else []
