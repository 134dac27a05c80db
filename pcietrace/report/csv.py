"""CSV: one block per non-empty result table, each under a ``# table: NAME`` line, after the summary as
``# summary:`` lines (read a block back with ``pandas.read_csv(..., comment="#")``; ``float_precision="round_trip"``
for the floats bit for bit).

Text arrives cleaned (:mod:`pcietrace.report.text`: no newline can start a line of its own); a text value holding
``#`` is quoted (``--group-by numbered``'s ``layer#``: the reader's comment character would cut its row there), and
a table whose first column holds text starting with ``#`` is written with every field quoted, so that no row reads
as a comment or a ``# table:`` line."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping
from typing import Any, TextIO

import numpy as np
import pandas as pd

from pcietrace.report.renderers import Renderer, without_timelines
from pcietrace.schema import RowText, RowTexts


#: Rows turned into CSV text at a time (a long run's range instances never become one string).
CHUNK_ROWS = 50_000


def _quoting(df: pd.DataFrame) -> int:
    first = df.iloc[:, 0]
    text = first.dtype == object or isinstance(first.dtype, (pd.StringDtype, pd.CategoricalDtype))
    starts = text and bool(first.astype(str).str.startswith("#").where(first.notna(), False).any())
    return csv.QUOTE_ALL if starts or str(df.columns[0]).startswith("#") else csv.QUOTE_MINIMAL


def _holds_hash(df: pd.DataFrame) -> bool:
    """Whether any text of ``df`` holds ``#`` (a categorical column's categories read, not its rows)."""
    for j in range(df.shape[1]):
        c = df.iloc[:, j]
        if isinstance(c.dtype, pd.CategoricalDtype):
            c = pd.Series(c.cat.categories)
        elif not (c.dtype == object or isinstance(c.dtype, pd.StringDtype)):
            continue
        if c.astype(str).str.contains("#", regex=False).where(c.notna(), False).any():
            return True
    return False


class CsvRow(RowText):
    """A row as pandas' ``to_csv(index=False, quoting=csv.QUOTE_MINIMAL)`` writes it (and a text holding ``#``
    quoted too), made in Arrow a column at a time by :class:`pcietrace.schema.RowTexts` (a long run's range
    instances: pandas takes ~16 us a row)."""

    missing = ""
    bools = ("False", "True")

    def key(self, k: int, column: Any) -> str:
        return "," if k else ""

    def end(self, columns: int) -> str:
        return ""

    def value(self, u: Any) -> str:
        if isinstance(u, float) and math.isnan(u):
            return ""
        text = str(u)  # (as the csv module writes a value: a list as its repr)
        return '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"\n\r#') else text

    def floats(self, v: np.ndarray) -> list[Any]:
        """Python's repr of each value, as pandas writes it: Arrow's shortest text is the same from 1e-4 to 1e10
        (whole numbers given ".0"); the few values outside that, and infinities, take their repr one by one."""
        import pyarrow as pa
        import pyarrow.compute as pc

        text = super().floats(v)  # (JSON's: null where not finite)
        size = np.abs(v)
        odd = np.isinf(v) | ((v != 0) & ((size < 1e-4) | (size >= 1e10)))
        missing = np.isnan(v)
        if not odd.any() and not missing.any():
            return text
        text = text[0]  # (one part: two are whole numbers below 1e10, none odd or missing)
        if odd.any():
            text = pc.replace_with_mask(text, pa.array(odd), pa.array([repr(x) for x in v[odd].tolist()],
                                                                      pa.large_string()))
        return [pc.fill_null(text, pa.scalar("", pa.large_string()))]


#: Column types :class:`CsvRow` writes as pandas does (any other: the table through pandas).
_ROW_TYPES = "biufO"


def _by_rows(df: pd.DataFrame, quoting: int) -> bool:
    """Whether a table's rows are made by :class:`CsvRow`: quoted where needed, of two columns or more (a row of
    one empty field is quoted), of column types it writes as pandas does (float32's text is its own)."""
    return quoting == csv.QUOTE_MINIMAL and len(df.columns) > 1 and all(
        isinstance(t, pd.CategoricalDtype) or t.kind in _ROW_TYPES and t != np.float32 and t != np.float16
        for t in df.dtypes)


def write(meta: dict[str, Any], results: Mapping[str, pd.DataFrame], summary: dict[str, Any], out: TextIO) -> None:
    """The summary lines, then each table's block, into ``out`` as they are made."""
    out.write("".join(f"# summary: {line}\n" for line in summary.get("lines", [])))
    for name, df in results.items():
        if "parquet" in df.attrs:  # (report --instances)
            out.write(f"\n# table: {name}: {len(df)} rows in {df.attrs['parquet']} (Parquet)\n")
        elif len(df):
            out.write(f"\n# table: {name}\n")
            quoting = _quoting(df)
            if _by_rows(df, quoting):
                out.write(df.iloc[:0].to_csv(index=False, lineterminator="\n", quoting=quoting))  # (the header)
                rows = RowTexts(df, "\n", CsvRow())
                for i in range(0, len(df), CHUNK_ROWS):
                    out.write(bytes(rows.joined(i, min(i + CHUNK_ROWS, len(df)))).decode() + "\n")
                continue
            quoting = csv.QUOTE_ALL if _holds_hash(df) else quoting  # (pandas quotes no "#" of its own)
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
