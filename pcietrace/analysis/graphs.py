"""``pcietrace graphs``: per workload size and strategy, time per iteration, speedup over eager, host cost,
the strategy's counts, PCIe bytes per iteration and the break-even of an instantiation. Stateless.

Inputs: the session's ``graphs`` table (one row per iteration, ns) and its windows after
:func:`~pcietrace.analysis.counters.subtract_floor` (``mode`` = strategy or "idle", ``kernels``,
``iterations``, ``rx_net_bytes``/``tx_net_bytes``).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pcietrace.analysis.launch import DIRECTIONS
from pcietrace.analysis.spread import t975
from pcietrace.schema import COUNT_COLUMNS as COUNTS  # what each iteration counts (a plain tuple)

#: Columns of :func:`summary`, in order.
SUMMARY_COLUMNS = ["kernels", "strategy", "iterations", "wall_us_median", "wall_us_median_lo", "wall_us_median_hi",
                   "wall_us_mean", "wall_us_mean_lo", "wall_us_mean_hi", "speedup", "speedup_lo", "speedup_hi",
                   "submit_us_median", "cpu_us_mean", "prep_us_mean", *COUNTS, "h2d_bytes_per_iter",
                   "h2d_ci95", "d2h_bytes_per_iter", "d2h_ci95", "build_us", "launch_us", "saving_us_per_reuse",
                   "break_even_reuses"]

BOOTSTRAP = 2000


def _boot(v: np.ndarray, stat: str, rng: np.random.Generator) -> np.ndarray:
    """``BOOTSTRAP`` resampled means or medians of ``v``."""
    draws = rng.choice(v, size=(BOOTSTRAP, v.size), replace=True)
    return np.median(draws, axis=1) if stat == "median" else draws.mean(axis=1)


def window_rates(wb: pd.DataFrame) -> pd.DataFrame:
    """Net PCIe bytes per iteration for each strategy window: ``kernels, strategy, round, h2d_bytes_per_iter,
    d2h_bytes_per_iter``."""
    w = wb[(wb["mode"] != "idle") & (wb["iterations"] > 0)].dropna(subset=["rx_net_bytes", "tx_net_bytes"])
    out = pd.DataFrame({"kernels": w["kernels"], "strategy": w["mode"], "round": w["round"]})
    for d, c in DIRECTIONS.items():
        out[f"{d}_bytes_per_iter"] = w[f"{c}_net_bytes"] / w["iterations"]
    return out.reset_index(drop=True)


def summary(iters: pd.DataFrame, wb: pd.DataFrame, per_window: bool = False, seed: int = 0) -> pd.DataFrame:
    """One row per (kernels, strategy), eager first.

    ``per_window``: the run was pipelined (no synchronize per iteration), so one iteration's time is not
    its own; wall times are then taken per window (window time / iterations) and the statistics run over
    windows instead of iterations.

    ``wall_us_median``/``wall_us_mean`` with bootstrap 95 % intervals (``_lo``/``_hi``) over iterations: the
    mean is total time / iterations, so it carries the instantiations a strategy pays now and then; ``speedup``
    = eager's mean / this strategy's mean, bootstrap 95 % interval resampling both; ``submit_us_median``
    (start -> work submitted), ``cpu_us_mean`` (host CPU time per iteration), ``prep_us_mean`` (capture,
    instantiate, update); the strategy's counts summed over all iterations; ``h2d/d2h_bytes_per_iter``
    (floor removed, mean over windows) with Student-t ``_ci95`` half-widths over windows; break-even:
    ``build_us`` (median preparation time of iterations that instantiated a graph), ``launch_us`` (median
    iteration time minus its preparation: the iteration with the graph ready), ``saving_us_per_reuse``
    (eager's median minus ``launch_us``) and ``break_even_reuses`` = build / saving (how many launches of
    one executable graph repay its instantiation; inf if a launch saves nothing).
    """
    if not len(iters):
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    rng = np.random.default_rng(seed)
    rates = window_rates(wb) if len(wb) else pd.DataFrame(columns=["kernels", "strategy",
                                                                   *(f"{d}_bytes_per_iter" for d in DIRECTIONS)])
    rows = []
    def walls(g: pd.DataFrame) -> np.ndarray:
        w = g.groupby("round")["wall_ns"].mean() if per_window else g["wall_ns"]
        return w.to_numpy(float) / 1e3

    for n, per_size in iters.groupby("kernels", sort=True):
        eager = walls(per_size[per_size["strategy"] == "eager"])
        eager_boot = _boot(eager, "mean", rng) if eager.size else None
        eager_median = float(np.median(eager)) if eager.size else math.nan
        order = list(dict.fromkeys(["eager", *per_size["strategy"]]))
        for s in order:
            g = per_size[per_size["strategy"] == s]
            if not len(g):
                continue
            wall = walls(g)
            row: dict[str, float | int | str] = {"kernels": int(n), "strategy": s, "iterations": int(len(g))}
            for stat in ("median", "mean"):
                b = _boot(wall, stat, rng)
                row[f"wall_us_{stat}"] = float(np.median(wall) if stat == "median" else wall.mean())
                row[f"wall_us_{stat}_lo"], row[f"wall_us_{stat}_hi"] = map(float, np.percentile(b, [2.5, 97.5]))
                if stat == "mean":
                    ratio = eager_boot / b if eager_boot is not None else np.array([math.nan])
                    row["speedup"] = float(eager.mean() / wall.mean()) if eager.size else math.nan
                    row["speedup_lo"], row["speedup_hi"] = map(float, np.percentile(ratio, [2.5, 97.5]))
            row["submit_us_median"] = float(g["submit_ns"].median()) / 1e3
            row["cpu_us_mean"] = float(g["cpu_ns"].mean()) / 1e3
            row["prep_us_mean"] = float(g["prep_ns"].mean()) / 1e3
            for c in COUNTS:
                row[c] = int(g[c].sum())
            r = rates[(rates["kernels"] == n) & (rates["strategy"] == s)]
            for d in DIRECTIONS:
                v = r[f"{d}_bytes_per_iter"].to_numpy(float)
                row[f"{d}_bytes_per_iter"] = float(v.mean()) if v.size else math.nan
                row[f"{d}_ci95"] = (float(t975(v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))
                                    if v.size > 1 else math.nan)
            built = g[g["instantiations"] > 0]
            row["build_us"] = float(built["prep_ns"].median()) / 1e3 if len(built) and s != "eager" else math.nan
            own = s != "eager" and not per_window  # a pipelined iteration's time is not its own
            row["launch_us"] = float((g["wall_ns"] - g["prep_ns"]).median()) / 1e3 if own else math.nan
            row["saving_us_per_reuse"] = eager_median - row["launch_us"]
            saving = row["saving_us_per_reuse"]
            # unknown (NaN) where either side is (pipelined: no iteration's own time), never "no saving" (inf)
            row["break_even_reuses"] = (row["build_us"] / saving if saving > 0 else math.inf) \
                if not (math.isnan(row["build_us"]) or math.isnan(saving)) else math.nan
            rows.append(row)
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def compare_rows(gs: pd.DataFrame) -> list[tuple[str, str, float, float]]:
    """Headline figures of a graphs run for :func:`pcietrace.analysis.compare.metrics`: per size and
    strategy the mean wall time per iteration and the speedup over eager, each with its 95 % half-width."""
    rows: list[tuple[str, str, float, float]] = []
    for r in gs.itertuples():
        rows.append((f"graphs {r.kernels} kernels, {r.strategy}: time / iteration", "us", r.wall_us_mean,
                     (r.wall_us_mean_hi - r.wall_us_mean_lo) / 2))
        if r.strategy != "eager":
            rows.append((f"graphs {r.kernels} kernels, {r.strategy}: speedup over eager", "x", r.speedup,
                         (r.speedup_hi - r.speedup_lo) / 2))
    return rows
