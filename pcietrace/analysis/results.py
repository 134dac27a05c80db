"""Typed results, one per kind of session, each a read-only mapping of its result tables by name.

A result's fields are the tables its kind produces; :attr:`AnalysisResult.tables` gives every table of
:data:`RESULT_TABLES` in display order, the ones its kind does not produce empty with their declared columns, so
that every consumer (the API, the renderers, the saved report) reads any kind alike: ``result["per_launch"]``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass, fields
from functools import cached_property
from typing import Any, ClassVar

import pandas as pd

from pcietrace.analysis import attribution, counters, floor, gpu_time, launch, summary
from pcietrace.analysis import graphs as graphs_analysis
from pcietrace.analysis import latency as latency_analysis
from pcietrace.analysis.notes import Note
from pcietrace.schema import TABLE_COLUMNS, empty_table

#: Result tables in display order; each is a DataFrame documented in its producing function.
RESULT_TABLES = ("sampling", "per_gpu", "floor", "calibration", "per_launch", "per_node", "by_duration",
                 "cpu_cost", "host_cost_by_language", "gpu_time", "speedup", "latency", "topology_model", "ranges",
                 "range_instances", "whole_run", "whole_run_bounds", "notes", "graphs", "fit_windows", "rates",
                 "launch_rates")

#: Column groups ``range_instances`` has all of or none of, beside :data:`attribution.INSTANCE_COLUMNS`, in this
#: order: ``gpu_time`` where the GPU's busy time was recorded (``attach --gpu-time``), ``savings`` where launch costs
#: are known (attach's "graphs save" figure).
INSTANCE_EXTRAS = {"gpu_time": gpu_time.BUSY_COLUMNS, "savings": ["graph_savings_ms", "launch_bound"]}
#: Columns of the ``notes`` table (attach: one note per row; a :class:`Note` until rendered, then its sentence).
NOTES_COLUMNS = ["note"]


@dataclass(frozen=True, eq=False)
class AnalysisResult(Mapping[str, pd.DataFrame]):
    """The tables every kind has; a subclass per kind adds its own (:data:`RESULT_TYPES`)."""

    #: ``meta["kind"]`` of the sessions this result is for.
    kind: ClassVar[str] = "run"
    #: Columns of the ``floor`` table: a run's rate floor, or attach's per-read model.
    floor_columns: ClassVar[list[str]] = counters.RATE_FLOOR_COLUMNS

    sampling: pd.DataFrame

    @classmethod
    def declared_columns(cls) -> dict[str, list[str]]:
        """Each result table's columns, as its producer declares them: the columns every table has, with rows
        or without. Two tables name more: ``calibration`` is the session's own table (its declared columns,
        :data:`pcietrace.schema.TABLE_COLUMNS`, and whatever else the recording holds) and ``range_instances``
        gains :data:`INSTANCE_EXTRAS` where measured."""
        return {"sampling": counters.SAMPLING_COLUMNS, "per_gpu": summary.GPU_COLUMNS, "floor": cls.floor_columns,
                "calibration": list(TABLE_COLUMNS["calibration"]), "per_launch": launch.PER_LAUNCH_COLUMNS,
                "per_node": launch.PER_NODE_COLUMNS, "by_duration": launch.BY_DURATION_COLUMNS,
                "cpu_cost": launch.CPU_COST_COLUMNS, "host_cost_by_language": launch.HOST_COST_BY_LANGUAGE_COLUMNS,
                "gpu_time": launch.GPU_TIME_COLUMNS, "speedup": launch.SPEEDUP_COLUMNS,
                "latency": latency_analysis.SUMMARY_COLUMNS,
                "topology_model": latency_analysis.TOPOLOGY_MODEL_COLUMNS,
                "ranges": attribution.SUMMARY_COLUMNS, "range_instances": attribution.INSTANCE_COLUMNS,
                "whole_run": attribution.WHOLE_RUN_COLUMNS, "whole_run_bounds": attribution.WHOLE_RUN_BOUND_COLUMNS,
                "notes": NOTES_COLUMNS, "graphs": graphs_analysis.SUMMARY_COLUMNS,
                "fit_windows": launch.FIT_WINDOW_COLUMNS, "rates": counters.RATES_COLUMNS,
                "launch_rates": attribution.LAUNCH_RATE_COLUMNS}

    @classmethod
    def empty_tables(cls) -> dict[str, pd.DataFrame]:
        """Every result table with no rows and its :meth:`declared_columns`."""
        columns = cls.declared_columns()
        out = {t: pd.DataFrame(columns=columns[t]) for t in RESULT_TABLES}
        out["calibration"] = empty_table(TABLE_COLUMNS["calibration"])  # (as a saved session's empty table loads)
        return out

    @classmethod
    def of(cls, tables: Mapping[str, Any]) -> AnalysisResult:
        """This kind's result from ``tables`` by name; those missing are empty, with their declared columns."""
        required = [f.name for f in fields(cls) if f.default is MISSING]
        empty = cls.empty_tables() if any(n not in tables for n in required) else {}
        return cls(**{n: tables[n] if n in tables else empty[n] for n in required},
                   **{f.name: tables[f.name] for f in fields(cls) if f.default is not MISSING and f.name in tables})

    @cached_property
    def tables(self) -> dict[str, pd.DataFrame]:
        """Every table of :data:`RESULT_TABLES` by name, in that order (those of other kinds empty)."""
        own = {f.name: getattr(self, f.name) for f in fields(self)}
        if "notes" in own:
            own["notes"] = pd.DataFrame({"note": pd.Series(list(own["notes"]), dtype=object)}, columns=NOTES_COLUMNS)
        empty = self.empty_tables() if any(t not in own for t in RESULT_TABLES) else {}
        return {t: own[t] if t in own else empty[t] for t in RESULT_TABLES}

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.tables[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tables)

    def __len__(self) -> int:
        return len(self.tables)


@dataclass(frozen=True, eq=False)
class _HostCosts:
    """Tables of the host's launch loops and round trips (a run's, and whatever an attach recording holds)."""

    calibration: pd.DataFrame
    cpu_cost: pd.DataFrame
    host_cost_by_language: pd.DataFrame
    gpu_time: pd.DataFrame
    speedup: pd.DataFrame
    latency: pd.DataFrame
    topology_model: pd.DataFrame


@dataclass(frozen=True, eq=False)
class RunResult(AnalysisResult, _HostCosts):
    """``pcietrace run``: bytes per launch from the launch windows, host and GPU cost per launch, round trips,
    and one row of key figures per GPU (``per_gpu``)."""

    kind: ClassVar[str] = "run"

    per_gpu: pd.DataFrame
    floor: pd.DataFrame
    per_launch: pd.DataFrame
    per_node: pd.DataFrame
    by_duration: pd.DataFrame
    fit_windows: pd.DataFrame


@dataclass(frozen=True, eq=False)
class LatencyResult(RunResult):
    """``pcietrace latency``: a run with round trips only (its tables are a run's)."""

    kind: ClassVar[str] = "latency"


@dataclass(frozen=True, eq=False)
class AttachResult(AnalysisResult, _HostCosts):
    """``pcietrace attach``: the floor model per GPU, the PCIe bytes and launches of every NVTX range
    (``range_instances``) and name (``ranges``), the whole run, the PCIe rates and each process's launch rates over
    time, and :class:`Note` s."""

    kind: ClassVar[str] = "attach"
    floor_columns: ClassVar[list[str]] = floor.FLOOR_COLUMNS

    floor: pd.DataFrame
    ranges: pd.DataFrame
    range_instances: pd.DataFrame
    whole_run: pd.DataFrame
    whole_run_bounds: pd.DataFrame
    rates: pd.DataFrame
    launch_rates: pd.DataFrame
    notes: tuple[Note, ...] = ()


@dataclass(frozen=True, eq=False)
class GraphsResult(AnalysisResult):
    """``pcietrace graphs``: per workload size and strategy, time per iteration and PCIe bytes (``graphs``)."""

    kind: ClassVar[str] = "graphs"

    floor: pd.DataFrame
    graphs: pd.DataFrame


#: The result type of each kind of session (``meta["kind"]``; none: a run). An attach whose program never ran
#: ("attach-failed") keeps an attach's tables, empty.
RESULT_TYPES: dict[str, type[AnalysisResult]] = {"run": RunResult, "latency": LatencyResult, "attach": AttachResult,
                                                 "attach-failed": AttachResult, "graphs": GraphsResult}


def result_type(kind: str | None) -> type[AnalysisResult]:
    """The result type for sessions of ``kind`` (a run's for none or one this version does not know)."""
    return RESULT_TYPES.get(str(kind or "run"), RunResult)


def declared_columns(kind: str | None) -> dict[str, list[str]]:
    """:meth:`AnalysisResult.declared_columns` of a session of ``kind`` (``meta["kind"]``; None: a run)."""
    return result_type(kind).declared_columns()


def empty_results(kind: str | None) -> dict[str, pd.DataFrame]:
    """Every result table of a session of ``kind`` with no rows and its :func:`declared_columns`."""
    return result_type(kind).empty_tables()
