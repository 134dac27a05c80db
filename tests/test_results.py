"""Typed results (pcietrace/analysis/results.py) and the analyzer of each kind (pcietrace/analysis/kinds/):
``analyze`` picks the session's kind's analyzer from one registry and returns that kind's result, a read-only
mapping of every result table by name."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from pcietrace.analysis import (RESULT_TABLES, RESULT_TYPES, AnalysisResult, AttachResult, GraphsResult,
                                LatencyResult, RunResult, analyze, empty_results)
from pcietrace.analysis.kinds import ANALYZERS
from pcietrace.session import Session

from conftest import DATA


def test_every_kind_has_an_analyzer_and_a_result_type() -> None:
    assert set(ANALYZERS) == set(RESULT_TYPES)


@pytest.mark.parametrize("name,kind,typ", [("h100_run", None, RunResult), ("attach_h100_python", "attach", AttachResult),
                                           ("graphs_h100", "graphs", GraphsResult)])
def test_a_recording_is_analysed_into_its_kind_s_result(name, kind, typ) -> None:
    s = Session.load(DATA / name)
    assert s.meta.get("kind") == kind
    res = analyze(s)
    assert type(res) is typ and res.kind == (kind or "run")
    assert list(res) == list(RESULT_TABLES) == list(res.tables) and len(res) == len(RESULT_TABLES)
    own = {f.name for f in dataclasses.fields(res)}
    for name in RESULT_TABLES:  # a table of another kind is empty, with its declared columns
        if name not in own:
            assert not len(res[name]) and list(res[name].columns) == list(empty_results(kind)[name].columns)
    assert {**res}.keys() == set(RESULT_TABLES)


def test_a_latency_session_is_analysed_as_a_run() -> None:
    lat = Session.load(DATA / "h100_run_latency")
    res = analyze(Session(meta={**lat.meta, "kind": "latency"}, latency=lat.latency))
    assert type(res) is LatencyResult and isinstance(res, RunResult) and len(res["latency"])


def test_an_unknown_kind_is_analysed_as_a_run() -> None:
    s = Session.load(DATA / "h100_run")
    assert type(analyze(Session(meta={**s.meta, "kind": "from-the-future"}, samples=s.samples,
                                windows=s.windows))) is RunResult


def test_a_result_is_read_only() -> None:
    res = analyze(Session(meta={"gpus": []}))
    assert isinstance(res, AnalysisResult)
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.sampling = pd.DataFrame()  # type: ignore[misc]
    with pytest.raises(TypeError):
        res["sampling"] = pd.DataFrame()  # type: ignore[index]
