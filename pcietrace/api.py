"""Python API: a saved run (or a fresh measurement) as named result tables, its summary and metadata.

>>> import pcietrace
>>> run = pcietrace.load("reports/h100-20261124")
>>> run.summary["lines"][0]                  # the answer, as the console prints it first
>>> run.per_launch                           # any result table by name (a pandas DataFrame)
>>> run.tables.keys()                        # every table, empty ones included
>>> sim = pcietrace.measure(simulate=True, quick=True)   # `pcietrace run` from Python
>>> lat = pcietrace.latency(simulate=True, gpus=2)       # also attach([...]) and graphs(simulate=True)

Each records through :mod:`pcietrace.workflow` from a validated config (:mod:`pcietrace.config`), as the CLI
does; a bad value raises :class:`~pcietrace.errors.ConfigError` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import pandas as pd

from pcietrace.analysis.latency import DEFAULT_US_PER_LEVEL
from pcietrace.device.gpus import GpuSpec
from pcietrace.errors import PcietraceError

if TYPE_CHECKING:
    from pcietrace.workflow import Recorded


@dataclass
class Result:
    """``meta``: the run's metadata (GPUs, driver, plan, topology); ``tables``: every result table of
    :func:`pcietrace.analysis.analyze` by name (also readable as attributes: ``result.per_launch``), its notes
    worded (:mod:`pcietrace.report.notes`);
    ``summary``: ``lines`` (plain sentences) and the key figures behind them; ``path``: where it was loaded from."""

    meta: dict[str, Any]
    tables: dict[str, pd.DataFrame]
    summary: dict[str, Any]
    path: Path | None = None
    session: Any = field(default=None, repr=False)

    def __getattr__(self, name: str) -> pd.DataFrame:
        tables = self.__dict__.get("tables", {})
        if name in tables:
            return tables[name]
        raise AttributeError(f"no result table {name!r}; tables: {', '.join(tables)}")

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.tables[name]

    def __repr__(self) -> str:
        filled = [k for k, v in self.tables.items() if len(v)]
        return f"<pcietrace.Result {self.meta.get('kind', 'run')} {self.path or ''}: tables {', '.join(filled)}>"

    def __str__(self) -> str:
        return "\n".join(self.summary.get("lines", [])) or repr(self)


def load(path: str | Path, us_per_level: float = DEFAULT_US_PER_LEVEL) -> Result:
    """A saved run (its folder or ``report.json``), re-analysed: the same tables ``pcietrace report`` prints."""
    from pcietrace.analysis import analyze
    from pcietrace.analysis.summary import summarize
    from pcietrace.report.notes import with_sentences
    from pcietrace.session import Session

    from pcietrace import multinode

    if multinode.is_merged(Path(path)):  # its saved tables: the nodes' samples are never loaded together
        m = multinode.load(Path(path))
        return Result(meta=m.meta, tables=m.results, summary=summarize(m.meta, m.results), path=Path(path))
    s = Session.load(Path(path))
    tables = analyze(s, us_per_level)
    return Result(meta=s.meta, tables=with_sentences(tables), summary=summarize(s.meta, tables), path=Path(path),
                  session=s)


def _result(recorded: Recorded) -> Result:
    """A recording's result: what :func:`load` would give of the run it saved. A signal that stopped it is
    raised again; a save that failed is a :class:`~pcietrace.errors.PcietraceError`."""
    from pcietrace.analysis.summary import summarize

    recorded.saving.later()  # (attach: its Perfetto trace, which the CLI writes once the report is shown)
    if recorded.interrupted is not None:
        raise recorded.interrupted
    if recorded.save_error is not None:
        raise PcietraceError(recorded.save_error.removeprefix("pcietrace: error: "))
    session, results = recorded.session, recorded.results
    return Result(meta=session.meta, tables=results, summary=summarize(session.meta, results), path=recorded.path,
                  session=session)


def _saved(output: str | Path | None) -> dict[str, Any]:
    return {"output": output, "save": output is not None}


def measure(gpu: GpuSpec = "all", *, simulate: bool = False, quick: bool = False, output: str | Path | None = None,
            latency: bool = True, **options: Any) -> Result:
    """``pcietrace run`` from Python: returns its result. ``gpu``: "all", "0,1", 0 or [0, 1] (CUDA device
    numbers); ``output``: folder to save the run in (default: not saved). Other options are
    :class:`pcietrace.config.RunConfig`'s fields, e.g. ``window_s=0.2, durations_us=(0, 5, 50), gpus=4`` (with
    ``simulate=True``), ``force=True``. Nothing is printed."""
    from pcietrace import workflow
    from pcietrace.config import RunConfig

    config = RunConfig(gpu=gpu, simulate=simulate, quick=quick, latency=latency, **{**_saved(output), **options})
    return _result(workflow.record_run(config))


def latency(gpu: GpuSpec = "all", *, simulate: bool = False, output: str | Path | None = None,
            **options: Any) -> Result:
    """``pcietrace latency`` from Python: PCIe round trips and launch/completion latencies. Options are
    :class:`pcietrace.config.LatencyConfig`'s fields (``repeats``, ``gpus`` and ``seed`` with ``simulate``)."""
    from pcietrace import workflow
    from pcietrace.config import LatencyConfig

    config = LatencyConfig(gpu=gpu, simulate=simulate, **{**_saved(output), **options})
    return _result(workflow.record_latency(config))


def graphs(gpu: int = 0, *, simulate: bool = False, output: str | Path | None = None, **options: Any) -> Result:
    """``pcietrace graphs`` from Python: what each way of using CUDA graphs costs when parameters change.
    Options are :class:`pcietrace.config.GraphsConfig`'s fields (``kernels``, ``strategies``, ``iterations``...)."""
    from pcietrace import workflow
    from pcietrace.config import GraphsConfig

    config = GraphsConfig(gpu=gpu, simulate=simulate, **{**_saved(output), **options})
    return _result(workflow.record_graphs(config))


def attach(command: Sequence[str], gpu: GpuSpec = "all", *, output: str | Path | None = None,
           **options: Any) -> Result:
    """``pcietrace attach`` from Python: runs ``command`` (a list: the program and its arguments) under the
    samplers and returns its per-range result; the program's exit code is ``result.meta["exit_code"]``.
    Options are :class:`pcietrace.config.AttachConfig`'s fields (``sample_interval_ms``, ``gpu_time``...)."""
    from pcietrace import workflow
    from pcietrace.config import AttachConfig

    config = AttachConfig(command=tuple(command), gpu=gpu, **{**_saved(output), **options})
    return _result(workflow.record_attach(config))


def merge(paths: list[str | Path], output: str | Path, *, workers: int | None = None, scheduler: str | None = None,
          force: bool = False) -> Result:
    """``pcietrace merge``: the attach recordings of a job's nodes (``paths``) analysed in parallel (``workers``
    local processes, or a Dask cluster at ``scheduler``) and saved as one report in ``output``; returns it
    loaded (:func:`load`)."""
    from pcietrace import multinode

    return load(multinode.merge([Path(p) for p in paths], Path(output), workers, scheduler, force))
