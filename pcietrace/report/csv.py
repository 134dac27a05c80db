"""CSV: one block per non-empty result table, each under a ``# table: NAME`` line, after the summary as
``# summary:`` lines (read a block back with ``pandas.read_csv(..., comment="#")``)."""

from __future__ import annotations

from typing import Any

import pandas as pd


def render(meta: dict[str, Any], results: dict[str, pd.DataFrame], summary: dict[str, Any]) -> str:
    parts = [f"# summary: {line}\n" for line in summary.get("lines", [])]
    for name, df in results.items():
        if "parquet" in df.attrs:  # (report --instances)
            parts.append(f"\n# table: {name}: {len(df)} rows in {df.attrs['parquet']} (Parquet)\n")
        elif len(df):
            parts.append(f"\n# table: {name}\n")
            parts.append(df.to_csv(index=False, lineterminator="\n"))
    return "".join(parts)
