"""JSON: the schema, the run's metadata, the summary and every result table as records (NaN -> null; counts as
integers: :func:`pcietrace.schema.records`), the timelines are left out by
:func:`pcietrace.report.output.emit`, as in the saved report."""

from __future__ import annotations

import io
import math
from typing import Any, TextIO

import pandas as pd

from pcietrace.schema import records, write_json


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
    out = io.StringIO()
    write(meta, results, summary, out)
    return out.getvalue()


def write(meta: dict[str, Any], results: dict[str, pd.DataFrame], summary: dict[str, Any], out: TextIO) -> None:
    """:func:`render` written to ``out`` as it is made: a table's rows a chunk at a time
    (:func:`pcietrace.schema.write_json`), so millions of range instances never make one string."""
    from pcietrace.session import SCHEMA

    doc = {"schema": SCHEMA, "meta": _finite(meta),
           "summary": {k: records(v) if isinstance(v, pd.DataFrame) else v for k, v in summary.items()},
           "results": dict(results)}
    write_json(doc, out)
    out.write("\n")
