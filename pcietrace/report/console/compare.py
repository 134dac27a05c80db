"""The console for ``pcietrace compare`` (runs side by side) and ``savings`` (attach's predicted graph savings
against the measured)."""

from __future__ import annotations

from typing import Any

import pandas as pd
from rich.table import Table

from pcietrace.analysis.compare import RUN_TO_RUN_PCT
from pcietrace.report.console.cells import domain_mark, esc, new_table, num, pm, summary_lines
from pcietrace.text import shortened


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
    t = new_table(title, cols, caption=f"{runs}. Δ vs A, with % of A (none where A is within its interval of 0 or too "
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
            cells.append(pm(v, ci, fmt) if v is not None and not pd.isna(v) else "–")
            if i:
                d, pct, sig = r.get(f"delta:{n}"), r.get(f"pct:{n}"), r.get(f"significant:{n}")
                txt = "–" if d is None or pd.isna(d) else "same" if d == 0 else f"{d:+,.3f}"
                if pct is not None and not pd.isna(pct):
                    txt += f" ({pct:+.1f}%)"
                cells.append(txt + ("*" if sig is True else ""))
        t.add_row(*cells)
    return t


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


def savings_table(sv: pd.DataFrame, paths: list[str]) -> Table:
    """Attach's predicted graph savings against the measured (see :func:`pcietrace.analysis.savings.savings`)."""
    one_domain = sv["domain"].astype(str).nunique() <= 1
    t = new_table("Graph savings per NVTX range: predicted from the eager run vs measured"
                  + (esc(f" (domain {sv['domain'].iloc[0]})") if one_domain and len(sv) else ""),
                  # (two-line headers: one line of them left the range names a column too narrow at 80 columns,
                  # and decode_step_b64 was folded into decode_step_b6 / 4)
                  [("range", "left"), ("eager\nms", "right"), ("graphed", "right"), ("launches", "right"),
                   ("saved\nms", "right"), ("predicted", "right"), ("error", "right"), ("bound", "left")],
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
        t.add_row(esc(shortened(r.name)) + domain_mark(r.domain, one_domain), num(r.eager_ms, ",.2f"),
                  num(r.graphed_ms, ",.2f"), num(r.eager_launches), num(r.measured_ms, ",.2f"),
                  num(r.predicted_ms, ",.2f"), err(r.error_pct),
                  "–" if pd.isna(r.launch_bound) else "yes" if r.launch_bound else "no")
    return t


def compare_parts(meta: dict[str, Any], results: dict[str, pd.DataFrame], summary: dict[str, Any] | None = None,
                  detail: bool = False, view: Any = None) -> list[Any]:
    """The summary lines, then :func:`compare_tables` (``meta["runs"]``: the runs' names)."""
    return summary_lines(summary or {}) + compare_tables(results["compare"], meta["runs"])


def savings_parts(meta: dict[str, Any], results: dict[str, pd.DataFrame], summary: dict[str, Any] | None = None,
                  detail: bool = False, view: Any = None) -> list[Any]:
    """:func:`savings_table` (``meta["runs"]``: the eager and the graphed recording)."""
    return [savings_table(results["savings"], meta["runs"])]
