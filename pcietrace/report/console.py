"""Rich tables for a run's results (see :func:`pcietrace.analysis.analyze` for the columns).

Readable at 80 columns: number cells never wrap or get cut (``no_wrap`` numeric columns, short headers,
GPU labels instead of bus ids, long text under the table rather than in it); only text cells (names)
wrap. Text from outside (range names, GPU names, sysfs strings, paths, commands) goes through
:func:`esc` before rich sees it, so ``loss[/total]`` prints as written instead of being read as markup.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pandas as pd
from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from pcietrace.analysis import names
from pcietrace.analysis.compare import RUN_TO_RUN_PCT
from pcietrace.analysis.launch import LANGUAGES
from pcietrace.analysis.summary import DETAIL_GPUS, gpu_label, link_label, merge_gpu_notes, short_name
from pcietrace.text import clean

DIR_LABEL = {"h2d": "H2D", "d2h": "D2H"}


def esc(x: Any) -> str:
    """Outside text made safe for rich markup (the one place that escapes)."""
    return escape(str(x))


def _num(x: Any, fmt: str = ",.0f", unit: str = "") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)) or x is pd.NA:
        return "–"
    return f"{x:{fmt}}{unit}"


def _ms(x: Any) -> str:
    """Milliseconds to 0.01 ms, to 0.1 ms from a second up (the column stays narrow at 80)."""
    return _num(x, ",.1f" if x is not None and not pd.isna(x) and abs(x) >= 1e3 else ",.2f")


def _stated_err(r: Any, d: str) -> float:
    """A range's stated error in bytes: its edges' worst case plus the floor's 95 % half-width (the edges
    alone where the floor has no error estimate)."""
    floor_err = getattr(r, f"{d}_floor_err_bytes", math.nan)
    return getattr(r, f"{d}_edge_bytes") + (0.0 if pd.isna(floor_err) else floor_err)


def _pm(x: Any, ci: Any, fmt: str = ",.0f") -> str:
    if ci is None or (isinstance(ci, float) and math.isnan(ci)):
        return _num(x, fmt)
    return f"{x:{fmt}} ± {ci:{fmt}}"


class WordTable(Table):
    """A rich table that never splits a word while the words fit the terminal.

    rich narrows text columns below their longest word and then folds the word (``ncclCommIn`` / ``itRankConf``);
    here a text column shrinks only to its longest word (header included), so text wraps at spaces alone.
    Only where even those widths overflow does rich's own (folding) layout apply. The title and caption span the
    terminal, not the table (a narrow table no longer wraps its caption into a column), and a blank line
    follows, so that piped output never runs one table's caption into the next one's title."""

    def _calculate_column_widths(self, console: Console, options: ConsoleOptions) -> list[int]:
        ranges = [self._measure_column(console, options, c) for c in self.columns]
        widest = np.array([r.maximum or 1 for r in ranges])
        least = np.array([r.maximum if c.no_wrap else max(r.minimum, 1) for r, c in zip(ranges, self.columns)])
        if widest.sum() <= options.max_width:
            return widest.tolist()
        if least.sum() > options.max_width:
            return super()._calculate_column_widths(console, options)
        # water-fill: the highest common cap on the wide columns that still fits, each column held at its least
        caps = np.arange(int(widest.max()) + 1)
        totals = np.maximum(least[None, :], np.minimum(widest[None, :], caps[:, None])).sum(axis=1)
        cap = caps[totals <= options.max_width].max()
        return np.maximum(least, np.minimum(widest, cap)).tolist()

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        bare = copy.copy(self)
        bare.title = bare.caption = None
        if self.title:
            yield console.render_str(self.title, style=self.title_style or "table.title", highlight=False) \
                if isinstance(self.title, str) else self.title
        yield from Table.__rich_console__(bare, console, options)
        if self.caption:
            yield console.render_str(self.caption, style=self.caption_style or "table.caption", highlight=False) \
                if isinstance(self.caption, str) else self.caption
        yield Text("")


def _table(title: str, columns: list[tuple[str, str]], caption: str | None = None) -> Table:
    """Right-justified columns hold numbers: they never wrap (the text columns wrap instead, at spaces: see
    :class:`WordTable`)."""
    t = WordTable(title=title, caption=caption, box=box.SIMPLE_HEAD, title_justify="left", caption_justify="left",
              title_style="bold", caption_style="dim", pad_edge=False, collapse_padding=True)
    for name, justify in columns:
        t.add_column(name, justify=justify, no_wrap=justify != "left",  # type: ignore[arg-type]
                     overflow="fold" if justify == "left" else "ellipsis")
    return t


def system_table(meta: dict[str, Any], sampling: pd.DataFrame) -> Table:
    pinned = any(g.get("timing_cpu") is not None for g in meta.get("gpus", []))  # runs since timed steps took turns
    resets = "counter_jumps" in sampling and bool(sampling["counter_jumps"].any())
    t = _table("System", [("GPU", "right"), ("model", "left"), ("bus id", "right"), ("PCIe", "left"),
                          ("counter", "left"), ("reads/s", "right"), ("gap ms", "right")]
               + ([("timing CPU", "right")] if pinned else []),
               caption=esc(f"driver {meta.get('driver', '?')}, host {meta.get('host', '?')}, {meta.get('created', '')}; "
                           "counter: NVML fields 197/198 (32-bit, wrapping) or the 20 ms throughput API (LOW RES); "
                           + ("reset(s): steps no link could move, the bytes across them unknown (windows left out, "
                              "ranges 'wrap risk'); " if resets else "")
                           + "gap: median time between background samples"
                           + ("; timing CPU: the core that timed the GPU's host loops, one GPU at a time (beside "
                              "others: its turn did not come in time, so its timed figures may have shifted)" if pinned else "")))
    keys = ["node", "nvml_index"] if "node" in sampling else ["nvml_index"]  # (a merged report: GPUs of several nodes)
    smp = sampling.set_index(keys) if len(sampling) else None
    for g in meta.get("gpus", []):
        c = g.get("counter", {})
        src = f"{c.get('bits', 32)}-bit" if c.get("mode") == "fields" else "[yellow]LOW RES[/]"
        key = tuple(g.get(k) for k in keys) if len(keys) > 1 else g["nvml_index"]
        row = smp.loc[key] if smp is not None and key in smp.index else None
        jumps = int(row.get("counter_jumps", 0)) if row is not None else 0
        src += f" [yellow]{jumps} reset(s)[/]" if jumps else ""
        t.add_row(node_gpu(g), esc(short_name(g.get("name"))), esc(g.get("bus_id", "?")),
                  esc(link_label(g)), src, _num(row["rate_hz"] if row is not None else None),
                  _num(row["median_gap_us"] / 1e3 if row is not None else None, ".1f"),
                  *([_num(g.get("timing_cpu")) + (" [yellow](beside others)[/]" if g.get("timed_beside_others") else "")]
                    if pinned else []))
    return t


def floor_table(fl: pd.DataFrame) -> Table:
    t = _table("Background floor (idle windows, subtracted from every window)",
               [("GPU", "right"), ("H2D MB/s", "right"), ("D2H MB/s", "right"), ("windows", "right"),
                ("reads/s", "right")],
               caption="mean ± standard deviation over idle windows with the sampler running; MB = 10^6 B; includes "
                       "the traffic of the counter reads themselves")
    for r in fl.itertuples():
        t.add_row(gpu_label(r.nvml_index), _pm(r.rx_Bps / 1e6, r.rx_Bps_std / 1e6, ".3f"),
                  _pm(r.tx_Bps / 1e6, r.tx_Bps_std / 1e6, ".3f"), str(r.windows), _num(r.reads_per_s))
    return t


def calibration_table(cal: pd.DataFrame) -> Table:
    t = _table("Kernel duration calibration", [("GPU", "right"), ("asked us", "right"), ("median us", "right"),
                                               ("min – max us", "right")],
               caption="measured on the GPU's global timer inside the kernel")
    for r in cal.itertuples():
        t.add_row(gpu_label(r.nvml_index), _num(r.kernel_us, "g"), _num(r.measured_us, ".3f"),
                  f"{r.min_us:.3f} – {r.max_us:.3f}")
    return t


def per_launch_table(pl: pd.DataFrame) -> Table:
    t = _table("PCIe bytes per launch (fit of net window bytes vs launch calls)",
               [("GPU", "right"), ("mode", "left"), ("K", "right"), ("dir", "left"), ("B/call ±95%", "right"),
                ("B/kernel", "right"), ("R²", "right"), ("n", "right"), ("resid", "right")],
               caption="call = one cuLaunchKernel (eager) or one cuGraphLaunch of K kernels (graph); H2D = GPU RX, "
                       "D2H = GPU TX; bytes include TLP headers; resid = fit intercept in MB/s after floor "
                       "removal (ok = consistent with 0)")
    for r in pl.itertuples():
        check = "ok" if r.intercept_ok else f"[yellow]{r.intercept_Bps / 1e6:+.3f}[/]"
        t.add_row(gpu_label(r.nvml_index), r.mode, str(r.graph_k), DIR_LABEL[r.direction], _pm(r.bytes_per_call, r.ci95),
                  _num(r.bytes_per_kernel, ",.1f"), _num(r.r2, ".4f"), str(r.n), check)
    return t


def per_node_table(pn: pd.DataFrame) -> Table:
    t = _table("Graph launch bytes = fixed + per node × K", [("GPU", "right"), ("dir", "left"),
               ("fixed B ±95%", "right"), ("B/node ±95%", "right"), ("sizes", "right")],
               caption="sizes: how many graph sizes K the fit used")
    for r in pn.itertuples():
        t.add_row(gpu_label(r.nvml_index), DIR_LABEL[r.direction], _pm(r.fixed_bytes, r.fixed_ci95),
                  _pm(r.per_node_bytes, r.per_node_ci95, ",.2f"), str(r.ks))
    return t


def by_duration_table(bd: pd.DataFrame) -> Table:
    t = _table("Eager bytes per launch vs kernel duration (max rate, floor removed)",
               [("GPU", "right"), ("kernel us", "right"), ("launches/s", "right"), ("H2D B/launch", "right"),
                ("D2H B/launch", "right")])
    for r in bd.itertuples():
        t.add_row(gpu_label(r.nvml_index), _num(r.kernel_us, "g"), _num(r.achieved_rate_hz),
                  _num(r.h2d_bytes_per_launch, ",.1f"), _num(r.d2h_bytes_per_launch, ",.1f"))
    return t


def cpu_table(cc: pd.DataFrame) -> Table:
    t = _table("Host cost per launch call", [("GPU", "right"), ("mode", "left"), ("K", "right"),
               ("us/call", "right"), ("us/kernel", "right"), ("CPU us/call", "right")],
               caption="launch loop while the GPU is blocked (the queue never fills, no call waits): wall time "
                       "and the thread's CPU time per call")
    for r in cc.itertuples():
        t.add_row(gpu_label(r.nvml_index), r.mode, str(r.graph_k), _num(r.host_us_per_call, ".3f"),
                  _num(r.host_us_per_kernel, ".3f"), _num(r.cpu_us_per_call, ".3f"))
    return t


def speedup_table(gt: pd.DataFrame, sp: pd.DataFrame) -> Table:
    keys = ["nvml_index", "kernel_us"]
    merged = gt.merge(sp, on=keys, how="outer") if len(gt) and len(sp) else (gt if len(gt) else sp)
    k = int(sp["graph_k"].iloc[0]) if len(sp) else 0
    contexts = int("eager_contexts" in merged and bool((merged["eager_contexts"] > 1).any()))
    t = _table(f"Eager vs CUDA graph (K={k}), us per kernel",
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
        spread = f"{_num(r['eager_gpu_us_min'], '.2f')}–{_num(r['eager_gpu_us_max'], '.2f')}" if n is not None and n > 1 else ""
        t.add_row(gpu_label(r["nvml_index"]), _num(r["kernel_us"], "g"), _num(r.get("eager_gpu_us"), ".3f") + star,
                  *[spread] * contexts,
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
    t = _table("Latency", [("GPU", "right"), ("test", "left"), ("median us", "right"), ("95% CI", "right"),
                           ("p10 – p90 us", "right"), ("IQR %", "right"), ("n", "right")],
               caption="chase tests: per dependent load; others: per operation, host-timed; CI = bootstrap of the "
                       "median")
    for r in lat.itertuples():
        test = esc(LATENCY_LABELS.get(r.test, r.test)) + ("" if r.peer < 0 else f" -> {gpu_label(r.peer)}")
        t.add_row(gpu_label(r.nvml_index), test, _num(r.median_us, ".3f"), f"± {r.ci95_us:.3f}",
                  f"{r.p10_us:.3f} – {r.p90_us:.3f}", _num(r.spread_pct, ".1f"), str(r.n))
    return t


def model_table(m: pd.DataFrame) -> Table:
    r0 = m.iloc[0]
    t = _table("Topology model: what each added PCIe switch level would cost",
               [("GPU", "right"), ("kernel us", "right"), ("levels", "right"), ("eager us", "right"),
                ("+1 level", "right"), ("+2 levels", "right"), ("share/level", "right")],
               caption=(f"eager us: GPU time per kernel, eager. Assumptions: an eager launch costs the GPU "
                        f"{r0.eager_extra_us:.3f} us more than a graph node (empty kernels, queue full) = "
                        f"{r0.rtts_per_launch:.2f} serialized host round trips of {r0.host_rtt_us:.3f} us (measured); "
                        f"each switch level adds {r0.us_per_level:g} us per round trip, so +{r0.added_us_per_level:.3f} "
                        "us per launch per level"))
    for r in m.itertuples():
        levels = "?" if r.switch_levels is None or pd.isna(r.switch_levels) else _num(int(r.switch_levels), "d")
        t.add_row(gpu_label(r.nvml_index), _num(r.kernel_us, "g"), levels, _num(r.eager_gpu_us, ".3f"),
                  _num(r.eager_gpu_us_plus1, ".3f"), _num(r.eager_gpu_us_plus2, ".3f"),
                  _num(r.share_per_level_pct, ".1f", " %"))
    return t


def _hop(h: dict[str, Any]) -> str:
    link = f" {h['link_speed'].replace(' PCIe', '')} x{_unknown(h['link_width'])}" if h.get("link_speed") else ""
    best = ""
    if h.get("max_link_speed") and (h["max_link_speed"], h["max_link_width"]) != (h.get("link_speed"), h.get("link_width")):
        best = f" (max {h['max_link_speed'].replace(' PCIe', '')} x{_unknown(h['max_link_width'])})"
    return esc(f"{h['bdf']} {h['role']} {_id(h.get('vendor'))}:{_id(h.get('device'))}{link}{best}")


def topology_tables(topo: dict[str, Any]) -> list[Any]:
    """Per-GPU placement, each GPU's PCIe path (as text under the table) and the GPU<->GPU matrix."""
    named = any(g.get("name") for g in topo.get("gpus", []))  # fixtures and sysfs alone have no model names
    t = _table(esc(f"PCIe placement (source: {topo.get('source')})"),
               [("GPU", "right")] + ([("model", "left")] if named else []) + [
                   ("bus id", "right"), ("NUMA", "right"), ("CPUs", "left"), ("levels", "right")],
               caption="levels: PCIe switch levels between the GPU and its root port")
    paths = []
    for g in topo.get("gpus", []):
        label = gpu_label(g["nvml_index"]) if g.get("nvml_index") is not None else esc(g["bdf"])
        model = [esc(short_name(g.get("name"))) if g.get("name") else "–"] if named else []
        t.add_row(label, *model, esc(g["bdf"]), esc(_unknown(g.get("numa_node"))),
                  esc(_unknown(g.get("local_cpulist"))), esc(_unknown(g.get("switch_levels"))))
        paths.append("\n".join([f"{label}: {g['host_bridge']}"] + [f"  {_hop(h)}" for h in g.get("hops", [])]))
    parts: list[Any] = [t, Text("PCIe path from the root complex down:\n" + "\n".join(paths), style="dim")]
    labels = topo.get("labels", [])
    if labels:
        m = _table("GPU <-> GPU", [("", "left")] + [(esc(lab), "right") for lab in labels])
        for lab, row in zip(labels, topo.get("matrix", [])):
            m.add_row(esc(lab), *(esc(x) for x in row))
        parts += [m, Text("X self; NV# NVLink links; PIX one PCIe switch; PXB several switches; PHB host bridge; "
                          "NODE across host bridges in a NUMA node; SYS across NUMA nodes", style="dim")]
    parts.extend(Text(f"note: {n}", style="dim") for n in merge_gpu_notes(topo.get("notes", [])))
    return parts


def compare_table(cmp: pd.DataFrame, names: list[str], letters: str | None = None, title: str = "Comparison") -> Table:
    """Runs side by side; for each run after the first its delta and % delta, ``*`` where significant.
    ``letters``: the runs' labels (default A, B, C...)."""
    letters = letters or "".join(chr(65 + i) for i in range(len(names)))
    cols: list[tuple[str, str]] = [("GPU", "right"), ("metric", "left")]
    for i, n in enumerate(names):
        cols.append((letters[i], "right"))
        if i:
            cols.append((f"Δ {letters[i]}", "right"))
    runs = "; ".join(esc(n) if n.startswith(f"{letters[i]}: ") else f"{letters[i]} = {esc(n)}" for i, n in enumerate(names))
    floor = RUN_TO_RUN_PCT
    t = _table(title, cols, caption=f"{runs}. Δ vs A, with % of A (none where A is within its interval of 0 or too "
                                           "small to matter); * = significant: material (pcietrace/analysis/compare.py "
                                           "MATERIAL), beyond the 95 % intervals and, for figures that move with the "
                                           "host's speed, beyond what two runs of one machine differ by (in % of the "
                                           "mean: "
                                           f"host cost {floor['host cost / eager launch']:g} %; launch + sync, first "
                                           f"instruction, 4 B copy, graphs' time per iteration "
                                           f"{floor['launch + sync (eager)']:g} %; host-memory round trip "
                                           f"{floor['host read round trip']:g} %); no mark = not significant or not "
                                           "judged")
    for r in cmp.to_dict("records"):
        unit = f" ({r['unit']})" if r["unit"] else ""
        cells = [esc(r["gpu"]), esc(r["metric"]) + unit]
        for i, n in enumerate(names):
            v, ci = r.get(f"value:{n}"), r.get(f"ci95:{n}")
            small = r["unit"] in ("us", "x") or (v is not None and not pd.isna(v) and abs(v) < 10)
            fmt = ",.0f" if r["metric"] == "PCIe switch levels" else ",.3f" if small else ",.1f"
            cells.append(_pm(v, ci, fmt) if v is not None and not pd.isna(v) else "–")
            if i:
                d, pct, sig = r.get(f"delta:{n}"), r.get(f"pct:{n}"), r.get(f"significant:{n}")
                txt = "–" if d is None or pd.isna(d) else "same" if d == 0 else f"{d:+,.3f}"
                if pct is not None and not pd.isna(pct):
                    txt += f" ({pct:+.1f}%)"
                cells.append(txt + ("*" if sig is True else ""))
        t.add_row(*cells)
    return t


def _domain_mark(domain: Any, one_domain: bool) -> str:
    """A range name's domain beside it where ranges of several domains share a table; NVTX's default domain
    (no domain: torch.cuda.nvtx, nvtxRangePushA) goes unsaid."""
    return "" if one_domain or str(domain) == "default" else f" [dim]({esc(str(domain))})[/]"


@dataclass(frozen=True)
class RangeView:
    """Which of attach's ranges the console shows (``--top``, ``--all``, ``--sort``, ``--filter``): the first
    ``top`` (None: all) by ``sort`` whose name matches ``pattern``; ``group_by`` only names how they were grouped."""

    top: int | None = names.DEFAULT_TOP
    sort: str = names.DEFAULT_SORT
    pattern: str | None = None
    group_by: str = names.DEFAULT_GROUP_BY


#: Nesting shown by indenting a range's name this many spaces per level, up to MAX_INDENT levels (deeper ones
#: stand at that level: the name column stays narrow enough for 80 columns).
INDENT, MAX_INDENT = 2, 4


def attach_tables(meta: dict[str, Any], results: dict[str, pd.DataFrame], view: RangeView | None = None) -> list[Any]:
    """Per-range tables (bytes and time; launches and costs) for the ranges ``view`` picks, a line saying what it
    left out, whole-run line, processes, and notes."""
    view = view or RangeView()
    parts: list[Any] = []
    costs = meta.get("launch_costs")
    all_ranges = results.get("ranges", pd.DataFrame())
    rg, shown = (names.select(all_ranges, view.sort, view.top, view.pattern) if len(all_ranges)
                 else (all_ranges, {"ranges": 0, "names": 0, "matched": 0, "shown": 0}))
    interval = meta.get("sample_interval_ms")
    if len(results.get("floor", ())):
        parts.append(attach_floor_table(results["floor"]))
    if len(rg):
        domains = all_ranges["domain"].astype(str).unique()
        one_domain = len(domains) == 1

        def name(r: Any, marked: bool = True) -> str:  # the marks on a line of their own, so they never break the name
            marks = ([f"{r.short_calls} short"] if r.short_calls else []) \
                + ([f"{r.stalls} stall{'s' * (r.stalls != 1)}"] if getattr(r, "stalls", 0) else [])
            pad = " " * INDENT * min(int(getattr(r, "indent", 0) or 0), MAX_INDENT)
            return pad + esc(r.name) + _domain_mark(r.domain, one_domain) + (
                f"\n[yellow]({', '.join(marks)})[/]" if marks and marked else "")

        def mb(r: Any, d: str, edge: bool) -> str:
            if getattr(r, "status", "ok") != "ok":  # no floor / no data / wrap risk: never a silent number
                return f"[red]{r.status}[/]"
            v = getattr(r, f"{d}_bytes") / 1e6
            return _pm_lines(v, _stated_err(r, d) / 1e6, ",.3f") if edge else _num(v, ",.3f")  # narrow: ± below

        one_gpu = len(meta.get("gpus", [])) == 1  # (its label in the title: a column of one value costs the names room)
        where = [f"domain {domains[0]}"] * one_domain + [f"GPU{meta['gpus'][0].get('nvml_index', 0)}"] * one_gpu
        t = _table("PCIe bytes per NVTX range" + (esc(f" ({', '.join(where)})") if where else ""),
                   [("range", "left")] + [("GPUs", "left")] * (not one_gpu) + [("calls", "right"), ("incl\nms", "right"),
                    ("excl\nms", "right"), ("H2D MB\n± error", "right"), ("D2H\nMB", "right")],
                   caption="totals over calls, nested ranges included, floor removed, on the range's own GPUs; "
                           "MB = 10^6 B; ± error: the edges' worst case + the floor's 95 % interval")
        for r in rg.itertuples():
            t.add_row(name(r), *[_gpu_list(getattr(r, "gpus", ""))] * (not one_gpu), _num(r.calls), _ms(r.incl_ms),
                      _ms(r.excl_ms), mb(r, "h2d", True), mb(r, "d2h", False))
        parts.append(t)
        busy = "gpu_busy_ms" in rg and rg["gpu_busy_ms"].notna().any()
        capt = "captured_launches" in rg and (rg["captured_launches"] > 0).any()  # (shown where any range captured)
        t = _table("Launches per NVTX range", [("range", "left"), ("eager", "right"), ("graph", "right")]
                   + ([("captured", "right")] if capt else []) + [
                   ("H2D\nB/launch", "right"), ("launch\nms", "right")] + ([("GPU busy\nms", "right")] if busy else [])
                   + [("graphs\nsave ≤ ms", "right")],
                   caption="totals over calls, by the range's own thread"
                           + ("; captured: into a stream being captured (graph nodes: nothing ran)" if capt else "")
                           + "; launch ms = launches x host cost per launch "
                           f"({esc(costs['source']) if costs else 'not measured'}); graphs save: "
                           + ("its time less its kernels' GPU time in a graph" if busy else
                              "per eager launch, its time per launch less a graph kernel's")
                           + " (pcietrace/analysis/savings.py)")
        for r in rg.itertuples():  # (the marks once, in the bytes table above)
            t.add_row(name(r, marked=False), _num(r.eager_launches, ",.0f"), _num(r.graph_launches, ",.0f"),
                      *([_num(r.captured_launches, ",.0f")] if capt else []),
                      _num(r.h2d_bytes_per_launch, ",.0f"), _num(r.launch_overhead_ms, ",.2f"),
                      *([_num(r.gpu_busy_ms, ",.2f")] if busy else []), _num(r.graph_savings_ms, ",.2f"))
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
        if marked:
            parts.append(Text("note: calls marked " + "; ".join(marked), style="yellow"))
    if len(results.get("ranges_by_host", ())):
        parts.append(ranges_by_host_table(results["ranges_by_host"]))
    wr = results.get("whole_run", pd.DataFrame())
    if len(wr):
        bounds = results.get("whole_run_bounds", pd.DataFrame())
        t = _table("Whole run", [("GPU", "right"), ("ms", "right"), ("H2D MB", "right"), ("D2H MB", "right"),
                                 ("eager", "right"), ("graph", "right"), ("procs", "right"), ("ranges", "right"),
                                 ("exit", "right")],
                   caption="per sampled GPU: its bytes (± the floor's 95 % interval, which outweighs the edges' over "
                           "a whole run" + ("; ≥: the least it moved, where a sampling gap could hide a counter wrap, "
                                            "see the note" if len(bounds) else "")
                           + ") and the kernel launches made on it (eager/graph); procs (processes followed) "
                           "and ranges: the program's totals")
        seen = bounds.set_index("nvml_index") if len(bounds) else pd.DataFrame()
        for w in wr.to_dict("records"):
            ok = w.get("status", "ok") == "ok"
            bad = f"[red]{w.get('status')}[/]"
            if not ok and w.get("nvml_index") in seen.index:  # the least it moved, a wrap could hide more
                b = seen.loc[w["nvml_index"]]
                bad = {d: f"[yellow]≥ {_num(max(b[f'{d}_seen_bytes'], 0) / 1e6, ',.1f')}[/]" for d in ("h2d", "d2h")}
            t.add_row(node_gpu(w) if "nvml_index" in w else "all", _num(w["duration_ms"], ",.1f"),
                      _pm_lines(w["h2d_bytes"] / 1e6, w["h2d_floor_err_bytes"] / 1e6, ",.1f") if ok
                      else bad["h2d"] if isinstance(bad, dict) else bad,
                      _pm_lines(w["d2h_bytes"] / 1e6, w["d2h_floor_err_bytes"] / 1e6, ",.1f") if ok
                      else bad["d2h"] if isinstance(bad, dict) else bad,
                      _num(w["eager_launches"], ",.0f"), _num(w["graph_launches"], ",.0f"), _num(w["processes"], ".0f"),
                      _num(w["ranges"], ",.0f"), esc(meta.get("exit_code")))
        parts.append(t)
    notes = results.get("notes", pd.DataFrame())
    for note in notes["note"] if "note" in notes else []:  # an attach run with no samples has an empty, column-less table
        parts.append(Text("note: " + note, style="yellow"))
    procs = meta.get("processes", [])
    plain = len(procs) == 1 and procs[0]["nvtx"] and not procs[0].get("trace_full") and "node" not in procs[0]
    if plain:  # one process that used NVTX: a line, not a table
        p = procs[0]
        parts.append(Text(f"process followed: pid {p['pid']}, {p['ranges']:,} ranges, {p['cupti']}",
                          style="dim"))
    elif procs:
        nodes = any("node" in p for p in procs)  # (a merged report: several nodes' processes)
        t = _table("Processes followed", [("node", "left")] * nodes + [("pid", "right"), ("NVTX", "left"),
                                                                       ("launch counting", "left"), ("ranges", "right")],
                   caption="processes that cleared their environment, or never called NVTX or CUDA, do not appear")
        for p in procs:
            t.add_row(*[esc(p.get("node"))] * nodes, str(p["pid"]), "yes" if p["nvtx"] else "no", esc(p["cupti"]),
                      str(p["ranges"]))
        parts.append(t)
    if not len(rg):
        parts.append(Text("no NVTX ranges were seen: whole-run totals only. Wrap the phases you care about in "
                          "nvtx.annotate(...) / torch.cuda.nvtx.range(...) / nvtxRangePush(...) to see them per range.",
                          style="yellow"))
    return parts


def ranges_by_host_table(rh: pd.DataFrame) -> Table:
    """A merged report's ranges on each node (the ranges table sums them over the nodes)."""
    t = _table("PCIe bytes per NVTX range and node", [("range", "left"), ("node", "left"), ("host", "left"),
                                                     ("calls", "right"), ("incl\nms", "right"),
                                                     ("H2D MB\n± error", "right"), ("D2H\nMB", "right")],
               caption="each node's own figures, as in the table above; MB = 10^6 B")
    for r in rh.sort_values(["domain", "name"], kind="stable").itertuples():
        ok = getattr(r, "status", "ok") == "ok"
        t.add_row(esc(r.name), esc(r.node), esc(r.host), str(r.calls), _num(r.incl_ms, ",.2f"),
                  _pm(r.h2d_bytes / 1e6, _stated_err(r, "h2d") / 1e6, ",.3f") if ok else f"[red]{r.status}[/]",
                  _num(r.d2h_bytes / 1e6, ",.3f") if ok else f"[red]{r.status}[/]")
    return t


def gpu_summary_table(gpus: pd.DataFrame) -> Table:
    """One row of key figures per GPU (the summary's ``gpus`` table); the model goes in the title when shared."""
    shared = gpus["name"].nunique() == 1
    cols = [("GPU", "right")] + ([] if shared else [("model", "left")]) + [
        ("PCIe", "left"), ("lvl", "right"), ("H2D B ±95%", "right"), ("D2H B", "right"), ("host us", "right"),
        ("saved us", "right"), ("×", "right")]
    t = _table("Per GPU" + (f" ({esc(gpus['name'].iloc[0])})" if shared else ""), cols,
               caption="per eager launch: H2D/D2H bytes and host time; saved us: GPU time per kernel a graph saves; "
                       "×: wall-time graph speedup at the shortest kernel; lvl: PCIe switch levels")
    for r in gpus.itertuples():
        levels = "?" if r.switch_levels is None or pd.isna(r.switch_levels) else str(int(r.switch_levels))
        t.add_row(r.gpu, *([] if shared else [esc(r.name)]), esc(r.link), levels,
                  _pm(r.eager_h2d_bytes, r.eager_h2d_ci95), _num(r.eager_d2h_bytes), _num(r.host_us_per_launch, ".1f"),
                  _num(r.gpu_saved_us_per_kernel, ".2f"), _num(r.speedup_min_kernel, ".1f", "×"))
    return t


def _cell(x: Any, col: str) -> str:
    if col == "nvml_index" and isinstance(x, (int, float)) and not pd.isna(x):
        return gpu_label(int(x))
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return esc(x)
    if isinstance(x, int):
        return f"{x:,}"
    return _num(x, ",.3f" if abs(x) < 1000 else ",.0f")


def generic_table(name: str, df: pd.DataFrame) -> Table:
    """Any result table without a dedicated renderer: its columns as they are (numbers right-aligned)."""
    cols = [(("GPU" if c == "nvml_index" else esc(c)), "right" if pd.api.types.is_numeric_dtype(df[c]) else "left")
            for c in df.columns]
    t = _table(esc(name.replace("_", " ")), cols)
    for rec in df.itertuples(index=False):
        t.add_row(*(_cell(x, c) for x, c in zip(rec, df.columns)))
    return t


def _dedicated_or_generic(key: str, fn: Callable[[pd.DataFrame], Table], df: pd.DataFrame) -> Table:
    """A table whose columns are not what its renderer expects (an older or damaged report) still prints."""
    try:
        return fn(df)
    except (KeyError, AttributeError, TypeError, ValueError):
        return generic_table(key, df)


RENDERERS: list[tuple[str, Callable[[pd.DataFrame], Table]]] = [
    ("floor", floor_table), ("calibration", calibration_table), ("per_launch", per_launch_table),
    ("per_node", per_node_table), ("by_duration", by_duration_table), ("cpu_cost", cpu_table),
]
#: Tables rendered elsewhere in :func:`render` or not meant for the console (per-instance rows: JSON/CSV).
HANDLED = {"sampling", "gpu_time", "speedup", "latency", "topology_model", "ranges", "range_instances", "whole_run",
           "whole_run_bounds",
           "fit_windows", "rates", "notes", "graphs", "per_gpu", "ranges_by_host"}


def summary_lines(summary: dict[str, Any]) -> list[Any]:
    return [Text(line, style="bold") for line in summary.get("lines", [])]


def render(meta: dict[str, Any], results: dict[str, pd.DataFrame], console: Console,
           summary: dict[str, Any] | None = None, detail: bool = False, view: RangeView | None = None) -> None:
    """Print :func:`parts` on ``console``."""
    for part in parts(meta, results, summary, detail, view):
        console.print(part)


def parts(meta: dict[str, Any], results: dict[str, pd.DataFrame], summary: dict[str, Any] | None = None,
          detail: bool = False, view: RangeView | None = None) -> list[Any]:
    """The summary first, then every result table that has data, with a SIMULATED banner where it applies.
    With more than :data:`DETAIL_GPUS` GPUs, detail tables only with ``detail``."""
    parts: list[Any] = []
    if meta.get("simulated"):
        parts.append(Panel(Text("SIMULATED — no GPU was used; figures come from a model of "
                                f"{meta.get('sim_source', 'a recorded real run')}", style="bold yellow")))
    if meta.get("status", "complete") != "complete":
        cut = meta.get("interrupted") if isinstance(meta.get("interrupted"), dict) else {}
        how = f"; {cut.get('how')}: its last {cut.get('lost_at_most_s', 0):g} s at most are missing" if cut else ""
        parts.append(Panel(Text(f"run status: {meta.get('status')} — tables show what was recorded{how}", style="bold red")))
    if summary and summary.get("lines"):
        parts.extend(summary_lines(summary) + [Text("")])
    many = len(meta.get("gpus", [])) > DETAIL_GPUS and not str(meta.get("kind", "")).startswith("attach")
    parts.append(system_table(meta, results.get("sampling", pd.DataFrame())))
    if many and not detail:
        if summary is not None and len(summary.get("gpus", ())):
            parts.append(gpu_summary_table(summary["gpus"]))
        parts.append(Text(f"{len(meta['gpus'])} GPUs: per-GPU detail tables with --detail (always in the saved "
                          "report and in --format json/csv/md)", style="dim"))
        return parts
    if str(meta.get("kind", "")).startswith("attach"):
        parts.extend(attach_tables(meta, results, view))
    if meta.get("kind") == "graphs":
        parts.extend(graphs_tables(meta, results))
    for key, fn in RENDERERS:
        if key == "floor" and str(meta.get("kind", "")).startswith("attach"):
            continue  # attach's floor model has its own table
        if len(results.get(key, ())):
            parts.append(_dedicated_or_generic(key, fn, results[key]))
    if len(results.get("gpu_time", ())) or len(results.get("speedup", ())):
        parts.append(speedup_table(results.get("gpu_time", pd.DataFrame()), results.get("speedup", pd.DataFrame())))
    for key, df in results.items():  # tables added later (other commands) still show
        if key not in HANDLED and key not in dict(RENDERERS) and len(df):
            parts.append(generic_table(key, df))
    if meta.get("topology") and (detail or not str(meta.get("kind", "")).startswith("attach")):
        parts.extend(topology_tables(meta["topology"]))
    elif meta.get("topology"):
        parts.append(Text("PCIe placement and the GPU <-> GPU matrix: --detail (or `pcietrace topo`)", style="dim"))
    if len(results.get("latency", ())):
        parts.append(latency_table(results["latency"]))
    if len(results.get("topology_model", ())):
        parts.append(model_table(results["topology_model"]))
    return parts


def attach_floor_table(fl: pd.DataFrame) -> Table:
    """Attach's floor model per GPU (:func:`pcietrace.analysis.floor.floor_model`)."""
    t = _table("Background floor per GPU", [("GPU", "left"), ("fit", "left"), ("reads/s\nin ranges", "right"),
                                            ("H2D B/read", "right"), ("D2H B/read", "right"),
                                            ("± B/read\nH2D / D2H", "right"), ("other MB/s\nH2D / D2H", "right")],
               caption="NVML reads are PCIe traffic: an interval's floor = B/read x the sampler's reads in it "
                       "(reads/s in ranges: at most one per sampling interval, however dense the ranges) + the "
                       "other background x its duration, fitted on idle windows before and after the program; "
                       "± B/read: how far a read's cost strayed in the program's state (95 %), in each range's "
                       "± error; MB = 10^6 B")
    for r in fl.to_dict("records"):
        if r["status"] == "no floor":
            t.add_row(node_gpu(r), "[red]no floor[/]", *["–"] * 5)
            continue
        state = f"{_num(r['h2d_state_bytes_per_read'])} / {_num(r['d2h_state_bytes_per_read'])}"
        t.add_row(node_gpu(r), r["status"], _num(r.get("reads_per_s_program")), _num(r["h2d_bytes_per_read_program"]),
                  _num(r["d2h_bytes_per_read_program"]), state,
                  f"{_num(r['h2d_background_Bps'] / 1e6, '.2f')} / {_num(r['d2h_background_Bps'] / 1e6, '.2f')}")
    return t


def graphs_tables(meta: dict[str, Any], results: dict[str, pd.DataFrame]) -> list[Any]:
    """``pcietrace graphs``: per workload size, the strategies' times and their counts and bytes (see
    :func:`pcietrace.analysis.graphs.summary` for the columns)."""
    gs = results.get("graphs", pd.DataFrame())
    plan = meta.get("graphs_plan", {})
    stats = ("each iteration ends with a stream synchronize; \\[lo, hi] = bootstrap 95 % intervals over iterations"
             if plan.get("sync", True) else "pipelined (no synchronize per iteration): times per window, \\[lo, hi] "
             "over windows")
    parts: list[Any] = []
    for n, g in gs.groupby("kernels", sort=True) if len(gs) else []:
        lo, hi = plan.get("kernel_us", ["?", "?"])
        title = (f"CUDA graphs, {n:,} kernels of {lo:g}-{hi:g} us per iteration, {plan.get('param_sets')} parameter "
                 f"sets ({plan.get('order')})")
        # 80 columns: short headers (spelt out in the caption), each interval on a line of its own in its cell
        t = _table(title + ": time", [("strategy", "left"), ("mean ms", "right"), ("median", "right"),
                                      ("speedup", "right"), ("CPU ms", "right"), ("inst.", "right"),
                                      ("reuses", "right")],
                   caption=f"timing: {meta.get('timing', '?')}; {stats}; times in ms per iteration (inst.: per "
                           "instantiation); mean = total / iterations (carries the occasional instantiations; speedup = "
                           "eager mean / mean); CPU = host CPU time; reuses = the break-even, instantiate time / (eager - "
                           "graph-ready iteration); median's interval in --format json/csv/md")

        def ms(x: float, lo: float, hi: float) -> str:
            return f"{x / 1e3:,.3f}\n[{lo / 1e3:,.3f}, {hi / 1e3:,.3f}]"

        t.columns[0].no_wrap = True  # the strategy names the row: never cut
        for r in g.itertuples():
            t.add_row(r.strategy, ms(r.wall_us_mean, r.wall_us_mean_lo, r.wall_us_mean_hi),
                      _num(r.wall_us_median / 1e3, ",.3f"),
                      "1" if r.strategy == "eager" else f"{r.speedup:.3f}x\n[{r.speedup_lo:.3f}, {r.speedup_hi:.3f}]",
                      _num(r.cpu_us_mean / 1e3, ",.3f"), _num(r.build_us / 1e3, ",.3f"),
                      "never" if r.break_even_reuses == math.inf else _num(r.break_even_reuses, ",.1f"))
        c = _table(title + ": what each strategy did, and its PCIe traffic",
                   [("strategy", "left"), ("capt.", "right"), ("inst.", "right"), ("upd.", "right"),
                    ("nodes", "right"), ("hits", "right"), ("fail", "right"), ("H2D kB", "right"),
                    ("D2H kB", "right")],
                   caption=f"counts summed over {int(g['iterations'].iloc[0]):,} iterations per strategy: captures, "
                           "instantiations, graph updates, kernel-node updates, cache hits, failed updates; kB = "
                           "10^3 B per iteration from the counters, floor removed, ± 95 % over windows")
        c.columns[0].no_wrap = True
        for r in g.itertuples():
            c.add_row(r.strategy, _num(r.captures), _num(r.instantiations), _num(r.updates), _num(r.node_updates),
                      _num(r.cache_hits), _num(r.update_failures),
                      _pm_lines(r.h2d_bytes_per_iter / 1e3, r.h2d_ci95 / 1e3, ",.1f"),
                      _pm_lines(r.d2h_bytes_per_iter / 1e3, r.d2h_ci95 / 1e3, ",.1f"))
        parts += [t, c]
    return parts


def savings_table(sv: pd.DataFrame, paths: list[str]) -> Table:
    """Attach's predicted graph savings against the measured (see :func:`pcietrace.analysis.savings.savings`)."""
    one_domain = sv["domain"].astype(str).nunique() <= 1
    t = _table("Graph savings per NVTX range: predicted from the eager run vs measured"
               + (esc(f" (domain {sv['domain'].iloc[0]})") if one_domain and len(sv) else ""),
               [("range", "left"), ("eager ms", "right"), ("graphed", "right"), ("launches", "right"),
                ("saved ms", "right"), ("predicted", "right"), ("error", "right"), ("bound", "left")],
               caption=f"eager: {esc(paths[0])}; graphed: {esc(paths[1])}; graphed: its inclusive range time, ms; "
                       "launches: the eager run's; saved = measured, eager - graphed inclusive range time; predicted = attach's \"graphs save\" figure "
                       "from the eager run, ms (from the GPU's busy time where it was recorded, --gpu-time; else from "
                       "launch counts: launch-bound ranges save their own time per launch minus a graph kernel's, "
                       "others the GPU overhead difference; pcietrace/analysis/savings.py); error in % of the "
                       "measured saving; bound: launch-bound")
    t.columns[0].min_width = 12  # the range names the row: never squeezed to nothing

    def err(x: Any) -> str:
        return "–" if x is None or pd.isna(x) else f"{x:+.0f} %"

    for r in sv.itertuples():
        t.add_row(esc(r.name) + _domain_mark(r.domain, one_domain), _num(r.eager_ms, ",.2f"),
                  _num(r.graphed_ms, ",.2f"), _num(r.eager_launches), _num(r.measured_ms, ",.2f"),
                  _num(r.predicted_ms, ",.2f"), err(r.error_pct),
                  "–" if pd.isna(r.launch_bound) else "yes" if r.launch_bound else "no")
    return t


def language_table(lang: pd.DataFrame) -> Table:
    t = _table("Host cost per eager launch, by what launches it",
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
                  _num(r["us_per_launch"], ".3f"), _num(r["iqr_pct"], ".1f"), _num(r["cpu_us_per_launch"], ".3f"),
                  _num(r["extra_us_vs_native"], "+.3f"), _num(r["ratio_vs_native"], ".2f", "×"))
    return t


RENDERERS.append(("host_cost_by_language", language_table))


def _unknown(v: Any) -> str:
    """A sysfs value for display, '?' where it is unknown."""
    return "?" if v is None else str(v)


def _id(v: Any) -> str:
    """A PCI id ("0x10de") without its "0x", '?' where it is unknown."""
    return v[2:] if isinstance(v, str) and v.startswith("0x") else "?"


def node_gpu(row: Any) -> str:
    """A GPU's name in a table: "GPU3", or "node1 GPU3" in a merged report (whose rows and GPUs name their node)."""
    node = row.get("node")
    return esc(f"{node} " if node is not None and node == node else "") + gpu_label(row["nvml_index"])


def _gpu_list(text: Any) -> str:
    """[0, 1, 2, 3, 5] (or "0,1,2,3,5") -> "0-3,5": runs of NVML indices shortened, so the column stays narrow
    on big boxes. A merged report's "node:index" items -> "node0:0,1 node1:0,1"."""
    items = list(text) if isinstance(text, (list, tuple)) or hasattr(text, "tolist") else None
    if items and any(":" in str(x) for x in items):
        by_node: dict[str, list[str]] = {}
        for x in items:
            node, _, idx = str(x).rpartition(":")
            by_node.setdefault(node, []).append(idx)
        return " ".join(f"{esc(n)}:{_gpu_list(ix)}" for n, ix in by_node.items())
    try:
        items = text if isinstance(text, (list, tuple)) else str(text).split(",")
        idx = sorted({int(x) for x in items if str(x).strip()})
    except ValueError:
        return esc(text)
    runs: list[list[int]] = []
    for i in idx:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ",".join(map(str, r)) for r in runs)


def _pm_lines(x: Any, ci: Any, fmt: str = ",.0f") -> str:
    """:func:`_pm` with the interval on a second line (narrow columns)."""
    return _pm(x, ci, fmt).replace(" ± ", "\n± ")


def compare_tables(cmp: pd.DataFrame, names: list[str]) -> list[Table]:
    """:func:`compare_table`, or with more than two runs one table per run against the first (side by side
    they no longer fit 80 columns); each keeps the rows either run has."""
    if len(names) <= 2:
        return [compare_table(cmp, names)]
    tables = []
    for i, n in enumerate(names[1:], 1):
        either = cmp[f"value:{names[0]}"].notna() | cmp[f"value:{n}"].notna() | cmp[f"delta:{n}"].notna()
        tables.append(compare_table(cmp[either], [names[0], n], "A" + chr(65 + i), f"Comparison: {chr(65 + i)} vs A"))
    return tables


def tell(line: str) -> None:
    """A status line on stderr as rich prints it (no markup, not wrapped off a terminal): what a measuring
    command says about its run (``saved to DIR``, attach's ``running CMD``), passed to record/ by the command."""
    Console(stderr=True).print(clean(line), markup=False, soft_wrap=True)
