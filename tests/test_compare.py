"""compare: runs named by folder, host and date; significance that is material and beyond run-to-run noise; the
headline leads with the figures a user acts on; unknowns never printed as +0.000. On two committed H100 runs of
one machine and an 8x H200 run."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from pcietrace.analysis import analyze
from pcietrace.analysis.compare import compare, material, run_name
from pcietrace.analysis.summary import compare_summary
from pcietrace.cli import main
from pcietrace.session import Session

ROOT = Path(__file__).parent.parent
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
