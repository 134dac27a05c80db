"""Python API: a saved run (or a fresh measurement) as named result tables, its summary and metadata.

>>> import pcietrace
>>> run = pcietrace.load("reports/h100-20261124")
>>> run.summary["lines"][0]                  # the answer, as the console prints it first
>>> run.per_launch                           # any result table by name (a pandas DataFrame)
>>> run.tables.keys()                        # every table, empty ones included
>>> sim = pcietrace.measure(simulate=True, quick=True)   # `pcietrace run` from Python
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from pcietrace.analysis.latency import DEFAULT_US_PER_LEVEL
from pcietrace.errors import PcietraceError, UsageError


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


def measure(gpu: str | int = "all", *, simulate: bool = False, quick: bool = False, output: str | Path | None = None,
            latency: bool = True, **options: Any) -> Result:
    """Run ``pcietrace run`` from Python and return its result. ``output``: folder to save the run in (default:
    a temporary folder, removed afterwards). Other options are ``pcietrace run``'s, by their Python names,
    e.g. ``window_s=0.2, durations="0,5,50", gpus=4`` (with ``simulate=True``). Nothing is printed."""
    from pcietrace import commands
    from pcietrace.cli import build_parser

    argv = ["run", "--gpu", str(gpu), "--format", "json"] + (["--simulate"] if simulate else []) + \
        (["--quick"] if quick else []) + ([] if latency else ["--no-latency"])
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not False and value is not None:  # (not `in (False, None)`: 0 == False, and gpus=0 was dropped)
            argv += [flag, ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)]
    with contextlib.ExitStack() as stack:
        folder = Path(output) if output is not None else Path(stack.enter_context(tempfile.TemporaryDirectory())) / "run"
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                args = build_parser().parse_args(argv + ["--output", str(folder)])
        except SystemExit:
            why = said.getvalue().strip().splitlines()[-1:] or [""]
            raise UsageError(f"invalid options for measure(): {' '.join(argv[1:])} "
                             f"({why[0].split('error: ', 1)[-1]})") from None
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = commands.cmd_run(args)
        if code >= 128:  # Ctrl-C or SIGTERM: cmd_run saved what it had and returned the shell's code
            raise KeyboardInterrupt
        if code:  # the run was measured but could not be saved: say why (stderr was captured)
            lines = [ln for ln in err.getvalue().splitlines() if "error" in ln]
            raise PcietraceError(lines[-1].removeprefix("pcietrace: error: ") if lines
                                 else f"run exited with code {code}")
        result = load(folder)
        if output is None:
            result.path = None
        return result


def merge(paths: list[str | Path], output: str | Path, *, workers: int | None = None, scheduler: str | None = None,
          force: bool = False) -> Result:
    """``pcietrace merge``: the attach recordings of a job's nodes (``paths``) analysed in parallel (``workers``
    local processes, or a Dask cluster at ``scheduler``) and saved as one report in ``output``; returns it
    loaded (:func:`load`)."""
    from pcietrace import multinode

    return load(multinode.merge([Path(p) for p in paths], Path(output), workers, scheduler, force))
