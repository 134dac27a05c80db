"""Per-launch analyses: bytes per launch (fit), per graph node, by kernel duration, CPU cost, GPU time
per kernel and graph speedup. Stateless: DataFrames in, DataFrames out.

Inputs are the window frame after :func:`~pcietrace.analysis.counters.subtract_floor` (``wb``), and the
``bursts``, ``e2e`` and ``calibration`` records of a session. Directions: ``h2d`` = host->device =
the GPU's RX counter; ``d2h`` = device->host = TX.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from pcietrace.analysis.fit import linear_fit
from pcietrace.analysis.spread import iqr_pct

DIRECTIONS = {"h2d": "rx", "d2h": "tx"}
#: Launch modes of bursts and end-to-end loops, as the tables pair them.
MODES = ("eager", "graph")
BY_DURATION_COLUMNS = ["nvml_index", "kernel_us", "launches", "achieved_rate_hz", "h2d_bytes_per_launch",
                       "d2h_bytes_per_launch"]
PER_LAUNCH_COLUMNS = ["nvml_index", "mode", "graph_k", "direction", "bytes_per_call", "ci95", "bytes_per_kernel",
                      "intercept_bytes", "intercept_Bps", "intercept_ci95_Bps", "floor_Bps", "intercept_ok", "r2", "n"]
PER_NODE_COLUMNS = ["nvml_index", "direction", "fixed_bytes", "fixed_ci95", "per_node_bytes", "per_node_ci95", "ks"]
CPU_COST_COLUMNS = ["nvml_index", "mode", "graph_k", "host_us_per_call", "host_us_per_kernel", "cpu_us_per_call"]
GPU_TIME_COLUMNS = ["nvml_index", "kernel_us", "eager_gpu_us", "graph_gpu_us", "saturated", "eager_gpu_us_min",
                    "eager_gpu_us_max", "eager_contexts", "measured_us", "eager_gap_us", "graph_gap_us", "gpu_speedup"]
SPEEDUP_COLUMNS = ["nvml_index", "kernel_us", "eager_wall_us", "graph_wall_us", "graph_k", "speedup"]

#: Launch paths (``path`` column of bursts, windows and e2e records) and how tables name them.
#: Reports from before the native loops have no ``path``: their loops ran in Python.
LANGUAGES = {"native": "native C (pcietrace loops)", "python": "from Python (cuda.bindings)",
             "torch": "from PyTorch (x.fill_)"}


def primary(records: pd.DataFrame) -> pd.DataFrame:
    """The records of a run's main launch path: the native loops where there are any, else all (an
    older report, or one whose every loop ran in Python)."""
    if "path" in records and (records["path"] == "native").any():
        return records[records["path"] == "native"]
    return records


def per_launch_fits(wb: pd.DataFrame, fl: pd.DataFrame) -> pd.DataFrame:
    """Bytes per launch call from a fit of net window bytes (floor removed) against launch calls at
    several rates.

    Eager: one fit over the ``fit`` windows (empty kernel, rates from max down). Graph: one fit per K
    over the ``graph`` windows. Net bytes are fitted because windows differ in length (a full queue
    takes time to drain), so raw bytes would mix floor into the slope. Columns: ``nvml_index, mode,
    graph_k, direction, bytes_per_call, ci95`` (95 % half-width), ``bytes_per_kernel`` (per call / K),
    ``intercept_bytes`` (the fit's intercept), ``intercept_Bps`` (fit intercept over the mean window length: traffic neither launches nor the
    floor explain), ``floor_Bps`` (the idle floor that was removed), ``intercept_ok`` (0 lies inside
    the intercept's 95 % interval, i.e. the measured floor accounts for all non-launch traffic),
    ``r2``, ``n``.
    """
    rows = []
    sel = wb[wb["purpose"].isin(["fit", "graph"])].dropna(subset=["rx_net_bytes", "tx_net_bytes"])
    floors = fl.set_index("nvml_index") if len(fl) else None
    for (idx, mode, k), g in sel.groupby(["nvml_index", "mode", "graph_k"]):
        dur = g["duration_s"].mean()
        for direction, c in DIRECTIONS.items():
            f = linear_fit(g["calls"], g[f"{c}_net_bytes"])
            floor_bps = float(floors.loc[idx, f"{c}_Bps"]) if floors is not None and idx in floors.index else np.nan
            icpt, icpt_ci = f["intercept"] / dur, f["intercept_ci95"] / dur
            rows.append({"nvml_index": int(idx), "mode": mode, "graph_k": int(k), "direction": direction,
                         "bytes_per_call": f["slope"], "ci95": f["slope_ci95"],
                         "bytes_per_kernel": f["slope"] / k, "intercept_bytes": f["intercept"], "intercept_Bps": icpt, "intercept_ci95_Bps": icpt_ci,
                         "floor_Bps": floor_bps, "intercept_ok": bool(abs(icpt) <= icpt_ci),
                         "r2": f["r2"], "n": f["n"]})
    return pd.DataFrame(rows, columns=PER_LAUNCH_COLUMNS)


FIT_WINDOW_COLUMNS = ["nvml_index", "mode", "graph_k", "calls", "duration_s", "h2d_net_bytes", "d2h_net_bytes"]


def fit_windows(wb: pd.DataFrame) -> pd.DataFrame:
    """The points behind :func:`per_launch_fits`: net bytes (floor removed) and launch calls of every fit
    window (:data:`FIT_WINDOW_COLUMNS`), for plots and exports."""
    sel = wb[wb["purpose"].isin(["fit", "graph"])]
    out = sel.rename(columns={f"{c}_net_bytes": f"{d}_net_bytes" for d, c in DIRECTIONS.items()})
    return out.reindex(columns=FIT_WINDOW_COLUMNS).reset_index(drop=True)


def per_node(fits: pd.DataFrame) -> pd.DataFrame:
    """Graph bytes per launch split into a fixed part and a per-node part: a fit of bytes per graph
    launch against K. Columns: ``nvml_index, direction, fixed_bytes, fixed_ci95, per_node_bytes,
    per_node_ci95, ks`` (how many graph sizes)."""
    rows = []
    g_fits = fits[fits["mode"] == "graph"]
    for (idx, direction), g in g_fits.groupby(["nvml_index", "direction"]):
        f = linear_fit(g["graph_k"], g["bytes_per_call"])
        rows.append({"nvml_index": int(idx), "direction": direction, "fixed_bytes": f["intercept"],
                     "fixed_ci95": f["intercept_ci95"], "per_node_bytes": f["slope"],
                     "per_node_ci95": f["slope_ci95"], "ks": f["n"]})
    return pd.DataFrame(rows, columns=PER_NODE_COLUMNS)


def by_duration(wb: pd.DataFrame) -> pd.DataFrame:
    """Net bytes per launch of eager windows at max rate, per kernel duration (is it flat?).
    Columns: ``nvml_index, kernel_us, launches, achieved_rate_hz, h2d_bytes_per_launch,
    d2h_bytes_per_launch``."""
    sel = wb[(wb["mode"] == "eager") & wb["target_rate_hz"].isna() & (wb["launches"] > 0)]
    out = sel[["nvml_index", "kernel_us", "launches", "achieved_rate_hz"]].copy()
    for direction, c in DIRECTIONS.items():
        # float: windows no sample covers have NaN bytes, which must stay a column, not vanish from the mean
        out[f"{direction}_bytes_per_launch"] = sel[f"{c}_net_bytes"].astype(float) / sel["launches"]
    return out.groupby(["nvml_index", "kernel_us"], as_index=False)[BY_DURATION_COLUMNS[2:]].mean()


#: More than this share of a group's bursts ran dry: the group keeps them all, and its figure is an upper bound.
MOSTLY_DRY = 0.5


def kept_bursts(bursts: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The bursts a host-cost median is taken over, per group of ``keys``: those that kept their blocker
    running (``saturated``, the precondition), where at least half of the group did; every burst of a group
    where most ran dry (a queue too short for the burst: its figure is then an upper bound). A dry burst
    among saturated ones took milliseconds longer than its launches can: a host stall, not launch cost."""
    if not len(bursts):
        return bursts
    dry = ~bursts["saturated"].astype(bool)
    mostly_dry = dry.groupby([bursts[k] for k in keys]).transform("mean") > MOSTLY_DRY
    return bursts[~dry | mostly_dry]


def cpu_cost(bursts: pd.DataFrame) -> pd.DataFrame:
    """Host cost per launch call while the GPU is blocked (so the queue never fills and no call
    waits): ``host_us_per_call`` (wall time of the launch loop) and ``cpu_us_per_call`` (the launching
    thread's CPU time), medians over kernel durations (dry bursts left out: :func:`kept_bursts`), and
    ``host_us_per_kernel`` (per call / K).
    Columns: :data:`CPU_COST_COLUMNS`."""
    bursts = kept_bursts(primary(bursts), ["nvml_index", "mode", "graph_k", "kernel_us"])
    b = bursts.assign(host_us_per_call=bursts["host_ns"] / bursts["calls"] / 1e3,
                      cpu_us_per_call=bursts["cpu_ns"] / bursts["calls"] / 1e3)
    out = b.groupby(["nvml_index", "mode", "graph_k"], as_index=False)[["host_us_per_call", "cpu_us_per_call"]].median()
    out["host_us_per_kernel"] = out["host_us_per_call"] / out["graph_k"]
    return out[CPU_COST_COLUMNS]


def gpu_time(bursts: pd.DataFrame, calibration: pd.DataFrame, contexts: pd.DataFrame | None = None) -> pd.DataFrame:
    """GPU time per kernel with the queue full (``eager_gpu_us``, ``graph_gpu_us``), per kernel duration.
    ``gap`` = per-kernel time minus the kernel's measured duration (the launch overhead the GPU
    sees); ``gpu_speedup`` = eager / graph. ``saturated`` False means the burst did not keep the queue
    full and the number is an upper bound.

    A CUDA context draws its own eager level (:data:`pcietrace.record.run.RunPlan.gpu_time_contexts`):
    where ``contexts`` holds bursts in fresh contexts, the shortest kernel's ``eager_gpu_us`` is the median
    over every context's level (:func:`context_levels`), ``eager_gpu_us_min``/``_max`` their range and
    ``eager_contexts`` their number (1, min = max, elsewhere). Columns: :data:`GPU_TIME_COLUMNS`."""
    b = primary(bursts)
    b = b.assign(us_per_kernel=b["gpu_ns"] / b["launches"] / 1e3)
    piv = b.pivot_table(index=["nvml_index", "kernel_us"], columns="mode",
                        values=["us_per_kernel", "saturated"], aggfunc={"us_per_kernel": "median", "saturated": "all"})
    # both modes, measured or not (a run stopped between a duration's eager and graph bursts has one)
    piv = piv.reindex(columns=pd.MultiIndex.from_product([["us_per_kernel", "saturated"], MODES]))
    sat = piv["saturated"].ne(False)  # a mode not measured (NaN): no figure of its own, no upper-bound mark on the other
    out = pd.DataFrame({
        "eager_gpu_us": piv[("us_per_kernel", "eager")],
        "graph_gpu_us": piv[("us_per_kernel", "graph")],
        "saturated": sat["eager"] & sat["graph"],
    }).reset_index()
    out["eager_gpu_us_min"] = out["eager_gpu_us_max"] = out["eager_gpu_us"]
    out["eager_contexts"] = 1
    levels = context_levels(bursts, contexts)
    if len(levels):
        g = levels.groupby(["nvml_index", "kernel_us"])["eager_gpu_us"].agg(["median", "min", "max", "count"])
        key = pd.MultiIndex.from_frame(out[["nvml_index", "kernel_us"]])
        hit = key.isin(g.index)
        g = g.reindex(key[hit])
        out.loc[hit, ["eager_gpu_us", "eager_gpu_us_min", "eager_gpu_us_max", "eager_contexts"]] = g.to_numpy()
        # The contexts' levels come from saturated bursts only: no upper bound on the eager side there.
        out.loc[hit, "saturated"] = sat["graph"].to_numpy()[hit]
    out["eager_contexts"] = out["eager_contexts"].astype(int)
    cal = calibration[["nvml_index", "kernel_us", "measured_us"]]
    out = out.merge(cal, on=["nvml_index", "kernel_us"], how="left")
    out["eager_gap_us"] = out["eager_gpu_us"] - out["measured_us"]
    out["graph_gap_us"] = out["graph_gpu_us"] - out["measured_us"]
    out["gpu_speedup"] = out["eager_gpu_us"] / out["graph_gpu_us"]
    return out[GPU_TIME_COLUMNS]


def context_levels(bursts: pd.DataFrame, contexts: pd.DataFrame | None) -> pd.DataFrame:
    """GPU time per eager kernel (us, median over a context's saturated bursts) in each CUDA context a run
    measured in, at the kernel duration the fresh contexts ran: context 0 is the run's own (its eager bursts
    at that duration), 1, 2, ... fresh ones. Empty (declared columns) without fresh contexts.
    Columns: ``nvml_index, kernel_us, context, eager_gpu_us, bursts``."""
    cols = ["nvml_index", "kernel_us", "context", "eager_gpu_us", "bursts"]
    if contexts is None or not len(contexts):
        return pd.DataFrame(columns=cols)
    own = primary(bursts)
    own = own[own["mode"] == "eager"].merge(contexts[["nvml_index", "kernel_us"]].drop_duplicates())
    b = pd.concat([own.assign(context=0), contexts[contexts["mode"] == "eager"]], ignore_index=True)
    b = b.assign(eager_gpu_us=b["gpu_ns"] / b["launches"] / 1e3)
    b = b[b["saturated"].astype(bool) & np.isfinite(b["eager_gpu_us"])]  # (a NaN level would become the median)
    out = b.groupby(["nvml_index", "kernel_us", "context"], as_index=False).agg(
        eager_gpu_us=("eager_gpu_us", "median"), bursts=("eager_gpu_us", "size"))
    return out[cols]


def speedup(e2e: pd.DataFrame) -> pd.DataFrame:
    """End-to-end wall time per kernel (``eager_wall_us``, ``graph_wall_us``; host launching as fast as it can, plus the final sync),
    eager vs graph, per kernel duration; ``speedup`` = eager / graph (the classic CUDA-graph figure).
    Columns: :data:`SPEEDUP_COLUMNS`."""
    e2e = primary(e2e)
    e = e2e.assign(us_per_kernel=e2e["wall_ns"] / e2e["launches"] / 1e3)
    piv = e.pivot_table(index=["nvml_index", "kernel_us"], columns="mode", values="us_per_kernel", aggfunc="median")
    piv = piv.reindex(columns=list(MODES))  # (a run stopped between a duration's eager and graph loops has one)
    out = pd.DataFrame({"eager_wall_us": piv["eager"], "graph_wall_us": piv["graph"]}).reset_index()
    out["graph_k"] = int(e.loc[e["mode"] == "graph", "graph_k"].iloc[0]) if (e["mode"] == "graph").any() else 0
    out["speedup"] = out["eager_wall_us"] / out["graph_wall_us"]
    return out[SPEEDUP_COLUMNS]


#: Bursts under which host_cost_by_language gives no spread (``iqr_pct`` NaN): too few to speak of one.
MIN_SPREAD_BURSTS = 4


def shortest_eager(bursts: pd.DataFrame) -> pd.DataFrame:
    """The eager bursts at each GPU's shortest kernel: those the host cost by language is taken over."""
    b = bursts[bursts["mode"] == "eager"]
    return b[b["kernel_us"] == b.groupby("nvml_index")["kernel_us"].transform("min")]


HOST_COST_BY_LANGUAGE_COLUMNS = ["nvml_index", "language", "path", "kernel_us", "us_per_launch", "cpu_us_per_launch",
                                 "extra_us_vs_native", "ratio_vs_native", "iqr_pct", "bursts", "dry_bursts",
                                 "saturated"]


def host_cost_by_language(bursts: pd.DataFrame) -> pd.DataFrame:
    """Host cost per eager launch call by the language that issues it, at the shortest kernel measured:
    the same empty-kernel burst behind a blocker (the queue never fills, no call waits), launched from
    the native C loops, from Python through cuda.bindings, and from PyTorch where it imported.
    ``us_per_launch``: median wall time per call over the bursts that kept the blocker running (the
    precondition); ``cpu_us_per_launch``: the thread's CPU time per call, over the same bursts;
    ``extra_us_vs_native`` / ``ratio_vs_native``: against the native row (NaN without one); ``iqr_pct``:
    the interquartile range of the per-burst wall times in % of their median (the run's own spread; NaN
    under 4 bursts; separate runs move further, :data:`pcietrace.analysis.compare.RUN_TO_RUN_PCT`); ``bursts``:
    bursts measured; ``dry_bursts``: those whose launch loop outlasted the blocker (a host stall of
    milliseconds, or a queue too short for the burst), left out of the medians (:func:`kept_bursts`);
    ``saturated``: at least half kept the blocker running (else the medians are over every burst, and an
    upper bound).
    Columns: :data:`HOST_COST_BY_LANGUAGE_COLUMNS`."""
    if not len(bursts):
        return pd.DataFrame(columns=HOST_COST_BY_LANGUAGE_COLUMNS)
    b = shortest_eager(bursts if "path" in bursts else bursts.assign(path="python"))
    b = b.assign(us=b["host_ns"] / b["calls"] / 1e3, cpu=b["cpu_ns"] / b["calls"] / 1e3,
                 dry=~b["saturated"].astype(bool))
    keys = ["nvml_index", "path"]
    count = b.groupby(keys, as_index=False).agg(kernel_us=("kernel_us", "first"), bursts=("us", "size"),
                                                dry_bursts=("dry", "sum"))
    count["saturated"] = count["dry_bursts"] / count["bursts"] <= MOSTLY_DRY  # as kept_bursts decides
    stats = kept_bursts(b, keys).groupby(keys, as_index=False).agg(
        us_per_launch=("us", "median"), cpu_us_per_launch=("cpu", "median"),
        iqr_pct=("us", functools.partial(iqr_pct, min_values=MIN_SPREAD_BURSTS)))
    out = count.merge(stats, on=keys)
    native = out[out["path"] == "native"].set_index("nvml_index")["us_per_launch"]
    base = out["nvml_index"].map(native)
    out["extra_us_vs_native"] = out["us_per_launch"] - base
    out["ratio_vs_native"] = out["us_per_launch"] / base
    out["language"] = out["path"].map(LANGUAGES).fillna(out["path"])
    order = {p: i for i, p in enumerate(LANGUAGES)}
    out = out.sort_values(["nvml_index", "path"], key=lambda c: c.map(order) if c.name == "path" else c)
    return out[HOST_COST_BY_LANGUAGE_COLUMNS].reset_index(drop=True)
