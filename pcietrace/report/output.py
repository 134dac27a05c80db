"""Where commands hand results to the renderers (:mod:`pcietrace.report.renderers`: one class per format): the
one place their text is made safe for a terminal or a text format (:mod:`pcietrace.report.text`) and their notes
are worded (:mod:`pcietrace.report.notes`)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from pcietrace.report.notes import with_sentences
from pcietrace.report.renderers import FORMATS, renderer
from pcietrace.report.text import clean_all

__all__ = ["FORMATS", "emit", "emit_compare", "emit_savings"]


def emit(meta: dict[str, Any], results: Mapping[str, pd.DataFrame], summary: dict[str, Any], fmt: str = "table",
         detail: bool = False, plot_dir: Path | None = None, out: TextIO | None = None,
         view: Any = None) -> list[Path]:
    """Render ``results`` (with ``summary`` first) in ``fmt`` to ``out`` (stdout); PNGs to ``plot_dir``;
    ``view``: which of attach's ranges the console shows (:class:`pcietrace.report.console.RangeView`; the other
    formats hold every range). Returns the plot paths written. Every string goes through
    :func:`pcietrace.report.text.clean_all` first."""
    meta, results, summary = clean_all((meta, with_sentences(results), summary))
    renderer(fmt, detail=detail, view=view).render(meta, results, summary, out or sys.stdout)
    if plot_dir is None:
        return []
    paths = renderer("plots").render(meta, results, summary, plot_dir)
    print(clean_all(f"plots: {', '.join(str(p) for p in paths) or 'nothing to plot'}"), file=sys.stderr)
    return paths


def emit_compare(cmp: pd.DataFrame, names: list[str], summary: dict[str, Any], fmt: str = "table",
                 out: TextIO | None = None) -> None:
    """The comparison (:func:`pcietrace.analysis.compare.compare`) with its summary lines first."""
    emit({"kind": "compare", "runs": names}, {"compare": cmp}, summary, fmt, out=out)


def emit_savings(table: pd.DataFrame, paths: list[str], fmt: str = "table", out: TextIO | None = None) -> None:
    """Two attach runs' "graphs save" prediction against the measured saving
    (:func:`pcietrace.analysis.savings.savings`) in ``fmt``; JSON is the table's records."""
    emit({"kind": "savings", "runs": paths}, {"savings": table}, {}, fmt, out=out)
