"""The console for ``pcietrace attach`` (and ``merge``, whose report is an attach's over several nodes): the
floor model, per-range bytes and launches for the ranges a :class:`RangeView` picks, the whole run, processes and
notes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
from rich.table import Table
from rich.text import Text

from pcietrace.analysis import names
from pcietrace.analysis.floor import STATE_MIN_SHARE
from pcietrace.report.console import run
from pcietrace.report.console.cells import (domain_mark, esc, gpu_list, ms_cell, new_table, node_gpu, num, pm,
                                            pm_lines, stated_err)
from pcietrace.report.console.system import head, system_table, topology_tables
from pcietrace.report.notes import with_sentences
from pcietrace.text import shortened


@dataclass(frozen=True)
class RangeView:
    """Which of attach's ranges the console shows (``--top``, ``--all``, ``--sort``, ``--filter``): the first
    ``top`` (None: all) by ``sort`` whose name matches ``pattern``; ``group_by`` only names how they were grouped;
    ``fit_lines``: fewer than ``top`` (down to :data:`MIN_TOP`) where the whole report would run past that many
    lines (None: ``top`` as given)."""

    top: int | None = names.DEFAULT_TOP
    sort: str = names.DEFAULT_SORT
    pattern: str | None = None
    group_by: str = names.DEFAULT_GROUP_BY
    fit_lines: int | None = None


#: A screen: the lines a report keeps within where the user chose no --top (many GPUs, processes or notes take
#: lines the ranges then give up).
SCREEN_LINES = 120
#: The fewest ranges a report fitted to a screen shows, and the lines each takes at most (two in the bytes table
#: with its marks, one in the launches table): the steps it gives up lines in.
MIN_TOP, LINES_PER_RANGE = 5, 3


#: Nesting shown by indenting a range's name this many spaces per level, up to MAX_INDENT levels (deeper ones
#: stand at that level: the name column stays narrow enough for 80 columns).
INDENT, MAX_INDENT = 2, 4


def attach_floor_table(fl: pd.DataFrame) -> Table:
    """Attach's floor model per GPU (:func:`pcietrace.analysis.floor.floor_model`)."""
    t = new_table("Background floor per GPU", [("GPU", "left"), ("fit", "left"), ("reads/s\nin ranges", "right"),
                                               ("H2D B/read", "right"), ("D2H B/read", "right"),
                                               ("± B/read\nH2D / D2H", "right"), ("other MB/s\nH2D / D2H", "right")],
                  caption="NVML reads are PCIe traffic: a range's floor = B/read x the sampler's reads in it (at "
                          "most one per sampling interval, however dense the ranges) + other MB/s x its time, fitted "
                          "on idle windows before and after the program; ± B/read: its spread in the program "
                          f"(95 %; busy reads >= {STATE_MIN_SHARE['h2d'] * 100:.0f} / "
                          f"{STATE_MIN_SHARE['d2h'] * 100:.0f} %), in each range's ± error")
    for r in fl.to_dict("records"):
        if r["status"] == "no floor":
            t.add_row(node_gpu(r), "[red]no floor[/]", *["–"] * 5)
            continue
        state = f"{num(r['h2d_state_bytes_per_read'])} / {num(r['d2h_state_bytes_per_read'])}"
        t.add_row(node_gpu(r), r["status"], num(r.get("reads_per_s_program")), num(r["h2d_bytes_per_read_program"]),
                  num(r["d2h_bytes_per_read_program"]), state,
                  f"{num(r['h2d_background_Bps'] / 1e6, '.2f')} / {num(r['d2h_background_Bps'] / 1e6, '.2f')}")
    return t


def attach_tables(meta: dict[str, Any], results: dict[str, pd.DataFrame], view: RangeView | None = None,
                  floor: bool = True) -> list[Any]:
    """The floor table (``floor``), per-range tables (bytes and time; launches and costs) for the ranges ``view``
    picks, a line saying what it left out, whole-run line, processes, and notes."""
    view = view or RangeView()
    results = with_sentences(results)
    parts: list[Any] = []
    costs = meta.get("launch_costs")
    all_ranges = results.get("ranges", pd.DataFrame())
    rg, shown = (names.select(all_ranges, view.sort, view.top, view.pattern) if len(all_ranges)
                 else (all_ranges, {"ranges": 0, "names": 0, "matched": 0, "shown": 0}))
    interval = meta.get("sample_interval_ms")
    if floor and len(results.get("floor", ())):
        parts.append(attach_floor_table(results["floor"]))
    if len(rg):
        domains = all_ranges["domain"].astype(str).unique()
        one_domain = len(domains) == 1

        def name(r: Any, marked: bool = True) -> str:  # the marks on a line of their own, so they never break the name
            marks = ([f"{r.short_calls:,} short"] if r.short_calls else []) \
                + ([f"{r.stalls} stall{'s' * (r.stalls != 1)}"] if getattr(r, "stalls", 0) else []) \
                + ([f"{r.unknown_calls:,} {r.status}"] if partly(r) else []) \
                + ([f"{n:,} elsewhere"] if (n := elsewhere(r)) else [])
            pad = " " * INDENT * min(int(getattr(r, "indent", 0) or 0), MAX_INDENT)
            return pad + esc(shortened(r.name)) + domain_mark(r.domain, one_domain) + (
                f"\n[yellow]({', '.join(marks)})[/]" if marks and marked else "")

        def elsewhere(r: Any) -> int:  # an indented range's calls not in its parent's (its totals hold them too)
            placed = getattr(r, "parent_calls", None)
            return 0 if not getattr(r, "indent", 0) or pd.isna(placed) else int(r.calls - placed)

        def partly(r: Any) -> bool:  # a long run's few calls over a stall that could hide a wrap: the rest measured
            return getattr(r, "status", "ok") == "wrap risk" and 0 < getattr(r, "unknown_calls", 0) < r.calls

        def mb(r: Any, d: str, edge: bool) -> str:
            if partly(r):  # the least its calls moved: those measured (never a silent number for the others)
                return f"[yellow]≥ {num(getattr(r, f'{d}_measured_bytes') / 1e6, ',.3f')}[/]"
            if getattr(r, "status", "ok") != "ok":  # no floor / no data / wrap risk: never a silent number
                return f"[red]{r.status}[/]"
            v = getattr(r, f"{d}_bytes") / 1e6
            return pm_lines(v, stated_err(r, d) / 1e6, ",.3f") if edge else num(v, ",.3f")  # narrow: ± below

        # one GPU list on every row (one GPU, or each range on every rank's GPU): its label in the title, where a
        # column of one value would cost the names room (a deeply nested emit_nvtx name split at 80 columns)
        shown_gpus = set(rg["gpus"].map(gpu_list)) if "gpus" in rg else set()
        if len(meta.get("gpus", [])) == 1:
            label = f"GPU{meta['gpus'][0].get('nvml_index', 0)}"
        else:
            label = f"GPUs {next(iter(shown_gpus))}" if len(shown_gpus) == 1 and "" not in shown_gpus else ""
        one_gpu = bool(label)
        where = [f"domain {domains[0]}"] * one_domain + [label] * one_gpu
        t = new_table("PCIe bytes per NVTX range" + (esc(f" ({', '.join(where)})") if where else ""),
                      [("range", "left")] + [("GPUs", "left")] * (not one_gpu) + [("calls", "right"), ("incl\nms", "right"),
                       ("excl\nms", "right"), ("H2D MB\n± error", "right"), ("D2H\nMB", "right")],
                      caption="totals over calls, nested ranges included, floor removed, on the range's own GPUs; "
                              "MB = 10^6 B; ± error: the edges' worst case + the floor's 95 % interval"
                              + ("; indented: under the range its calls most often sit in, its totals over all its "
                                 "calls (N elsewhere: N of them sit outside that range)"
                                 if (rg.get("level", pd.Series(dtype=float)) > 0).any() else ""))
        for r in rg.itertuples():
            t.add_row(name(r), *[gpu_list(getattr(r, "gpus", ""))] * (not one_gpu), num(r.calls), ms_cell(r.incl_ms),
                      ms_cell(r.excl_ms), mb(r, "h2d", True), mb(r, "d2h", False))
        parts.append(t)
        busy = "gpu_busy_ms" in rg and rg["gpu_busy_ms"].notna().any()
        capt = "captured_launches" in rg and (rg["captured_launches"] > 0).any()  # (shown where any range captured)
        t = new_table("Launches per NVTX range", [("range", "left"), ("eager", "right"), ("graph", "right")]
                      + ([("captured", "right")] if capt else []) + [
                      ("H2D\nB/launch", "right"), ("launch\nms", "right")] + ([("GPU busy\nms", "right")] if busy else [])
                      + [("graphs\nsave ≤ ms", "right")],
                      caption="totals over calls, by the range's thread and by threads with no range open (autograd)"
                              + ("; captured: into a stream being captured (graph nodes: nothing ran)" if capt else "")
                              + "; launch ms = launches x host cost per launch "
                              f"({esc(costs['source']) if costs else 'not measured'}); graphs save: "
                              + ("its time less its kernels' GPU time in a graph" if busy else
                                 "per eager launch, its time per launch less a graph kernel's"))
        for r in rg.itertuples():  # (the marks once, in the bytes table above)
            t.add_row(name(r, marked=False), num(r.eager_launches, ",.0f"), num(r.graph_launches, ",.0f"),
                      *([num(r.captured_launches, ",.0f")] if capt else []),
                      num(r.h2d_bytes_per_launch, ",.0f"), num(r.launch_overhead_ms, ",.2f"),
                      *([num(r.gpu_busy_ms, ",.2f")] if busy else []), num(r.graph_savings_ms, ",.2f"))
        parts.append(t)
        left = shown["ranges"] - shown["shown"]
        if left or shown["names"] > shown["ranges"]:
            parts.append(Text(
                f"{shown['shown']:,} of {shown['ranges']:,} ranges"
                + (f" ({shown['names']:,} names grouped by {view.group_by})" if shown["names"] > shown["ranges"] else "")
                + (f", {shown['matched']:,} matching {view.pattern!r}" if view.pattern else "")
                + (f", the first by {names.SORT_LABELS[view.sort]}" if view.top is not None and shown["matched"] > view.top
                   else "")
                + (": --top N, --all, --sort, --filter REGEX, --group-by; --format json/csv hold every range and call"
                   if left else ": --group-by name for every name"),
                style="dim"))
        marked = [f"short: under two counter samples ({interval} ms sampling), bytes interpolated"] * bool(
            rg["short_calls"].sum()) + ["stalls: over sampling gaps > 4 counter updates, wider edge errors (in ± error)"] * \
            bool("stalls" in rg and rg["stalls"].sum())
        marked += ["wrap risk: over a sampling gap that could hide a counter wrap, bytes unknown (≥: the other calls' "
                   "total, the least the range moved)"] * any(partly(r) for r in rg.itertuples())
        if marked:
            parts.append(Text("note: calls marked " + "; ".join(marked), style="yellow"))
    if len(results.get("ranges_by_host", ())):
        parts.append(ranges_by_host_table(results["ranges_by_host"]))
    wr = results.get("whole_run", pd.DataFrame())
    if len(wr):
        bounds = results.get("whole_run_bounds", pd.DataFrame())
        # the program's figures, alike on every GPU's row (one program, or a merge's nodes alike): said once below
        apart = [c for c in ("processes", "ranges") if c in wr and wr[c].nunique(dropna=False) > 1]
        n = wr["processes"].iloc[0] if "processes" in wr else None
        program = [f"{num(n, '.0f')} process{'' if n == 1 else 'es'} followed"] * ("processes" not in apart) \
            + [f"{num(wr['ranges'].iloc[0], ',.0f')} ranges"] * ("ranges" not in apart) \
            + [f"exit code {'unknown' if meta.get('exit_code') is None else esc(meta.get('exit_code'))}"]
        t = new_table("Whole run", [("GPU", "right"), ("ms", "right"), ("H2D MB", "right"), ("D2H MB", "right"),
                                    ("eager", "right"), ("graph", "right")]
                      + [("procs", "right")] * ("processes" in apart) + [("ranges", "right")] * ("ranges" in apart),
                      caption="per sampled GPU: its bytes (± the floor's 95 % interval, which outweighs the edges' over "
                              "a whole run" + ("; ≥: the least it moved, where a sampling gap could hide a counter wrap, "
                                               "see the note" if len(bounds) else "")
                              + ") and the kernel launches made on it (eager/graph)"
                              + "; procs (processes followed) and ranges: the node's" * bool(apart)
                              + "; the program: " + ", ".join(program))
        seen = bounds.set_index("nvml_index") if len(bounds) else pd.DataFrame()
        for w in wr.to_dict("records"):
            ok = w.get("status", "ok") == "ok"
            bad = f"[red]{w.get('status')}[/]"
            if not ok and w.get("nvml_index") in seen.index:  # the least it moved, a wrap could hide more
                b = seen.loc[w["nvml_index"]]
                bad = {d: f"[yellow]≥ {num(max(b[f'{d}_seen_bytes'], 0) / 1e6, ',.1f')}[/]" for d in ("h2d", "d2h")}
            t.add_row(node_gpu(w) if "nvml_index" in w else "all", num(w["duration_ms"], ",.1f"),
                      pm(w["h2d_bytes"] / 1e6, w["h2d_floor_err_bytes"] / 1e6, ",.1f") if ok
                      else bad["h2d"] if isinstance(bad, dict) else bad,
                      pm(w["d2h_bytes"] / 1e6, w["d2h_floor_err_bytes"] / 1e6, ",.1f") if ok
                      else bad["d2h"] if isinstance(bad, dict) else bad,
                      num(w["eager_launches"], ",.0f"), num(w["graph_launches"], ",.0f"),
                      *[num(w["processes"], ".0f")] * ("processes" in apart),
                      *[num(w["ranges"], ",.0f")] * ("ranges" in apart))
        parts.append(t)
    notes = results.get("notes", pd.DataFrame())
    for note in notes["note"] if "note" in notes else []:  # an attach run with no samples has an empty, column-less table
        parts.append(Text("note: " + note, style="yellow"))
    procs = meta.get("processes", [])
    plain = len(procs) == 1 and procs[0]["nvtx"] and not procs[0].get("trace_full") and "node" not in procs[0]
    if plain:  # one process that used NVTX: a line, not a table
        p = procs[0]
        parts.append(Text(f"process followed: pid {p['pid']}, {p['ranges']:,} ranges, {p['cupti']}{edge_cost(p)}",
                          style="dim"))
    elif procs:
        nodes = any("node" in p for p in procs)  # (a merged report: several nodes' processes)
        timed = any("edges_ms" in p for p in procs)  # (recordings of a library that timed its edges)
        counting = {p["cupti"] for p in procs}  # (one way for every process: said once, below)
        t = new_table("Processes followed", [("node", "left")] * nodes + [("pid", "right"), ("NVTX", "left")]
                      + [("launch counting", "left")] * (len(counting) > 1) + [("ranges", "right")]
                      + [("edges cost\nms", "right")] * timed,
                      caption="processes that cleared their environment, or never called NVTX or CUDA, do not appear"
                              + "; edges cost: the least the process's NVTX range edges cost its threads (the time "
                                "inside attach's library, one edge in 61 timed)" * timed
                              + (f"; every one: {esc(next(iter(counting)))}" if len(counting) == 1 else ""))
        for p in procs:
            t.add_row(*[esc(p.get("node"))] * nodes, str(p["pid"]), "yes" if p["nvtx"] else "no",
                      *[esc(p["cupti"])] * (len(counting) > 1), f"{p['ranges']:,}",
                      *[num(p.get("edges_ms"), ",.1f")] * timed)
        parts.append(t)
    if len(all_ranges) and not len(rg):  # (ranges were seen: the filter left none)
        parts.append(Text(f"no range's name matches --filter {view.pattern!r} ({shown['ranges']:,} ranges in all, "
                          f"names grouped by {view.group_by}): --filter REGEX searches the names as shown",
                          style="yellow"))
    if not len(all_ranges):
        parts.append(Text("no NVTX ranges were seen: whole-run totals only. Wrap the phases you care about in "
                          "nvtx.annotate(...) / torch.cuda.nvtx.range(...) / nvtxRangePush(...) to see them per range.",
                          style="yellow"))
    return parts


def edge_cost(process: dict[str, Any]) -> str:
    """What a process's NVTX range edges cost its threads (:func:`pcietrace.record.attach.processes`), as a
    clause of the process line ("" where its library did not time them)."""
    if any(process.get(k) is None for k in ("edges", "edges_ms", "edge_ns")):
        return ""
    return (f"; its {process['edges']:,} range edges took at least {process['edges_ms']:,.1f} ms of its threads "
            f"({process['edge_ns']:,.0f} ns each inside attach's library)")


def ranges_by_host_table(rh: pd.DataFrame) -> Table:
    """A merged report's ranges on each node (the ranges table sums them over the nodes)."""
    t = new_table("PCIe bytes per NVTX range and node", [("range", "left"), ("node", "left"), ("host", "left"),
                                                        ("calls", "right"), ("incl\nms", "right"),
                                                        ("H2D MB\n± error", "right"), ("D2H\nMB", "right")],
                  caption="each node's own figures, as in the table above; MB = 10^6 B")
    for r in rh.sort_values(["domain", "name"], kind="stable").itertuples():
        ok = getattr(r, "status", "ok") == "ok"
        t.add_row(esc(shortened(r.name)), esc(r.node), esc(r.host), str(r.calls), num(r.incl_ms, ",.2f"),
                  pm(r.h2d_bytes / 1e6, stated_err(r, "h2d") / 1e6, ",.3f") if ok else f"[red]{r.status}[/]",
                  num(r.d2h_bytes / 1e6, ",.3f") if ok else f"[red]{r.status}[/]")
    return t


def parts(meta: dict[str, Any], results: dict[str, pd.DataFrame], summary: dict[str, Any] | None = None,
          detail: bool = False, view: RangeView | None = None) -> list[Any]:
    """:func:`head`, the system, :func:`attach_tables`, the run's other tables that have rows (not its floor:
    attach's floor model has its own table), the topology with ``detail`` and the round trips. With more GPUs
    than the summary's detail limit, the system and the floor are its two sentences (``gpu_lines``) unless
    ``detail``."""
    gpu_lines = [] if detail else (summary or {}).get("gpu_lines") or []
    parts = head(meta, summary)
    parts += [Text(line) for line in gpu_lines] + [
        Text("Per GPU (bus ids, read rates, each read's cost and spread): --detail", style="dim"), Text("")] \
        if gpu_lines else [system_table(meta, results.get("sampling", pd.DataFrame()))]
    parts += attach_tables(meta, results, view, floor=not gpu_lines) + run.tables(results, skip=("floor",))
    if meta.get("topology") and detail:
        parts.extend(topology_tables(meta["topology"]))
    elif meta.get("topology"):
        parts.append(Text("PCIe placement and the GPU <-> GPU matrix: --detail (or `pcietrace topo`)", style="dim"))
    return parts + run.round_trip_tables(results)
