"""A user's first minute (issue 10): the summary first, readable at 80 columns, escaped outside text, every
output format, plots, the Python API, the complete simulated run, compare over every GPU, topo fixtures.
All on the committed real reports (tests/data/) or the SIMULATED device."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console
from rich.table import Table
from rich.text import Text

import pcietrace
from pcietrace.analysis import analyze
from pcietrace.analysis.summary import summarize
from pcietrace.cli import build_parser, main
from pcietrace.report import console
from pcietrace.session import Session

ROOT = Path(__file__).parent.parent
REPORTS = [ROOT / "tests/data/h100_run_defaults", ROOT / "tests/data/h200x2_run_defaults", ROOT / "tests/data/h100_run",
           ROOT / "tests/data/h100_run_latency", ROOT / "tests/data/h200x2_run", ROOT / "tests/data/attach_h100_python"]


@pytest.fixture(scope="module")
def loaded() -> dict[str, tuple[Session, dict[str, pd.DataFrame]]]:
    out = {}
    for p in REPORTS:
        s = Session.load(p)
        out[p.name] = (s, analyze(s))
    return out


def _plain(cell: object) -> str:
    return Text.from_markup(cell).plain if isinstance(cell, str) else getattr(cell, "plain", str(cell))


def _render(parts: list, width: int) -> str:
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=False, color_system=None)
    for part in parts:
        con.print(part)
    return buf.getvalue()


def _assert_readable(parts: list, width: int) -> None:
    """No cell cut ('…'), no line past the width, and every number cell printed whole on one line."""
    out = _render(parts, width)
    assert "…" not in out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= width
    for t in (p for p in parts if isinstance(p, Table)):
        for col in t.columns:
            if not col.no_wrap:
                continue
            for cell in col._cells:
                for text in _plain(cell).splitlines():  # a cell's own lines (a value, its ± below) each whole
                    assert any(text in line for line in lines), f"{t.title!r} / {col.header!r}: {text!r} wrapped or cut"


ATTACH_RECORDINGS = sorted(p.parent for p in (ROOT / "tests/data").glob("**/report.json") if "attach" in str(p.parent))


@pytest.mark.parametrize("rec", ATTACH_RECORDINGS, ids=lambda p: str(p.relative_to(ROOT / "tests/data")))
def test_every_attach_recording_is_readable_at_80_columns(rec: Path) -> None:
    # was: a name column held at the longest name's width pushed the table past 80 columns, and rich cropped
    # each line there: the D2H column of attach_h200x8_torchrun and attach_h100_blind_cpp was lost, silently
    s = Session.load(rec)
    res = analyze(s)
    _assert_readable(console.parts(s.meta, res, summarize(s.meta, res), detail=True), 80)


@pytest.mark.parametrize("width", [80, 160])
@pytest.mark.parametrize("report", [p.name for p in REPORTS])
def test_committed_reports_are_readable(loaded, report: str, width: int) -> None:
    s, res = loaded[report]
    parts = console.parts(s.meta, res, summarize(s.meta, res), detail=True)
    assert sum(isinstance(p, Table) for p in parts) >= 3
    _assert_readable(parts, width)


def test_report_command_at_80_columns_piped(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["report", str(REPORTS[1])]) == 0
    out = capsys.readouterr().out
    assert "…" not in out and max(map(len, out.splitlines())) <= 80
    assert "GPU1" in out and "0000:00:07.0" in out  # labels in narrow tables, the bus id once in System


def test_compare_is_readable_and_marks_significance_in_text(loaded, monkeypatch, capsys) -> None:
    from pcietrace.analysis.compare import compare
    from pcietrace.analysis.summary import compare_summary

    a, b = loaded["h100_run_latency"], loaded["h200x2_run"]
    names = ["A: H100", "B: H200 x2"]
    cmp = compare([(names[0], a[1], a[0].meta), (names[1], b[1], b[0].meta)])
    assert set(cmp["gpu"]) == {"GPU0", "GPU1"}  # every GPU, not just the first
    for width in (80, 160):
        _assert_readable([console.compare_table(cmp, names)], width)
    out = _render([console.compare_table(cmp, names)], 160)
    sig = cmp[cmp["significant:B: H200 x2"] == True]  # noqa: E712
    assert len(sig) and out.count("*") >= len(sig)
    r = sig.iloc[0]
    assert f"{r['pct:B: H200 x2']:+.1f}%" in out
    lines = compare_summary(cmp, names)["lines"]
    assert lines and "significant" in lines[0]
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["compare", str(REPORTS[3]), str(REPORTS[4])]) == 0
    out = capsys.readouterr().out
    assert "vs A" in out and "GPU1" in out and "…" not in out


# -- the answer first ------------------------------------------------------------------------------

def test_run_summary_comes_from_the_tables(loaded) -> None:
    s, res = loaded["h100_run_defaults"]
    summ = summarize(s.meta, res)
    pl = res["per_launch"]
    eager = pl[(pl["mode"] == "eager") & (pl["direction"] == "h2d")].iloc[0]
    row = summ["gpus"].iloc[0]
    assert row["eager_h2d_bytes"] == eager["bytes_per_call"] and row["gpu"] == "GPU0"
    sp = res["speedup"].sort_values("kernel_us")
    line = summ["lines"][0]
    assert line.startswith("One eager launch on GPU0 (H100")
    assert f"{eager['bytes_per_call']:,.0f} ± {eager['ci95']:,.0f} B H2D" in line
    assert f"{sp['speedup'].iloc[0]:.1f}x faster at {sp['kernel_us'].iloc[0]:g} us" in line
    rtt = res["latency"].set_index("test").loc["host_read_rtt", "median_us"]
    assert f"{rtt:.2f} us" in line


def test_attach_summary_names_the_top_ranges(loaded) -> None:
    s, res = loaded["attach_h100_python"]
    summ = summarize(s.meta, res)
    top = res["ranges"].sort_values("launch_overhead_ms", ascending=False).iloc[0]
    assert summ["ranges"].iloc[0]["name"] == top["name"]
    assert f"{top['name']} {top['launch_overhead_ms']:,.1f} ms of launch overhead" in " ".join(summ["lines"])


def test_summary_is_printed_first_and_in_json(capsys) -> None:
    assert main(["report", str(REPORTS[0])]) == 0
    out = capsys.readouterr().out
    assert out.startswith("One eager launch on GPU0")
    assert main(["report", str(REPORTS[0]), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["lines"][0].startswith("One eager launch") and doc["summary"]["gpus"][0]["gpu"] == "GPU0"
    assert main(["report", str(REPORTS[0]), "--json"]) == 0  # the alias
    assert json.loads(capsys.readouterr().out) == doc


# -- outside text is text --------------------------------------------------------------------------

def _hostile_attach() -> tuple[Session, dict[str, pd.DataFrame]]:
    s = Session.load(REPORTS[5])
    rename = {"idle": "loss[/total]", "h2d_copy": "[model] forward", "graph_launch": "[bold]x[/bold] \\"}
    s.events = s.events.assign(message=s.events["message"].replace(rename))
    s.meta["gpus"][0]["name"] = "NVIDIA [red]H100[/]"
    s.meta["command"] = ["python3", "[/x]"]
    return s, analyze(s)


def test_markup_in_range_gpu_and_command_names_prints_literally() -> None:
    s, res = _hostile_attach()
    out = _render(console.parts(s.meta, res, summarize(s.meta, res)), 160)
    for text in ("loss[/total]", "[model] forward", "[bold]x[/bold] \\", "[red]H100[/]", "[/x]"):
        assert text in out


def test_markup_in_topology_strings_prints_literally() -> None:
    topo = json.loads(json.dumps(Session.load(REPORTS[0]).meta["topology"]))
    topo["gpus"][0]["local_cpulist"] = "0-15[/]"
    topo["gpus"][0]["name"] = "[x] gpu"
    out = _render(console.topology_tables(topo), 120)
    assert "0-15[/]" in out and "[x] gpu" in out


# -- formats ---------------------------------------------------------------------------------------

def test_csv_blocks_read_back_as_the_result_tables(loaded, capsys) -> None:
    assert main(["report", str(REPORTS[0]), "--format", "csv"]) == 0
    text = capsys.readouterr().out
    blocks = dict(re.findall(r"# table: (\w+)\n(.*?)(?=\n# table: |\Z)", text, re.S))
    _, res = loaded["h100_run_defaults"]
    assert set(blocks) == {k for k, v in res.items() if len(v)}
    back = pd.read_csv(io.StringIO(blocks["per_launch"]))
    assert back["bytes_per_call"].tolist() == pytest.approx(res["per_launch"]["bytes_per_call"].tolist())
    assert text.startswith("# summary: One eager launch")


def test_markdown_has_one_pipe_table_per_result_table(loaded, capsys) -> None:
    assert main(["report", str(REPORTS[5]), "--format", "md"]) == 0
    text = capsys.readouterr().out
    _, res = loaded["attach_h100_python"]
    section = text.split("## ranges\n\n")[1].split("\n\n")[0].splitlines()
    assert len(section) == 2 + len(res["ranges"]) and section[0].startswith("| domain | name |")


def test_prometheus_parses_with_dcgm_labels(loaded, capsys) -> None:
    parser = pytest.importorskip("prometheus_client.openmetrics.parser")
    assert main(["report", str(REPORTS[1]), "--format", "prometheus"]) == 0
    fams = {f.name: f for f in parser.text_string_to_metric_families(capsys.readouterr().out)}
    s, res = loaded["h200x2_run_defaults"]
    launch = fams["pcietrace_launch_pcie_bytes"]
    assert launch.unit == "bytes"
    pl = res["per_launch"]
    for g in s.meta["gpus"]:
        want = pl[(pl["nvml_index"] == g["nvml_index"]) & (pl["mode"] == "eager") & (pl["direction"] == "h2d")]
        got = [x for x in launch.samples if x.labels["gpu"] == str(g["nvml_index"]) and x.labels["mode"] == "eager"
               and x.labels["direction"] == "h2d"]
        assert got[0].value == pytest.approx(want["bytes_per_call"].iloc[0])
        assert got[0].labels["UUID"] == g["uuid"] and got[0].labels["pci_bus_id"] == g["bus_id"]
        assert got[0].labels["modelName"] == g["name"] and got[0].labels["Hostname"] == s.meta["host"]
    for name in ("pcietrace_launch_host_seconds", "pcietrace_kernel_gpu_seconds", "pcietrace_host_read_rtt_seconds",
                 "pcietrace_pcie_switch_levels", "pcietrace_graph_node_pcie_bytes"):
        assert fams[name].samples, name


def test_prometheus_attach_ranges_keep_hostile_names(capsys) -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    from pcietrace.report import prometheus

    s, res = _hostile_attach()
    fams = {f.name: f for f in text_string_to_metric_families(prometheus.render(s.meta, res, {}))}
    launches = {(x.labels["range"], x.labels["kind"]): x.value for x in fams["pcietrace_range_launches"].samples}
    assert launches[("loss[/total]", "eager")] == 0
    eager = res["ranges"].set_index("name")["eager_launches"]
    assert launches[("[bold]x[/bold] \\", "graph")] == res["ranges"].set_index("name").loc["[bold]x[/bold] \\", "graph_launches"]
    assert launches[("eager_launches", "eager")] == eager["eager_launches"]


# -- plots -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("report,pngs", [
    ("h100_run_latency", {"bytes_vs_launches.png", "bytes_vs_duration.png", "time_per_kernel.png", "latency.png"}),
    ("attach_h100_python", {"attach_timeline.png"}),
    ("graphs_h100", {"graph_strategies.png"})])
def test_plot_writes_the_pngs(report: str, pngs: set[str], tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    assert main(["report", str(ROOT / "tests/data" / report), "--plot", str(tmp_path), "--format", "json"]) == 0
    written = {p.name for p in tmp_path.iterdir()}
    assert written == pngs
    for name in written:
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


# -- Python API ------------------------------------------------------------------------------------

def test_load_gives_named_tables_summary_and_meta(loaded) -> None:
    run = pcietrace.load(REPORTS[0])
    _, res = loaded["h100_run_defaults"]
    pd.testing.assert_frame_equal(run.per_launch, res["per_launch"])
    assert run["speedup"] is run.tables["speedup"]
    assert run.meta["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert str(run).startswith("One eager launch on GPU0")
    with pytest.raises(AttributeError, match="no result table"):
        run.nope  # noqa: B018


def test_measure_runs_the_simulated_pipeline(tmp_path) -> None:
    run = pcietrace.measure(simulate=True, quick=True, window_s=0.02, gpus=2, latency=False, output=tmp_path / "m")
    assert run.meta["simulated"] and len(run.meta["gpus"]) == 2
    assert set(run.per_launch["nvml_index"]) == {0, 1}
    assert (tmp_path / "m" / "report.json").is_file()


def test_import_stays_light() -> None:
    import subprocess
    import sys

    code = "import sys, pcietrace; print([m for m in ('pandas', 'rich', 'numpy') if m in sys.modules])"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"


# -- the simulated run -----------------------------------------------------------------------------

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


# -- topo fixtures, help ---------------------------------------------------------------------------

def test_topo_renders_json_fixtures(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    fixture = ROOT / "tests/data/topo/dgx2_half_two_switch_levels.json"
    assert main(["topo", "--fixture", str(fixture)]) == 0
    out = capsys.readouterr().out
    assert "GPU7" in out and "PXB" in out and "switch downstream" in out and "…" not in out
    assert main(["topo", "--fixture", str(fixture), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [g["switch_levels"] for g in doc["gpus"]] == [2] * 8
    assert main(["topo", "--fixture", str(ROOT / "README.md")]) == 2


def test_help_never_says_default_none() -> None:
    parser = build_parser()
    subs = next(a for a in parser._actions if a.dest == "command").choices
    for name, sub in subs.items():
        text = sub.format_help()
        assert "(default: None)" not in text and "(default: False)" not in text, name


# -- on a GPU ---------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_real_run_answers_first_in_every_format(tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    parser = pytest.importorskip("prometheus_client.openmetrics.parser")
    out = tmp_path / "run"
    assert main(["run", "--gpu", "0", "--quick", "--no-latency", "-o", str(out), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    line = doc["summary"]["lines"][0]
    print(line)
    assert line.startswith("One eager launch on GPU") and "B H2D" in line and "Graphs save" in line, line
    ref = pcietrace.load(REPORTS[0]).summary["gpus"].iloc[0]  # the committed real H100 run
    got = doc["summary"]["gpus"][0]
    ratio = got["eager_h2d_bytes"] / ref["eager_h2d_bytes"]
    # same launch path, same order of bytes
    assert 0.5 < ratio < 2, f"{got['eager_h2d_bytes']} vs {ref['eager_h2d_bytes']} B"
    assert main(["report", str(out), "--format", "csv"]) == 0 and "# table: per_launch" in capsys.readouterr().out
    assert main(["report", str(out), "--format", "prometheus"]) == 0
    names = {f.name for f in parser.text_string_to_metric_families(capsys.readouterr().out)}
    assert {"pcietrace_launch_pcie_bytes", "pcietrace_launch_host_seconds"} <= names
    assert main(["report", str(out), "--plot", str(tmp_path / "png"), "--format", "md"]) == 0
    assert {"bytes_vs_launches.png", "time_per_kernel.png"} <= {p.name for p in (tmp_path / "png").iterdir()}


def test_a_table_with_unexpected_columns_still_prints(loaded) -> None:
    s, res = loaded["h100_run"]
    odd = {**res, "by_duration": res["by_duration"].drop(columns=["h2d_bytes_per_launch"]),
           "host_cost_by_language": pd.DataFrame({"nvml_index": [0], "language": ["C"], "us_per_launch": [2.5]})}
    out = _render(console.parts(s.meta, odd), 80)
    assert "by duration" in out and "host cost by language" in out and "2.500" in out


def test_prometheus_labels_a_range_with_its_own_gpus() -> None:
    """Real 8x H200 torchrun attach: one rank's ranges (its instances, summarized alone) are charged to its own
    GPU only, and the exported ``gpu`` label says that GPU, not every sampled one."""
    pytest.importorskip("prometheus_client")
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    from pcietrace.analysis import attribution
    from pcietrace.report import prometheus

    s = Session.load(ROOT / "tests/data/attach_h200x8_torchrun")
    res = analyze(s)
    inst = res["range_instances"]
    rank = inst[inst["pid"] == inst["pid"].max()]
    one = {",".join(map(str, g)) for g in rank["gpus"]}
    assert len(one) == 1 and one != {",".join(str(g["nvml_index"]) for g in s.meta["gpus"])}
    res = {**res, "ranges": attribution.summarize(rank, s.meta.get("launch_costs"), 0)}
    fams = {f.name: f for f in text_string_to_metric_families(prometheus.render(s.meta, res, {}))}
    assert {x.labels["gpu"] for x in fams["pcietrace_range_duration_seconds"].samples} == one
