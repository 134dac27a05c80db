"""The console for ``pcietrace graphs``: per workload size, the strategies' times and their counts and bytes,
laid out as a run's (:func:`pcietrace.report.console.run.layout`)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from pcietrace.report.console import run
from pcietrace.report.console.cells import new_table, num, pm_lines


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
        t = new_table(title + ": time", [("strategy", "left"), ("mean ms", "right"), ("median", "right"),
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
                      num(r.wall_us_median / 1e3, ",.3f"),
                      "1" if r.strategy == "eager" else f"{r.speedup:.3f}x\n[{r.speedup_lo:.3f}, {r.speedup_hi:.3f}]",
                      num(r.cpu_us_mean / 1e3, ",.3f"), num(r.build_us / 1e3, ",.3f"),
                      "never" if r.break_even_reuses == math.inf else num(r.break_even_reuses, ",.1f"))
        c = new_table(title + ": what each strategy did, and its PCIe traffic",
                      [("strategy", "left"), ("capt.", "right"), ("inst.", "right"), ("upd.", "right"),
                       ("nodes", "right"), ("hits", "right"), ("fail", "right"), ("H2D kB", "right"),
                       ("D2H kB", "right")],
                      caption=f"counts summed over {int(g['iterations'].iloc[0]):,} iterations per strategy: captures, "
                              "instantiations, graph updates, kernel-node updates, cache hits, failed updates; kB = "
                              "10^3 B per iteration from the counters, floor removed, ± 95 % over windows")
        c.columns[0].no_wrap = True
        for r in g.itertuples():
            c.add_row(r.strategy, num(r.captures), num(r.instantiations), num(r.updates), num(r.node_updates),
                      num(r.cache_hits), num(r.update_failures),
                      pm_lines(r.h2d_bytes_per_iter / 1e3, r.h2d_ci95 / 1e3, ",.1f"),
                      pm_lines(r.d2h_bytes_per_iter / 1e3, r.d2h_ci95 / 1e3, ",.1f"))
        parts += [t, c]
    return parts


def parts(meta: dict[str, Any], results: dict[str, pd.DataFrame], summary: dict[str, Any] | None = None,
          detail: bool = False, view: Any = None) -> list[Any]:
    return run.layout(meta, results, summary, detail, own=graphs_tables)
