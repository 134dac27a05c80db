"""The answer first: a few plain sentences and the key figures behind them, taken from the result tables.

Stateless: result tables (and the run's metadata) in, plain data out. Every figure is read from a
result table; the sentences only format them. ``summarize`` returns ``{"kind", "lines": [str],
"gpus": DataFrame}`` for a run (one row of key figures per GPU, columns :data:`GPU_COLUMNS`), an
attach (``"ranges"``: the top ranges by launch overhead, :data:`RANGE_COLUMNS`) or a comparison
(:func:`compare_summary`, ``"deltas"``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from pcietrace.text import shortened


#: Key figures per GPU of a run (the ``per_gpu`` result table): bytes per eager launch (95 % half-widths),
#: graph launch bytes (fixed + per node, H2D), host cost per launch call (us; native loops, and from Python
#: where measured), GPU time per empty kernel eager/graph (us; eager: the median over the CUDA contexts measured,
#: with their range and number) and what graphs save of it, wall-time speedup at the shortest and longest
#: kernel, and the host read round trip.
GPU_COLUMNS = ["nvml_index", "gpu", "name", "link", "switch_levels", "eager_h2d_bytes", "eager_h2d_ci95",
               "eager_d2h_bytes", "eager_d2h_ci95", "graph_fixed_h2d_bytes", "graph_node_h2d_bytes",
               "host_us_per_launch", "host_us_per_launch_python", "host_us_per_graph_launch", "eager_gpu_us", "graph_gpu_us",
               "eager_gpu_us_min", "eager_gpu_us_max", "eager_contexts", "gpu_saved_us_per_kernel", "min_kernel_us", "speedup_min_kernel", "max_kernel_us",
               "speedup_max_kernel", "host_rtt_us"]
#: Top attach ranges by launch overhead.
RANGE_COLUMNS = ["domain", "name", "incl_ms", "eager_launches", "graph_launches", "launch_overhead_ms",
                 "graph_savings_ms"]
TOP_RANGES = 3
#: More GPUs than this: one sentence over all GPUs, and on the console one summary row per GPU (detail tables
#: need ``--detail``).
DETAIL_GPUS = 2


def gpu_label(nvml_index: Any) -> str:
    """``GPU0``: the short label narrow tables and sentences use instead of bus ids."""
    return f"GPU{nvml_index}"


def short_name(name: Any) -> str:
    return str(name or "?").replace("NVIDIA ", "")


def _nan(x: Any) -> float:
    return float("nan") if x is None or pd.isna(x) else float(x)


def _pick(df: pd.DataFrame, col: str, **eq: Any) -> float:
    """The first value of ``col`` where every ``eq`` column matches, NaN if none."""
    if not len(df) or col not in df:
        return math.nan
    m = pd.Series(True, index=df.index)
    for k, v in eq.items():
        if k not in df:
            return math.nan
        m &= df[k] == v
    return _nan(df.loc[m, col].iloc[0]) if m.any() else math.nan


def link_label(g: dict[str, Any]) -> str:
    """A GPU record's PCIe link as running ("Gen5 x16"), with the best it could do where that differs."""
    gen, width = g.get("pcie_gen_current"), g.get("pcie_width_current")
    if gen is None or width is None:
        return "link unknown"
    now, best = f"Gen{gen} x{width}", f"Gen{g.get('pcie_gen_max', gen)} x{g.get('pcie_width_max', width)}"
    return now if now == best else f"{now} (max {best})"


def gpu_figures(meta: dict[str, Any], results: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row of key figures per GPU of a run (:data:`GPU_COLUMNS`)."""
    r = {k: results.get(k, pd.DataFrame()) for k in ("per_launch", "per_node", "cpu_cost", "gpu_time", "speedup", "latency",
                                                     "host_cost_by_language")}
    levels = {t.get("nvml_index"): t.get("switch_levels") for t in (meta.get("topology") or {}).get("gpus", [])}
    rows = []
    for g in meta.get("gpus", []):
        i = g["nvml_index"]
        gt = r["gpu_time"][r["gpu_time"]["nvml_index"] == i].sort_values("kernel_us") if len(r["gpu_time"]) else r["gpu_time"]
        sp = r["speedup"][r["speedup"]["nvml_index"] == i].sort_values("kernel_us") if len(r["speedup"]) else r["speedup"]
        eager_gpu = _nan(gt["eager_gpu_us"].iloc[0]) if len(gt) else math.nan
        graph_gpu = _nan(gt["graph_gpu_us"].iloc[0]) if len(gt) else math.nan
        rows.append({
            "nvml_index": i, "gpu": gpu_label(i), "name": short_name(g.get("name")), "link": link_label(g),
            "switch_levels": levels.get(i),
            "eager_h2d_bytes": _pick(r["per_launch"], "bytes_per_call", nvml_index=i, mode="eager", direction="h2d"),
            "eager_h2d_ci95": _pick(r["per_launch"], "ci95", nvml_index=i, mode="eager", direction="h2d"),
            "eager_d2h_bytes": _pick(r["per_launch"], "bytes_per_call", nvml_index=i, mode="eager", direction="d2h"),
            "eager_d2h_ci95": _pick(r["per_launch"], "ci95", nvml_index=i, mode="eager", direction="d2h"),
            "graph_fixed_h2d_bytes": _pick(r["per_node"], "fixed_bytes", nvml_index=i, direction="h2d"),
            "graph_node_h2d_bytes": _pick(r["per_node"], "per_node_bytes", nvml_index=i, direction="h2d"),
            "host_us_per_launch": _pick(r["cpu_cost"], "host_us_per_call", nvml_index=i, mode="eager"),
            "host_us_per_launch_python": _pick(r["host_cost_by_language"], "us_per_launch", nvml_index=i, path="python"),
            "host_us_per_graph_launch": _pick(r["cpu_cost"], "host_us_per_call", nvml_index=i, mode="graph"),
            "eager_gpu_us": eager_gpu, "graph_gpu_us": graph_gpu,
            **{c: _nan(gt[c].iloc[0]) if len(gt) and c in gt else math.nan
               for c in ("eager_gpu_us_min", "eager_gpu_us_max", "eager_contexts")},
            "gpu_saved_us_per_kernel": eager_gpu - graph_gpu,
            "min_kernel_us": _nan(sp["kernel_us"].iloc[0]) if len(sp) else math.nan,
            "speedup_min_kernel": _nan(sp["speedup"].iloc[0]) if len(sp) else math.nan,
            "max_kernel_us": _nan(sp["kernel_us"].iloc[-1]) if len(sp) else math.nan,
            "speedup_max_kernel": _nan(sp["speedup"].iloc[-1]) if len(sp) else math.nan,
            "host_rtt_us": _pick(r["latency"], "median_us", nvml_index=i, test="host_read_rtt", peer=-1),
        })
    return pd.DataFrame(rows, columns=GPU_COLUMNS).astype({"eager_contexts": "Int64"})  # a count: 5, not 5.0


def _f(x: float, fmt: str) -> str | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _join(parts: list[str | None], sep: str = ", ") -> str:
    return sep.join(p for p in parts if p)


def _gpu_sentence(row: pd.Series, lead: str) -> str | None:
    """One GPU's figures as a sentence; clauses whose figures are missing are left out (None: no figures)."""
    levels = "" if row["switch_levels"] is None or pd.isna(row["switch_levels"]) else f", {int(row['switch_levels'])} switch levels"
    where = f"{row['gpu']} ({row['name']}, {row['link']}{levels})"
    if pd.isna(row["eager_h2d_bytes"]) and pd.isna(row["host_us_per_launch"]):  # e.g. a latency-only session
        rtt = _f(row["host_rtt_us"], ".2f")
        return f"Host-memory read round trip on {where}: {rtt} us." if rtt else None
    head = f"{lead} on {where}"
    h2d = _f(row["eager_h2d_bytes"], ",.0f")
    ci = _f(row["eager_h2d_ci95"], ",.0f")
    d2h = _f(row["eager_d2h_bytes"], ",.0f")
    eager = _join([f"{h2d}{f' ± {ci}' if ci else ''} B H2D" if h2d else None, f"{d2h} B D2H" if d2h else None], " + ")
    host = _f(row["host_us_per_launch"], ".1f")
    clauses = [_join([eager, f"{host} us of host time" if host else None])]
    fixed, node = _f(row["graph_fixed_h2d_bytes"], ",.0f"), _f(row["graph_node_h2d_bytes"], ".2f")
    if fixed and node:
        clauses.append(f"a graph launch: {fixed} B + {node} B per kernel H2D")
    text = head + ": " + "; ".join(c for c in clauses if c) + "."
    saved = _f(row["gpu_saved_us_per_kernel"], ".2f")
    s_min, s_max = _f(row["speedup_min_kernel"], ".1f"), _f(row["speedup_max_kernel"], ".2f")
    speed = None
    if s_min and s_max:
        speed = (f"{s_min}x faster at {row['min_kernel_us']:g} us kernels, {s_max}x at {row['max_kernel_us']:g} us"
                 if row["max_kernel_us"] != row["min_kernel_us"] else f"{s_min}x faster at {row['min_kernel_us']:g} us kernels")
    if saved:
        saved = f"save {saved} us of GPU time per kernel"
        if not pd.isna(row["eager_contexts"]) and row["eager_contexts"] > 1:  # (none: runs before contexts)
            saved += _contexts_clause(row["eager_gpu_us_min"], row["eager_gpu_us_max"],
                                      f"{int(row['eager_contexts'])} CUDA contexts")
    if saved or speed:
        text += " Graphs " + _join([saved, speed], "; ") + "."
    rtt = _f(row["host_rtt_us"], ".2f")
    if rtt:
        text += f" Host-memory read round trip: {rtt} us."
    return text


def _range_text(lo: float, hi: float, fmt: str) -> str:
    return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{format(lo, fmt)}–{format(hi, fmt)}"


def _contexts_clause(lo_us: float, hi_us: float, contexts: str) -> str:
    """" (eager GPU time LO–HI us over CONTEXTS)": the range the eager median over CUDA contexts was taken over."""
    return f" (eager GPU time {_range_text(lo_us, hi_us, '.2f')} us over {contexts})"


def run_lines(gpus: pd.DataFrame, detail_gpus: int = DETAIL_GPUS) -> list[str]:
    """Sentences for a run: one per GPU up to ``detail_gpus`` GPUs, else one over all GPUs (ranges)."""
    if not len(gpus):
        return []
    if len(gpus) <= detail_gpus:
        return [s for _, r in gpus.iterrows() if (s := _gpu_sentence(r, "One eager launch"))]
    names = ", ".join(sorted(set(gpus["name"])))
    parts = []
    for col, fmt, unit in (("eager_h2d_bytes", ",.0f", " B H2D"), ("eager_d2h_bytes", ",.0f", " B D2H"),
                           ("host_us_per_launch", ".1f", " us of host time")):
        v = gpus[col].dropna()
        if len(v):
            parts.append(_range_text(v.min(), v.max(), fmt) + unit)
    text = f"One eager launch on {len(gpus)} GPUs ({names}): " + ", ".join(parts) + "."
    saved = gpus["gpu_saved_us_per_kernel"].dropna()
    sp = gpus["speedup_min_kernel"].dropna()
    if len(saved) and len(sp):
        ctx = gpus[gpus["eager_contexts"].fillna(1) > 1]
        spread = (_contexts_clause(ctx["eager_gpu_us_min"].min(), ctx["eager_gpu_us_max"].max(),
                                   "the CUDA contexts measured") if len(ctx) else "")
        text += (f" Graphs save {_range_text(saved.min(), saved.max(), '.2f')} us of GPU time per kernel{spread}; "
                 f"{_range_text(sp.min(), sp.max(), '.1f')}x faster at {gpus['min_kernel_us'].min():g} us kernels.")
    levels = gpus["switch_levels"].dropna()
    if len(levels):
        text += f" Switch levels: {_range_text(levels.min(), levels.max(), '.0f')}."
    return [text]


def top_ranges(ranges: pd.DataFrame, n: int = TOP_RANGES) -> pd.DataFrame:
    """The ``n`` ranges with the most launch overhead (by launches where no overhead was measured), of those a
    graph could capture (:func:`pcietrace.analysis.savings.capturable`)."""
    if not len(ranges):
        return pd.DataFrame(columns=RANGE_COLUMNS)
    key = "launch_overhead_ms" if ranges["launch_overhead_ms"].notna().any() else "eager_launches"
    from pcietrace.analysis.savings import capturable

    launched = ranges[((ranges["eager_launches"] + ranges["graph_launches"]) > 0) & capturable(ranges)]
    launched = launched[launched[key] >= 0.01 * launched[key].max()]  # leave out ranges with next to no overhead
    return launched.sort_values(key, ascending=False, kind="stable").head(n)[RANGE_COLUMNS].reset_index(drop=True)


def _left_out(meta: dict[str, Any], results: dict[str, pd.DataFrame]) -> list[str]:
    """What the headline leaves out: ranges whose launches no graph captures (NCCL's communicator set-up), with
    their own launches (those of the ranges nested in them are not theirs) and what those cost the host."""
    from pcietrace.analysis import nesting
    from pcietrace.analysis.savings import capturable, parent_labels

    inst = results.get("range_instances", pd.DataFrame())
    if not len(inst) or inst["eager_launches"].isna().all():
        return []
    out = ~capturable(inst)
    if not out.any():
        return []
    parent_at = nesting.parent_rows(inst.index, parent_labels(inst))  # (the stored positions, not a new search)
    launches = {m: inst[f"{m}_launches"].to_numpy(float, na_value=np.nan) for m in ("eager", "graph")}
    own = {m: np.nansum((v - nesting.children_sum(parent_at, v))[out.to_numpy(bool)]) for m, v in launches.items()}
    if own["eager"] + own["graph"] <= 0:
        return []
    costs = meta.get("launch_costs")
    cost = (f", {(own['eager'] * costs['host_us_per_eager_launch'] + own['graph'] * costs['host_us_per_graph_launch']) / 1e3:,.1f}"
            " ms of launch overhead" if costs else "")
    names = ", ".join(sorted(set(inst.loc[out, "name"].astype(str))))
    return [f"Left out of the above (no graph captures them): NCCL's communicator set-up and tear-down ({names}: "
            f"{own['eager']:,.0f} eager and {own['graph']:,.0f} graph launches of its own{cost})."]


def attach_lines(meta: dict[str, Any], results: dict[str, pd.DataFrame]) -> list[str]:
    lines = []
    wr = results.get("whole_run", pd.DataFrame())
    cmd = " ".join(str(c) for c in meta.get("command", []))
    gpus = ", ".join((f"{g['node']} " if g.get("node") else "") + gpu_label(g["nvml_index"]) for g in meta.get("gpus", []))
    if len(wr):
        w = wr.iloc[0]
        if "node" in wr:  # a merged report: the program's figures are each node's, repeated on its GPUs' rows
            programs = wr.drop_duplicates("node")
            w = w.copy()
            w["duration_ms"] = wr["duration_ms"].max()
            for c in ("program_eager_launches", "program_graph_launches", "program_captured_launches"):
                w[c] = programs[c].sum(min_count=len(programs))
        # one whole-run row per GPU; a GPU whose counters could not be followed throughout has no figure
        ok = wr[wr["status"] == "ok"] if "status" in wr else wr
        bounds = results.get("whole_run_bounds", pd.DataFrame())
        bounded = bounds.dropna(subset=["h2d_seen_bytes", "d2h_seen_bytes"]) if len(bounds) else bounds
        rest = wr.drop(ok.index)
        rest = rest[~rest["nvml_index"].isin(bounded["nvml_index"])] if len(bounded) else rest
        unknown = [f"{getattr(r, 'node', '')} {gpu_label(r.nvml_index)} {r.status}".strip() for r in rest.itertuples()]
        if len(bounded):  # sampling gaps that could hide a wrap: the least the run moved, and the most it could hide
            h2d = ok["h2d_bytes"].sum() + bounded["h2d_seen_bytes"].clip(lower=0).sum()
            d2h = ok["d2h_bytes"].sum() + bounded["d2h_seen_bytes"].clip(lower=0).sum()
            moved = (f"at least {h2d / 1e6:,.1f} MB H2D and {d2h / 1e6:,.1f} MB D2H (sampling gaps on "
                     f"GPU{index_runs(bounded['nvml_index'].tolist())} could each hide a counter wrap: at most "
                     f"{bounded['hidden_max_bytes'].sum() / 1e9:,.0f} GB more, a saturated link's worth)")
            moved += f"; not followed: {', '.join(unknown)}" if unknown else ""
        elif len(ok):
            moved = (f"{ok['h2d_bytes'].sum() / 1e6:,.1f} MB H2D, {ok['d2h_bytes'].sum() / 1e6:,.1f} MB D2H"
                     + (f" on the GPUs it could follow (not: {', '.join(unknown)})" if unknown else ""))
        else:
            moved = f"bytes unknown ({', '.join(unknown)})"
        launches = (f"{w['program_eager_launches']:,.0f} eager and {w['program_graph_launches']:,.0f} graph launches"
                    if pd.notna(w["program_eager_launches"]) else "launches not counted")
        if w.get("program_captured_launches", 0) > 0:  # NaN (not counted) and 0 say nothing more
            launches += f" ({w['program_captured_launches']:,.0f} more captured into graphs)"
        code = meta.get("exit_code")  # (None: pcietrace stopped before the program ended: a recovered run)
        lines.append(f"`{cmd}` ran {w['duration_ms'] / 1e3:,.2f} s (exit code {'unknown' if code is None else code}) "
                     f"on {gpus}: "
                     f"{moved}, {launches}.")
    ranges = results.get("ranges", pd.DataFrame())
    top = top_ranges(ranges)
    if len(ranges) and ranges["eager_launches"].isna().all():  # --no-count-launches
        lines.append("Launches were not counted (--no-count-launches): no range's launch overhead or graph saving "
                     "is known.")
    elif len(top):
        items = []
        for r in top.itertuples():
            if pd.notna(r.launch_overhead_ms):
                items.append(f"{shortened(r.name)} {r.launch_overhead_ms:,.1f} ms of launch overhead"
                             + (f" (graphs could save up to {r.graph_savings_ms:,.1f} ms)" if pd.notna(r.graph_savings_ms) else ""))
            else:
                items.append(f"{shortened(r.name)} {r.eager_launches + r.graph_launches:,.0f} launches")
        lines.append("Top ranges by launch overhead (nested ranges include their children's): " + "; ".join(items) + ".")
        lines += _left_out(meta, results)
        if len(wr) and pd.notna(wr.iloc[0].get("program_graph_savings_ms", math.nan)):
            saved = wr.drop_duplicates("node")["program_graph_savings_ms"].sum() if "node" in wr \
                else wr.iloc[0]["program_graph_savings_ms"]  # (a merged report: summed over its nodes)
            lines.append(f"Capturing the outermost ranges that a graph can capture could save up to {saved:,.1f} ms of "
                         "the run" + (" (summed over the nodes)." if "node" in wr else "."))
    elif len(results.get("ranges", ())):
        lines.append(f"None of the {len(results['ranges'])} NVTX ranges launched kernels.")
    elif meta.get("kind") == "attach":
        lines.append("No NVTX ranges were seen: whole-run totals only.")
    return lines


def _run_summary(meta: dict[str, Any], results: dict[str, pd.DataFrame], detail_gpus: int) -> dict[str, Any]:
    gpus = results["per_gpu"] if len(results.get("per_gpu", ())) else gpu_figures(meta, results)
    return {"gpus": gpus, "lines": run_lines(gpus, detail_gpus)}


def _graphs_summary(meta: dict[str, Any], results: dict[str, pd.DataFrame], detail_gpus: int) -> dict[str, Any]:
    gpus = results["per_gpu"] if len(results.get("per_gpu", ())) else gpu_figures(meta, results)
    return {"gpus": gpus, "lines": graphs_lines(meta, results.get("graphs", pd.DataFrame()))}


def attach_gpu_lines(meta: dict[str, Any], results: dict[str, pd.DataFrame], detail_gpus: int = DETAIL_GPUS
                     ) -> list[str]:
    """With more than ``detail_gpus`` GPUs, the system and the background floor in a sentence each over all GPUs
    (their per-GPU tables then need ``--detail``); none where a GPU stands apart (its counter read another way or
    reset, no floor or one of fewer terms), which only the tables show, nor for a merged report."""
    gpus = meta.get("gpus", [])
    sampling, fl = results.get("sampling", pd.DataFrame()), results.get("floor", pd.DataFrame())
    needed = {"rate_hz", "median_gap_us"} <= set(sampling) and {
        "status", "h2d_bytes_per_read_program", "d2h_bytes_per_read_program", "reads_per_s_program"} <= set(fl)
    if len(gpus) <= detail_gpus or not needed or any(g.get("node") for g in gpus) or len(sampling) != len(gpus) \
            or len(fl) != len(gpus) or (fl["status"] != "per read").any() \
            or any(g.get("counter", {}).get("mode") != "fields" for g in gpus) \
            or ("counter_jumps" in sampling and sampling["counter_jumps"].any()):
        return []

    def span(values: Any, fmt: str) -> str:  # (GPUs without the figure left out: "" where none has it)
        v = pd.Series(values, dtype=float).dropna()
        return _range_text(v.min(), v.max(), fmt) if len(v) else ""

    models = ", ".join(sorted({short_name(g.get("name")) for g in gpus}))
    links = ", ".join(sorted({link_label(g) for g in gpus}))
    bits = "/".join(sorted({str(g.get("counter", {}).get("bits", 32)) for g in gpus}))
    rate, gap = span(sampling["rate_hz"], ",.0f"), span(sampling["median_gap_us"] / 1e3, ".1f")
    system = (f"System: {len(gpus)} GPUs ({models}, {links}), their counters (NVML fields 197/198, {bits}-bit, "
              "wrapping) read" + (f" {rate} times a second over the run" if rate else "")
              + (f"{',' if rate else ''} a median {gap} ms apart" if gap else "")
              + f"; driver {meta.get('driver', '?')}, host {meta.get('host', '?')}.")
    rate = span(fl["reads_per_s_program"], ",.0f")
    floor = (f"Background floor (NVML reads are PCIe traffic): {span(fl['h2d_bytes_per_read_program'], ',.0f')} B "
             f"H2D and {span(fl['d2h_bytes_per_read_program'], ',.0f')} B D2H a read"
             + (f", {rate} reads a second in ranges" if rate else "")
             + ", fitted per GPU on idle windows and taken out of every range (with its spread, in each range's ± "
               "error).")
    return [system, floor]


def _attach_summary(meta: dict[str, Any], results: dict[str, pd.DataFrame], detail_gpus: int) -> dict[str, Any]:
    return {"ranges": top_ranges(results.get("ranges", pd.DataFrame())), "lines": attach_lines(meta, results),
            "gpu_lines": attach_gpu_lines(meta, results, detail_gpus)}


#: The summary of each kind of session (``meta["kind"]``; none, or a kind not listed: a run's): its ``lines``
#: and the figures behind them.
SUMMARIES = {"run": _run_summary, "latency": _run_summary, "graphs": _graphs_summary, "attach": _attach_summary,
             "attach-failed": _attach_summary}


def summarize(meta: dict[str, Any], results: dict[str, pd.DataFrame],
              detail_gpus: int = DETAIL_GPUS) -> dict[str, Any]:
    """The summary of a run or attach: ``kind``, ``lines`` (plain sentences), and per-GPU figures
    (``gpus``) or the top ranges (``ranges``)."""
    kind = str(meta.get("kind", "run"))
    out: dict[str, Any] = {"kind": kind, "simulated": bool(meta.get("simulated")), "lines": []}
    out.update(SUMMARIES.get(kind, _run_summary)(meta, results, detail_gpus))
    if meta.get("simulated"):
        out["lines"] = [f"SIMULATED (no GPU was used): {line}" if i == 0 else line for i, line in enumerate(out["lines"])]
    return out


#: What a comparison leads with, in this order: the figures a user acts on (matched on the metric's name; the
#: first row that matches, e.g. the speedup at the shortest kernel). Other rows follow only where significant.
KEY_METRICS = ("eager H2D bytes / launch", "host cost / eager launch", "GPU time / empty kernel, eager",
               "graph speedup, ", "speedup over eager")


def _verdict(sig: pd.Series) -> str:
    """A key figure's verdict over the GPUs that have it."""
    judged = sig.dropna()
    if not len(judged):
        return "not judged: no interval or run-to-run bound"
    hits = int((judged == True).sum())  # noqa: E712
    if len(judged) == 1:
        return "significant" if hits else "within noise"
    return f"significant on {hits} of {len(judged)} GPUs" if hits else "within noise"


def _figure(x: float, unit: str) -> str:
    return f"{x:,.0f}" if unit == "B" and abs(x) >= 10 else f"{x:,.3g}" if unit == "x" else f"{x:,.3f}"


def graphs_lines(meta: dict[str, Any], gs: pd.DataFrame) -> list[str]:
    """``pcietrace graphs``: per workload size, the fastest strategy against eager launches (with its 95 %
    interval) and every other strategy's speedup, and how the iterations were paced."""
    if not len(gs):
        return []
    plan = meta.get("graphs_plan", {})
    pace = ("Each iteration was synchronized (--sync-each-iteration: capture and update cannot hide behind the "
            "GPU's work)" if plan.get("sync", True) else "Iterations were pipelined: the host prepared each one while "
            "the GPU ran the previous one, as a training loop does")
    lines = []
    for n, g in gs.groupby("kernels", sort=True):
        graphs = g[g["strategy"] != "eager"].sort_values("speedup", ascending=False)
        if not len(graphs):
            continue
        best = graphs.iloc[0]
        others = ", ".join(f"{r.strategy} {r.speedup:.2f}x" for r in graphs.iloc[1:].itertuples())
        verdict = "faster" if best["speedup_lo"] > 1 else "no faster, within the intervals," \
            if best["speedup_hi"] >= 1 else "slower"
        lines.append(f"{n:,} kernels per iteration: {best['strategy']} is fastest, {best['speedup']:.2f}x eager "
                     f"[{best['speedup_lo']:.2f}, {best['speedup_hi']:.2f}] ({verdict} than launching each kernel); "
                     + (f"{others}." if others else ""))
    return lines + [f"{pace}."] if lines else []


def compare_summary(cmp: pd.DataFrame, names: list[str], n: int = 4) -> dict[str, Any]:
    """For every run after the first: the key figures (:data:`KEY_METRICS`) from one run to the other with
    their verdict (the median over GPUs where several have them), then the other significant deltas (largest
    relative first, only those with a % of a material base)."""
    lines = []
    base = names[0]
    for name in names[1:]:
        sig_col, pct_col = f"significant:{name}", f"pct:{name}"
        if sig_col not in cmp:
            continue
        both = cmp[cmp[f"value:{base}"].notna() & cmp[f"value:{name}"].notna()]
        keys, items = [], []
        for key in KEY_METRICS:
            hit = both[both["metric"].str.contains(key, regex=False)]
            if not len(hit):
                continue
            metric = hit["metric"].iloc[0]
            rows = hit[hit["metric"] == metric]
            keys.append(metric)
            a, b = rows[f"value:{base}"].median(), rows[f"value:{name}"].median()
            unit = str(rows["unit"].iloc[0])
            pct = f"{(b - a) / abs(a) * 100:+.1f} %, " if rows[pct_col].notna().all() else ""
            over = f" (median of {len(rows)} GPUs)" if len(rows) > 1 else ""
            items.append(f"{metric}{over} {_figure(a, unit)} -> {_figure(b, unit)} {unit} ({pct}{_verdict(rows[sig_col])})")
        if items:
            lines.append(f"{name} vs {base}: " + "; ".join(items) + ".")
        sig = cmp[(cmp[sig_col] == True) & cmp[pct_col].notna() & ~cmp["metric"].isin(keys)]  # noqa: E712
        sig = sig.reindex(sig[pct_col].abs().sort_values(ascending=False).index).head(n)
        if len(sig):
            lines.append(("Also significant: " if items else f"{name} vs {base}: significant: ")
                         + "; ".join(f"{r['gpu']} {r['metric']} {r[pct_col]:+.1f} %" for _, r in sig.iterrows()) + ".")
        elif not items:
            lines.append(f"{name} vs {base}: no significant difference (beyond the 95 % intervals and, for "
                         "figures that move with the host's speed, beyond how far two runs of one machine differ).")
    return {"kind": "compare", "lines": lines}


def index_runs(idx: list[int]) -> str:
    """[0, 1, 2, 3, 5] -> "0-3,5"."""
    runs: list[list[int]] = []
    for i in sorted(set(idx)):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ",".join(map(str, r)) for r in runs)
