"""PNG plots of the result tables (matplotlib, ``pcietrace[plot]``). Plots only: every figure draws columns
of a result table as they are; nothing is computed here beyond the fit line the table describes.

- ``bytes_vs_launches.png``: net window bytes vs launch calls (``fit_windows``) with the fit and its 95 %
  band (``per_launch``: slope ± ci95, intercept), eager and every graph size K;
- ``bytes_vs_duration.png``: bytes per eager launch vs kernel duration (``by_duration``), with the fit;
- ``time_per_kernel.png``: GPU and wall time per kernel, eager vs graph, vs duration, and the speedup
  (``gpu_time``, ``speedup``);
- ``latency.png``: medians with p10-p90 (``latency``), one panel per test;
- ``attach_timeline.png``: PCIe rate per GPU (``rates``), one panel each, with the NVTX ranges by name (as grouped)
  under them (``range_instances``);
- ``graph_strategies.png``: ``pcietrace graphs``' median time per iteration per strategy and graph size, with its
  95 % interval, labelled with the speedup over eager (of the mean times, as the table gives it; ``graphs``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pcietrace.errors import UsageError
from pcietrace.report.labels import LATENCY_LABELS
from pcietrace.report.renderers import Renderer

DIR_COLOR = {"h2d": "tab:blue", "d2h": "tab:orange"}
MARKERS, LINES = "os^Dv<>p", ["-", "--", ":", "-."]  # told apart per GPU (colour = direction)


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'pcietrace[plot]'") from None
    return plt


def _label(meta: dict[str, Any], idx: int, text: str) -> str:
    """Legend text per GPU; with many GPUs only the first is named (the others are drawn alike)."""
    ids = sorted(g["nvml_index"] for g in meta.get("gpus", []))
    if len(ids) <= 2:
        return f"GPU{idx} {text}"
    return f"GPU{ids[0]} {text} (+{len(ids) - 1} GPUs drawn alike)" if idx == ids[0] else "_nolegend_"


def _title(meta: dict[str, Any], what: str) -> str:
    name = ", ".join(sorted({str(g.get("name", "?")).replace("NVIDIA ", "") for g in meta.get("gpus", [])}))
    return f"{what} — {name}" + (" (SIMULATED)" if meta.get("simulated") and "SIMULATED" not in name else "")


def bytes_vs_launches(plt: Any, meta: dict[str, Any], fw: pd.DataFrame, pl: pd.DataFrame) -> Any:
    groups = list(fw.groupby(["mode", "graph_k"]))
    ncols = min(3, len(groups))
    nrows = -(-len(groups) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.8 * nrows), squeeze=False)
    for ax in axes.flat[len(groups):]:
        ax.set_visible(False)
    for i, (ax, ((mode, k), g)) in enumerate(zip(axes.flat, groups)):
        for d, color in DIR_COLOR.items():
            for idx, gi in g.groupby("nvml_index"):
                ax.scatter(gi["calls"], gi[f"{d}_net_bytes"] / 1e6, s=14, color=color, marker=MARKERS[idx % 8],
                           label=_label(meta, idx, f"{d.upper()} windows"))
                fit = pl[(pl["nvml_index"] == idx) & (pl["mode"] == mode) & (pl["graph_k"] == k) & (pl["direction"] == d)]
                if len(fit):
                    f = fit.iloc[0]
                    x = pd.Series([0.0, float(gi["calls"].max())])
                    ax.plot(x, (f["intercept_bytes"] + f["bytes_per_call"] * x) / 1e6, color=color, lw=1, ls=LINES[idx % 4],
                            label=_label(meta, idx, f"fit {f['bytes_per_call']:,.0f} ± {f['ci95']:,.0f} B/call"))
                    ax.fill_between(x, (f["intercept_bytes"] + (f["bytes_per_call"] - f["ci95"]) * x) / 1e6,
                                    (f["intercept_bytes"] + (f["bytes_per_call"] + f["ci95"]) * x) / 1e6,
                                    color=color, alpha=0.2, lw=0)
        ax.set_title(f"graphs of K={k} kernels" if mode == "graph" else "eager (one kernel per call)", fontsize=10)
        ax.set_xlabel("launch calls in window")
        if i % ncols == 0:
            ax.set_ylabel("net MB in window (floor removed)")
        ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 3))
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(_title(meta, "PCIe bytes vs launch calls (fit, 95 % band)"))
    fig.tight_layout()
    return fig


def bytes_vs_duration(plt: Any, meta: dict[str, Any], bd: pd.DataFrame, pl: pd.DataFrame) -> Any:
    fig, ax = plt.subplots(figsize=(7, 4))
    for idx, g in bd.groupby("nvml_index"):
        for d, color in DIR_COLOR.items():
            ax.plot(g["kernel_us"], g[f"{d}_bytes_per_launch"], marker=MARKERS[idx % 8], ls=LINES[idx % 4], color=color,
                    label=_label(meta, idx, f"{d.upper()} at max rate"))
            fit = pl[(pl["nvml_index"] == idx) & (pl["mode"] == "eager") & (pl["direction"] == d)] if len(pl) else pl
            if len(fit):
                f = fit.iloc[0]
                ax.axhspan(f["bytes_per_call"] - f["ci95"], f["bytes_per_call"] + f["ci95"], color=color, alpha=0.15,
                           label=_label(meta, idx, f"{d.upper()} fit {f['bytes_per_call']:,.0f} ± {f['ci95']:,.0f} B"))
    ax.set_xlabel("kernel duration (us)")
    ax.set_ylabel("PCIe bytes per eager launch")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(_title(meta, "Bytes per launch vs kernel duration"))
    return fig


def _gpu_color(plt: Any, idx: int) -> Any:
    return plt.cm.tab10(int(idx) % 10)


def time_per_kernel(plt: Any, meta: dict[str, Any], gt: pd.DataFrame, sp: pd.DataFrame) -> Any:
    """Left: time per kernel, eager (solid) and graph (dashed), one colour per GPU, on log axes so that the
    ~1 us eager-vs-graph gap stays visible beside 50 us kernels; right: the speedup (eager / graph)."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for idx, g in gt.groupby("nvml_index") if len(gt) else []:
        c = _gpu_color(plt, idx)
        ax.plot(g["kernel_us"], g["eager_gpu_us"], "o-", color=c, label=f"GPU{idx} GPU time, eager")
        ax.plot(g["kernel_us"], g["graph_gpu_us"], "o--", color=c, label=f"GPU{idx} GPU time, graph")
        ax2.plot(g["kernel_us"], g["gpu_speedup"], "o--", color=c, label=f"GPU{idx} GPU time ×")
    for idx, g in sp.groupby("nvml_index") if len(sp) else []:
        c = _gpu_color(plt, idx)
        ax.plot(g["kernel_us"], g["eager_wall_us"], "s-", color=c, alpha=0.5, ms=3, label=f"GPU{idx} wall, eager")
        ax.plot(g["kernel_us"], g["graph_wall_us"], "s--", color=c, alpha=0.5, ms=3, label=f"GPU{idx} wall, graph")
        ax2.plot(g["kernel_us"], g["speedup"], "s-", color=c, label=f"GPU{idx} wall ×")
    for a in (ax, ax2):
        a.set_xscale("symlog", linthresh=1)  # 0 us kernels stay on the axis
        a.set_xlabel("kernel duration (us)")
        a.grid(alpha=0.3, which="both")
    ax.set_yscale("log")
    ax.set_ylabel("us per kernel (log)")
    ax.set_title("time per kernel: eager solid, graph dashed", fontsize=10)
    ax2.set_ylabel("eager / graph")
    ax2.axhline(1, color="grey", lw=0.8)
    ax2.set_title("graph speedup", fontsize=10)
    for a in (ax, ax2):
        a.legend(fontsize=6, ncol=2 if gt["nvml_index"].nunique() > 2 else 1)
    fig.suptitle(_title(meta, "Eager vs CUDA graph"))
    fig.tight_layout()
    return fig


def latency(plt: Any, meta: dict[str, Any], lat: pd.DataFrame) -> Any:
    """Small multiples: one panel per test, one bar per GPU (peer reads: per GPU pair), medians with p10-p90
    whiskers; the figure's size bounded whatever the GPU count (a panel's bars get thinner, not the figure
    longer)."""
    tests = list(dict.fromkeys(lat["test"]))
    ncols = min(3, len(tests))
    nrows = -(-len(tests) // ncols)
    bars = int(lat.groupby("test").size().max())
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, min(2.6 * nrows + 0.15 * bars * nrows, 14)),
                             squeeze=False)
    for ax in axes.flat[len(tests):]:
        ax.set_visible(False)
    for ax, test in zip(axes.flat, tests):
        g = lat[lat["test"] == test].reset_index(drop=True)
        if (g["peer"] >= 0).all() and len(g) > 8:  # GPU pairs: a matrix reads, 56 bars do not
            m = g.pivot_table(index="nvml_index", columns="peer", values="median_us")
            im = ax.imshow(m.to_numpy(float), cmap="viridis")
            ax.set_xticks(range(m.shape[1]), [f"GPU{c}" for c in m.columns], fontsize=6, rotation=90)
            ax.set_yticks(range(m.shape[0]), [f"GPU{i}" for i in m.index], fontsize=6)
            for (r, c), v in np.ndenumerate(m.to_numpy(float)):
                if np.isfinite(v):
                    ax.text(c, r, f"{v:.2f}", ha="center", va="center", fontsize=5, color="white")
            ax.set_xlabel("peer read (median us)", fontsize=7)
            ax.set_title(LATENCY_LABELS.get(test, test), fontsize=8)
            fig.colorbar(im, ax=ax, fraction=0.046)
            continue
        labels = [f"GPU{r.nvml_index}" + ("" if r.peer < 0 else f"->{r.peer}") for r in g.itertuples()]
        y = list(range(len(g)))
        ax.barh(y, g["median_us"], color=[_gpu_color(plt, i) for i in g["nvml_index"]], alpha=0.8)
        ax.errorbar(g["median_us"], y, xerr=[(g["median_us"] - g["p10_us"]).clip(lower=0),
                                             (g["p90_us"] - g["median_us"]).clip(lower=0)],
                    fmt="none", ecolor="black", lw=0.8, capsize=1.5)
        ax.set_yticks(y, labels, fontsize=6 if len(g) > 16 else 7)
        ax.invert_yaxis()
        ax.set_title(LATENCY_LABELS.get(test, test), fontsize=8)
        ax.set_xlabel("us", fontsize=7)
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(_title(meta, "Host round trips and launch latencies (median, whiskers p10–p90)"), fontsize=10)
    fig.tight_layout()
    return fig


def graph_strategies(plt: Any, meta: dict[str, Any], gr: pd.DataFrame) -> Any:
    sizes = sorted(gr["kernels"].unique())
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.5 * len(sizes), 3.6), squeeze=False)
    for ax, n in zip(axes[0], sizes):
        g = gr[gr["kernels"] == n].reset_index(drop=True)
        x = range(len(g))
        med_ms = g["wall_us_median"] / 1e3
        ax.bar(list(x), med_ms, color="tab:blue", alpha=0.7)
        # (a bootstrap interval holds its median; clipped all the same: matplotlib refuses a negative bar)
        ax.errorbar(list(x), med_ms, fmt="none", ecolor="black", lw=1, capsize=3,
                    yerr=[(med_ms - g["wall_us_median_lo"] / 1e3).clip(lower=0),
                          (g["wall_us_median_hi"] / 1e3 - med_ms).clip(lower=0)])
        top_ms = pd.concat([med_ms, g["wall_us_median_hi"] / 1e3], axis=1).max(axis=1)  # a NaN bound: the bar's top
        for i, r in g.iterrows():  # the speedup over eager above each bar (the table's: of the mean times)
            if pd.notna(r["speedup"]):  # none without an eager row to set it against
                ax.annotate(f"{r['speedup']:.2f}x", (i, top_ms[i]), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(list(x), g["strategy"], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("ms per iteration (median, 95 % CI)")
        ax.set_title(f"{n:,} kernels per iteration", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(_title(meta, "CUDA graph strategies (labels: speedup over eager, of the mean times)"), fontsize=10)
    fig.tight_layout()
    return fig


#: Rate panels of the attach timeline, one per GPU, at most this many (the rest summed into the last, said so).
MAX_FACETS = 8
#: Range rows of the attach timeline: the names with the most time, at most this many.
MAX_RANGE_ROWS = 12


def attach_timeline(plt: Any, meta: dict[str, Any], rates: pd.DataFrame, inst: pd.DataFrame) -> Any:
    """One PCIe-rate panel per GPU (small multiples sharing the time axis; H2D drawn over D2H, a log rate
    axis so that a few MB/s beside GB/s copies still shows), and under them the NVTX ranges, one row per
    range name (the names with the most time; grouped as the report groups them, where the instances say their
    ``group``: an emit_nvtx op's calls on one row, not one row per call), each its own colour and labelled on its
    row. The time axis spans the program's ranges (else its run), in seconds since the program started."""
    # a panel per GPU; in a merged report (several nodes' GPUs) per node and GPU
    facet = (rates["node"].astype(str) + " GPU" if "node" in rates else "GPU") + rates["nvml_index"].astype(str)
    gpus = sorted(facet.unique())[:MAX_FACETS]
    key = "group" if "group" in inst else "name"
    names = (inst.assign(d=inst["t_end_ns"] - inst["t_start_ns"]).groupby(key, observed=True)["d"].sum()
             .sort_values(ascending=False).index[:MAX_RANGE_ROWS].tolist()) if len(inst) else []
    heights = [1.0] * len(gpus) + ([max(1.2, 0.25 * len(names))] if names else [])
    fig, axes = plt.subplots(len(heights), 1, figsize=(12, min(1.3 * len(gpus) + 0.3 * len(names) + 1.5, 14)),
                             sharex=True, squeeze=False, gridspec_kw={"height_ratios": heights})
    axes = axes[:, 0]
    t0 = meta.get("t_app_start_ns") or int(rates["t_ns"].min())
    for ax, idx in zip(axes, gpus):
        g = rates[facet == idx]
        x = (g["t_ns"] - t0) / 1e9
        ax.fill_between(x, g["tx_Bps"].clip(lower=1) / 1e6, 1e-3, step="post", color=DIR_COLOR["d2h"], alpha=0.5,
                        lw=0, label="D2H", zorder=1)
        ax.step(x, g["rx_Bps"].clip(lower=1) / 1e6, where="post", color=DIR_COLOR["h2d"], lw=0.9, label="H2D",
                zorder=2)
        ax.set_yscale("log")
        ax.set_ylim(bottom=0.1)
        ax.set_ylabel(f"{idx}\nMB/s", fontsize=7)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="upper left", ncol=2)
    if names:
        ax2 = axes[-1]
        rows = {n: i for i, n in enumerate(names)}
        shown = inst[inst[key].isin(rows)]
        for n, g in shown.groupby(key, sort=False, observed=True):
            c = plt.cm.tab20(rows[n] % 20)
            ax2.broken_barh(list(zip((g["t_start_ns"] - t0) / 1e9, (g["t_end_ns"] - g["t_start_ns"]) / 1e9)),
                            (rows[n] - 0.4, 0.8), facecolors=c, edgecolor="none")
        ax2.set_yticks(list(rows.values()), [str(n)[:32] for n in rows], fontsize=7)
        ax2.set_ylim(len(rows) - 0.5, -0.5)
        left = inst[key].nunique() - len(names)
        ax2.set_title("NVTX ranges" + (f" (the {len(names)} with the most time; {left:,} more in the tables)" if left else ""),
                      fontsize=8)
        ax2.grid(axis="x", alpha=0.3)
    span = (inst["t_start_ns"].min(), inst["t_end_ns"].max()) if len(inst) else \
        (meta.get("t_app_start_ns"), meta.get("t_app_end_ns"))
    if span[0] is not None and span[1] is not None:
        width = (span[1] - span[0]) / 1e9
        axes[-1].set_xlim((span[0] - t0) / 1e9 - 0.02 * width, (span[1] - t0) / 1e9 + 0.02 * width)
    axes[-1].set_xlabel("s since the program started")
    more = f" ({len(gpus)} of {facet.nunique()} GPUs)" if facet.nunique() > len(gpus) else ""
    fig.suptitle(_title(meta, "attach: " + " ".join(str(c) for c in meta.get("command", []))[:80] + more), fontsize=10)
    fig.tight_layout()
    return fig


def check(directory: Path) -> None:
    """Before a measurement: refuse now (UsageError) what would fail after it, no matplotlib or no folder."""
    _plt()
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create plot folder {directory}: {exc.strerror}") from None


def write(meta: dict[str, Any], results: dict[str, pd.DataFrame], directory: Path) -> list[Path]:
    """Every plot the results have data for, as PNGs in ``directory`` (created); returns their paths."""
    plt = _plt()
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create plot folder {directory}: {exc.strerror}") from None
    r = {k: results.get(k, pd.DataFrame()) for k in ("fit_windows", "per_launch", "by_duration", "gpu_time", "speedup",
                                                     "latency", "rates", "range_instances", "graphs")}
    figs = []
    if len(r["fit_windows"]) and len(r["per_launch"]):
        figs.append(("bytes_vs_launches.png", bytes_vs_launches(plt, meta, r["fit_windows"], r["per_launch"])))
    if len(r["by_duration"]):
        figs.append(("bytes_vs_duration.png", bytes_vs_duration(plt, meta, r["by_duration"], r["per_launch"])))
    if len(r["gpu_time"]) or len(r["speedup"]):
        figs.append(("time_per_kernel.png", time_per_kernel(plt, meta, r["gpu_time"], r["speedup"])))
    if len(r["latency"]):
        figs.append(("latency.png", latency(plt, meta, r["latency"])))
    if len(r["rates"]):
        figs.append(("attach_timeline.png", attach_timeline(plt, meta, r["rates"], r["range_instances"])))
    if len(r["graphs"]):
        figs.append(("graph_strategies.png", graph_strategies(plt, meta, r["graphs"])))
    paths = []
    for name, fig in figs:
        try:
            fig.savefig(directory / name, dpi=110)
        except OSError as exc:
            raise UsageError(f"cannot write {directory / name}: {exc.strerror}") from None
        finally:
            plt.close(fig)
        paths.append(directory / name)
    return paths


class PlotsRenderer(Renderer):
    """Every plot the results have data for, as PNGs in the folder ``out`` (:func:`write`); returns their paths."""

    name = "plots"

    def render(self, meta: dict[str, Any], results: Mapping[str, pd.DataFrame], summary: dict[str, Any],
               out: Path) -> list[Path]:
        return write(meta, dict(results), Path(out))
