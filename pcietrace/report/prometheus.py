"""OpenMetrics text for node_exporter's textfile collector (or any scraper), named and labelled like
dcgm-exporter: ``gpu`` (NVML index), ``UUID``, ``pci_bus_id``, ``modelName``, ``Hostname``. Times are in
seconds and sizes in bytes (Prometheus base units). Needs ``prometheus-client`` (``pcietrace[prometheus]``).

Run: per-launch PCIe bytes (eager and graph, with 95 % half-widths), graph bytes fixed + per node, host
cost per launch call, GPU and wall time per kernel eager/graph per kernel duration, host read round trip,
PCIe switch levels. Attach: bytes, launches and time per NVTX range, labelled with the range's own GPUs
(those its bytes are summed over): every GPU label, each the GPUs' values joined with "," where it spans several.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator, TextIO

import pandas as pd

from pcietrace.errors import UsageError
from pcietrace.report.renderers import Renderer, without_timelines

PREFIX = "pcietrace_"
GPU_LABELS = ["gpu", "UUID", "pci_bus_id", "modelName", "Hostname"]


def _gpu_labels(meta: dict[str, Any]) -> dict[Any, list[str]]:
    """Each GPU's labels by NVML index; a merged report's (``pcietrace merge``: GPUs of several nodes, each
    with its node and host) also by "node:index", as its ranges name them."""
    host = str(meta.get("host", ""))
    out: dict[Any, list[str]] = {}
    for g in meta.get("gpus", []):
        row = [str(g["nvml_index"]), str(g.get("uuid", "")), str(g.get("bus_id", "")), str(g.get("name", "")),
               str(g.get("host", host))]
        out.setdefault(int(g["nvml_index"]), row)
        if "node" in g:  # (its gpu label as the merged report names it: "node1:0")
            out[f"{g['node']}:{g['nvml_index']}"] = [f"{g['node']}:{g['nvml_index']}", *row[1:]]
    return out


def families(meta: dict[str, Any], results: dict[str, pd.DataFrame]) -> Iterator[Any]:
    """The metric families (prometheus_client GaugeMetricFamily objects) of one result."""
    from prometheus_client.core import GaugeMetricFamily

    labels = _gpu_labels(meta)

    def family(name: str, doc: str, extra: list[str], rows: Any, unit: str = "") -> Any:
        fam = GaugeMetricFamily(PREFIX + name, doc, labels=GPU_LABELS + extra, unit=unit)
        for idx, values, v in rows:
            if idx in labels and v is not None and not pd.isna(v):
                fam.add_metric(labels[idx] + [str(x) for x in values], float(v))
        return fam

    def table(key: str) -> pd.DataFrame:
        return results.get(key, pd.DataFrame())

    pl = table("per_launch")
    if len(pl):
        for col, name, doc in (("bytes_per_call", "launch_pcie", "PCIe bytes per launch call (eager: one kernel; graph: one graph of graph_k kernels)"),
                               ("ci95", "launch_pcie_ci95", "95 % half-width of launch_pcie_bytes")):
            yield family(name, doc, ["mode", "graph_k", "direction"],
                         [(r.nvml_index, (r.mode, r.graph_k, r.direction), getattr(r, col)) for r in pl.itertuples()], "bytes")
    pn = table("per_node")
    if len(pn):
        yield family("graph_launch_fixed_pcie", "PCIe bytes of a graph launch independent of its size", ["direction"],
                     [(r.nvml_index, (r.direction,), r.fixed_bytes) for r in pn.itertuples()], "bytes")
        yield family("graph_node_pcie", "PCIe bytes a graph launch adds per kernel node", ["direction"],
                     [(r.nvml_index, (r.direction,), r.per_node_bytes) for r in pn.itertuples()], "bytes")
    cc = table("cpu_cost")
    if len(cc):
        yield family("launch_host", "host wall time per launch call, queue never full", ["mode", "graph_k"],
                     [(r.nvml_index, (r.mode, r.graph_k), r.host_us_per_call / 1e6) for r in cc.itertuples()], "seconds")
    gt = table("gpu_time")
    if len(gt):
        yield family("kernel_gpu", "GPU time per kernel with the queue full", ["mode", "kernel_us"],
                     [(r.nvml_index, (m, f"{r.kernel_us:g}"), getattr(r, f"{m}_gpu_us") / 1e6)
                      for r in gt.itertuples() for m in ("eager", "graph")], "seconds")
        multi = gt[gt["eager_contexts"] > 1] if "eager_contexts" in gt else gt.iloc[:0]
        if len(multi):  # each CUDA context draws its own eager level: the range the median was taken over
            yield family("kernel_gpu_eager_contexts", "GPU time per eager kernel over the CUDA contexts measured",
                         ["kernel_us", "stat"],
                         [(r.nvml_index, (f"{r.kernel_us:g}", s), getattr(r, f"eager_gpu_us_{s}") / 1e6)
                          for r in multi.itertuples() for s in ("min", "max")], "seconds")
    sp = table("speedup")
    if len(sp):
        yield family("kernel_wall", "wall time per kernel, host launching as fast as it can", ["mode", "kernel_us"],
                     [(r.nvml_index, (m, f"{r.kernel_us:g}"), getattr(r, f"{m}_wall_us") / 1e6)
                      for r in sp.itertuples() for m in ("eager", "graph")], "seconds")
    lat = table("latency")
    if len(lat):
        rtt = lat[(lat["test"] == "host_read_rtt") & (lat["peer"] < 0)]
        yield family("host_read_rtt", "PCIe round trip of a GPU read from pinned host memory (median)", [],
                     [(r.nvml_index, (), r.median_us / 1e6) for r in rtt.itertuples()], "seconds")
    topo = (meta.get("topology") or {}).get("gpus", [])
    if topo:
        yield family("pcie_switch_levels", "PCIe switch levels between the GPU and its root port", [],
                     [(g.get("nvml_index"), (), g.get("switch_levels")) for g in topo])
    rg = table("ranges")
    if len(rg):
        sampled = [int(g["nvml_index"]) for g in meta.get("gpus", [])]
        base = GPU_LABELS + ["range", "domain"]

        def range_labels(r: Any) -> list[str]:
            """dcgm-exporter's labels for the GPUs whose bytes the range holds (its own), each label's values
            joined with "," in one order ("0,1" with "GPU-a,GPU-b") where a range spans several GPUs."""
            gpus = getattr(r, "gpus", sampled)  # a list in the table, "0,1" in older tables
            # (a merged report names them "node:index")
            idx = [int(x) if str(x).strip().isdigit() else str(x).strip()
                   for x in (gpus if isinstance(gpus, (list, tuple)) else str(gpus).split(",")) if str(x).strip()]
            known = [labels[i] for i in idx if i in labels]
            joined = [",".join(dict.fromkeys(v)) if k == "Hostname" else ",".join(v)
                      for k, v in zip(GPU_LABELS, zip(*known))] if known else [""] * len(GPU_LABELS)
            return joined

        def rfam(name: str, doc: str, extra: list[str], rows: Any, unit: str = "") -> Any:
            fam = GaugeMetricFamily(PREFIX + name, doc, labels=base + extra, unit=unit)
            for r, values, v in rows:
                if v is not None and not pd.isna(v):
                    fam.add_metric(range_labels(r) + [str(r.name), str(r.domain)] + list(values), float(v))
            return fam

        yield rfam("range_pcie", "PCIe bytes during an NVTX range (floor removed, nested ranges included)", ["direction"],
                   [(r, (d,), getattr(r, f"{d}_bytes")) for r in rg.itertuples() for d in ("h2d", "d2h")], "bytes")
        yield rfam("range_launches", "kernel launches made in the range by its own thread and by its process's "
                   "threads with no range of their own open (captured: into a stream being captured into a graph)",
                   ["kind"], [(r, (k,), getattr(r, f"{k}_launches", 0)) for r in rg.itertuples()
                              for k in ("eager", "graph", "captured")])
        yield rfam("range_duration", "time inside the NVTX range, summed over its calls", [],
                   [(r, (), r.incl_ms / 1e3) for r in rg.itertuples()], "seconds")


#: What this format says nothing about: refused before measuring (`graphs`) or rendering (`report`).
NO_METRICS = {"graphs": "--format prometheus has no metrics for `pcietrace graphs` (its figures are per strategy "
                        "and workload): use table, json, csv or md"}


def render(meta: dict[str, Any], results: dict[str, pd.DataFrame], summary: dict[str, Any]) -> str:
    if meta.get("kind") in NO_METRICS:
        raise UsageError(NO_METRICS[meta["kind"]])
    try:
        from prometheus_client.openmetrics.exposition import generate_latest
        from prometheus_client.registry import CollectorRegistry
    except ImportError:
        raise UsageError("--format prometheus needs prometheus-client: pip install 'pcietrace[prometheus]'") from None
    fams = list(families(meta, results))

    class _Collector:
        def collect(self) -> list[Any]:
            return fams

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())  # type: ignore[arg-type]
    return generate_latest(registry).decode()


class PrometheusRenderer(Renderer):
    """OpenMetrics text (:func:`render`) of the tables the saved report holds."""

    name = "prometheus"

    def render(self, meta: dict[str, Any], results: Mapping[str, pd.DataFrame], summary: dict[str, Any],
               out: TextIO) -> None:
        out.write(render(meta, without_timelines(results), summary))
