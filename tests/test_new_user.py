"""A new user's hour without a GPU (fuzz9): what bit, each case failing before its fix. Real recordings
(tests/data, reports/) or the SIMULATED device."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pcietrace.analysis import analyze
from pcietrace.analysis.summary import summarize
from pcietrace.report import console
from pcietrace.session import Session

ROOT = Path(__file__).parent.parent
GRAPHS = [ROOT / "tests/data/graphs_h100", ROOT / "reports/h100-graphs-pipelined-20261122"]


def _plain(cell: object) -> str:
    return Text.from_markup(cell).plain if isinstance(cell, str) else getattr(cell, "plain", str(cell))


@pytest.mark.parametrize("width", [80, 160])
@pytest.mark.parametrize("path", GRAPHS, ids=lambda p: p.name)
def test_graphs_tables_fit_the_terminal(path: Path, width: int) -> None:
    # was: at 80 columns the strategy column was squeezed to nothing (rows without names) and every time,
    # interval and byte cell was cut with '…'
    s = Session.load(path)
    res = analyze(s)
    parts = console.parts(s.meta, res, summarize(s.meta, res), detail=True)
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=False, color_system=None)
    for part in parts:
        con.print(part)
    lines = buf.getvalue().splitlines()
    assert "…" not in buf.getvalue() and max(map(len, lines)) <= width
    graphs = [t for t in parts if isinstance(t, Table) and str(t.title).startswith("CUDA graphs")]
    assert len(graphs) == 2 * res["graphs"]["kernels"].nunique()
    for t in graphs:
        for col in t.columns:
            for cell in col._cells:  # every line of every cell whole on one output line
                assert all(any(part in line for line in lines) for part in _plain(cell).splitlines()), (t.title, cell)
        assert [_plain(c) for c in t.columns[0]._cells] == list(res["graphs"]["strategy"].unique())
