"""The result tables as ``report.json`` saves them (and ``--json`` prints them): timelines left out, notes as
their sentences (:mod:`pcietrace.report.notes`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from pcietrace.analysis.timelines import TIMELINES
from pcietrace.report.notes import with_sentences
from pcietrace.schema import records


def to_jsonable(results: Mapping[str, pd.DataFrame]) -> dict[str, Any]:
    """Result tables as lists of records (:func:`pcietrace.schema.records`: NaN -> null, counts as integers), for
    the JSON report and ``--json`` (timelines left out: :data:`TIMELINES`)."""
    return {k: records(v) for k, v in saved_tables(results).items()}


def saved_tables(results: Mapping[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Result tables as ``report.json`` saves them (:func:`to_jsonable`'s, timelines left out) but still as
    DataFrames, which :meth:`pcietrace.session.Session.save` writes as records a chunk of rows at a time: a long
    attach run's range instances never become one list of dicts or one string."""
    return {k: v for k, v in with_sentences(results).items() if k not in TIMELINES}
