"""Attach's background floor, modelled per counter read.

Every NVML counter read is itself PCIe traffic (~14.6 KB H2D + ~17 KB D2H on the lent GPUs: a GSP RPC), and
the sampler's read rate changes while a program runs (edges wake it, stalls slow it). So the floor of an
interval is ``bytes_per_read x reads in the interval + background_Bps x duration``, fitted per GPU from
idle windows where the sampler alternately reads (``sampling="on"``) and pauses (``"paused"``). Windows are
aligned to samples (last sample at or before the start, first at or after the end): no interpolation.
Stateless: DataFrames in, DataFrames out.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pcietrace.analysis.launch import DIRECTIONS

#: Columns of :func:`floor_model`. ``status``: "per read" (both terms fitted), "rate only" (windows of one
#: read density: one rate, reads not separated), or "no floor" (no idle window covered by samples).
#: ``{d}_bytes_per_read_se``/``{d}_background_Bps_se``: the terms' standard errors from the windows' scatter,
#: ``{d}_floor_corr`` their correlation, ``dof`` the degrees of freedom left (0: no error estimate).
FLOOR_COLUMNS = ["nvml_index", "status", "windows", "reads_per_s", "h2d_bytes_per_read", "d2h_bytes_per_read",
                 "h2d_background_Bps", "d2h_background_Bps", "h2d_Bps", "d2h_Bps", "dof",
                 "h2d_bytes_per_read_se", "d2h_bytes_per_read_se", "h2d_background_Bps_se", "d2h_background_Bps_se",
                 "h2d_floor_corr", "d2h_floor_corr"]


def aligned_windows(cum: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Idle windows widened to the samples around them: ``t_a_ns``/``t_b_ns`` (sample times), ``duration_s``,
    ``reads`` (samples in (t_a, t_b]), ``h2d_bytes``/``d2h_bytes``; windows no sample precedes or follows are
    dropped (they cannot be measured)."""
    rows = []
    idle = windows[windows["mode"] == "idle"] if len(windows) else windows
    for idx, g in cum.groupby("nvml_index"):
        t = g["t_ns"].to_numpy(np.int64)
        ys = {d: g[f"{c}_bytes"].to_numpy(float) for d, c in DIRECTIONS.items()}
        for w in idle[idle["nvml_index"] == idx].itertuples():
            i, j = np.searchsorted(t, w.t_start_ns, "right") - 1, np.searchsorted(t, w.t_end_ns, "left")
            if i < 0 or j >= t.size or j <= i:
                continue
            row = {"nvml_index": int(idx), "sampling": getattr(w, "sampling", "on"), "t_a_ns": int(t[i]),
                   "t_b_ns": int(t[j]), "duration_s": (t[j] - t[i]) / 1e9, "reads": int(j - i)}
            for d, y in ys.items():
                row[f"{d}_bytes"] = float(y[j] - y[i])
            rows.append(row)
    return pd.DataFrame(rows, columns=["nvml_index", "sampling", "t_a_ns", "t_b_ns", "duration_s", "reads",
                                       "h2d_bytes", "d2h_bytes"])


def floor_model(cum: pd.DataFrame, windows: pd.DataFrame, nvml_indices: list[int]) -> pd.DataFrame:
    """Per GPU (every index in ``nvml_indices``, also those with no usable window): bytes per read and
    background rate per direction (:data:`FLOOR_COLUMNS`); ``h2d_Bps``/``d2h_Bps`` is the plain mean rate
    over the windows (for display and old reports)."""
    aw = aligned_windows(cum, windows)
    rows = []
    for idx in nvml_indices:
        g = aw[aw["nvml_index"] == idx]
        row: dict[str, object] = {"nvml_index": int(idx), "windows": len(g)}
        if not len(g):
            rows.append({**row, "status": "no floor"})
            continue
        dur, reads = g["duration_s"].to_numpy(), g["reads"].to_numpy(float)
        density = reads / dur
        on = g["sampling"].to_numpy() == "on"
        row["reads_per_s"] = float(reads[on].sum() / dur[on].sum()) if on.any() else 0.0
        two_terms = len(g) >= 2 and np.ptp(density) > 0.5 * density.max()
        row["status"] = "per read" if two_terms else "rate only"
        row["dof"] = max(len(g) - (2 if two_terms else 1), 0)
        for d in DIRECTIONS:
            y = g[f"{d}_bytes"].to_numpy()
            row[f"{d}_Bps"] = float(y.sum() / dur.sum())
            # the design: bytes = per_read x reads + rate x duration (rate only: per_read = 0, rows weighted
            # by 1/duration, so that the rate stays the windows' total bytes / total time)
            w = np.ones_like(dur) if two_terms else 1 / np.sqrt(dur)
            x = (np.column_stack([reads, dur]) if two_terms else dur[:, None]) * w[:, None]
            y = y * w
            coef, *_ = np.linalg.lstsq(x, y, rcond=None)
            per_read, rate = (coef[0], coef[1]) if two_terms else (0.0, coef[0])
            row[f"{d}_bytes_per_read"], row[f"{d}_background_Bps"] = float(per_read), float(rate)
            cov = np.full((2, 2), np.nan)
            if row["dof"]:
                resid = y - x @ coef
                c = (resid @ resid / row["dof"]) * np.linalg.inv(x.T @ x)
                cov = c if two_terms else np.array([[0.0, 0.0], [0.0, c[0, 0]]])
            se = np.sqrt(np.diag(cov))
            row[f"{d}_bytes_per_read_se"], row[f"{d}_background_Bps_se"] = float(se[0]), float(se[1])
            # no estimate (dof 0): unknown, not 0; one term exact or not fitted (rate only): nothing to correlate
            row[f"{d}_floor_corr"] = float(cov[0, 1] / (se[0] * se[1])) if se[0] * se[1] > 0 else \
                (0.0 if row["dof"] else np.nan)
        rows.append(row)
    return pd.DataFrame(rows, columns=FLOOR_COLUMNS)


def floor_err_bytes(model_row: pd.Series, direction: str, reads: np.ndarray, duration_ns: np.ndarray) -> np.ndarray:
    """Half-width of the 95 % interval (Student t) of :func:`floor_bytes` for the same intervals, from the
    fitted terms' standard errors (NaN without a floor or with no degrees of freedom left)."""
    shape = np.shape(reads)
    if model_row["status"] == "no floor" or not model_row.get("dof"):
        return np.full(shape, np.nan)
    from scipy import stats  # here, not at import: scipy.stats alone takes ~1 s to import

    r, t = np.asarray(reads, float), np.asarray(duration_ns, float) / 1e9
    a, b = model_row[f"{direction}_bytes_per_read_se"], model_row[f"{direction}_background_Bps_se"]
    var = (r * a) ** 2 + (t * b) ** 2 + 2 * r * t * a * b * model_row[f"{direction}_floor_corr"]
    return stats.t.ppf(0.975, model_row["dof"]) * np.sqrt(np.maximum(var, 0.0))


def floor_bytes(model_row: pd.Series, direction: str, reads: np.ndarray, duration_ns: np.ndarray) -> np.ndarray:
    """Floor bytes of intervals with ``reads`` counter reads lasting ``duration_ns`` (NaN without a floor)."""
    if model_row["status"] == "no floor":
        return np.full(np.shape(reads), np.nan)
    return (model_row[f"{direction}_bytes_per_read"] * np.asarray(reads, float)
            + model_row[f"{direction}_background_Bps"] * np.asarray(duration_ns, float) / 1e9)
