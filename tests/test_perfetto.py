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
