"""guard.Saving, the one way out of every measuring command (run, graphs, latency, attach), on its own: a
real recorded session (the H100 run in tests/data) saved into a real folder, with stand-in recording steps
and analyses: an interrupted, failed or refused save or analysis loses nothing. The commands' own paths are pinned
in test_signals, test_store, test_attach, test_gpu_close."""

from __future__ import annotations

import json
import os
import signal

import pandas as pd
import pytest

from pcietrace.cli import main
from pcietrace.errors import DataError
from pcietrace.record import guard
from pcietrace.report.console import tell
from pcietrace.report.saved import to_jsonable
from pcietrace.session import Session
from pcietrace.signals import Terminated

from conftest import QUICK_SIM


def _saving(*args, **kw) -> guard.Saving:
    """guard.Saving with what the commands pass it from above record/: the results' JSON form, the rich status line."""
    return guard.Saving(*args, to_jsonable=to_jsonable, tell=tell, **kw)


def _session(h100) -> Session:
    return Session(meta={**h100.meta, "status": "complete"}, samples=h100.samples, windows=h100.windows)


def _results() -> dict[str, pd.DataFrame]:
    return {"notes": pd.DataFrame({"note": ["analysed"]})}


@pytest.mark.parametrize("partial", [True, False], ids=["run", "attach"])
def test_a_signal_while_recording_saves_what_was_recorded_in_one_line(partial, h100, tmp_path, capsys,
                                                                      as_in_a_terminal) -> None:
    """Ctrl-C in the recording: swallowed, the run saved and published, one line, exit 130, nothing rendered.
    A partial run (run, graphs) is marked interrupted and not analysed; attach's is analysed as it stands."""
    s, out = _session(h100), tmp_path / "run"
    analysed, rendered = [], []
    saving = _saving(s, guard.RunFolder(out), lambda: analysed.append(1) or _results(),
                     partial_if_interrupted=partial)
    before = signal.getsignal(signal.SIGTERM)
    with saving:
        assert signal.getsignal(signal.SIGTERM) is not before  # SIGTERM stops it like Ctrl-C from here
        raise KeyboardInterrupt
    assert signal.getsignal(signal.SIGTERM) is before
    assert saving.end(rendered.append) == 128 + signal.SIGINT and not rendered
    what = guard.run_saved(complete=not partial)
    assert capsys.readouterr().err == (f"pcietrace: interrupted: saved {what} to {out}; "
                                       f"`pcietrace report {out}` shows it\n")
    saved = Session.load(out)
    assert saved.meta["status"] == ("interrupted" if partial else "complete") and len(saved.samples) == len(h100.samples)
    assert analysed == ([] if partial else [1]) and list(tmp_path.iterdir()) == [out]


def test_a_signal_in_the_held_steps_waits_for_the_save(h100, tmp_path, capsys, as_in_a_terminal) -> None:
    """SIGTERM as the step before the save runs (attach: the samplers stop): held until the run is saved and
    the step after it has run, then one line 'the whole run', exit 143, no 'saved to' line."""
    s, out = _session(h100), tmp_path / "run"
    steps: list[str] = []
    class Steps(guard.SaveSteps):
        def before(self, sv):
            steps.append("before")
            os.kill(os.getpid(), signal.SIGTERM)

        def after(self, sv):
            steps.append(f"after, saved to {sv.out_dir.name}")

    saving = _saving(s, guard.RunFolder(out), _results, steps=Steps())
    with saving:
        steps.append("recorded")
    assert isinstance(saving.interrupted, Terminated) and steps == ["recorded", "before", "after, saved to run"]
    assert saving.end(lambda results: None) == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    assert err == (f"pcietrace: interrupted: saved the whole run (the signal came while saving) to {out}; "
                   f"`pcietrace report {out}` shows it\n")
    assert Session.load(out).meta["status"] == "complete"


@pytest.mark.parametrize("rc", [0, 3])
def test_a_failed_save_is_one_line_the_results_still_render_and_the_exit_code_is_never_0(rc, h100, tmp_path, capsys,
                                                                                        monkeypatch) -> None:
    """The disk fills while saving: one line, no folder (staging removed), the results rendered all the same;
    exit 2 where the recording's own code was 0, its own code (attach: the program's) otherwise."""
    def disk_full(self, directory, results=None):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Session, "save", disk_full)
    rendered: list = []
    saving = _saving(_session(h100), guard.RunFolder(tmp_path / "run"), _results)
    with saving:
        pass
    assert saving.out_dir is None and saving.end(rendered.append, rc) == (rc or 2)
    assert [list(r) for r in rendered] == [["notes"]]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"pcietrace: error: could not save the run to {tmp_path / 'run'}: ")
    assert "No space left on device" in err
    assert list(tmp_path.iterdir()) == []


def test_an_error_while_recording_still_saves_then_propagates(h100, tmp_path, capsys) -> None:
    """Not a signal: the run is saved (and said) before the error goes on; the signal handlers are restored."""
    before = signal.getsignal(signal.SIGINT)
    saving = _saving(_session(h100), guard.RunFolder(tmp_path / "run"), lambda: None, steps=guard.PartialRun())
    with pytest.raises(RuntimeError, match="GPU fell off the bus"):
        with saving:
            raise RuntimeError("GPU fell off the bus")
    assert saving.interrupted is None and signal.getsignal(signal.SIGINT) is before
    assert capsys.readouterr().err == f"saved partial run to {tmp_path / 'run'}\n"
    assert len(Session.load(tmp_path / "run").samples) == len(h100.samples)


def test_interrupted_save_leaves_nothing_not_an_empty_folder(tmp_path, h100) -> None:
    folder = guard.RunFolder(tmp_path / "run")

    def boom(*a, **k):
        raise KeyboardInterrupt

    s = Session(meta=dict(h100.meta))
    s.save = boom
    with pytest.raises(KeyboardInterrupt):
        guard.finish(s, folder, lambda: (_ for _ in ()).throw(KeyboardInterrupt()), lambda r: r, print)
    assert list(tmp_path.iterdir()) == []


def test_failed_save_still_prints_the_results(tmp_path, capsys, monkeypatch) -> None:
    def disk_full(self, directory, results=None):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Session, "save", disk_full)
    assert main(QUICK_SIM + ["-o", str(tmp_path / "run"), "--json"]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out)["results"]["per_launch"]  # the figures were printed
    assert "could not save" in err and "No space left" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists() and not list(tmp_path.iterdir())


def test_an_analysis_error_still_publishes_the_raw_data(tmp_path, h100) -> None:
    folder = guard.RunFolder(tmp_path / "run")

    def refuse():
        raise DataError("samples: not in time order")

    with pytest.raises(DataError):
        guard.finish(h100, folder, refuse, lambda r: r, print)
    assert len(Session.load(tmp_path / "run").samples) == len(h100.samples)
    assert [p.name for p in tmp_path.iterdir()] == ["run"]
