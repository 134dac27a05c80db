"""Rich tables for a run's results (see :func:`pcietrace.analysis.analyze` for the columns)."""

from __future__ import annotations

import math
from typing import Any, Callable

import pandas as pd
from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

DIR_LABEL = {"h2d": "H2D", "d2h": "D2H"}


def _num(x: Any, fmt: str = ",.0f", unit: str = "") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:{fmt}}{unit}"


def _pm(x: Any, ci: Any, fmt: str = ",.0f") -> str:
    if ci is None or (isinstance(ci, float) and math.isnan(ci)):
        return _num(x, fmt)
    return f"{x:{fmt}} ± {ci:{fmt}}"


def _table(title: str, columns: list[tuple[str, str]], caption: str | None = None) -> Table:
    t = Table(title=title, caption=caption, box=box.SIMPLE_HEAVY, title_justify="left", caption_justify="left",
              title_style="bold", caption_style="dim")
    for name, justify in columns:
        t.add_column(name, justify=justify)  # type: ignore[arg-type]
    return t


def system_table(meta: dict[str, Any], sampling: pd.DataFrame) -> Table:
    t = _table("System", [("GPU", "left"), ("CUDA", "right"), ("NVML", "right"), ("bus id", "left"),
                          ("PCIe now / max", "left"), ("counters", "left"), ("samples/s", "right"),
                          ("gap", "right")],
               caption=f"driver {meta.get('driver', '?')}  host {meta.get('host', '?')}  {meta.get('created', '')}")
    smp = sampling.set_index("nvml_index") if len(sampling) else None
    for g in meta.get("gpus", []):
        c = g.get("counter", {})
        src = f"197/198 {c.get('bits', 32)}-bit" if c.get("mode") == "fields" else "[yellow]throughput API (20 ms, LOW RES)[/]"
        row = smp.loc[g["nvml_index"]] if smp is not None and g["nvml_index"] in smp.index else None
        link = (f"Gen{g.get('pcie_gen_current')} x{g.get('pcie_width_current')} / "
                f"Gen{g.get('pcie_gen_max')} x{g.get('pcie_width_max')}")
        t.add_row(g.get("name", "?").replace("NVIDIA ", ""), str(g.get("cuda_ordinal", "–")), str(g["nvml_index"]),
                  g.get("bus_id", "?"), link, src,
                  _num(row["rate_hz"] if row is not None else None),
                  _num(row["median_gap_us"] if row is not None else None, ".0f", " us"))
    return t


def floor_table(fl: pd.DataFrame) -> Table:
    t = _table("Background floor (idle windows, sampler running; subtracted from every window)",
               [("NVML", "right"), ("H2D MB/s", "right"), ("D2H MB/s", "right"), ("windows", "right"),
                ("counter reads/s", "right")],
               caption="mean ± standard deviation over idle windows; MB = 10^6 B; includes the traffic of the "
                       "counter reads themselves")
    for r in fl.itertuples():
        t.add_row(str(r.nvml_index), _pm(r.rx_Bps / 1e6, r.rx_Bps_std / 1e6, ".3f"),
                  _pm(r.tx_Bps / 1e6, r.tx_Bps_std / 1e6, ".3f"), str(r.windows), _num(r.reads_per_s))
    return t


def calibration_table(cal: pd.DataFrame) -> Table:
    t = _table("Kernel duration calibration", [("NVML", "right"), ("requested us", "right"),
                                               ("measured us (median)", "right"), ("min – max", "right")],
               caption="measured on the GPU's global timer inside the kernel")
    for r in cal.itertuples():
        t.add_row(str(r.nvml_index), _num(r.kernel_us, "g"), _num(r.measured_us, ".3f"),
                  f"{r.min_us:.3f} – {r.max_us:.3f}")
    return t


def per_launch_table(pl: pd.DataFrame) -> Table:
    t = _table("PCIe bytes per launch (fit of net window bytes vs launch calls)",
               [("NVML", "right"), ("mode", "left"), ("K", "right"), ("direction", "left"),
                ("B/call ±95%", "right"), ("B/kernel", "right"), ("R²", "right"), ("n", "right"),
                ("residual", "right")],
               caption="call = one cuLaunchKernel (eager) or one cuGraphLaunch of K kernels (graph); H2D = GPU RX, "
                       "D2H = GPU TX; bytes include TLP headers; residual = fit intercept in MB/s after floor "
                       "removal (ok = consistent with 0)")
    for r in pl.itertuples():
        check = "ok" if r.intercept_ok else f"[yellow]{r.intercept_Bps / 1e6:+.3f}[/]"
        t.add_row(str(r.nvml_index), r.mode, str(r.graph_k), DIR_LABEL[r.direction], _pm(r.bytes_per_call, r.ci95),
                  _num(r.bytes_per_kernel, ",.1f"), _num(r.r2, ".4f"), str(r.n), check)
    return t


def per_node_table(pn: pd.DataFrame) -> Table:
    t = _table("Graph launch bytes = fixed + per node × K", [("NVML", "right"), ("direction", "left"),
               ("fixed B (95% CI)", "right"), ("B per node (95% CI)", "right"), ("graph sizes", "right")])
    for r in pn.itertuples():
        t.add_row(str(r.nvml_index), DIR_LABEL[r.direction], _pm(r.fixed_bytes, r.fixed_ci95),
                  _pm(r.per_node_bytes, r.per_node_ci95, ",.2f"), str(r.ks))
    return t


def by_duration_table(bd: pd.DataFrame) -> Table:
    t = _table("Eager bytes per launch vs kernel duration (max rate, floor removed)",
               [("NVML", "right"), ("kernel us", "right"), ("launches/s", "right"), ("H2D B/launch", "right"),
                ("D2H B/launch", "right")])
    for r in bd.itertuples():
        t.add_row(str(r.nvml_index), _num(r.kernel_us, "g"), _num(r.achieved_rate_hz),
                  _num(r.h2d_bytes_per_launch, ",.1f"), _num(r.d2h_bytes_per_launch, ",.1f"))
    return t


def cpu_table(cc: pd.DataFrame) -> Table:
    t = _table("Host cost per launch call", [("NVML", "right"), ("mode", "left"), ("K", "right"),
               ("us / call", "right"), ("us / kernel", "right"), ("CPU us / call", "right")],
               caption="launch loop while the GPU is blocked (the queue never fills, no call waits): wall time "
                       "and the thread's CPU time per call")
    for r in cc.itertuples():
        t.add_row(str(r.nvml_index), r.mode, str(r.graph_k), _num(r.host_us_per_call, ".3f"),
                  _num(r.host_us_per_kernel, ".3f"), _num(r.cpu_us_per_call, ".3f"))
    return t


def speedup_table(gt: pd.DataFrame, sp: pd.DataFrame) -> Table:
    keys = ["nvml_index", "kernel_us"]
    merged = gt.merge(sp, on=keys, how="outer") if len(gt) and len(sp) else (gt if len(gt) else sp)
    k = int(sp["graph_k"].iloc[0]) if len(sp) else 0
    t = _table(f"Eager vs CUDA graph (K={k}) per kernel duration",
               [("NVML", "right"), ("kernel us", "right"), ("GPU eager", "right"), ("GPU graph", "right"),
                ("GPU ×", "right"), ("wall eager", "right"), ("wall graph", "right"), ("wall ×", "right")],
               caption="us per kernel. GPU: queue kept full behind a blocker kernel (* = queue ran dry: upper bound); "
                       "wall: host launching as fast as it can, incl. final sync; × = eager / graph")
    for r in merged.to_dict("records"):
        star = "*" if r.get("saturated") is False else ""
        t.add_row(str(r["nvml_index"]), _num(r["kernel_us"], "g"), _num(r.get("eager_gpu_us"), ".3f") + star,
                  _num(r.get("graph_gpu_us"), ".3f") + star, _num(r.get("gpu_speedup"), ".2f", "×"),
                  _num(r.get("eager_wall_us"), ".3f"), _num(r.get("graph_wall_us"), ".3f"),
                  _num(r.get("speedup"), ".2f", "×"))
    return t


LATENCY_LABELS = {
    "host_read_rtt": "host memory read round trip (chase, 64 KiB)",
    "host_read_rtt_2mib": "host memory read round trip (chase, 2 MiB)", "device_read_l2": "device memory chase, 2 MiB (L2)",
    "device_read_hbm": "device memory chase, 256 MiB (HBM)", "peer_read_rtt": "peer GPU memory read round trip",
    "copy_h2d_4B": "4 B copy H2D + sync", "copy_d2h_4B": "4 B copy D2H + sync",
    "launch_sync_eager": "launch + synchronize, eager", "launch_sync_graph1": "launch + synchronize, graph of 1",
    "launch_to_first_instruction": "launch -> first instruction seen by host",
    "kernel_end_to_host": "kernel's last store seen -> stream reported done"}


def latency_table(lat: pd.DataFrame) -> Table:
    t = _table("Latency", [("NVML", "right"), ("test", "left"), ("peer", "right"), ("median us", "right"),
                           ("95% CI", "right"), ("p10 – p90 us", "right"), ("IQR %", "right"), ("n", "right")],
               caption="chase tests: per dependent load; others: per operation, host-timed; CI = bootstrap of the median")
    for r in lat.itertuples():
        t.add_row(str(r.nvml_index), LATENCY_LABELS.get(r.test, r.test), "–" if r.peer < 0 else str(r.peer),
                  _num(r.median_us, ".3f"), f"± {r.ci95_us:.3f}", f"{r.p10_us:.3f} – {r.p90_us:.3f}", _num(r.spread_pct, ".1f"), str(r.n))
    return t


def model_table(m: pd.DataFrame) -> Table:
    r0 = m.iloc[0]
    t = _table("Topology model: what each added PCIe switch level would cost",
               [("NVML", "right"), ("kernel us", "right"), ("switch levels now", "right"), ("eager GPU us/kernel", "right"),
                ("+1 level", "right"), ("+2 levels", "right"), ("share / level", "right")],
               caption=(f"assumptions: eager launch costs the GPU {r0.eager_extra_us:.3f} us more than a graph node "
                        f"(empty kernels, queue full) = {r0.rtts_per_launch:.2f} serialized host round trips of "
                        f"{r0.host_rtt_us:.3f} us (measured); each switch level adds {r0.us_per_level:g} us per round "
                        f"trip, so +{r0.added_us_per_level:.3f} us per launch per level"))
    for r in m.itertuples():
        t.add_row(str(r.nvml_index), _num(r.kernel_us, "g"), _num(r.switch_levels, "d") if r.switch_levels is not None else "?",
                  _num(r.eager_gpu_us, ".3f"), _num(r.eager_gpu_us_plus1, ".3f"), _num(r.eager_gpu_us_plus2, ".3f"),
                  _num(r.share_per_level_pct, ".1f", " %"))
    return t


def topology_tables(topo: dict[str, Any]) -> list[Table]:
    """Per-GPU placement (with its PCIe path) and the GPU<->GPU matrix."""
    legend = ("GPU <-> GPU: X self; NV# NVLink links; PIX one PCIe switch; PXB several switches; PHB host bridge; "
              "NODE across host bridges in a NUMA node; SYS across NUMA nodes"
              + "".join(f"\nnote: {n}" for n in topo.get("notes", [])))
    t = _table(f"PCIe placement (source: {topo.get('source')})",
               [("GPU", "left"), ("bus id", "left"), ("NUMA", "right"), ("CPUs", "left"), ("switch levels", "right"),
                ("path from root complex", "left")], caption=legend)
    for g in topo.get("gpus", []):
        hops = "\n".join(f"{h['bdf']} {h['role']} {_id(h['vendor'])}:{_id(h['device'])}"
                         + (f" {h['link_speed'].replace(' PCIe', '')} x{_unknown(h['link_width'])}" if h.get("link_speed") else "")
                         + (f" (max {h['max_link_speed'].replace(' PCIe', '')} x{_unknown(h['max_link_width'])})"
                            if h.get("max_link_speed") and (h["max_link_speed"], h["max_link_width"]) != (h.get("link_speed"), h.get("link_width")) else "")
                         for h in g.get("hops", []))
        label = f"GPU{g['nvml_index']}" if g.get("nvml_index") is not None else g["bdf"]
        t.add_row(label + (f" {g['name']}" if g.get("name") else ""), g["bdf"], _unknown(g.get("numa_node")),
                  _unknown(g.get("local_cpulist")), _unknown(g.get("switch_levels")), f"{g['host_bridge']}\n{hops}")
    labels = topo.get("labels", [])
    m = _table("GPU <-> GPU", [("", "left")] + [(lab, "center") for lab in labels])
    for lab, row in zip(labels, topo.get("matrix", [])):
        m.add_row(lab, *row)
    return [t, m] if labels else [t]


def compare_table(cmp: pd.DataFrame, names: list[str]) -> Table:
    cols: list[tuple[str, str]] = [("metric", "left"), ("unit", "left")]
    for i, n in enumerate(names):
        cols.append((n, "right"))
        if i:
            cols.append((f"Δ vs {names[0]}", "right"))
    t = _table("Comparison", cols, caption="Δ in bold where the 95 % intervals say it is significant, dim where they "
                                             "say it is not, plain where a run gives no interval")
    for r in cmp.to_dict("records"):
        cells = [r["metric"], r["unit"]]
        for i, n in enumerate(names):
            v, ci = r.get(f"value:{n}"), r.get(f"ci95:{n}")
            cells.append(_pm(v, ci, ",.3f" if r["unit"] in ("us", "x") else ",.1f") if v is not None and not pd.isna(v) else "–")
            if i:
                d, sig = r.get(f"delta:{n}"), r.get(f"significant:{n}")
                txt = "–" if d is None or pd.isna(d) else f"{d:+,.3f}"
                cells.append(f"[bold]{txt}[/]" if sig is True else (f"[dim]{txt}[/]" if sig is False else txt))
        t.add_row(*cells)
    return t


def attach_tables(meta: dict[str, Any], results: dict[str, pd.DataFrame]) -> list[Any]:
    """Per-range table, whole-run line, processes, and the notes a reader needs."""
    parts: list[Any] = []
    costs = meta.get("launch_costs")
    rg = results.get("ranges", pd.DataFrame())
    interval = meta.get("sample_interval_ms")
    if len(rg):
        t = _table("PCIe bytes and launches per NVTX range",
                   [("range", "left"), ("domain", "left"), ("calls", "right"), ("incl ms", "right"), ("excl ms", "right"),
                    ("H2D MB ± edges", "right"), ("D2H MB", "right"), ("eager", "right"), ("graph", "right"),
                    ("H2D B/launch", "right"), ("launch ms", "right"), ("graph saves ≤ ms", "right")],
                   caption="bytes inclusive of nested ranges, floor removed, summed over sampled GPUs; MB = 10^6 B; "
                           "± edges: how far interpolating the counters at the range's edges can be off; "
                           "eager/graph = launches made by the range's own thread; launch ms = launches x host cost "
                           f"per launch ({costs['source'] if costs else 'not measured'})")
        for r in rg.itertuples():
            short = f" [yellow]({r.short_calls} short)[/]" if r.short_calls else ""
            t.add_row(str(r.name) + short, str(r.domain), str(r.calls), _num(r.incl_ms, ",.2f"), _num(r.excl_ms, ",.2f"),
                      _pm(r.h2d_bytes / 1e6, r.h2d_edge_bytes / 1e6, ",.3f"), _num(r.d2h_bytes / 1e6, ",.3f"),
                      _num(r.eager_launches, ",.0f"),
                      _num(r.graph_launches, ",.0f"), _num(r.h2d_bytes_per_launch, ",.0f"),
                      _num(r.launch_overhead_ms, ",.2f"), _num(r.graph_savings_ms, ",.2f"))
        parts.append(t)
        if rg["short_calls"].sum():
            parts.append(Text(f"note: ranges marked short lasted less than two counter samples ({interval} ms sampling, "
                              "counters update every ~0.2 ms): their bytes are interpolated", style="yellow"))
    wr = results.get("whole_run", pd.DataFrame())
    if len(wr):
        w = wr.iloc[0]
        t = _table("Whole run", [("duration ms", "right"), ("H2D MB", "right"), ("D2H MB", "right"),
                                 ("eager launches", "right"), ("graph launches", "right"), ("processes", "right"),
                                 ("ranges", "right"), ("exit code", "right")])
        t.add_row(_num(w["duration_ms"], ",.1f"), _num(w["h2d_bytes"] / 1e6, ",.3f"), _num(w["d2h_bytes"] / 1e6, ",.3f"),
                  _num(w["eager_launches"], ",.0f"), _num(w["graph_launches"], ",.0f"), str(w["processes"]), str(w["ranges"]),
                  str(meta.get("exit_code")))
        parts.append(t)
    procs = meta.get("processes", [])
    if procs:
        t = _table("Processes followed", [("pid", "right"), ("NVTX", "left"), ("launch counting", "left"), ("ranges", "right")],
                   caption="processes that cleared their environment, or never called NVTX or CUDA, do not appear")
        for p in procs:
            t.add_row(str(p["pid"]), "yes" if p["nvtx"] else "no", p["cupti"], str(p["ranges"]))
        parts.append(t)
    if not len(rg):
        parts.append(Text("no NVTX ranges were seen: whole-run totals only. Wrap the phases you care about in "
                          "nvtx.annotate(...) / torch.cuda.nvtx.range(...) / nvtxRangePush(...) to see them per range.",
                          style="yellow"))
    return parts


RENDERERS: list[tuple[str, Callable[[pd.DataFrame], Table]]] = [
    ("floor", floor_table), ("calibration", calibration_table), ("per_launch", per_launch_table),
    ("per_node", per_node_table), ("by_duration", by_duration_table), ("cpu_cost", cpu_table),
]


def render(meta: dict[str, Any], results: dict[str, pd.DataFrame], console: Console) -> None:
    """Print every result table that has data, with a SIMULATED banner where it applies."""
    parts: list[Any] = []
    if meta.get("simulated"):
        parts.append(Panel(Text("SIMULATED — no GPU was used; figures come from a model of "
                                f"{meta.get('sim_source', 'a recorded real run')}", style="bold yellow")))
    if meta.get("status", "complete") != "complete":
        parts.append(Panel(Text(f"run status: {meta.get('status')} — tables show what was recorded", style="bold red")))
    parts.append(system_table(meta, results.get("sampling", pd.DataFrame())))
    if str(meta.get("kind", "")).startswith("attach"):
        parts.extend(attach_tables(meta, results))
    for key, fn in RENDERERS:
        if len(results.get(key, ())):
            parts.append(fn(results[key]))
    if len(results.get("gpu_time", ())) or len(results.get("speedup", ())):
        parts.append(speedup_table(results.get("gpu_time", pd.DataFrame()), results.get("speedup", pd.DataFrame())))
    if meta.get("topology"):
        parts.extend(topology_tables(meta["topology"]))
    if len(results.get("latency", ())):
        parts.append(latency_table(results["latency"]))
    if len(results.get("topology_model", ())):
        parts.append(model_table(results["topology_model"]))
    for part in parts:
        console.print(part)


def _unknown(v: Any) -> str:
    """A sysfs value for display, '?' where it is unknown."""
    return "?" if v is None else str(v)


def _id(v: Any) -> str:
    """A PCI id ("0x10de") without its "0x", '?' where it is unknown."""
    return v[2:] if isinstance(v, str) and v.startswith("0x") else "?"
