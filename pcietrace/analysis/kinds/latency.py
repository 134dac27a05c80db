"""``pcietrace latency``: round trips and the topology model, analysed as a run's (a run with no launch
windows)."""

from __future__ import annotations

from pcietrace.analysis.kinds import run, shared
from pcietrace.analysis.results import LatencyResult
from pcietrace.session import Session


def analyze(s: Session, options: shared.Options) -> LatencyResult:
    return LatencyResult.of(run.tables(s, options))
