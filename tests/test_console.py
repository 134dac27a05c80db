"""The console tables of every committed recording at 80 and 200 columns: no word split across lines (wrapping
only at spaces), nothing cut, no line past the width, and a blank line between a table and what follows; number
cells and range names whole; markup in range, GPU, command and topology names printed literally; a table with
unexpected columns or no results still prints; the SIMULATED run's every table, and a many-GPU box compact unless
--detail."""

from __future__ import annotations

import functools
import io
import json
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from pcietrace.analysis import analyze
from pcietrace.analysis.summary import summarize
from pcietrace.cli import main
from pcietrace.report import console
from pcietrace.report.console import render
from pcietrace.session import Session

from conftest import DATA, REPORTS, ROOT, as_text, assert_readable, hostile_attach, plain

RECORDINGS = sorted(p.parent for p in DATA.glob("**/report.json"))
ATTACH_RECORDINGS = sorted(p.parent for p in (ROOT / "tests/data").glob("**/report.json") if "attach" in str(p.parent))
BOX = set("─━│┃┏┓┗┛┡┩└┘┌┐├┤┬┴┼╇╈╋ ")


@functools.lru_cache(maxsize=None)
def _parts(rec: Path) -> tuple:
    s = Session.load(rec)
    res = analyze(s)
    return tuple(console.parts(s.meta, res, summarize(s.meta, res), detail=True))


def _source_words(part: object) -> set[str]:
    """Every word the part was given to print (cells, headers, title, caption, text)."""
    if isinstance(part, Table):
        texts = [part.title, part.caption] + [c.header for c in part.columns] \
            + [cell for c in part.columns for cell in c._cells]
    elif isinstance(part, Panel):
        texts = [part.renderable]
    else:
        texts = [part]
    return {w for t in texts for w in plain(t).split()}


@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize("rec", RECORDINGS, ids=lambda p: str(p.relative_to(DATA)))
def test_no_word_is_split_or_cut(rec: Path, width: int) -> None:
    # was: at 80 columns rich folded words inside narrow text columns ('ncclCommIn' / 'itRankConf', 'GP' / 'U')
    # and wrapped captions and titles to the table's width
    for part in _parts(rec):
        out = as_text([part], width)
        lines = out.splitlines()
        assert "…" not in out and max(map(len, lines), default=0) <= width
        words = _source_words(part)
        rendered = {w for line in lines for w in line.split() if not set(w) <= BOX}
        split = rendered - words
        assert not split, f"{getattr(part, 'title', part)!r}: {sorted(split)[:8]} are pieces of words"


def test_a_table_ends_with_a_blank_line_so_piped_tables_stay_apart() -> None:
    # was: piped, a table's caption ran straight into the next table's title
    t = console._table("First", [("GPU", "right")], caption="the caption")
    t.add_row("GPU0")
    lines = as_text([t], 80).splitlines()
    assert lines[0] == "First" and lines[-2].strip() == "the caption" and lines[-1] == ""


def test_a_narrow_table_keeps_its_caption_on_the_terminal_width() -> None:
    # was: the caption wrapped to a narrow table's width, one short line after another
    caption = "a caption far longer than the table is wide, which should use the terminal's width instead"
    t = console._table("T", [("GPU", "right")], caption=caption)
    t.add_row("GPU0")
    assert caption in as_text([t], 120)


def test_a_long_name_wraps_at_spaces_and_is_never_folded() -> None:
    t = console._table("T", [("range", "left"), ("a", "right"), ("b", "right"), ("c", "right")])
    t.add_row("ncclCommInitRankConfig (NCCL) (1344 stalls)", "1" * 15, "2" * 15, "3" * 15)
    out = as_text([t], 80)  # the name column must shrink to its longest word, no further
    assert "ncclCommInitRankConfig" in out and "1" * 15 in out and "3" * 15 in out


@pytest.mark.parametrize("rec", ATTACH_RECORDINGS, ids=lambda p: str(p.relative_to(ROOT / "tests/data")))
def test_every_attach_recording_is_readable_at_80_columns(rec: Path) -> None:
    # was: a name column held at the longest name's width pushed the table past 80 columns, and rich cropped
    # each line there: the D2H column of attach_h200x8_torchrun and attach_h100_blind_cpp was lost, silently
    s = Session.load(rec)
    res = analyze(s)
    assert_readable(console.parts(s.meta, res, summarize(s.meta, res), detail=True), 80)


@pytest.mark.parametrize("width", [80, 160])
@pytest.mark.parametrize("report", [p.name for p in REPORTS])
def test_committed_reports_are_readable(loaded, report: str, width: int) -> None:
    s, res = loaded[report]
    parts = console.parts(s.meta, res, summarize(s.meta, res), detail=True)
    assert sum(isinstance(p, Table) for p in parts) >= 3
    assert_readable(parts, width)


def test_report_command_at_80_columns_piped(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["report", str(REPORTS[1])]) == 0
    out = capsys.readouterr().out
    assert "…" not in out and max(map(len, out.splitlines())) <= 80
    assert "GPU1" in out and "0000:00:07.0" in out  # labels in narrow tables, the bus id once in System


def test_markup_in_range_gpu_and_command_names_prints_literally() -> None:
    s, res = hostile_attach()
    out = as_text(console.parts(s.meta, res, summarize(s.meta, res)), 160)
    for text in ("loss[/total]", "[model] forward", "[bold]x[/bold] \\", "[red]H100[/]", "[/x]"):
        assert text in out


def test_markup_in_topology_strings_prints_literally() -> None:
    topo = json.loads(json.dumps(Session.load(REPORTS[0]).meta["topology"]))
    topo["gpus"][0]["local_cpulist"] = "0-15[/]"
    topo["gpus"][0]["name"] = "[x] gpu"
    out = as_text(console.topology_tables(topo), 120)
    assert "0-15[/]" in out and "[x] gpu" in out


def test_simulated_run_prints_every_table(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["run", "--simulate", "--quick", "--window-s", "0.05", "--no-save"]) == 0
    out = capsys.readouterr().out
    for title in ("System", "Background floor", "PCIe bytes per launch", "Graph launch bytes", "Host cost",
                  "Eager vs CUDA graph", "PCIe placement", "GPU <-> GPU", "Latency", "Topology model"):
        assert title in out, title
    assert "SIMULATED" in out and "GenNone" not in out and "xNone" not in out and "Gen5 x16" in out
    assert "…" not in out


def test_simulated_box_of_many_gpus_is_compact_unless_detail(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    argv = ["run", "--simulate", "--gpus", "3", "--quick", "--window-s", "0.02", "--durations", "0,5", "--no-save"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "Per GPU" in out and "GPU2" in out and "--detail" in out and "PCIe bytes per launch" not in out
    assert main(argv + ["--detail"]) == 0
    assert "PCIe bytes per launch" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["run", "--simulate", "--gpus", "0"])
    assert main(["run", "--simulate", "--gpus", "2", "--gpu", "5", "--no-save"]) == 2


def test_a_table_with_unexpected_columns_still_prints(loaded) -> None:
    s, res = loaded["h100_run"]
    odd = {**res, "by_duration": res["by_duration"].drop(columns=["h2d_bytes_per_launch"]),
           "host_cost_by_language": pd.DataFrame({"nvml_index": [0], "language": ["C"], "us_per_launch": [2.5]})}
    out = as_text(console.parts(s.meta, odd), 80)
    assert "by duration" in out and "host cost by language" in out and "2.500" in out


def test_a_fit_with_no_value_shows_a_dash_not_nan(copy) -> None:
    """A run whose windows made no launch calls has no per-launch fit: its intercept is blank like the fit's other
    cells (it printed "+nan")."""
    from pcietrace.analysis import analyze
    from pcietrace.session import Session

    from conftest import edit_report

    run = copy("h100_run")
    edit_report(run, lambda d: [w.update(calls=0) for w in d["tables"]["windows"]])
    s = Session.load(run)
    res = analyze(s)
    assert len(res["per_launch"]) and not res["per_launch"]["intercept_ok"].any()
    out = as_text(console.parts(s.meta, res, summarize(s.meta, res)), 120)
    assert "nan" not in out.lower() and "PCIe bytes per launch" in out


def test_render_survives_an_empty_result_set(h100) -> None:
    buf = io.StringIO()
    render(h100.meta, {}, Console(file=buf, width=200))
    assert "System" in buf.getvalue() and "H100" in buf.getvalue()


@pytest.mark.parametrize("name", ["attach_h100_decode/decode-eager-gputime", "attach_h200x8_torchrun"])
def test_attach_range_names_longer_than_their_column_are_folded_not_cut(name, data_dir, monkeypatch, capsys) -> None:
    # was: 'decode_…', 'ncclCommI…' at 80 columns: the name that says which row is which, cut
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["report", str(data_dir / name), "--all"]) == 0  # (every range: a screen's worth may leave some out)
    out = capsys.readouterr().out
    assert "…" not in out and max(map(len, out.splitlines())) <= 80
    flat = "".join(line.strip() for line in out.splitlines())
    names = set(analyze(Session.load(data_dir / name))["ranges"]["name"])
    assert names and all(n in flat or n in out for n in names)


def test_attach_range_names_stay_whole_at_80_columns(data_dir, monkeypatch, capsys) -> None:
    # was: 'graph_repla' / 'y_h2d' and 'pageable_d2h_cp' / 'u (2 stalls)' at 80 columns: the numbers' one-line
    # headers squeezed the name column to 11-15 characters, and a range's marks broke its name further
    monkeypatch.setenv("COLUMNS", "80")
    rec = data_dir / "attach_h100_blind_graphs"
    assert main(["report", str(rec), "--all"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "…" not in "".join(lines) and max(map(len, lines)) <= 80
    rg = analyze(Session.load(rec))["ranges"]
    assert rg["stalls"].sum() and rg["short_calls"].sum()  # the recording has both marks to show
    for r in rg.itertuples():  # in both tables, each name whole on a line of its own; its marks on the next, once
        # table rows start with a space, nested ranges' names further in by their level
        rows = [i for i, line in enumerate(lines) if line.startswith(" ") and line.lstrip().startswith(f"{r.name} ")]
        assert len(rows) == 2, r.name
        marks = [f"{r.short_calls} short"] * bool(r.short_calls) + [f"{r.stalls} stall{'s' * (r.stalls != 1)}"] * bool(r.stalls)
        if marks:
            # (beside the ± error, which has the row's second line too)
            assert lines[rows[0] + 1].split("   ")[0].strip() == f"({', '.join(marks)})", (r.name, lines[rows[0] + 1])
    assert "(1 stall)" in "".join(lines)  # cross_thread's one


@pytest.mark.parametrize("rec", ["attach_h200x2_torchrun_outside", "attach_h100_python"])
def test_what_each_process_s_range_edges_cost_it_is_shown_where_its_library_timed_them(rec: str) -> None:
    # a real recording of a library before edges were timed, given the fields a newer one's processes carry:
    # the process table (several processes) or line (one) says them, and readable at 80 columns
    s = Session.load(DATA / rec)
    for k, p in enumerate(s.meta["processes"]):
        if p["nvtx"]:
            p.update(edges=2 * p["ranges"], edge_ns=301.4 + k, edges_ms=2 * p["ranges"] * (301.4 + k) / 1e6 + 1234)
    res = analyze(s)
    parts = console.parts(s.meta, res, summarize(s.meta, res), detail=True)
    assert_readable(parts, 80)
    text = " ".join(as_text(parts, 200).split())
    timed = [p for p in s.meta["processes"] if p["nvtx"]]
    if len(s.meta["processes"]) > 1:
        assert "edges cost" in text and "one edge in 61 timed" in text and "the least" in text
        assert all(f"{p['edges_ms']:,.1f}" in text for p in timed)
    else:
        p, = timed
        assert f"its {p['edges']:,} range edges took at least {p['edges_ms']:,.1f} ms of its threads" in text
        assert f"({p['edge_ns']:,.0f} ns each inside attach's library" in text


def test_the_per_node_and_savings_tables_cut_a_long_name_too() -> None:
    """A 1,000-character range name in the per-node ranges table and in `compare`'s savings table: cut with "…"
    as in the ranges table (it wrapped over 33 lines; a reviewer's case). SIMULATED rows."""
    from rich.console import Console

    from pcietrace.report.console.attach import ranges_by_host_table
    from pcietrace.report.console.compare import savings_table
    from pcietrace.text import NAME_CHARS

    name = "§" * 1000
    by_host = pd.DataFrame({"domain": ["d"], "name": [name], "node": ["n0"], "host": ["h0"], "calls": [1],
                            "incl_ms": [1.0], "status": ["ok"], "h2d_bytes": [1e6], "d2h_bytes": [1e6],
                            "h2d_edge_bytes": [0.0], "h2d_floor_err_bytes": [0.0]})
    saved = pd.DataFrame({"domain": ["d"], "name": [name], "eager_ms": [2.0], "graphed_ms": [1.0],
                          "eager_launches": [10], "measured_ms": [1.0], "predicted_ms": [1.0], "error_pct": [0.0],
                          "launch_bound": [True]})
    for table in (ranges_by_host_table(by_host), savings_table(saved, ["a", "b"])):
        c = Console(width=80, record=True)
        c.print(table)
        text = c.export_text()
        assert "…" in text and text.count("§") <= NAME_CHARS
