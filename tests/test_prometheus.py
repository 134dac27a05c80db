"""--format prometheus: dcgm-exporter's labels (gpu, UUID, pci_bus_id, modelName, Hostname) on every metric, the
attach range metrics included, on every committed recording; values equal to the result tables, range names kept
as written, and a range labelled with its own GPUs only."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcietrace.analysis import analyze
from pcietrace.analysis.summary import summarize
from pcietrace.cli import main
from pcietrace.report import prometheus
from pcietrace.session import Session

from conftest import DATA, REPORTS, ROOT, hostile_attach

pytest.importorskip("prometheus_client")
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


def test_prometheus_parses_with_dcgm_labels(loaded, capsys) -> None:
    parser = pytest.importorskip("prometheus_client.openmetrics.parser")
    assert main(["report", str(REPORTS[1]), "--format", "prometheus"]) == 0
    fams = {f.name: f for f in parser.text_string_to_metric_families(capsys.readouterr().out)}
    s, res = loaded["h200x2_run_defaults"]
    launch = fams["pcietrace_launch_pcie_bytes"]
    assert launch.unit == "bytes"
    pl = res["per_launch"]
    for g in s.meta["gpus"]:
        want = pl[(pl["nvml_index"] == g["nvml_index"]) & (pl["mode"] == "eager") & (pl["direction"] == "h2d")]
        got = [x for x in launch.samples if x.labels["gpu"] == str(g["nvml_index"]) and x.labels["mode"] == "eager"
               and x.labels["direction"] == "h2d"]
        assert got[0].value == pytest.approx(want["bytes_per_call"].iloc[0])
        assert got[0].labels["UUID"] == g["uuid"] and got[0].labels["pci_bus_id"] == g["bus_id"]
        assert got[0].labels["modelName"] == g["name"] and got[0].labels["Hostname"] == s.meta["host"]
    for name in ("pcietrace_launch_host_seconds", "pcietrace_kernel_gpu_seconds", "pcietrace_host_read_rtt_seconds",
                 "pcietrace_pcie_switch_levels", "pcietrace_graph_node_pcie_bytes"):
        assert fams[name].samples, name


def test_prometheus_attach_ranges_keep_hostile_names(capsys) -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    from pcietrace.report import prometheus

    s, res = hostile_attach()
    fams = {f.name: f for f in text_string_to_metric_families(prometheus.render(s.meta, res, {}))}
    launches = {(x.labels["range"], x.labels["kind"]): x.value for x in fams["pcietrace_range_launches"].samples}
    assert launches[("loss[/total]", "eager")] == 0
    eager = res["ranges"].set_index("name")["eager_launches"]
    assert launches[("[bold]x[/bold] \\", "graph")] == res["ranges"].set_index("name").loc["[bold]x[/bold] \\", "graph_launches"]
    assert launches[("eager_launches", "eager")] == eager["eager_launches"]


def test_prometheus_labels_a_range_with_its_own_gpus() -> None:
    """Real 8x H200 torchrun attach: one rank's ranges (its instances, summarized alone) are charged to its own
    GPU only, and the exported ``gpu`` label says that GPU, not every sampled one."""
    pytest.importorskip("prometheus_client")
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    from pcietrace.analysis import attribution
    from pcietrace.report import prometheus

    s = Session.load(ROOT / "tests/data/attach_h200x8_torchrun")
    res = analyze(s)
    inst = res["range_instances"]
    rank = inst[inst["pid"] == inst["pid"].max()]
    one = {",".join(map(str, g)) for g in rank["gpus"]}
    assert len(one) == 1 and one != {",".join(str(g["nvml_index"]) for g in s.meta["gpus"])}
    res = {**res, "ranges": attribution.summarize(rank, s.meta.get("launch_costs"), 0)}
    fams = {f.name: f for f in text_string_to_metric_families(prometheus.render(s.meta, res, {}))}
    assert {x.labels["gpu"] for x in fams["pcietrace_range_duration_seconds"].samples} == one
