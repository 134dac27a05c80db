"""One analyzer per kind of session, each a function ``analyze(session, options) -> result`` (its typed result,
:mod:`pcietrace.analysis.results`): :data:`ANALYZERS` is what :func:`pcietrace.analysis.analyze` picks from."""

from __future__ import annotations

from typing import Callable

from pcietrace.analysis.kinds import attach, graphs, latency, run
from pcietrace.analysis.kinds.shared import Options
from pcietrace.analysis.results import AnalysisResult
from pcietrace.session import Session

__all__ = ["ANALYZERS", "Options", "analyzer"]

#: The analyzer of each kind of session (``meta["kind"]``; none: a run). "attach-failed": an attach whose
#: program never ran (its tables stay empty).
ANALYZERS: dict[str, Callable[[Session, Options], AnalysisResult]] = {
    "run": run.analyze, "latency": latency.analyze, "attach": attach.analyze, "attach-failed": attach.analyze,
    "graphs": graphs.analyze}


def analyzer(kind: str | None) -> Callable[[Session, Options], AnalysisResult]:
    """The analyzer for sessions of ``kind`` (a run's for none, or for a kind this version does not know)."""
    return ANALYZERS.get(str(kind or "run"), run.analyze)
