"""compare: runs named by folder, host and date; significance that is material and beyond run-to-run noise; the
headline leads with the figures a user acts on; unknowns never printed as +0.000; every GPU compared, readable at
80 columns, significance marked in text; reports with no figure or NVTX range in common refused in one line, each
side read through the one validated load. On two committed H100 runs of one machine, 2x, 4x and 8x H200 runs, and
the attach and graphs recordings."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from pcietrace.analysis import analyze
from pcietrace.analysis.compare import compare, material, run_name
from pcietrace.analysis.summary import compare_summary
from pcietrace.cli import main
from pcietrace.report import console
from pcietrace.session import Session

from conftest import REPORTS, ROOT, as_text, assert_readable, edit_report, one_line_exit_2

SAME_MACHINE = [ROOT / "tests/data/h100_run_defaults", ROOT / "reports/h100-20261124"]


@pytest.fixture(scope="module")
def same_machine() -> tuple[pd.DataFrame, list[str]]:
    runs = []
    for letter, p in zip("AB", SAME_MACHINE):
        s = Session.load(p)
        runs.append((run_name(letter, p.name, s.meta), analyze(s), s.meta))
    return compare(runs), [r[0] for r in runs]


def test_runs_are_named_by_folder_host_and_date(same_machine) -> None:
    # was: "A: H100 80GB HBM3 x1" and "B: H100 80GB HBM3 x1", the same name for two runs
    _, names = same_machine
    meta = Session.load(SAME_MACHINE[0]).meta
    assert names[0].startswith("A: h100_run_defaults (H100") and f"host {meta['host']}" in names[0]
    assert meta["created"][:10] in names[0] and names[0] != names[1]


def test_a_change_of_a_figure_indistinguishable_from_zero_is_no_significant_percentage(same_machine) -> None:
    # was: 'significant: GPU0 graph D2H bytes / node +108.9 %', from -0.123 ± 0.038 to 0.011 B
    cmp, names = same_machine
    row = cmp.set_index("metric").loc["graph D2H bytes / node"]
    a, b = row[f"value:{names[0]}"], row[f"value:{names[1]}"]
    assert abs(a) < material("graph D2H bytes / node") and abs(b - a) < material("graph D2H bytes / node")
    assert math.isnan(row[f"pct:{names[1]}"]) and row[f"significant:{names[1]}"] is not True
    lines = compare_summary(cmp, names)["lines"]
    assert not any("bytes / node" in line for line in lines)


def test_the_headline_leads_with_the_figures_users_act_on(same_machine) -> None:
    cmp, names = same_machine
    first = compare_summary(cmp, names)["lines"][0]
    found = [first.find(k) for k in ("eager H2D bytes / launch", "host cost / eager launch",
                                     "GPU time / empty kernel, eager", "graph speedup, ")]
    assert -1 not in found and found == sorted(found)
    # the host cost moved by a quarter, within how far two runs of one machine differ: said so, not left unmarked
    host = cmp.set_index("metric").loc["host cost / eager launch"]
    assert host[f"significant:{names[1]}"] is False and "within noise" in first.split("host cost / eager launch")[1]


def test_unknowns_are_not_printed_as_zero_deltas(capsys, monkeypatch) -> None:
    # was: 'PCIe switch levels ... +0.000' and 'round trip expected from switch levels – – +0.000'
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["compare", *map(str, SAME_MACHINE)]) == 0
    out = capsys.readouterr().out
    assert "+0.000 " not in out and "round trip expected" not in out
    assert "h100_run_defaults" in out and "h100-20261124" in out


def test_a_real_difference_stays_significant() -> None:
    # H100 vs H200: the eager GPU time per empty kernel differs by ~20 %, beyond its 12 % run-to-run bound
    runs = [(run_name(x, p.name, Session.load(p).meta), analyze(Session.load(p)), Session.load(p).meta)
            for x, p in zip("AB", [SAME_MACHINE[0], ROOT / "tests/data/h200x8_run"])]
    cmp = compare(runs)
    row = cmp[(cmp["gpu"] == "GPU0") & (cmp["metric"] == "GPU time / empty kernel, eager")].iloc[0]
    assert row[f"significant:{runs[1][0]}"] is True
    assert "GPU time / empty kernel, eager" in compare_summary(cmp, [r[0] for r in runs])["lines"][0]


def test_compare_is_readable_and_marks_significance_in_text(loaded, monkeypatch, capsys) -> None:
    from pcietrace.analysis.compare import compare
    from pcietrace.analysis.summary import compare_summary

    a, b = loaded["h100_run_latency"], loaded["h200x2_run"]
    names = ["A: H100", "B: H200 x2"]
    cmp = compare([(names[0], a[1], a[0].meta), (names[1], b[1], b[0].meta)])
    assert set(cmp["gpu"]) == {"GPU0", "GPU1"}  # every GPU, not just the first
    for width in (80, 160):
        assert_readable([console.compare_table(cmp, names)], width)
    out = as_text([console.compare_table(cmp, names)], 160)
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


def test_compare_and_baseline_go_through_the_same_load(copy, capsys, data_dir) -> None:
    run = copy()
    edit_report(run, lambda d: d["meta"].update(gpus=[{"nvml_index": "x"}]))
    one_line_exit_2(["compare", str(data_dir / "h100_run"), str(run)], capsys)


@pytest.mark.parametrize("pair", [("graphs_h100", "h100_run"), ("h200x2_run", "graphs_h100"),
                                  ("graphs_h100", "h100_run_latency")])
def test_compare_refuses_reports_with_no_figure_in_common(pair, data_dir, capsys) -> None:
    # was: exit 0, "no significant difference" over a table where every row had one side empty
    line = one_line_exit_2(["compare", *(str(data_dir / p) for p in pair)], capsys)
    assert "have no figure in common" in line and "(kind: graphs)" in line


@pytest.mark.parametrize("pair", [("attach_h100_python", "attach_h200x8_torchrun"),
                                  ("attach_h100_decode/decode-graph", "attach_h100_python")])
def test_compare_refuses_attach_runs_with_no_range_in_common(pair, data_dir, capsys) -> None:
    # was: exit 0 and an empty savings table
    line = one_line_exit_2(["compare", *(str(data_dir / p) for p in pair)], capsys)
    assert "no NVTX range in common" in line


def test_compare_of_graphs_runs_of_other_sizes_names_why(copy, data_dir, capsys) -> None:
    # was: 'compare graphs reports with graphs reports' said of two graphs reports
    folder = copy("graphs_h100")
    edit_report(folder, lambda doc: [r.__setitem__("kernels", r["kernels"] * 2) for r in doc["tables"]["graphs"]
                                     + doc["tables"]["windows"]])
    line = one_line_exit_2(["compare", str(data_dir / "graphs_h100"), str(folder)], capsys)
    assert "(kind: graphs) have no figure in common: other sizes" in line


def test_an_attach_stopped_before_its_program_compares_as_an_attach_run(copy, data_dir, capsys) -> None:
    # was: compared as a run ('a attach-failed report and a run report have no figure in common')
    folder = copy("attach_h100_python")
    edit_report(folder, lambda doc: doc["meta"].update(kind="attach-failed", status="interrupted before the program ran"))
    line = one_line_exit_2(["compare", str(data_dir / "h100_run"), str(folder)], capsys)
    assert "an attach run compares only with another attach run" in line


def test_compare_of_three_runs_fits_80_columns(monkeypatch, capsys) -> None:
    # was: side by side the GPU and metric columns shrank to 'G…' and nothing and every figure was cut
    runs = [str(ROOT / "tests/data" / r) for r in ("h100_run_defaults", "h200x2_run_defaults", "h200x4_run")]
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["compare", *runs]) == 0
    out = capsys.readouterr().out
    assert "…" not in out and max(map(len, out.splitlines())) <= 80
    assert "Comparison: B vs A" in out and "Comparison: C vs A" in out
    assert out.count("host read round trip") >= 2  # a metric in each table
