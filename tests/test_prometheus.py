"""--format prometheus: dcgm-exporter's labels (gpu, UUID, pci_bus_id, modelName, Hostname) on every metric, the
attach range metrics included, on every committed recording."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcietrace.analysis import analyze
from pcietrace.analysis.summary import summarize
from pcietrace.report import prometheus
from pcietrace.session import Session

pytest.importorskip("prometheus_client")
DATA = Path(__file__).parent / "data"
RECORDINGS = [p.parent for p in sorted(DATA.glob("*/report.json")) if "graphs" not in p.parent.name]


@pytest.mark.parametrize("rec", RECORDINGS, ids=lambda p: p.name)
def test_every_metric_carries_dcgm_exporters_labels(rec: Path) -> None:
    # was: attach's range metrics carried only Hostname and gpu
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    s = Session.load(rec)
    res = analyze(s)
    text = prometheus.render(s.meta, res, summarize(s.meta, res))
    samples = [x for fam in text_string_to_metric_families(text) for x in fam.samples]
    assert samples
    uuids = {g.get("uuid") for g in s.meta["gpus"]}
    for x in samples:
        assert set(prometheus.GPU_LABELS) <= set(x.labels), (x.name, x.labels)
        assert set(x.labels["UUID"].split(",")) <= uuids and len(x.labels["UUID"].split(",")) == len(x.labels["gpu"].split(","))
