"""CSV: one block per non-empty result table, each under a ``# table: NAME`` line, after the summary as
``# summary:`` lines (read a block back with ``pandas.read_csv(..., comment="#")``).

Text arrives cleaned (:mod:`pcietrace.report.text`: no newline can start a line of its own); a table whose first
column holds text starting with ``#`` is written with every field quoted, so that no row reads as a comment or a
``# table:`` line."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from typing import Any, TextIO

import pandas as pd

from pcietrace.report.renderers import Renderer, without_timelines


#: Rows turned into CSV text at a time (a long run's range instances never become one string).
CHUNK_ROWS = 50_000


def _quoting(df: pd.DataFrame) -> int:
    first = df.iloc[:, 0]
    text = first.dtype == object or isinstance(first.dtype, (pd.StringDtype, pd.CategoricalDtype))
    starts = text and bool(first.astype(str).str.startswith("#").where(first.notna(), False).any())
    return csv.QUOTE_ALL if starts or str(df.columns[0]).startswith("#") else csv.QUOTE_MINIMAL


def write(meta: dict[str, Any], results: Mapping[str, pd.DataFrame], summary: dict[str, Any], out: TextIO) -> None:
    """The summary lines, then each table's block, into ``out`` as they are made."""
    out.write("".join(f"# summary: {line}\n" for line in summary.get("lines", [])))
    for name, df in results.items():
        if "parquet" in df.attrs:  # (report --instances)
            out.write(f"\n# table: {name}: {len(df)} rows in {df.attrs['parquet']} (Parquet)\n")
        elif len(df):
            out.write(f"\n# table: {name}\n")
            quoting = _quoting(df)
            for i in range(0, len(df), CHUNK_ROWS):
                out.write(df.iloc[i:i + CHUNK_ROWS].to_csv(index=False, header=not i, lineterminator="\n",
                                                           quoting=quoting))


def render(meta: dict[str, Any], results: Mapping[str, pd.DataFrame], summary: dict[str, Any]) -> str:
    """:func:`write`'s text as one string (small reports)."""
    out = io.StringIO()
    write(meta, results, summary, out)
    return out.getvalue()


class CsvRenderer(Renderer):
    """CSV blocks (:func:`render`) of the tables the saved report holds."""

    name = "csv"

    def render(self, meta: dict[str, Any], results: Mapping[str, pd.DataFrame], summary: dict[str, Any],
               out: TextIO) -> None:
        write(meta, without_timelines(results), summary, out)
