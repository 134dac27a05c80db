"""The console for ``pcietrace run`` (and ``latency``, a run of round trips only): bytes per launch, host and GPU
cost per launch, round trips, the topology model; :func:`layout` also lays out ``graphs``' console around its own
tables."""

from __future__ import annotations

from typing import Any, Callable

import pandas as pd
from rich.table import Table
from rich.text import Text

from pcietrace.analysis.launch import LANGUAGES
from pcietrace.analysis.compare import RUN_TO_RUN_PCT
from pcietrace.analysis.summary import DETAIL_GPUS, gpu_label
from pcietrace.analysis.timelines import TIMELINES
from pcietrace.report.console.cells import (DIR_LABEL, dedicated_or_generic, esc, generic_table, new_table, num, pm)
from pcietrace.report.console.system import head, system_table, topology_tables
from pcietrace.report.labels import LATENCY_LABELS


def floor_table(fl: pd.DataFrame) -> Table:
    t = new_table("Background floor (idle windows, subtracted from every window)",
                  [("GPU", "right"), ("H2D MB/s", "right"), ("D2H MB/s", "right"), ("windows", "right"),
                   ("reads/s", "right")],
                  caption="mean ± standard deviation over idle windows with the sampler running; MB = 10^6 B; includes "
                          "the traffic of the counter reads themselves")
    for r in fl.itertuples():
        t.add_row(gpu_label(r.nvml_index), pm(r.rx_Bps / 1e6, r.rx_Bps_std / 1e6, ".3f"),
                  pm(r.tx_Bps / 1e6, r.tx_Bps_std / 1e6, ".3f"), str(r.windows), num(r.reads_per_s))
    return t


def calibration_table(cal: pd.DataFrame) -> Table:
    t = new_table("Kernel duration calibration", [("GPU", "right"), ("asked us", "right"), ("median us", "right"),
                                                  ("min – max us", "right")],
                  caption="measured on the GPU's global timer inside the kernel")
    for r in cal.itertuples():
        t.add_row(gpu_label(r.nvml_index), num(r.kernel_us, "g"), num(r.measured_us, ".3f"),
                  f"{r.min_us:.3f} – {r.max_us:.3f}")
    return t


def per_launch_table(pl: pd.DataFrame) -> Table:
    t = new_table("PCIe bytes per launch (fit of net window bytes vs launch calls)",
                  [("GPU", "right"), ("mode", "left"), ("K", "right"), ("dir", "left"), ("B/call ±95%", "right"),
                   ("B/kernel", "right"), ("R²", "right"), ("n", "right"), ("resid", "right")],
                  caption="call = one cuLaunchKernel (eager) or one cuGraphLaunch of K kernels (graph); H2D = GPU RX, "
                          "D2H = GPU TX; bytes include TLP headers; resid = fit intercept in MB/s after floor "
                          "removal (ok = consistent with 0)")
    for r in pl.itertuples():
        check = "ok" if r.intercept_ok else f"[yellow]{num(r.intercept_Bps / 1e6, '+.3f')}[/]"  # (no fit: –)
        t.add_row(gpu_label(r.nvml_index), r.mode, str(r.graph_k), DIR_LABEL[r.direction], pm(r.bytes_per_call, r.ci95),
                  num(r.bytes_per_kernel, ",.1f"), num(r.r2, ".4f"), str(r.n), check)
    return t


def per_node_table(pn: pd.DataFrame) -> Table:
    t = new_table("Graph launch bytes = fixed + per node × K", [("GPU", "right"), ("dir", "left"),
                  ("fixed B ±95%", "right"), ("B/node ±95%", "right"), ("sizes", "right")],
                  caption="sizes: how many graph sizes K the fit used")
    for r in pn.itertuples():
        t.add_row(gpu_label(r.nvml_index), DIR_LABEL[r.direction], pm(r.fixed_bytes, r.fixed_ci95),
                  pm(r.per_node_bytes, r.per_node_ci95, ",.2f"), str(r.ks))
    return t


def by_duration_table(bd: pd.DataFrame) -> Table:
    t = new_table("Eager bytes per launch vs kernel duration (max rate, floor removed)",
                  [("GPU", "right"), ("kernel us", "right"), ("launches/s", "right"), ("H2D B/launch", "right"),
                   ("D2H B/launch", "right")])
    for r in bd.itertuples():
        t.add_row(gpu_label(r.nvml_index), num(r.kernel_us, "g"), num(r.achieved_rate_hz),
                  num(r.h2d_bytes_per_launch, ",.1f"), num(r.d2h_bytes_per_launch, ",.1f"))
    return t


def cpu_table(cc: pd.DataFrame) -> Table:
    t = new_table("Host cost per launch call", [("GPU", "right"), ("mode", "left"), ("K", "right"),
                  ("us/call", "right"), ("us/kernel", "right"), ("CPU us/call", "right")],
                  caption="launch loop while the GPU is blocked (the queue never fills, no call waits): wall time "
                          "and the thread's CPU time per call")
    for r in cc.itertuples():
        t.add_row(gpu_label(r.nvml_index), r.mode, str(r.graph_k), num(r.host_us_per_call, ".3f"),
                  num(r.host_us_per_kernel, ".3f"), num(r.cpu_us_per_call, ".3f"))
    return t


def speedup_table(gt: pd.DataFrame, sp: pd.DataFrame) -> Table:
    keys = ["nvml_index", "kernel_us"]
    merged = gt.merge(sp, on=keys, how="outer") if len(gt) and len(sp) else (gt if len(gt) else sp)
    k = int(sp["graph_k"].iloc[0]) if len(sp) else 0
    contexts = int("eager_contexts" in merged and bool((merged["eager_contexts"] > 1).any()))
    t = new_table(f"Eager vs CUDA graph (K={k}), us per kernel",
                  [("GPU", "right"), ("kernel", "right"), ("GPU eager", "right")]
                  + [("contexts", "right")] * contexts
                  + [("graph", "right"), ("×", "right"), ("wall eager", "right"), ("graph", "right"), ("×", "right")],
                  caption="GPU: queue kept full behind a blocker kernel (* = queue ran dry: upper bound); "
                          "wall: host launching as fast as it can, incl. final sync; × = eager / graph"
                          + ("; contexts: eager GPU time min–max over the CUDA contexts measured (each draws its own "
                             "level); GPU eager is their median" if contexts else ""))
    for r in merged.to_dict("records"):
        star = "*" if r.get("saturated") is False else ""
        n = r.get("eager_contexts")
        spread = f"{num(r['eager_gpu_us_min'], '.2f')}–{num(r['eager_gpu_us_max'], '.2f')}" if n is not None and n > 1 else ""
        t.add_row(gpu_label(r["nvml_index"]), num(r["kernel_us"], "g"), num(r.get("eager_gpu_us"), ".3f") + star,
                  *[spread] * contexts,
                  num(r.get("graph_gpu_us"), ".3f") + star, num(r.get("gpu_speedup"), ".2f", "×"),
                  num(r.get("eager_wall_us"), ".3f"), num(r.get("graph_wall_us"), ".3f"),
                  num(r.get("speedup"), ".2f", "×"))
    return t


def latency_table(lat: pd.DataFrame) -> Table:
    t = new_table("Latency", [("GPU", "right"), ("test", "left"), ("median us", "right"), ("95% CI", "right"),
                              ("p10 – p90 us", "right"), ("IQR %", "right"), ("n", "right")],
                  caption="chase tests: per dependent load; others: per operation, host-timed; CI = bootstrap of the "
                          "median")
    for r in lat.itertuples():
        test = esc(LATENCY_LABELS.get(r.test, r.test)) + ("" if r.peer < 0 else f" -> {gpu_label(r.peer)}")
        t.add_row(gpu_label(r.nvml_index), test, num(r.median_us, ".3f"), f"± {r.ci95_us:.3f}",
                  f"{r.p10_us:.3f} – {r.p90_us:.3f}", num(r.spread_pct, ".1f"), str(r.n))
    return t


def model_table(m: pd.DataFrame) -> Table:
    r0 = m.iloc[0]
    t = new_table("Topology model: what each added PCIe switch level would cost",
                  [("GPU", "right"), ("kernel us", "right"), ("levels", "right"), ("eager us", "right"),
                   ("+1 level", "right"), ("+2 levels", "right"), ("share/level", "right")],
                  caption=(f"eager us: GPU time per kernel, eager. Assumptions: an eager launch costs the GPU "
                           f"{r0.eager_extra_us:.3f} us more than a graph node (empty kernels, queue full) = "
                           f"{r0.rtts_per_launch:.2f} serialized host round trips of {r0.host_rtt_us:.3f} us (measured); "
                           f"each switch level adds {r0.us_per_level:g} us per round trip, so +{r0.added_us_per_level:.3f} "
                           "us per launch per level"))
    for r in m.itertuples():
        levels = "?" if r.switch_levels is None or pd.isna(r.switch_levels) else num(int(r.switch_levels), "d")
        t.add_row(gpu_label(r.nvml_index), num(r.kernel_us, "g"), levels, num(r.eager_gpu_us, ".3f"),
                  num(r.eager_gpu_us_plus1, ".3f"), num(r.eager_gpu_us_plus2, ".3f"),
                  num(r.share_per_level_pct, ".1f", " %"))
    return t


def language_table(lang: pd.DataFrame) -> Table:
    t = new_table("Host cost per eager launch, by what launches it",
                  [("GPU", "left"), ("from", "left"), ("us/launch", "right"), ("IQR %", "right"), ("CPU us", "right"),
                   ("+us vs C", "right"), ("× C", "right")],
                  caption="the same empty-kernel burst behind a blocker (queue never full), at the shortest kernel; IQR: "
                          "the spread of this run's bursts (separate runs of one machine differ more: `compare` allows "
                          f"{RUN_TO_RUN_PCT['host cost / eager launch']:g} % for host cost, from the lent VMs); from: "
                          + "; ".join(f"{p} = {name}" for p, name in LANGUAGES.items()))
    for r in lang.to_dict("records"):
        if r["saturated"]:
            dry = f" [dim]({r['dry_bursts']} of {r['bursts']} bursts ran dry, left out)[/]" if r.get("dry_bursts") else ""
        else:
            dry = f" [yellow]({r['dry_bursts']} of {r['bursts']} bursts ran dry: an upper bound)[/]"
        t.add_row(f"GPU{r['nvml_index']}", esc(r["path"]) + dry,
                  num(r["us_per_launch"], ".3f"), num(r["iqr_pct"], ".1f"), num(r["cpu_us_per_launch"], ".3f"),
                  num(r["extra_us_vs_native"], "+.3f"), num(r["ratio_vs_native"], ".2f", "×"))
    return t


def gpu_summary_table(gpus: pd.DataFrame) -> Table:
    """One row of key figures per GPU (the summary's ``gpus`` table); the model goes in the title when shared."""
    shared = gpus["name"].nunique() == 1
    cols = [("GPU", "right")] + ([] if shared else [("model", "left")]) + [
        ("PCIe", "left"), ("lvl", "right"), ("H2D B ±95%", "right"), ("D2H B", "right"), ("host us", "right"),
        ("saved us", "right"), ("×", "right")]
    t = new_table("Per GPU" + (f" ({esc(gpus['name'].iloc[0])})" if shared else ""), cols,
                  caption="per eager launch: H2D/D2H bytes and host time; saved us: GPU time per kernel a graph saves; "
                          "×: wall-time graph speedup at the shortest kernel; lvl: PCIe switch levels")
    for r in gpus.itertuples():
        levels = "?" if r.switch_levels is None or pd.isna(r.switch_levels) else str(int(r.switch_levels))
        t.add_row(r.gpu, *([] if shared else [esc(r.name)]), esc(r.link), levels,
                  pm(r.eager_h2d_bytes, r.eager_h2d_ci95), num(r.eager_d2h_bytes), num(r.host_us_per_launch, ".1f"),
                  num(r.gpu_saved_us_per_kernel, ".2f"), num(r.speedup_min_kernel, ".1f", "×"))
    return t


RENDERERS: list[tuple[str, Callable[[pd.DataFrame], Table]]] = [
    ("floor", floor_table), ("calibration", calibration_table), ("per_launch", per_launch_table),
    ("per_node", per_node_table), ("by_duration", by_duration_table), ("cpu_cost", cpu_table),
    ("host_cost_by_language", language_table),
]


#: Tables rendered elsewhere in :func:`render` or not meant for the console (per-instance rows: JSON/CSV; timelines:
#: plots and Perfetto).
HANDLED = {"sampling", "gpu_time", "speedup", "latency", "topology_model", "ranges", "range_instances", "whole_run",
           "whole_run_bounds", "fit_windows", "notes", "graphs", "per_gpu", "ranges_by_host", *TIMELINES}


def tables(results: dict[str, pd.DataFrame], skip: tuple[str, ...] = ()) -> list[Any]:
    """Every table of :data:`RENDERERS` that has rows (but those in ``skip``), the speedup table, then any table
    no renderer knows, as it is."""
    parts: list[Any] = []
    for key, fn in RENDERERS:
        if key not in skip and len(results.get(key, ())):
            parts.append(dedicated_or_generic(key, fn, results[key]))
    if len(results.get("gpu_time", ())) or len(results.get("speedup", ())):
        parts.append(speedup_table(results.get("gpu_time", pd.DataFrame()), results.get("speedup", pd.DataFrame())))
    for key, df in results.items():  # tables added later (other commands) still show
        if key not in HANDLED and key not in dict(RENDERERS) and len(df):
            parts.append(generic_table(key, df))
    return parts


def round_trip_tables(results: dict[str, pd.DataFrame]) -> list[Any]:
    """The latency table and the topology model, where they have rows."""
    parts: list[Any] = []
    if len(results.get("latency", ())):
        parts.append(latency_table(results["latency"]))
    if len(results.get("topology_model", ())):
        parts.append(model_table(results["topology_model"]))
    return parts


def layout(meta: dict[str, Any], results: dict[str, pd.DataFrame], summary: dict[str, Any] | None, detail: bool,
           own: Callable[[dict[str, Any], dict[str, pd.DataFrame]], list[Any]] | None = None) -> list[Any]:
    """:func:`head`, the system, then (with more than :data:`DETAIL_GPUS` GPUs, only with ``detail``) the
    command's ``own`` tables, :func:`tables`, the topology and :func:`round_trip_tables`; else the summary's row
    per GPU."""
    parts = head(meta, summary) + [system_table(meta, results.get("sampling", pd.DataFrame()))]
    if len(meta.get("gpus", [])) > DETAIL_GPUS and not detail:
        if summary is not None and len(summary.get("gpus", ())):
            parts.append(gpu_summary_table(summary["gpus"]))
        parts.append(Text(f"{len(meta['gpus'])} GPUs: per-GPU detail tables with --detail (always in the saved "
                          "report and in --format json/csv/md)", style="dim"))
        return parts
    parts += (own(meta, results) if own else []) + tables(results)
    if meta.get("topology"):
        parts.extend(topology_tables(meta["topology"]))
    return parts + round_trip_tables(results)


def parts(meta: dict[str, Any], results: dict[str, pd.DataFrame], summary: dict[str, Any] | None = None,
          detail: bool = False, view: Any = None) -> list[Any]:
    """A run's console: :func:`layout` with no tables of its own."""
    return layout(meta, results, summary, detail)
