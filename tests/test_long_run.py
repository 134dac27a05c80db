"""A long attach run's outputs stay bounded: range instances to Parquet (``report --instances``, and a saved run
past :data:`pcietrace.session.INLINE_INSTANCES`), and the benchmark's synthetic recordings load and analyse.
Speed and memory are bench/long_run.py's (laws, not timed tests)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import long_run
from golden import recordings


@pytest.mark.parametrize("folder", [f for f in recordings() if (f / "events.parquet").exists()][:6],
                         ids=lambda p: p.name)
def test_instances_to_parquet_hold_the_table(folder, tmp_path, capsys) -> None:
    """``report --instances FILE``: the table's rows in FILE, the JSON naming it and the row count."""
    import pcietrace
    from pcietrace.cli import main

    assert main(["report", str(folder), "--format", "json", "--instances", str(tmp_path / "i.parquet")]) == 0
    doc = json.loads(capsys.readouterr().out)
    inst = pcietrace.load(folder).range_instances
    assert doc["results"]["range_instances"] == {"parquet": str(tmp_path / "i.parquet"), "rows": len(inst)}
    back = pd.read_parquet(tmp_path / "i.parquet")
    assert list(back.columns) == list(inst.columns) and len(back) == len(inst)
    for c in ("t_start_ns", "h2d_bytes", "name", "status"):
        pd.testing.assert_series_equal(back[c], inst[c].reset_index(drop=True), check_dtype=False)
    assert [list(g) for g in back["gpus"]] == [list(g) for g in inst["gpus"]]


def test_instances_refuse_the_recordings_own_files(copy, capsys) -> None:
    from conftest import one_line_exit_2

    folder = copy("attach_h100_python")
    before = {f.name: f.read_bytes() for f in folder.iterdir()}
    assert "the report's own events.parquet" in one_line_exit_2(
        ["report", str(folder), "--instances", str(folder / "events.parquet")], capsys)
    assert {f.name: f.read_bytes() for f in folder.iterdir()} == before


def test_a_saved_run_past_the_inline_limit_keeps_its_instances_in_parquet(data_dir, tmp_path, monkeypatch) -> None:
    from pcietrace import session as session_module
    from pcietrace.analysis import analyze, saved_tables
    from pcietrace.session import INSTANCES_FILE, Session

    s = Session.load(data_dir / "attach_h100_blind")
    res = analyze(s)
    monkeypatch.setattr(session_module, "INLINE_INSTANCES", len(res["range_instances"]) - 1)
    s.save(tmp_path / "run", saved_tables(res))
    doc = json.loads((tmp_path / "run" / "report.json").read_text())
    assert doc["results"]["range_instances"] == {"parquet": INSTANCES_FILE, "rows": len(res["range_instances"])}
    assert len(pd.read_parquet(tmp_path / "run" / INSTANCES_FILE)) == len(res["range_instances"])
    assert doc["results"]["ranges"] and Session.load(tmp_path / "run").meta == s.meta  # still a recording
    monkeypatch.setattr(session_module, "INLINE_INSTANCES", len(res["range_instances"]))
    s.save(tmp_path / "small", saved_tables(res))  # at the limit: inline, as before
    doc = json.loads((tmp_path / "small" / "report.json").read_text())
    assert len(doc["results"]["range_instances"]) == len(res["range_instances"])


def test_the_synthetic_long_run_is_a_recording_of_its_size(tmp_path) -> None:
    """bench/long_run.py's recording: one process per GPU, about the ranges and samples asked for, each
    process's ranges charged to its own GPU."""
    import pcietrace

    long_run.synthesise(tmp_path / "r", gpus=3, samples=30_000, ranges=3_000, names=50)
    run = pcietrace.load(tmp_path / "r")
    inst = run.range_instances
    assert run.session.samples.groupby("nvml_index").size().to_dict() == {0: 10_000, 1: 10_000, 2: 10_000}
    assert 3_000 <= len(inst) < 3_000 + 3 * 464 and inst["pid"].nunique() == 3
    assert (inst.groupby("pid")["gpus"].agg(lambda g: {tuple(x) for x in g}).map(len) == 1).all()
    assert inst["name"].nunique() <= 50 * 8 and (inst["status"] == "ok").mean() > 0.9
    assert np.isfinite(run.whole_run["h2d_bytes"]).all()
