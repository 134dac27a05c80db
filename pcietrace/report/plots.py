"""PNG plots of the result tables (matplotlib, ``pcietrace[plot]``). Plots only: every figure draws columns
of a result table as they are; nothing is computed here beyond the fit line the table describes.

- ``bytes_vs_launches.png``: net window bytes vs launch calls (``fit_windows``) with the fit and its 95 %
  band (``per_launch``: slope ± ci95, intercept), eager and every graph size K;
- ``bytes_vs_duration.png``: bytes per eager launch vs kernel duration (``by_duration``), with the fit;
- ``time_per_kernel.png``: GPU and wall time per kernel, eager vs graph, vs duration, and the speedup
  (``gpu_time``, ``speedup``);
- ``latency.png``: medians with p10-p90 (``latency``);
- ``attach_timeline.png``: per-GPU PCIe rate (``rates``) with the NVTX ranges under it (``range_instances``);
- ``graph_strategies.png``: ``pcietrace graphs``' median time per iteration per strategy and graph size, with its
  95 % interval, labelled with the speedup over eager (of the mean times, as the table gives it; ``graphs``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from pcietrace.errors import UsageError

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


def time_per_kernel(plt: Any, meta: dict[str, Any], gt: pd.DataFrame, sp: pd.DataFrame) -> Any:
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for idx, g in gt.groupby("nvml_index") if len(gt) else []:
        ax.plot(g["kernel_us"], g["eager_gpu_us"], "o-", color="tab:red", label=_label(meta, idx, "GPU time, eager"))
        ax.plot(g["kernel_us"], g["graph_gpu_us"], "o-", color="tab:green", label=_label(meta, idx, "GPU time, graph"))
        ax2.plot(g["kernel_us"], g["gpu_speedup"], "o--", color="tab:purple", label=_label(meta, idx, "GPU time ×"))
    for idx, g in sp.groupby("nvml_index") if len(sp) else []:
        ax.plot(g["kernel_us"], g["eager_wall_us"], "s:", color="tab:red", label=_label(meta, idx, "wall, eager"))
        ax.plot(g["kernel_us"], g["graph_wall_us"], "s:", color="tab:green", label=_label(meta, idx, "wall, graph"))
        ax2.plot(g["kernel_us"], g["speedup"], "s-", color="tab:purple", label=_label(meta, idx, "wall ×"))
    ax.set_xlabel("kernel duration (us)")
    ax.set_ylabel("us per kernel")
    ax.set_title("time per kernel")
    ax2.set_xlabel("kernel duration (us)")
    ax2.set_ylabel("eager / graph")
    ax2.axhline(1, color="grey", lw=0.8)
    ax2.set_title("graph speedup")
    for a in (ax, ax2):
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.suptitle(_title(meta, "Eager vs CUDA graph"))
    return fig


def latency(plt: Any, meta: dict[str, Any], lat: pd.DataFrame) -> Any:
    from pcietrace.report.console import LATENCY_LABELS

    labels = [f"GPU{r.nvml_index} " + LATENCY_LABELS.get(r.test, r.test) + ("" if r.peer < 0 else f" -> GPU{r.peer}")
              for r in lat.itertuples()]
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(lat) + 1.2))
    y = range(len(lat))
    ax.barh(list(y), lat["median_us"], color="tab:blue", alpha=0.7)
    ax.errorbar(lat["median_us"], list(y), xerr=[lat["median_us"] - lat["p10_us"], lat["p90_us"] - lat["median_us"]],
                fmt="none", ecolor="black", lw=1, capsize=2)
    ax.set_yticks(list(y), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("us (median; whiskers p10–p90)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(_title(meta, "Host round trips and launch latencies"))
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


def attach_timeline(plt: Any, meta: dict[str, Any], rates: pd.DataFrame, inst: pd.DataFrame) -> Any:
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 6), sharex=True, gridspec_kw={"height_ratios": [2, 1.3]})
    starts = ([int(rates["t_ns"].min())] if len(rates) else []) + ([int(inst["t_start_ns"].min())] if len(inst) else [])
    t0 = min(starts, default=0)
    keys = ["node", "nvml_index"] if "node" in rates else ["nvml_index"]  # (a merged report: GPUs of several nodes)
    for key, g in rates.groupby(keys):
        idx, node = key[-1], (f"{key[0]} " if len(keys) > 1 else "")
        for d, col, text in (("h2d", "rx_Bps", "H2D (RX)"), ("d2h", "tx_Bps", "D2H (TX)")):
            label = _label(meta, idx, text)
            ax.plot((g["t_ns"] - t0) / 1e6, g[col] / 1e6, lw=0.8, color=DIR_COLOR[d],
                    label=label if label.startswith("_") else node + label)
    ax.set_ylabel("PCIe MB/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    who = inst["node"].astype(str) + " pid " + inst["pid"].astype(str) if "node" in inst else "pid " + inst["pid"].astype(str)
    rows = {key: i for i, key in enumerate(sorted(set(zip(who, inst["tid"], inst["depth"]))))} if len(inst) else {}
    app = [meta[k] for k in ("t_app_start_ns", "t_app_end_ns") if meta.get(k) is not None]
    span = ((app[0] - t0) / 1e6, (app[1] - t0) / 1e6) if len(app) == 2 else None
    colors = {name: plt.cm.tab10(i % 10) for i, name in enumerate(dict.fromkeys(inst["name"]))} if len(inst) else {}
    width_ms = (span[1] - span[0]) if span else 1.0
    for w, r in zip(who if len(inst) else [], inst.itertuples()):
        y = rows[(w, r.tid, r.depth)]
        dur_ms = (r.t_end_ns - r.t_start_ns) / 1e6
        ax2.barh(y, dur_ms, left=(r.t_start_ns - t0) / 1e6, height=0.8, color=colors[r.name], edgecolor="black", lw=0.5,
                 label=str(r.name))
        if dur_ms > 0.08 * width_ms:  # name inside the bar where it fits; the legend names them all
            ax2.text((r.t_start_ns - t0) / 1e6, y, f" {r.name}", va="center", fontsize=7, clip_on=True)
    if span:
        ax.set_xlim(span[0] - 0.02 * width_ms, span[1] + 0.02 * width_ms)  # the program's run, not the idle edges
    handles, names = ax2.get_legend_handles_labels()
    if names:
        uniq = dict(zip(names, handles))
        ax2.legend(uniq.values(), uniq.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), title="ranges",
                   title_fontsize=7)
    ax2.set_yticks(list(rows.values()), [f"{p} tid {t} depth {d}" for p, t, d in rows], fontsize=7)
    ax2.invert_yaxis()
    ax2.set_xlabel("ms since the first sample")
    ax2.set_title("NVTX ranges (one row per process, thread and nesting depth)", fontsize=9)
    fig.suptitle(_title(meta, "attach: " + " ".join(str(c) for c in meta.get("command", []))[:80]))
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
