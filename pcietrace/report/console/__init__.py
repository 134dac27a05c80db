"""Rich tables on the terminal, one module per command's console (:data:`LAYOUTS`: the session's kind ->
its layout; see :func:`pcietrace.analysis.analyze` for the columns).

Readable at 80 columns: number cells never wrap or get cut (``no_wrap`` numeric columns, short headers,
GPU labels instead of bus ids, long text under the table rather than in it); only text cells (names)
wrap. Text from outside (range names, GPU names, sysfs strings, paths, commands) goes through
:func:`esc` before rich sees it, so ``loss[/total]`` prints as written instead of being read as markup.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Callable, TextIO

import pandas as pd
from rich.console import Console

from pcietrace.report.console import attach, compare, graphs, run
from pcietrace.report.console.attach import LINES_PER_RANGE, MIN_TOP, SCREEN_LINES, RangeView, attach_tables
from pcietrace.report.console.cells import esc, generic_table, summary_lines, tell
from pcietrace.report.console.cells import new_table as _table
from pcietrace.report.console.compare import compare_table, compare_tables, savings_table
from pcietrace.report.console.run import language_table
from pcietrace.report.console.system import system_table, topology_tables
from pcietrace.report.labels import LATENCY_LABELS
from pcietrace.report.notes import with_sentences
from pcietrace.report.renderers import Renderer

__all__ = ["LATENCY_LABELS", "LAYOUTS", "SCREEN_LINES", "ConsoleRenderer", "RangeView", "attach_tables",
           "compare_table", "compare_tables", "esc", "generic_table", "language_table", "parts", "render",
           "savings_table", "summary_lines", "system_table", "tell", "topology_tables", "_table"]

Layout = Callable[..., list[Any]]
#: The console of each kind of result (``meta["kind"]``; none: a run): ``layout(meta, results, summary, detail,
#: view)`` -> the parts to print, in order.
LAYOUTS: dict[str, Layout] = {"run": run.parts, "latency": run.parts, "attach": attach.parts,
                              "attach-failed": attach.parts, "graphs": graphs.parts,
                              "compare": compare.compare_parts, "savings": compare.savings_parts}


def parts(meta: dict[str, Any], results: Mapping[str, pd.DataFrame], summary: dict[str, Any] | None = None,
          detail: bool = False, view: RangeView | None = None) -> list[Any]:
    """The summary first, then every result table that has data, with a SIMULATED banner where it applies, as
    the session's kind lays them out (:data:`LAYOUTS`; a kind this version does not know: a run's). With more
    GPUs than :data:`pcietrace.analysis.summary.DETAIL_GPUS`, a run's detail tables only with ``detail``."""
    layout = LAYOUTS.get(str(meta.get("kind") or "run"), run.parts)
    return layout(meta, with_sentences(results), summary, detail, view)


def render(meta: dict[str, Any], results: Mapping[str, pd.DataFrame], console: Console,
           summary: dict[str, Any] | None = None, detail: bool = False, view: RangeView | None = None) -> None:
    """Print :func:`parts` on ``console``; with a ``view`` that fits a screen (``fit_lines``), its ranges fewer
    until the report's lines at the console's width fit (down to :data:`MIN_TOP` ranges)."""
    shown = parts(meta, results, summary, detail, view)
    ranged = str(meta.get("kind", "")).startswith("attach")  # (the only kind whose ranges the view picks)
    while ranged and view is not None and view.fit_lines and view.top is not None and view.top > MIN_TOP:
        with console.capture() as text:
            for part in shown:
                console.print(part)
        over = text.get().count("\n") - view.fit_lines
        if over <= 0:
            break
        view = replace(view, top=max(MIN_TOP, view.top - math.ceil(over / LINES_PER_RANGE)))
        shown = parts(meta, results, summary, detail, view)
    for part in shown:
        console.print(part)


class ConsoleRenderer(Renderer):
    """The ``table`` format: :func:`parts` printed by rich on ``out``; options ``detail`` and ``view`` (which of
    attach's ranges to show: :class:`RangeView`)."""

    name = "table"

    def render(self, meta: dict[str, Any], results: Mapping[str, pd.DataFrame], summary: dict[str, Any],
               out: TextIO) -> None:
        console = Console(file=out) if out is not sys.stdout else Console()
        render(meta, results, console, summary, self.options.get("detail", False), self.options.get("view"))
