"""A recorded run: metadata plus raw tables. The seam between recording and analysis/rendering.

On disk a session is a folder: ``report.json`` (schema-versioned: metadata, the small tables as
records, and the analysis results) and ``samples.parquet`` (raw counter samples). Loading needs no GPU,
so any saved run can be re-analysed and re-rendered anywhere.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from pcietrace.errors import UsageError

SCHEMA = "pcietrace.report/1"
TABLES = ("windows", "bursts", "e2e", "calibration", "latency", "graphs")
REPORT_FILE = "report.json"
SAMPLES_FILE = "samples.parquet"
EVENTS_FILE = "events.parquet"


def _empty() -> pd.DataFrame:
    return pd.DataFrame()


@dataclass
class Session:
    """``meta``: tool version, host, command, ``simulated``, ``status`` ("complete" / "interrupted" /
    "failed: ..."), ``gpus`` (list of dicts with ``nvml_index``, ``cuda_ordinal``, name, bus id, PCIe
    link, ``counter`` mode/bits) and ``plan``. Tables: ``samples`` (raw counters, see
    ``pcietrace.collectors.SAMPLE_COLUMNS``), ``windows``, ``bursts``, ``e2e``, ``calibration``
    (records from :class:`pcietrace.record.generate.LaunchGenerator`, each with ``nvml_index``), ``latency``
    (:data:`pcietrace.record.latency.LATENCY_COLUMNS`), ``events`` (attach: NVTX/launch events,
    :data:`pcietrace.record.attach.EVENT_COLUMNS` + ``pid``), ``graphs`` (``pcietrace graphs``: one row per
    iteration, :data:`pcietrace.record.graphs.ITERATION_FIELDS`); ``meta["topology"]`` holds the machine's topology."""

    meta: dict[str, Any]
    samples: pd.DataFrame = field(default_factory=_empty)
    windows: pd.DataFrame = field(default_factory=_empty)
    bursts: pd.DataFrame = field(default_factory=_empty)
    e2e: pd.DataFrame = field(default_factory=_empty)
    calibration: pd.DataFrame = field(default_factory=_empty)
    latency: pd.DataFrame = field(default_factory=_empty)
    events: pd.DataFrame = field(default_factory=_empty)
    graphs: pd.DataFrame = field(default_factory=_empty)  # `pcietrace graphs`: one row per iteration

    @property
    def counters(self) -> dict[int, dict[str, Any]]:
        """Per NVML index: the counter source (``mode``: fields/throughput, ``bits``)."""
        return {int(g["nvml_index"]): g.get("counter", {"mode": "fields", "bits": 32}) for g in self.meta.get("gpus", [])}

    def save(self, directory: Path, results: dict[str, Any] | None = None) -> Path:
        """Write the session (and, if given, analysis results as JSON-ready data) to ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        doc = {"schema": SCHEMA, "meta": self.meta,
               "tables": {t: _records(getattr(self, t)) for t in TABLES}, "results": results or {}}
        self.samples.to_parquet(directory / SAMPLES_FILE, index=False)
        if len(self.events):
            self.events.to_parquet(directory / EVENTS_FILE, index=False)
        tmp = directory / (REPORT_FILE + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=_json_default) + "\n")
        os.replace(tmp, directory / REPORT_FILE)  # never leave a half-written report
        return directory / REPORT_FILE

    @classmethod
    def load(cls, path: Path) -> "Session":
        """Load a saved session from its folder or its ``report.json``."""
        path = Path(path)
        report = path / REPORT_FILE if path.is_dir() else path
        if not report.is_file():
            raise UsageError(f"no pcietrace report at {path}")
        try:
            doc = json.loads(report.read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"{report} is not a readable JSON report ({exc})") from exc
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            raise UsageError(f"{report} is not a {SCHEMA} report (schema: {doc.get('schema') if isinstance(doc, dict) else None})")
        samples_path = report.parent / SAMPLES_FILE
        samples = pd.read_parquet(samples_path) if samples_path.is_file() else _empty()
        tables = {t: pd.DataFrame.from_records(doc["tables"].get(t, [])) for t in TABLES}
        events_path = report.parent / EVENTS_FILE
        events = pd.read_parquet(events_path) if events_path.is_file() else _empty()
        return cls(meta=doc["meta"], samples=samples, events=events, **tables)


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return json.loads(df.to_json(orient="records")) if len(df) else []


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    if isinstance(o, float) and math.isnan(o):
        return None
    return str(o)
