"""Every result table has the columns its producer declares, with rows or without, for every kind of session:
real recordings (a run, an attach, an attach with --gpu-time, a graphs run) and SIMULATED sessions made from
them for the kinds tests/data has no recording of (a latency run, an attach that never ran its program, an
attach that saw no NVTX range, a session with no GPU and no table). And an empty table renders as a
column-less one did: no output format changes (bench/render_all.py diffs every recording every way)."""

from __future__ import annotations

import io

import pandas as pd
import pytest

from pcietrace.analysis import INSTANCE_EXTRAS, RESULT_TABLES, analyze, declared_columns, gpu_time
from pcietrace.cli import main
from pcietrace.session import Session

from conftest import DATA, edit_samples


REAL = {"run": "h100_run", "run with latency": "h100_run_latency", "attach": "attach_h100_python",
        "attach --gpu-time": "attach_h100_decode/decode-eager-gputime", "graphs": "graphs_h100"}


def _sessions() -> dict[str, Session]:
    out = {kind: Session.load(DATA / name) for kind, name in REAL.items()}
    run, att = out["run"], out["attach"]
    lat = out["run with latency"]
    out["SIMULATED latency"] = Session(meta={**lat.meta, "kind": "latency"}, latency=lat.latency)
    out["SIMULATED attach-failed"] = Session(meta={**att.meta, "kind": "attach-failed",
                                                   "status": "interrupted before the program ran"})
    out["SIMULATED attach, no NVTX range"] = Session(meta=att.meta, samples=att.samples, windows=att.windows,
                                                     events=att.events.iloc[:0])
    out["SIMULATED empty"] = Session(meta={"gpus": [], "status": "failed: before the first window"})
    assert run.meta.get("kind") is None  # (a run's kind is unsaid)
    return out


@pytest.fixture(scope="module")
def analysed() -> dict[str, tuple[Session, dict[str, pd.DataFrame]]]:
    return {kind: (s, analyze(s)) for kind, s in _sessions().items()}


def test_every_table_has_its_declared_columns_with_rows_or_without(analysed) -> None:
    filled, empty = set(), set()
    for kind, (s, res) in analysed.items():
        want = declared_columns(s.meta.get("kind"))  # (a table with rows has its producer's: the check below)
        assert list(res) == list(RESULT_TABLES), kind
        for table, df in res.items():
            cols = list(df.columns)
            (filled if len(df) else empty).add(table)
            if table == "calibration" and len(df):  # the recorded table: its declared columns and what else it holds
                assert set(want[table]) <= set(cols), (kind, table)
            elif table == "range_instances" and len(df):  # + each group measured, whole and in order
                extras = cols[len(want[table]):]
                groups = [g for g in INSTANCE_EXTRAS.values() if set(g) <= set(extras)]
                assert cols[:len(want[table])] == want[table] and extras == [c for g in groups for c in g], kind
            else:
                assert cols == want[table], (kind, table, "rows" if len(df) else "empty")
    assert filled == set(RESULT_TABLES) and empty == set(RESULT_TABLES)  # each table seen both ways
    inst = {k: list(r["range_instances"].columns) for k, (_, r) in analysed.items() if len(r["range_instances"])}
    assert set(gpu_time.BUSY_COLUMNS) <= set(inst["attach --gpu-time"]) - set(inst["attach"])  # both groups seen


def test_an_attach_table_reads_like_a_run_table(analysed) -> None:
    """The Python API's user: a column of a table an attach has no rows in is there, empty (was a KeyError)."""
    _, att = analysed["attach"]
    _, run = analysed["run"]
    assert not len(att["per_launch"]) and len(run["per_launch"])
    assert att["per_launch"]["bytes_per_call"].empty and run["ranges"]["h2d_bytes"].empty
    assert att["per_launch"].merge(run["per_launch"], on=["nvml_index", "mode", "direction"]).empty


def _renderings(meta: dict, res: dict[str, pd.DataFrame]) -> list[str]:
    from pcietrace.analysis.summary import summarize
    from pcietrace.report.output import emit

    out = []
    summ = summarize(meta, res)
    for fmt in ("table", "json", "csv", "md", "prometheus"):
        if fmt == "prometheus" and meta.get("kind") == "graphs":
            continue  # refused (tests/test_cli_errors.py)
        buf = io.StringIO()
        emit(meta, res, summ, fmt, detail=True, out=buf)
        out.append(buf.getvalue())
    return out


@pytest.mark.parametrize("kind", ["run", "attach", "graphs", "SIMULATED attach-failed", "SIMULATED empty"])
def test_empty_tables_render_as_column_less_ones_did(analysed, kind) -> None:
    s, res = analysed[kind]
    bare = {k: v if len(v) else pd.DataFrame() for k, v in res.items()}
    assert any(len(v.columns) for k, v in res.items() if not len(v))
    assert _renderings(s.meta, res) == _renderings(s.meta, bare)


def test_windows_no_sample_covers_render_with_declared_columns(copy, capsys, monkeypatch) -> None:
    """Only three samples, before every window: no window has bytes; tables say '–', nothing crashes."""
    run = copy()
    edit_samples(run, lambda s: s.iloc[:3])
    res = analyze(Session.load(run))
    assert {"h2d_bytes_per_launch", "d2h_bytes_per_launch"} <= set(res["by_duration"].columns)
    assert res["by_duration"]["h2d_bytes_per_launch"].isna().all()
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["report", str(run)]) == 0
    assert "vs kernel duration" in capsys.readouterr().out
