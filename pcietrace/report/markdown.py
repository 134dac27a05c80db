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


def table(df: pd.DataFrame) -> str:
    """``df`` as a GitHub-flavoured pipe table."""
    cols = [_cell(str(c)) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---:" if pd.api.types.is_numeric_dtype(df[c]) else "---"
                                                       for c in df.columns) + "|"]
    lines += ["| " + " | ".join(_cell(x) for x in rec) + " |" for rec in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def render(meta: dict[str, Any], results: dict[str, pd.DataFrame], summary: dict[str, Any]) -> str:
    title = "pcietrace " + str(meta.get("kind", "run")) + (" (SIMULATED)" if meta.get("simulated") else "")
    parts = [f"# {title}\n\n"] + [f"- {_cell(line)}\n" for line in summary.get("lines", [])]
    for name, df in results.items():
        if len(df):
            parts.append(f"\n## {name}\n\n{table(df)}")
    return "".join(parts)


class MarkdownRenderer(Renderer):
    """Markdown (:func:`render`) of the tables the saved report holds."""

    name = "md"

    def render(self, meta: dict[str, Any], results: Mapping[str, pd.DataFrame], summary: dict[str, Any],
               out: TextIO) -> None:
        out.write(render(meta, without_timelines(results), summary))
