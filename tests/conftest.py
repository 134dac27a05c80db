"""Shared fixtures. Tests marked ``gpu`` skip cleanly unless a CUDA GPU and driver are present."""

from __future__ import annotations

import functools
import io
import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
#: A short SIMULATED run (no latency suite) for the tests of what happens around a measurement.
QUICK_SIM = ["run", "--simulate", "--quick", "--window-s", "0.02", "--no-latency"]
#: Committed real reports of every kind a user reads first: two default runs, a run, a run with latency, a 2x H200
#: run and a Python attach run.
REPORTS = [ROOT / "tests/data/h100_run_defaults", ROOT / "tests/data/h200x2_run_defaults", ROOT / "tests/data/h100_run",
           ROOT / "tests/data/h100_run_latency", ROOT / "tests/data/h200x2_run", ROOT / "tests/data/attach_h100_python"]


def _hypothesis_profile() -> None:
    """Property tests draw the same examples on every run (and take as long as they need): a CI run never fails on
    a rare draw, nor on a machine busy enough to pass Hypothesis's 200 ms deadline. PCIETRACE_HYPOTHESIS_RANDOM=1
    draws new ones, to search."""
    from hypothesis import settings

    settings.register_profile("repeatable", derandomize=True, database=None, deadline=None)
    settings.register_profile("searching", deadline=None)
    settings.load_profile("searching" if os.environ.get("PCIETRACE_HYPOTHESIS_RANDOM") == "1" else "repeatable")


_hypothesis_profile()


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
def loaded():
    """Each of :data:`REPORTS`, by folder name: its Session and its analysis results."""
    from pcietrace.analysis import analyze
    from pcietrace.session import Session

    out = {}
    for p in REPORTS:
        s = Session.load(p)
        out[p.name] = (s, analyze(s))
    return out


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


def edit_samples(run: Path, change) -> None:
    """Replace a copied recording's samples.parquet by ``change(samples)``."""
    import pandas as pd

    s = pd.read_parquet(run / "samples.parquet")
    change(s).to_parquet(run / "samples.parquet", index=False)


def checkout_env(**extra: str) -> dict[str, str]:
    """The environment for a child process that imports this checkout's pcietrace (not an installed one)."""
    return dict(os.environ, PYTHONPATH=str(ROOT), **extra)


def plain(cell: object) -> str:
    """A rich table cell's (or title's) text without markup."""
    from rich.text import Text

    if cell is None:
        return ""
    return Text.from_markup(cell).plain if isinstance(cell, str) else getattr(cell, "plain", str(cell))


def as_text(parts: list, width: int) -> str:
    """``parts`` (rich renderables) printed one after another by a plain console ``width`` columns wide."""
    from rich.console import Console

    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=False, color_system=None)
    for part in parts:
        con.print(part)
    return buf.getvalue()


def assert_readable(parts: list, width: int) -> None:
    """No cell cut ('…'), no line past the width, and every number cell printed whole on one line."""
    from rich.table import Table

    out = as_text(parts, width)
    assert "…" not in out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= width
    for t in (p for p in parts if isinstance(p, Table)):
        for col in t.columns:
            if not col.no_wrap:
                continue
            for cell in col._cells:
                for text in plain(cell).splitlines():  # a cell's own lines (a value, its ± below) each whole
                    assert any(text in line for line in lines), f"{t.title!r} / {col.header!r}: {text!r} wrapped or cut"


def hostile_attach():
    """The Python attach run (:data:`REPORTS`) with markup-like text in range, GPU and command names, analysed."""
    from pcietrace.analysis import analyze
    from pcietrace.session import Session

    s = Session.load(REPORTS[5])
    rename = {"idle": "loss[/total]", "h2d_copy": "[model] forward", "graph_launch": "[bold]x[/bold] \\"}
    s.events = s.events.assign(message=s.events["message"].astype(str).replace(rename))  # (loaded: categories)
    s.meta["gpus"][0]["name"] = "NVIDIA [red]H100[/]"
    s.meta["command"] = ["python3", "[/x]"]
    return s, analyze(s)


def notes_text(results) -> list[str]:
    """The notes of analysis ``results`` as a report words them (:func:`pcietrace.report.notes.with_sentences`)."""
    from pcietrace.report.notes import with_sentences

    notes = with_sentences(results)["notes"]
    return notes["note"].tolist() if "note" in notes else []
