"""Side-by-side comparison of saved runs (DataFrames in, DataFrame out)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from pcietrace.analysis.latency import DEFAULT_US_PER_LEVEL
from pcietrace.analysis.summary import gpu_label, short_name


#: How far a figure that moves with the host's speed differs between two runs of one machine, in % of their
#: mean. Measured with the C++ oracle (bench/oracle_loops.cu) in rounds of fresh processes pinned as `run`
#: pins, on the lent H100 (10 rounds) and 4x H200 (6 rounds), 2026-11-22 (bench/host_noise.py "pair P95":
#: the 95th percentile of two rounds' difference; docs/lab/reports/host-noise-20261122): host cost per eager launch
#: 22 / 31 %, launch + synchronize 17 / 11 %, 4 B copies 21.4 / 13 %; the bounds are those, rounded (35 %,
#: 21 %). Not measured, assumed alike: host cost per graph launch (as eager), launch -> first instruction
#: and graphs' time per iteration (as launch + synchronize). The host-memory round trip is GPU-timed but
#: rests on host memory: its median moved 1.20-1.31 us over 6 pairs of suites in one H100 call
#: (docs/lab/reports/host-noise-20261122/latency_h100.log). A difference below the bound is no evidence of a
#: difference between machines, whatever one run's own (narrower) interval says. The eager GPU time per empty
#: kernel is GPU-timed but drawn per CUDA context: the median over 5 contexts of `pcietrace run` moved with a
#: pair P95 of 10.1 % (H100, 5 runs) and 6.7 % (H200, 4 runs) against C++ processes spread 10-14 %
#: (bench/eager_gpu_truth.py, docs/lab/reports/eager-gpu-time-20261122); rounded up, 12 %.
RUN_TO_RUN_PCT = {"host cost / eager launch": 35.0, "host cost / graph launch": 35.0,
                  "launch + sync (eager)": 21.0, "launch -> first instruction": 21.0, "4 B H2D copy": 21.0,
                  "graphs: time / iteration": 21.0, "host read round trip": 10.0,
                  "GPU time / empty kernel, eager": 12.0}


#: The smallest change of a figure worth acting on, in its own unit: a difference below it is not reported as
#: significant, however narrow the intervals, and a base below it gets no % (a % of a figure indistinguishable
#: from 0, such as a fitted -0.1 B per graph node, is no measure of anything). Bytes per launch: a few
#: bytes of a ~2 kB launch; bytes per node: a node's share of a whole graph launch, 1 kB per 1,000 nodes;
#: times: 0.1 us of host or GPU time per launch (launch paths take 1-10 us), 0.05 us of GPU time per kernel;
#: speedups: 0.05x. Matched on the metric's name, first match wins.
MATERIAL = (("bytes / node", 1.0), ("bytes /", 8.0), ("GPU time / empty kernel", 0.05), ("speedup", 0.05),
            ("PCIe switch levels", 1.0), ("", 0.1))


def material(metric: str) -> float:
    """The smallest change of ``metric`` worth acting on (:data:`MATERIAL`)."""
    return next(v for key, v in MATERIAL if key in metric)


def run_to_run_pct(metric: str) -> float:
    """The run-to-run bound of ``metric`` (:data:`RUN_TO_RUN_PCT`; a graphs run's "graphs N kernels,
    STRATEGY: time / iteration" rows share one), NaN for figures that do not move with the host."""
    if metric.startswith("graphs ") and metric.endswith(": time / iteration"):
        return RUN_TO_RUN_PCT["graphs: time / iteration"]
    return RUN_TO_RUN_PCT.get(metric, math.nan)


def run_name(letter: str, folder: str, meta: dict[str, Any]) -> str:
    """``A: h100-20261122 (H100 80GB HBM3 x1, host vm, 2026-11-22 07:35)``: a run as a comparison names it, by
    its folder, GPUs, host and date, so that two runs of one machine are told apart."""
    gpus = meta.get("gpus", [])
    models = "+".join(sorted({short_name(g.get("name")) for g in gpus})) or "?"
    when = str(meta.get("created", ""))[:16].replace("T", " ")
    sim = ", SIMULATED" if meta.get("simulated") else ""
    return f"{letter}: {folder} ({models} x{len(gpus)}{sim}, host {meta.get('host', '?')}{', ' + when if when else ''})"


def metrics(results: dict[str, pd.DataFrame], meta: dict[str, Any]) -> pd.DataFrame:
    """The headline figures of one run, for every GPU: ``gpu`` (GPU0, ...), ``metric``, ``unit``, ``value``,
    ``ci95`` (half-width; NaN where the run gives no interval)."""
    frames = [gpu_metrics(results, meta, g["nvml_index"]).assign(gpu=gpu_label(g["nvml_index"]))
              for g in meta.get("gpus", [])]
    cols = ["gpu", "metric", "unit", "value", "ci95"]
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)


def gpu_metrics(results: dict[str, pd.DataFrame], meta: dict[str, Any], idx: int) -> pd.DataFrame:
    """The headline figures of one GPU (NVML index ``idx``) of a run."""
    rows: list[tuple[str, str, float, float]] = []

    def first(df: pd.DataFrame, **eq: Any) -> pd.Series | None:
        if not len(df):
            return None
        m = df["nvml_index"] == idx
        for k, v in eq.items():
            m &= df[k] == v
        return df[m].iloc[0] if m.any() else None

    pl = results.get("per_launch", pd.DataFrame())
    for d, label in (("h2d", "H2D"), ("d2h", "D2H")):
        r = first(pl, mode="eager", direction=d)
        if r is not None:
            rows.append((f"eager {label} bytes / launch", "B", r["bytes_per_call"], r["ci95"]))
    pn = results.get("per_node", pd.DataFrame())
    for d, label in (("h2d", "H2D"), ("d2h", "D2H")):
        r = first(pn, direction=d)
        if r is not None:
            rows.append((f"graph {label} bytes / graph launch (fixed)", "B", r["fixed_bytes"], r["fixed_ci95"]))
            rows.append((f"graph {label} bytes / node", "B", r["per_node_bytes"], r["per_node_ci95"]))
    cc = results.get("cpu_cost", pd.DataFrame())
    for mode, label in (("eager", "host cost / eager launch"), ("graph", "host cost / graph launch")):
        r = first(cc, mode=mode)
        if r is not None:
            rows.append((label, "us", r["host_us_per_call"], math.nan))
    lat = results.get("latency", pd.DataFrame())
    for test, label in (("host_read_rtt", "host read round trip"), ("launch_sync_eager", "launch + sync (eager)"),
                        ("launch_to_first_instruction", "launch -> first instruction"), ("copy_h2d_4B", "4 B H2D copy")):
        r = first(lat, test=test, peer=-1)
        if r is not None:
            rows.append((label, "us", r["median_us"], r["ci95_us"]))
    gt = results.get("gpu_time", pd.DataFrame())
    if len(gt):
        g0 = gt[gt["nvml_index"] == idx].sort_values("kernel_us")
        if len(g0):
            rows.append(("GPU time / empty kernel, eager", "us", g0["eager_gpu_us"].iloc[0], math.nan))
            rows.append(("GPU time / empty kernel, graph", "us", g0["graph_gpu_us"].iloc[0], math.nan))
    sp = results.get("speedup", pd.DataFrame())
    for r in sp[sp["nvml_index"] == idx].sort_values("kernel_us").itertuples() if len(sp) else []:
        rows.append((f"graph speedup, {r.kernel_us:g} us kernels", "x", r.speedup, math.nan))
    if len(results.get("graphs", ())):
        from pcietrace.analysis.graphs import compare_rows

        rows.extend(compare_rows(results["graphs"]))
    topo = {g.get("nvml_index"): g for g in (meta.get("topology") or {}).get("gpus", [])}
    if idx in topo:
        rows.append(("PCIe switch levels", "", float(topo[idx]["switch_levels"]), math.nan))
    return pd.DataFrame(rows, columns=["metric", "unit", "value", "ci95"])


def compare(runs: list[tuple[str, dict[str, pd.DataFrame], dict[str, Any]]],
            us_per_level: float = DEFAULT_US_PER_LEVEL) -> pd.DataFrame:
    """One row per GPU label and metric, one ``value:<name>``/``ci95:<name>`` pair per run, and for every
    run after the first a ``delta:<name>`` (vs the first), ``pct:<name>`` (the delta in % of the first's
    value; NaN where that value is not material or within its own interval: :func:`material`) and
    ``significant:<name>`` (True when the difference exceeds the combined 95 % half-widths and, for figures
    that move with the host's speed, their run-to-run bound ``run_to_run_pct`` in % of the two values' mean
    (:func:`run_to_run_pct`), and is material (:func:`material`); None where there is neither an interval
    nor such a bound).
    GPUs pair by label (GPU0 with GPU0); a GPU only one run has gets NaN deltas.

    Per GPU whose switch levels differ, a row ``round trip expected from switch levels`` puts the host-read round-trip delta beside
    what the switch-level difference predicts (``us_per_level`` per level)."""
    out: pd.DataFrame | None = None
    keys = ["gpu", "metric", "unit"]
    order: list[tuple[str, str]] = []
    for name, res, meta in runs:
        m = metrics(res, meta).rename(columns={"value": f"value:{name}", "ci95": f"ci95:{name}"})
        order += [x for x in zip(m["gpu"], m["metric"]) if x not in order]
        out = m if out is None else out.merge(m, on=keys, how="outer")
    assert out is not None
    out = out.set_index(["gpu", "metric"]).loc[order].reset_index()  # first-seen order, not alphabetical
    base = runs[0][0]
    floor = out["metric"].map(run_to_run_pct)
    out["run_to_run_pct"] = floor
    for name, _, _ in runs[1:]:
        a, b = out[f"value:{base}"], out[f"value:{name}"]
        d = b - a
        comb = (out[f"ci95:{name}"] ** 2 + out[f"ci95:{base}"] ** 2) ** 0.5
        least = out["metric"].map(material)
        # a % only of a base that is distinguishable from 0: above its own interval and material in itself
        base_ok = (a.abs() >= least) & ~(a.abs() <= out[f"ci95:{base}"])
        out[f"delta:{name}"] = d
        out[f"pct:{name}"] = (d / a.abs() * 100).where(base_ok & (a != 0))
        # against the bound: the difference in % of the two runs' mean, so A vs B and B vs A agree
        mean_pct = d.abs() / ((a.abs() + b.abs()) / 2).where(lambda m: m != 0) * 100
        sig = pd.Series([_significant(x, c, p, f) for x, c, p, f in zip(d, comb, mean_pct, floor)], dtype=object)
        out[f"significant:{name}"] = sig.where(~((sig == True) & (d.abs() < least)), False)  # noqa: E712
    extra = []
    for gpu, levels in out[out["metric"] == "PCIe switch levels"].groupby("gpu", sort=False):
        moved = [levels[f"value:{name}"].iloc[0] - levels[f"value:{base}"].iloc[0] for name, _, _ in runs[1:]]
        if len(runs) > 1 and any(pd.notna(x) and x != 0 for x in moved):  # no level moved: nothing to expect
            row: dict[str, Any] = {"gpu": gpu, "metric": "round trip expected from switch levels", "unit": "us"}
            for name, _, _ in runs[1:]:
                row[f"delta:{name}"] = float(levels[f"value:{name}"].iloc[0] - levels[f"value:{base}"].iloc[0]) * us_per_level
            extra.append(row)
    return pd.concat([out, pd.DataFrame(extra)], ignore_index=True) if extra else out


def shares_figures(cmp: pd.DataFrame, name: str) -> bool:
    """Whether run ``name`` has any figure beside the first run's in :func:`compare`'s table (a graphs
    report and a run measure different things: no row would hold both)."""
    paired = cmp[cmp["metric"] != "round trip expected from switch levels"]
    return bool(paired[f"delta:{name}"].notna().any())


def _significant(delta: float, ci95: float, pct: float, floor_pct: float) -> bool | None:
    """A difference beyond both its intervals (``ci95``, combined half-width) and, for a figure that moves
    with the host's speed, the ``floor_pct`` two runs of one machine differ by (``pct``: the difference in %
    of the two values' mean); None where neither is known."""
    if math.isnan(delta) or (math.isnan(ci95) and math.isnan(floor_pct)):
        return None
    return bool((math.isnan(ci95) or abs(delta) > ci95) and (math.isnan(floor_pct) or abs(pct) > floor_pct))
