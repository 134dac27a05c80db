"""The renderers (pcietrace/report/renderers.py): one class per format behind one registry; every format renders
every kind of session tests/data holds a recording of (and the kinds made from them), or refuses in one line; CSV
blocks read back as the result tables, Markdown gives one pipe table per result table."""

from __future__ import annotations

import io
import json
import re

import pandas as pd
import pytest

from pcietrace.analysis import RESULT_TYPES, analyze
from pcietrace.analysis.summary import summarize
from pcietrace.cli import main
from pcietrace.errors import UsageError
from pcietrace.report import console
from pcietrace.report.output import emit, emit_compare, emit_savings
from pcietrace.report.renderers import FORMATS, RENDERERS, Renderer, renderer
from pcietrace.session import Session

from conftest import DATA, REPORTS

#: A committed recording of each kind tests/data holds (a latency session and an attach whose program never ran
#: are made from them below).
RECORDINGS = {"run": "h100_run", "attach": "attach_h100_python", "graphs": "graphs_h100"}
#: What a format says it cannot show, in one line (a UsageError), rather than an empty or misleading document.
REFUSED = {("prometheus", "graphs")}


def _session(kind: str) -> Session:
    if kind == "latency":
        lat = Session.load(DATA / "h100_run_latency")
        return Session(meta={**lat.meta, "kind": "latency"}, latency=lat.latency)
    if kind == "attach-failed":
        att = Session.load(DATA / RECORDINGS["attach"])
        return Session(meta={**att.meta, "kind": "attach-failed", "status": "interrupted before the program ran"})
    return Session.load(DATA / RECORDINGS[kind])


@pytest.fixture(scope="module")
def analysed() -> dict[str, tuple[Session, object]]:
    return {kind: (s, analyze(s)) for kind in RESULT_TYPES for s in [_session(kind)]}


def test_every_kind_of_session_is_covered() -> None:
    assert set(RESULT_TYPES) == {*RECORDINGS, "latency", "attach-failed"}


def test_the_registry_names_one_renderer_class_per_format() -> None:
    for name in RENDERERS:
        r = renderer(name)
        assert isinstance(r, Renderer) and type(r).name == name
    assert set(FORMATS) < set(RENDERERS)


def test_the_cli_offers_every_stream_format() -> None:
    from pcietrace.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and "report" in a.choices).choices["report"]
    fmt = next(a for a in sub._actions if "--format" in a.option_strings)
    assert tuple(fmt.choices) == FORMATS


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", list(RESULT_TYPES))
def test_every_stream_format_renders_every_kind(analysed, kind, fmt) -> None:
    s, res = analysed[kind]
    out = io.StringIO()
    if (fmt, kind.partition("-")[0]) in REFUSED:
        with pytest.raises(UsageError, match=fmt):
            emit(s.meta, res, summarize(s.meta, res), fmt, detail=True, out=out)
        return
    emit(s.meta, res, summarize(s.meta, res), fmt, detail=True, out=out)
    text = out.getvalue()
    nothing = not any(len(v) for v in res.values()) and not summarize(s.meta, res)["lines"]
    assert text.strip() or (fmt == "csv" and nothing)  # (CSV has no header of its own)
    if fmt == "json":
        doc = json.loads(text)
        assert doc["meta"].get("kind") == s.meta.get("kind") and set(doc["results"]) <= set(res)
        assert all(isinstance(n, str) for n in (r["note"] for r in doc["results"]["notes"]))


@pytest.mark.parametrize("kind", list(RESULT_TYPES))
def test_the_file_formats_render_every_kind(analysed, kind, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    s, res = analysed[kind]
    info = renderer("perfetto", session=s).render(s.meta, res, {}, tmp_path / "trace.json")
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert info["bytes"] == (tmp_path / "trace.json").stat().st_size and "traceEvents" in trace
    assert info["ranges_recorded"] == len(res["range_instances"])
    paths = renderer("plots").render(s.meta, res, {}, tmp_path / "plots")
    assert all(p.is_file() and p.stat().st_size for p in paths)
    drawn = {"run": "bytes_vs_launches.png", "attach": "attach_timeline.png", "graphs": "graph_strategies.png",
             "latency": "latency.png"}
    assert (drawn[kind] in {p.name for p in paths}) if kind in drawn else paths == []


def test_every_kind_has_a_console_layout() -> None:
    assert set(RESULT_TYPES) <= set(console.LAYOUTS)


def test_the_console_of_a_kind_shows_its_own_tables(analysed) -> None:
    titles = {kind: [getattr(p, "title", None) for p in console.parts(s.meta, res, detail=True)]
              for kind, (s, res) in analysed.items()}
    assert "Launches per NVTX range" in titles["attach"] and "Background floor per GPU" in titles["attach"]
    assert any(str(t).startswith("CUDA graphs, ") for t in titles["graphs"])
    assert "PCIe bytes per launch (fit of net window bytes vs launch calls)" in titles["run"]
    assert "Latency" in titles["latency"] and "Background floor per GPU" not in titles["run"]


def test_compare_and_savings_render_through_the_registry(analysed) -> None:
    """compare and savings are results of their own kind (meta["kind"]), rendered by the same classes."""
    cmp = pd.DataFrame({"gpu": ["GPU0"], "metric": ["m"], "unit": ["B"], "value:A": [1.0], "value:B": [2.0],
                        "delta:B": [1.0], "pct:B": [100.0], "significant:B": [True]})
    for fmt in ("table", "json", "csv", "md"):
        out = io.StringIO()
        emit_compare(cmp, ["A", "B"], {"kind": "compare", "lines": ["B vs A: more."]}, fmt, out=out)
        assert "B vs A: more." in out.getvalue()
    sv = pd.DataFrame({"domain": ["default"], "name": ["step"], "eager_ms": [2.0], "graphed_ms": [1.0],
                       "eager_launches": [10], "measured_ms": [1.0], "predicted_ms": [1.1], "error_pct": [10.0],
                       "launch_bound": [True]})
    out = io.StringIO()
    emit_savings(sv, ["eager", "graphed"], "json", out=out)
    assert json.loads(out.getvalue()) == json.loads(sv.to_json(orient="records"))
    out = io.StringIO()
    emit_savings(sv, ["eager", "graphed"], "table", out=out)
    assert "step" in out.getvalue()


def test_csv_blocks_read_back_as_the_result_tables(loaded, capsys) -> None:
    assert main(["report", str(REPORTS[0]), "--format", "csv"]) == 0
    text = capsys.readouterr().out
    blocks = dict(re.findall(r"# table: (\w+)\n(.*?)(?=\n# table: |\Z)", text, re.S))
    _, res = loaded["h100_run_defaults"]
    assert set(blocks) == {k for k, v in res.items() if len(v)}
    back = pd.read_csv(io.StringIO(blocks["per_launch"]))
    assert back["bytes_per_call"].tolist() == pytest.approx(res["per_launch"]["bytes_per_call"].tolist())
    assert text.startswith("# summary: One eager launch")


def test_csv_rows_made_in_arrow_are_the_text_pandas_writes(monkeypatch) -> None:
    """A table's CSV rows are made a column at a time in Arrow (:class:`pcietrace.report.csv.CsvRow`: pandas takes
    ~16 us a row, a long run's instances are millions) and are the text pandas' ``to_csv`` writes, byte for byte,
    in every chunk: on a real recording's range instances with NaN, NA, infinities, values whose shortest text
    Arrow writes apart from Python (1e-7, 1e10 on), quoted text and the values pandas takes as one added."""
    import numpy as np

    from pcietrace import api
    from pcietrace.report import csv as csv_format

    inst = api.load(DATA / "attach_h100_emit_nvtx").range_instances.iloc[:400].copy()
    inst.loc[inst.index[::7], "h2d_bytes"] = np.nan
    inst.loc[inst.index[::9], "d2h_bytes"] = np.inf
    inst.loc[inst.index[::11], "excl_h2d_bytes"] = 1.5e-7
    inst.loc[inst.index[::13], "excl_d2h_bytes"] = 123456789012.5
    inst["eager_launches"] = pd.array(inst["eager_launches"].where(inst.index % 5 > 0), "Int64")
    inst["group"] = inst["group"].cat.rename_categories(lambda c: c + ', "q"' if c.startswith("aten::a") else c)
    inst["mixed"] = np.array([True, 1, 1.0, -0.0, None] * 80, object)
    monkeypatch.setattr(csv_format, "CHUNK_ROWS", 64)
    assert csv_format._by_rows(inst, csv_format._quoting(inst))
    out = io.StringIO()
    csv_format.write({}, {"range_instances": inst}, {}, out)
    want = "".join(inst.iloc[i:i + 64].to_csv(index=False, header=not i, lineterminator="\n")
                    for i in range(0, len(inst), 64))
    assert out.getvalue() == "\n# table: range_instances\n" + want
    assert ',1.5e-07,' in want and ',inf,' in want and '"q""' in want  # (the cases were there)


def test_markdown_has_one_pipe_table_per_result_table(loaded, capsys) -> None:
    assert main(["report", str(REPORTS[5]), "--format", "md"]) == 0
    text = capsys.readouterr().out
    _, res = loaded["attach_h100_python"]
    section = text.split("## ranges\n\n")[1].split("\n\n")[0].splitlines()
    assert len(section) == 2 + len(res["ranges"]) and section[0].startswith("| domain | name |")


def test_markdown_tables_written_a_chunk_of_rows_at_a_time_are_the_whole_table(loaded, capsys, monkeypatch) -> None:
    """A long run's range instances are written a chunk of rows at a time, never one string: the same text."""
    from pcietrace.report import markdown

    assert main(["report", str(REPORTS[5]), "--format", "md"]) == 0
    whole = capsys.readouterr().out
    monkeypatch.setattr(markdown, "CHUNK_ROWS", 3)
    assert main(["report", str(REPORTS[5]), "--format", "md"]) == 0
    assert capsys.readouterr().out == whole and "## range_instances" in whole
