"""Markdown: the summary as a list, then one pipe table per non-empty result table.

(pandas' ``DataFrame.to_markdown`` needs the ``tabulate`` package; a pipe table is a few lines.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TextIO

import pandas as pd

from pcietrace.report.renderers import Renderer, without_timelines


def _cell(x: Any) -> str:
    if isinstance(x, float):
        return "" if math.isnan(x) else f"{x:.6g}"
    # (text arrives cleaned, pcietrace.report.text: CR and LF are shown as \r, \n; these stay as a backstop)
    # (a backslash escaped first: "a\\|b" must not turn the escape of its pipe into an escaped backslash)
    return str(x).replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")


#: Rows turned into a table's lines at a time (a long run's range instances never become one string).
CHUNK_ROWS = 50_000


def write_table(df: pd.DataFrame, out: TextIO) -> None:
    """``df`` as a GitHub-flavoured pipe table, into ``out`` :data:`CHUNK_ROWS` rows at a time."""
    cols = [_cell(str(c)) for c in df.columns]
    out.write("| " + " | ".join(cols) + " |\n|" + "|".join("---:" if pd.api.types.is_numeric_dtype(df[c]) else "---"
                                                            for c in df.columns) + "|\n")
    for i in range(0, len(df), CHUNK_ROWS):
        out.write("".join("| " + " | ".join(_cell(x) for x in rec) + " |\n"
                          for rec in df.iloc[i:i + CHUNK_ROWS].itertuples(index=False)))


def write(meta: dict[str, Any], results: Mapping[str, pd.DataFrame], summary: dict[str, Any], out: TextIO) -> None:
    """The title, the summary as a list, then one pipe table per non-empty result table, into ``out`` as they are
    made."""
    title = "pcietrace " + str(meta.get("kind", "run")) + (" (SIMULATED)" if meta.get("simulated") else "")
    out.write(f"# {title}\n\n" + "".join(f"- {_cell(line)}\n" for line in summary.get("lines", [])))
    for name, df in results.items():
        if len(df):
            out.write(f"\n## {name}\n\n")
            write_table(df, out)


class MarkdownRenderer(Renderer):
    """Markdown (:func:`write`) of the tables the saved report holds."""

    name = "md"

    def render(self, meta: dict[str, Any], results: Mapping[str, pd.DataFrame], summary: dict[str, Any],
               out: TextIO) -> None:
        write(meta, without_timelines(results), summary, out)
