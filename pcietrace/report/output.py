"""Picks the renderer for ``--format`` and writes plots for ``--plot``: the one place commands hand results to, and
so the one place their text is made safe for a terminal or a text format (:mod:`pcietrace.report.text`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from pcietrace.report.text import clean_all

FORMATS = ("table", "json", "csv", "md", "prometheus")


def emit(meta: dict[str, Any], results: dict[str, pd.DataFrame], summary: dict[str, Any], fmt: str = "table",
         detail: bool = False, plot_dir: Path | None = None, out: TextIO | None = None,
         view: Any = None) -> list[Path]:
    """Render ``results`` (with ``summary`` first) in ``fmt`` to ``out`` (stdout); PNGs to ``plot_dir``;
    ``view``: which of attach's ranges the console shows (:class:`pcietrace.report.console.RangeView`; the other
    formats hold every range). Returns the plot paths written. Every string goes through
    :func:`pcietrace.report.text.clean_all` first."""
    meta, results, summary = clean_all((meta, results, summary))
    out = out or sys.stdout
    if fmt == "table":
        from rich.console import Console

        from pcietrace.report import console

        console.render(meta, results, Console(file=out) if out is not sys.stdout else Console(), summary, detail, view)
    else:
        from importlib import import_module

        from pcietrace.analysis import TIMELINES

        module = {"json": "json", "csv": "csv", "md": "markdown", "prometheus": "prometheus"}[fmt]
        tables = {k: v for k, v in results.items() if k not in TIMELINES}  # as in the saved report: no timelines
        if fmt == "json":  # (written as made: a long run's range instances never make one string)
            from pcietrace.report import json as json_report

            json_report.write(meta, tables, summary, out)
        else:
            out.write(import_module(f"pcietrace.report.{module}").render(meta, tables, summary))
    if plot_dir is None:
        return []
    from pcietrace.report import plots

    paths = plots.write(meta, results, plot_dir)
    print(clean_all(f"plots: {', '.join(str(p) for p in paths) or 'nothing to plot'}"), file=sys.stderr)
    return paths


def emit_compare(cmp: pd.DataFrame, names: list[str], summary: dict[str, Any], fmt: str = "table",
                 out: TextIO | None = None) -> None:
    """The comparison (:func:`pcietrace.analysis.compare.compare`) with its summary lines first."""
    cmp, names, summary = clean_all((cmp, names, summary))
    out = out or sys.stdout
    if fmt == "table":
        from rich.console import Console

        from pcietrace.report.console import compare_tables, summary_lines

        con = Console(file=out) if out is not sys.stdout else Console()
        for part in summary_lines(summary) + compare_tables(cmp, names):
            con.print(part)
        return
    from importlib import import_module

    module = {"json": "json", "csv": "csv", "md": "markdown"}[fmt]
    out.write(import_module(f"pcietrace.report.{module}").render({"kind": "compare", "runs": names},
                                                                 {"compare": cmp}, summary))


def emit_savings(table: pd.DataFrame, paths: list[str], fmt: str = "table", out: TextIO | None = None) -> None:
    """Two attach runs' "graphs save" prediction against the measured saving
    (:func:`pcietrace.analysis.savings.savings`) in ``fmt``; JSON is the table's records (as it always was)."""
    table, paths = clean_all((table, paths))
    out = out or sys.stdout
    if fmt == "table":
        from rich.console import Console

        from pcietrace.report.console import savings_table

        (Console(file=out) if out is not sys.stdout else Console()).print(savings_table(table, paths))
    elif fmt == "json":
        out.write(table.to_json(orient="records", indent=1) + "\n")
    else:
        from importlib import import_module

        module = {"csv": "csv", "md": "markdown"}[fmt]
        out.write(import_module(f"pcietrace.report.{module}").render({"kind": "savings", "runs": paths},
                                                                     {"savings": table}, {}))
