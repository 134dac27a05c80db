"""report --perfetto (pcietrace/report/perfetto.py): a trace that cannot be written, or a report with no program
run to trace, is refused in one line."""

from __future__ import annotations

from pathlib import Path

from conftest import edit_report, one_line_exit_2


def test_perfetto_to_a_missing_folder_or_a_full_disk_is_one_line(data_dir, tmp_path, capsys) -> None:
    attach = str(data_dir / "attach_h100_python")
    one_line_exit_2(["report", attach, "--perfetto", str(tmp_path / "no" / "such" / "trace.json")], capsys)
    if Path("/dev/full").exists():
        assert "No space" in one_line_exit_2(["report", attach, "--perfetto", "/dev/full"], capsys)


def test_perfetto_of_an_attach_stopped_before_its_program_says_so(copy, tmp_path, capsys) -> None:
    # was: '--perfetto needs a report made by `pcietrace attach`' for a report attach made
    folder = copy("attach_h100_python")
    edit_report(folder, lambda doc: doc["meta"].update(kind="attach-failed", status="interrupted before the program ran"))
    line = one_line_exit_2(["report", str(folder), "--perfetto", str(tmp_path / "t.json")], capsys)
    assert "attach run stopped before its program ran" in line


def test_report_says_what_it_is_doing_on_a_terminal_and_nothing_elsewhere(data_dir, tmp_path, monkeypatch,
                                                                         capsys) -> None:
    """A long run's report analyses for a minute: on a terminal a status line says so (and then that it writes the
    trace), gone before the report; piped, stderr holds only the trace's line."""
    from pcietrace.cli import main

    args = ["report", str(data_dir / "attach_h100_python"), "--perfetto", str(tmp_path / "t.json")]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "analysing" not in err and "Perfetto trace:" in err
    monkeypatch.setattr("rich.console.Console.is_terminal", property(lambda self: True))
    assert main(args) == 0
    out = capsys.readouterr()
    assert "analysing" in out.err and "writing the Perfetto trace" in out.err and "Perfetto trace:" in out.err
    assert "analysing" not in out.out


def test_instances_into_a_device_or_a_pipe_leave_it_one(data_dir, tmp_path, capsys) -> None:
    """--instances into a device or a pipe: written into it in place (Parquet needs a file it can seek: a pipe is
    refused in one line). It was written beside it and renamed over it, which as root turned /dev/full into a
    file."""
    import os
    import stat
    import threading

    fifo = tmp_path / "instances.fifo"
    os.mkfifo(fifo)
    reader = threading.Thread(target=lambda: open(fifo, "rb").read())  # (the writer's open waits for a reader)
    reader.start()
    rec = str(data_dir / "attach_h100_python")
    assert "cannot write the range instances" in one_line_exit_2(["report", rec, "--instances", str(fifo)], capsys)
    reader.join(30)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and not list(tmp_path.glob("*.partial"))
    if Path("/dev/full").exists() and stat.S_ISCHR(os.stat("/dev/full").st_mode):
        assert "No space" in one_line_exit_2(["report", rec, "--instances", "/dev/full"], capsys)
        assert stat.S_ISCHR(os.stat("/dev/full").st_mode) and not Path("/dev/full.partial").exists()


def test_instances_of_a_report_with_no_ranges_or_into_a_folder_are_refused_naming_the_option(data_dir, tmp_path,
                                                                                             capsys) -> None:
    """--instances on a run report wrote a 0-row Parquet file of bool columns, and into a folder it was refused as
    "--perfetto DIR" (a fuzzer's)."""
    line = one_line_exit_2(["report", str(data_dir / "h100_run"), "--instances", str(tmp_path / "i.parquet")], capsys)
    assert line.startswith("pcietrace: error: --instances") and not (tmp_path / "i.parquet").exists()
    line = one_line_exit_2(["report", str(data_dir / "attach_h100_python"), "--instances", str(tmp_path)], capsys)
    assert "--instances" in line and "--perfetto" not in line


def test_counter_events_written_as_text_are_the_events_json_would_write(data_dir) -> None:
    """The trace's counter tracks are written as Arrow-made text (a long run's hundreds of thousands of points
    were a json.dumps each): the same events, keys and values (times to the nanosecond) as the dicts, on a real
    recording's rates, with rates left out over a counter reset (NaN: SIMULATED on the real rates)."""
    import json

    import numpy as np
    import pytest

    from pcietrace.analysis import analyze
    from pcietrace.report.perfetto import _events
    from pcietrace.session import Session

    s = Session.load(data_dir / "attach_h200_hooks")
    res = analyze(s)
    rates, launches = res["rates"].copy(), res["launch_rates"]
    rates.loc[rates.index[1::7], "rx_Bps"] = np.nan
    rates.loc[rates.index[2::5], "tx_Bps"] = np.nan
    no_ranges = res["range_instances"].iloc[:0]

    def events(as_text: bool) -> list[dict]:
        chunks = _events(s.meta, rates, no_ranges, launches, as_text=as_text)
        return [e for c in chunks for e in (json.loads(b"[" + c + b"]") if isinstance(c, bytes) else c)
                if e["ph"] == "C"]

    text, made = events(True), events(False)
    assert len(made) == len(rates) + len(launches) and len(text) == len(made)
    assert any(not e["args"] for e in made) and any(len(e["args"]) == 1 for e in made)  # (both left out; one)
    for a, b in zip(text, made):
        assert a.keys() == b.keys() and a["args"].keys() == b["args"].keys()
        assert {k: v for k, v in a.items() if k not in ("ts", "args")} == {k: v for k, v in b.items()
                                                                          if k not in ("ts", "args")}
        assert a["ts"] == pytest.approx(b["ts"], abs=1e-3) and a["args"] == pytest.approx(b["args"])
