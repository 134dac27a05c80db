"""CSV: one block per non-empty result table, each under a ``# table: NAME`` line, after the summary as
``# summary:`` lines (read a block back with ``pandas.read_csv(..., comment="#")``).

Text arrives cleaned (:mod:`pcietrace.report.text`: no newline can start a line of its own); a table whose first
column holds text starting with ``#`` is written with every field quoted, so that no row reads as a comment or a
``# table:`` line."""

from __future__ import annotations

import csv
from collections.abc import Mapping
from typing import Any, TextIO

import pandas as pd

from pcietrace.report.renderers import Renderer, without_timelines


def _quoting(df: pd.DataFrame) -> int:
    first = df.iloc[:, 0]
    starts = first.map(lambda v: isinstance(v, str) and v.startswith("#"), na_action="ignore")
    return csv.QUOTE_ALL if bool(starts.fillna(False).astype(bool).any()) or str(df.columns[0]).startswith("#") \
        else csv.QUOTE_MINIMAL


def render(meta: dict[str, Any], results: dict[str, pd.DataFrame], summary: dict[str, Any]) -> str:
    parts = [f"# summary: {line}\n" for line in summary.get("lines", [])]
    for name, df in results.items():
        if "parquet" in df.attrs:  # (report --instances)
            parts.append(f"\n# table: {name}: {len(df)} rows in {df.attrs['parquet']} (Parquet)\n")
        elif len(df):
            parts.append(f"\n# table: {name}\n")
            parts.append(df.to_csv(index=False, lineterminator="\n", quoting=_quoting(df)))
    return "".join(parts)


class CsvRenderer(Renderer):
    """CSV blocks (:func:`render`) of the tables the saved report holds."""

    name = "csv"

    def render(self, meta: dict[str, Any], results: Mapping[str, pd.DataFrame], summary: dict[str, Any],
               out: TextIO) -> None:
        out.write(render(meta, without_timelines(results), summary))
