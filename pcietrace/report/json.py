"""JSON: the schema, the run's metadata, the summary and every result table as records (NaN -> null; counts as
integers: :func:`counts_as_ints`), the timelines are left out by :func:`pcietrace.report.output.emit`, as in the
saved report."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd


#: Columns that count things (calls, launches, processes...): written as JSON integers, null where unknown.
COUNTS = ("calls", "short_calls", "stalls", "launches", "processes", "ranges", "samples", "windows", "dof",
          "quiet_intervals", "gpu_kernels")


def is_count(column: str) -> bool:
    """Whether ``column`` holds a count (:data:`COUNTS`, or launches: ``*_launches``, ``*_launches_process``)."""
    return column in COUNTS or column.endswith(("_launches", "_launches_process"))


def counts_as_ints(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its float count columns whose values are all whole (a column that may hold NaN is float in
    pandas, e.g. launches per GPU, unknown without device information) as nullable integers: 18018, not 18018.0,
    and null where unknown. A fractional value leaves its column as it is."""
    whole = {}
    for c in df.columns:
        if is_count(str(c)) and df[c].dtype.kind == "f":
            v = df[c].dropna().to_numpy()
            if np.isfinite(v).all() and (v == np.round(v)).all():
                whole[c] = "Int64"
    return df.astype(whole) if whole else df


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return json.loads(counts_as_ints(df).to_json(orient="records")) if len(df) else []


def _finite(o: Any) -> Any:
    """NaN/inf (not JSON) -> null, through nested metadata."""
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def render(meta: dict[str, Any], results: dict[str, pd.DataFrame], summary: dict[str, Any]) -> str:
    """The whole result as one strict JSON document (``summary`` first among the figures)."""
    from pcietrace.session import SCHEMA

    doc = {"schema": SCHEMA, "meta": _finite(meta),
           "summary": {k: _records(v) if isinstance(v, pd.DataFrame) else v for k, v in summary.items()},
           "results": {k: _records(v) for k, v in results.items()}}
    return json.dumps(doc, indent=1, default=str, allow_nan=False) + "\n"
