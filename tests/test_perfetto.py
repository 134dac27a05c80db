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
