"""Analysis: pure functions from a recorded :class:`~pcietrace.session.Session` to a typed result.

Never imports rich or touches a GPU, and never words anything for a reader: what a report must say beside its
figures comes out as coded :class:`~pcietrace.analysis.notes.Note` s (their sentences: :mod:`pcietrace.report`).
:func:`analyze` is the one entry point the CLI, the API and the tests use; it hands the session to its kind's
analyzer (:mod:`pcietrace.analysis.kinds`)."""

from __future__ import annotations

from pcietrace.analysis import names, validate
from pcietrace.analysis.kinds import Options, analyzer
from pcietrace.analysis.latency import DEFAULT_US_PER_LEVEL
from pcietrace.analysis.notes import Note
from pcietrace.analysis.results import (INSTANCE_EXTRAS, NOTES_COLUMNS, RESULT_TABLES, RESULT_TYPES, AnalysisResult,
                                        AttachResult, GraphsResult, LatencyResult, RunResult, declared_columns,
                                        empty_results, result_type)
from pcietrace.analysis.timelines import (MAX_TIMELINE_BINS, TIMELINES, idle_interval_ns, launch_timeline,
                                          timeline_bin_ns)
from pcietrace.session import Session

__all__ = ["INSTANCE_EXTRAS", "MAX_TIMELINE_BINS", "NOTES_COLUMNS", "RESULT_TABLES", "RESULT_TYPES", "TIMELINES",
           "AnalysisResult", "AttachResult", "GraphsResult", "LatencyResult", "Note", "RunResult", "analyze",
           "declared_columns", "empty_results", "idle_interval_ns", "launch_timeline", "result_type",
           "timeline_bin_ns"]


def analyze(session: Session, us_per_level: float = DEFAULT_US_PER_LEVEL,
            group_by: str = names.DEFAULT_GROUP_BY, release_events: bool = False,
            release_samples: bool = False) -> AnalysisResult:
    """The session's result, of its kind's type (:data:`RESULT_TYPES`): every result table by name (those whose
    inputs are missing come back empty, with their :func:`declared_columns`).
    ``us_per_level``: round trip added per PCIe switch level, for the topology model; ``group_by``: how attach's
    ``ranges`` table groups range names (:data:`names.GROUP_BY`; ``range_instances`` keeps every full name);
    ``release_events``: for a caller with no further use for ``session.events`` (`pcietrace report`; attach, which
    saves them from ``session.events_file``): an attach session's events are let go once what is read from them
    is made (:meth:`~pcietrace.session.Session.release_events`); ``release_samples``: for a caller with no further
    use for ``session.samples`` (`pcietrace report`): an attach session's samples are let go once read. A session
    that breaks an invariant the figures rely on raises :class:`~pcietrace.errors.DataError` first."""
    if group_by not in names.GROUP_BY:
        raise ValueError(f"group_by must be one of {', '.join(names.GROUP_BY)}, not {group_by!r}")
    validate.check(session)
    return analyzer(session.meta.get("kind"))(session, Options(us_per_level, group_by, release_events, release_samples))
