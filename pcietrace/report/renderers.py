"""One :class:`Renderer` class per output format, behind one registry (:data:`RENDERERS`: format name -> class).

A renderer writes a result it is given, already made safe (:func:`pcietrace.report.text.clean_all`) and with
its notes worded (:mod:`pcietrace.report.notes`) by :func:`pcietrace.report.output.emit`; it computes nothing.
``render(meta, results, summary, out)``: ``out`` is a text stream for the stream formats (:data:`FORMATS`, what
``--format`` offers) and a path for the file formats (``perfetto``: a file, ``plots``: a folder). The classes
are looked up by name, so that a format's dependencies (rich, matplotlib) load only when it is used.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from pathlib import Path
from typing import Any, ClassVar, TextIO

import pandas as pd

from pcietrace.analysis.timelines import TIMELINES


class Renderer:
    """Writes one result in one format (options, such as the console's ``detail``, go to the constructor)."""

    #: The format's name in :data:`RENDERERS`.
    name: ClassVar[str]

    def __init__(self, **options: Any) -> None:
        self.options = options

    def render(self, meta: dict[str, Any], results: Mapping[str, pd.DataFrame], summary: dict[str, Any],
               out: Any) -> Any:
        raise NotImplementedError


def without_timelines(results: Mapping[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The tables a machine-readable format holds: the saved report's, timelines left out (:data:`TIMELINES`)."""
    return {k: v for k, v in results.items() if k not in TIMELINES}


class JsonRenderer(Renderer):
    """The whole result as one strict JSON document (:func:`pcietrace.report.json.write`); ``savings``' JSON is
    its table's records."""

    name = "json"

    def render(self, meta: dict[str, Any], results: Mapping[str, pd.DataFrame], summary: dict[str, Any],
               out: TextIO) -> None:
        if meta.get("kind") == "savings":  # (its JSON has always been the table alone)
            out.write(results["savings"].to_json(orient="records", indent=1) + "\n")
            return
        from pcietrace.report import json as json_report

        # (written as made: a long run's range instances never make one string)
        json_report.write(meta, without_timelines(results), summary, out)


class PerfettoRenderer(Renderer):
    """An attach run's Perfetto trace (:func:`pcietrace.report.perfetto.write_trace`); options: ``session`` (the
    recording, for its meta), and optionally ``max_points`` and ``max_ranges``. Returns what
    ``write_trace`` says of the file."""

    name = "perfetto"

    def render(self, meta: dict[str, Any], results: Mapping[str, pd.DataFrame], summary: dict[str, Any],
               out: Path) -> dict[str, int]:
        from pcietrace.report.perfetto import write_trace

        options = dict(self.options)
        return write_trace(options.pop("session"), results, Path(out), **options)


#: Every format by name: ``module.Class`` of its renderer, imported when used.
RENDERERS: dict[str, str] = {
    "table": "pcietrace.report.console.ConsoleRenderer",
    "json": "pcietrace.report.renderers.JsonRenderer",
    "csv": "pcietrace.report.csv.CsvRenderer",
    "md": "pcietrace.report.markdown.MarkdownRenderer",
    "prometheus": "pcietrace.report.prometheus.PrometheusRenderer",
    "perfetto": "pcietrace.report.renderers.PerfettoRenderer",
    "plots": "pcietrace.report.plots.PlotsRenderer",
}
#: The formats written to a stream (``--format``); the others write files.
FORMATS = ("table", "json", "csv", "md", "prometheus")


def renderer(name: str, **options: Any) -> Renderer:
    """The renderer of format ``name`` (:data:`RENDERERS`), made with ``options``."""
    module, _, cls = RENDERERS[name].rpartition(".")
    return getattr(import_module(module), cls)(**options)
