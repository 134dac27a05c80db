"""Attach's background floor, modelled per counter read.

Every NVML counter read is itself PCIe traffic (~14.6 KB H2D + ~17 KB D2H on the lent GPUs: a GSP RPC), and
the sampler's read rate changes while a program runs (edges wake it, stalls slow it). So the floor of an
interval is ``bytes_per_read x reads in the interval + background_Bps x duration``, fitted per GPU from
idle windows where the sampler alternately reads (``sampling="on"``) and pauses (``"paused"``). Windows are
aligned to samples (last sample at or before the start, first at or after the end): no interpolation.

A read's cost depends on the GPU's state: a GPU without a CUDA context for a while (often before the program)
answers slower and moves more bytes per read. Where the windows' reads took clearly different times the fit
adds bytes per microsecond of read time, taken at the median read time inside the GPU's own ranges; the
ranges' own quiet sample intervals give the cost per read there (their mean, never above the windows'; far above
them, not reads alone, they are left out), and how far runs of them strayed beyond what independent reads explain
(states no window saw) joins each range's floor error. Stateless: DataFrames in, DataFrames out.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pandas as pd

from pcietrace.analysis.counters import counted_by, jumps, median, per_gpu, read_ns_of
from pcietrace.analysis.launch import DIRECTIONS
from pcietrace.analysis.spread import t975
from pcietrace.schema import by_object

#: Columns of :func:`floor_model`. ``status``: "per read" (per-read and background terms fitted), "rate only"
#: (windows of one read density: one rate, reads not separated), or "no floor" (no idle window covered by
#: samples). ``{d}_bytes_per_read_us``: bytes per microsecond a read took, fitted only where the reading
#: windows' reads took clearly different times (``read_time_term``), else 0. ``read_us_program``: the median
#: time a read took inside the GPU's own ranges (kept within the reading windows' mean read times; their mean
#: over all reads where no sample lies inside the ranges; NaN without a read-time term); ``read_us_min`` and
#: ``read_us_max``: the reading windows' lowest and highest mean read time, us (NaN without one).
#: ``{d}_bytes_per_read_quiet``: the mean bytes of the ranges' quiet sample intervals (one read each, less the
#: background; NaN with fewer than :data:`STATE_RUN`). ``{d}_bytes_per_read_program``, what each read in a range is
#: charged: the quiet mean, never above the higher of per read + per us x ``read_us_program`` and one cost per read
#: fitted without the read-time term; where the quiet mean of either direction lies more than :data:`STATE_MIN_SHARE`
#: above that higher cost (not reads alone), or without quiet intervals, the first. Where the windows saw the GPU only
#: in another state than its ranges, ``{d}_bytes_per_read`` is what other GPUs of its model measured a read at its
#: ranges' read time (``floor_rows``' ``borrow``), and the quiet mean is kept at most that.
#: ``{d}_state_bytes_per_read``: how far (bytes per read, 95 %) the quiet intervals strayed from it (from their own mean
#: where they are not reads alone) for as long as a state lasts (the GPU's state moves a read's cost; see
#: :func:`state_bytes_per_read`), plus, where there are quiet intervals, how far the windows' higher cost lies above the
#: one charged; charged x each range's reads in its floor error, where each of its busy reads (:func:`busy_reads`)
#: counts at least :data:`STATE_MIN_SHARE` of the cost.
#: ``quiet_intervals``: how many there were. ``reads_per_s_program``: the sampler's reads per second of this GPU
#: while any of its ranges was open (what the floor charges there; bounded by the sampling interval however dense
#: the ranges; NaN where no range spans a sample). ``{d}_*_se``: the terms' standard errors from the windows'
#: scatter; ``{d}_floor_corr`` (per read, background),
#: ``{d}_corr_read_vs_read_us`` and ``{d}_corr_read_us_vs_background``: their correlations; ``dof``: the
#: degrees of freedom left (0: no error estimate).
FLOOR_COLUMNS = ["nvml_index", "status", "windows", "reads_per_s", "h2d_bytes_per_read", "d2h_bytes_per_read",
                 "h2d_background_Bps", "d2h_background_Bps", "h2d_Bps", "d2h_Bps", "dof",
                 "h2d_bytes_per_read_se", "d2h_bytes_per_read_se", "h2d_background_Bps_se", "d2h_background_Bps_se",
                 "h2d_floor_corr", "d2h_floor_corr", "read_time_term", "read_us_program",
                 "h2d_bytes_per_read_us", "d2h_bytes_per_read_us", "h2d_bytes_per_read_us_se",
                 "d2h_bytes_per_read_us_se", "h2d_corr_read_vs_read_us", "d2h_corr_read_vs_read_us",
                 "h2d_corr_read_us_vs_background", "d2h_corr_read_us_vs_background", "read_us_min", "read_us_max",
                 "h2d_bytes_per_read_quiet", "d2h_bytes_per_read_quiet",
                 "h2d_bytes_per_read_program", "d2h_bytes_per_read_program",
                 "h2d_state_bytes_per_read", "d2h_state_bytes_per_read", "quiet_intervals", "reads_per_s_program"]

#: Reading windows whose mean read times differ by this much (relative to the fastest) fit a read-time term.
#: Measured (H100 and H200, driver 580): a read on a GPU without a CUDA context for a while took ~2x as long
#: (520-870 us vs 310-440 us) and moved ~2-3 kB more each way; fitting one cost per read over such windows
#: put the floor ~40 kB per 20 ms too high inside the program's ranges.
READ_TIME_SPREAD = 0.25

#: A sample interval of the program is quiet (the reads and background alone) below this multiple of the
#: floor's bytes for it, in both directions; the state spread is taken over runs of this many quiet intervals
#: (a state lasts many reads: measured on the H100, reads inside a program's idle ranges moved 12.2-12.8 kB
#: for 14 reads in a row, ~16 kB otherwise).
QUIET_FACTOR, STATE_RUN = 1.5, 8

#: A range whose reads took this much longer or shorter (relative, mean over at least STATE_RUN reads) than the
#: program's median read time was in a state of its own: its floor error adds |bytes per read us| x that
#: difference x its reads. The sign is not known: measured on the H100, slow reads moved MORE bytes on a GPU
#: without a context (the windows' term, ~+14 B/us) but LESS in two other states (reads of 398-420 us against
#: 318 us in two PyTorch eager ranges, ~1.6 kB D2H less each, -15 and -19 %; 600 us reads of 12.5 kB in idle
#: ranges), so charging a range at its own read time fixed the first and broke the second (1,830 range calls
#: of 19 recordings). The gate keeps read-time jitter out of the error.
RANGE_READ_TIME_SPREAD = 0.15

#: The least state spread per direction, as a share of the cost charged per read: reads in a program's busy
#: intervals (launch streams, copies) cost other than in its quiet ones and in the windows, and no interval of the
#: recording shows them alone. Measured on the H200 (2026-11-29), a read in a PyTorch training loop (bf16,
#: AdamW, ~1,070 launches per 70 ms) cost 1.7-2.2 kB more each way than idle: another process's reads, on and
#: off in paired calls (docs/lab/bench/read_cost_busy.py, two runs of 24 and 16), 17.9 and 18.8 kB H2D against
#: 16.2 and 16.6, 23.8 and 24.5 kB D2H against 22.1 and 22.4; under attach, 1 s training ranges of ~600 reads
#: read above their truth by 11 ... 12.4 % (H2D) and 7.2 ... 8.1 % (D2H) of what their reads were charged
#: (15.9 / 21.9 kB). So ~2.4 kB either way: 15 % and 11 %. Earlier (2x H200, a 1 s range of dense_app.py): up
#: to 5.7 % H2D and 3.1 % D2H. Only busy reads (:func:`busy_reads`) are held to it: a range's quiet reads are
#: in the state its quiet intervals measure. Quiet intervals dearer than the windows' cost by more than it are not
#: reads alone (:func:`_program_state`).
STATE_MIN_SHARE = {"h2d": 0.15, "d2h": 0.11}

#: Orders of the quiet intervals, shuffled with a fixed seed, over which :func:`state_bytes_per_read` finds how
#: far runs of independent reads stray (deterministic: the same recording gives the same figures).
SHUFFLES = 16

#: At most this many quiet intervals in each shuffled order: beyond it each order is this many drawn at random
#: from them (an hour on a GPU has millions: independent reads' spread is as well known from this many, at a
#: bounded cost).
MAX_SHUFFLED = 200_000

#: The terms of the floor, in the order of the design matrix and of the covariance (see :func:`_cov`).
TERMS = ("bytes_per_read", "bytes_per_read_us", "background_Bps")


def aligned_windows(cum: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Idle windows widened to the samples around them: ``t_a_ns``/``t_b_ns`` (sample times), ``duration_s``,
    ``reads`` (samples in (t_a, t_b]), ``read_us`` (the time those reads took), ``h2d_bytes``/``d2h_bytes``;
    windows no sample precedes or follows, or across a counter jump, are dropped (they cannot be measured)."""
    rows = []
    idle = windows[windows["mode"] == "idle"] if len(windows) else windows
    for idx, g in per_gpu(cum):
        mine = idle[idle["nvml_index"] == idx]
        if not len(mine):
            continue
        t = g["t_ns"].to_numpy(np.int64)
        ys = {d: g[f"{c}_bytes"].to_numpy() for d, c in DIRECTIONS.items()}  # (as floats where read: one each)
        read_ns = read_ns_of(g)
        jump = jumps(g)  # (a window across a counter jump cannot be measured either)
        for w in mine.itertuples():
            i, j = np.searchsorted(t, w.t_start_ns, "right") - 1, np.searchsorted(t, w.t_end_ns, "left")
            if i < 0 or j >= t.size or j <= i or jump[i:j].any():
                continue
            row = {"nvml_index": int(idx), "sampling": getattr(w, "sampling", "on"), "t_a_ns": int(t[i]),
                   "t_b_ns": int(t[j]), "duration_s": (t[j] - t[i]) / 1e9, "reads": int(j - i),
                   "read_us": float(read_ns[i + 1:j + 1].sum(dtype=np.int64)) / 1e3}
            for d, y in ys.items():
                row[f"{d}_bytes"] = float(float(y[j]) - float(y[i]))
            rows.append(row)
    return pd.DataFrame(rows, columns=["nvml_index", "sampling", "t_a_ns", "t_b_ns", "duration_s", "reads", "read_us",
                                       "h2d_bytes", "d2h_bytes"])


def floor_model(cum: pd.DataFrame, windows: pd.DataFrame, nvml_indices: list[int],
                spans_ns: np.ndarray | dict[int, np.ndarray] | None = None,
                windows_only: bool = False) -> pd.DataFrame:
    """Per GPU (every index in ``nvml_indices``, also those with no usable window): bytes per read, per
    microsecond of read time (where the windows tell it apart) and background rate per direction, and the
    cost per read in the state the GPU was in while the program's ranges ran (``spans_ns``: their start and
    end times, ns, shape (n, 2), for every GPU or per NVML index (:func:`spans_by_gpu`: each GPU's own
    ranges); None or empty: all samples) with its spread (:data:`FLOOR_COLUMNS`); ``h2d_Bps``/``d2h_Bps`` is
    the plain mean rate over the windows (for display and old reports). ``windows_only``: one cost per read
    from the windows, no read-time term and no program state (the whole run's rows: its reads outside the
    ranges, often on a cold GPU at the start, are not in the ranges' state)."""
    return pd.DataFrame(floor_rows(cum, windows, nvml_indices, spans_ns, windows_only), columns=FLOOR_COLUMNS)


def floor_rows(cum: pd.DataFrame, windows: pd.DataFrame, nvml_indices: list[int],
               spans_ns: np.ndarray | dict[int, np.ndarray] | None = None,
               windows_only: bool = False, borrow: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """:func:`floor_model`'s rows, one per index of ``nvml_indices`` (arguments as there): a long run's GPUs'
    rows made one GPU's samples at a time, then put in one table. ``borrow``: per direction the cost of a read and
    its standard error at the GPUs' ranges' read time as other GPUs of the same model measured it
    (:func:`peer_read_cost`), for GPUs whose windows saw them only in another state than their ranges
    (:func:`windows_elsewhere`): charged per read instead of their windows' (whose fit still gives the background)."""
    aw = aligned_windows(cum, windows)
    rows = []
    samples_of = dict(per_gpu(cum)) if not windows_only else {}  # (each GPU's rows: slices, not copies)
    for idx in nvml_indices:
        g = aw[aw["nvml_index"] == idx]
        row: dict[str, object] = {"nvml_index": int(idx), "windows": len(g)}
        if not len(g):
            rows.append({**row, "status": "no floor"})
            continue
        dur, reads, read_us = g["duration_s"].to_numpy(), g["reads"].to_numpy(float), g["read_us"].to_numpy()
        density = reads / dur
        on = g["sampling"].to_numpy() == "on"
        row["reads_per_s"] = float(reads[on].sum() / dur[on].sum()) if on.any() else 0.0
        two_terms = len(g) >= 2 and np.ptp(density) > 0.5 * density.max()
        mean_read_us = read_us[on] / np.maximum(reads[on], 1)
        three_terms = bool(not windows_only and two_terms and len(g) >= 4 and on.sum() >= 2 and mean_read_us.min() > 0
                           and np.ptp(mean_read_us) > READ_TIME_SPREAD * mean_read_us.min())
        row["status"] = "per read" if two_terms else "rate only"
        borrowed = borrow if borrow is not None and two_terms and not three_terms and not windows_only else None
        row["read_time_term"] = three_terms
        used = [0, 1, 2] if three_terms else [0, 2] if two_terms else [2]
        row["dof"] = max(len(g) - len(used), 0)
        # rate only: rows weighted by 1/sqrt(duration), so that the rate stays the windows' total bytes / time
        w = np.ones_like(dur) if two_terms else 1 / np.sqrt(dur)
        x = np.column_stack([reads, read_us, dur])[:, used] * w[:, None]
        one_cost: dict[str, float] = {}
        for d in DIRECTIONS:
            y = g[f"{d}_bytes"].to_numpy()
            row[f"{d}_Bps"] = float(y.sum() / dur.sum())
            yw = y * w
            coef3, cov3 = np.zeros(3), np.full((3, 3), np.nan)
            coef, *_ = np.linalg.lstsq(x, yw, rcond=None)
            coef3[used] = coef
            # one cost per read (per read + background, as without the read-time term): what the windows say a
            # read costs at most, with the read-time term's cost at the program's read time
            one_cost[d] = float(np.linalg.lstsq(np.column_stack([reads, dur]), y, rcond=None)[0][0]
                                if three_terms else coef3[0])
            if row["dof"]:
                resid = yw - x @ coef
                cov3 = np.zeros((3, 3))  # terms not fitted: exactly 0
                cov3[np.ix_(used, used)] = (resid @ resid / row["dof"]) * np.linalg.inv(x.T @ x)
            if borrowed is not None:  # (the windows' own cost is another state's: nothing above it to cap at)
                coef3[0], one_cost[d] = borrowed[d][0], -np.inf
                if row["dof"]:
                    cov3[0, :] = cov3[:, 0] = 0.0
                    cov3[0, 0] = borrowed[d][1] ** 2
            se = np.sqrt(np.diag(cov3))
            for k, term in enumerate(TERMS):
                row[f"{d}_{term}"], row[f"{d}_{term}_se"] = float(coef3[k]), float(se[k])
            # no estimate (dof 0): unknown, not 0; a term exact or not fitted: nothing to correlate
            for (i, j), name in (((0, 2), "floor_corr"), ((0, 1), "corr_read_vs_read_us"),
                                 ((1, 2), "corr_read_us_vs_background")):
                row[f"{d}_{name}"] = float(cov3[i, j] / (se[i] * se[j])) if se[i] * se[j] > 0 else \
                    (0.0 if row["dof"] else np.nan)
        # a GPU's own ranges' spans: another GPU's ranges may run while this one is cold or busy otherwise
        spans = spans_ns.get(int(idx)) if isinstance(spans_ns, dict) else spans_ns
        windows_read_us = (mean_read_us, float(read_us[on].sum() / reads[on].sum())) if three_terms else None
        if three_terms:  # how far a read's time may carry the read-time term: what the windows measured
            row["read_us_min"], row["read_us_max"] = float(mean_read_us.min()), float(mean_read_us.max())
        if windows_only:
            row.update({f"{d}_{k}": v for d in DIRECTIONS for k, v in
                        (("bytes_per_read_program", row[f"{d}_bytes_per_read"]), ("state_bytes_per_read", 0.0))})
        else:
            _program_state(row, samples_of.get(idx, cum.iloc[:0]), spans, windows_read_us, one_cost)
        rows.append(row)
    return rows


def reading_windows_us(g: pd.DataFrame, windows: pd.DataFrame, idx: int) -> tuple[np.ndarray, float]:
    """GPU ``idx``'s reading idle windows (``g``: its samples): each one's mean read time, and their mean over all
    their reads (us; NaN without one)."""
    aw = aligned_windows(g, windows)
    on = aw[(aw["nvml_index"] == idx) & (aw["sampling"] == "on") & (aw["reads"] > 0)]
    read_us, reads = on["read_us"].to_numpy(), on["reads"].to_numpy()
    return read_us / reads, float(read_us.sum() / reads.sum()) if len(on) else np.nan


def windows_elsewhere(row: dict[str, Any], g: pd.DataFrame, per_window_us: np.ndarray,
                      spans_ns: np.ndarray | None) -> dict[str, float] | None:
    """Where a GPU's fitted floor ``row`` (:func:`floor_rows`) has no read-time term and every one of its reading
    windows read slower than its ranges did (each window's mean read time, ``per_window_us``
    (:func:`reading_windows_us`), above the median inside ``spans_ns`` by more than :data:`READ_TIME_SPREAD`): its
    windows saw it only in a state its ranges were not in, and the cost per read they give is that state's.
    Measured on 4x H200 (2026-11-28): a torchrun rank that ended first left its GPU without a CUDA context for
    2-3.4 s before the windows after the job (reads of 516-637 us against 329-357 us in its ranges); charged
    17.7-17.9 kB H2D and 22.3-22.5 kB D2H a read, a read in its forward ranges cost 14.8-15.2 and 19.9-20.5 kB
    (docs/method.md). ``g``: that GPU's samples. Returns the windows' lowest and highest mean read time and the
    ranges' median (us), and what the row charges a read (``h2d_per_read``, ``d2h_per_read``, B); else None."""
    if row.get("status") != "per read" or row.get("read_time_term") or "read_ns" not in g or not per_window_us.size:
        return None
    inside = inside_spans(g["t_ns"].to_numpy(np.int64), spans_ns)
    if not inside.any():
        return None
    ranges_us = median(read_ns_of(g)[inside]) / 1e3
    if not per_window_us.min() > (1 + READ_TIME_SPREAD) * ranges_us:
        return None
    return {"windows_us_min": float(per_window_us.min()), "windows_us_max": float(per_window_us.max()),
            "ranges_us": float(ranges_us), **{f"{d}_per_read": float(row[f"{d}_bytes_per_read_program"])
                                              for d in DIRECTIONS}}


def peer_read_cost(peers: list[tuple[dict[str, Any], float]], read_us: float) -> dict[str, Any] | None:
    """What a read taking ``read_us`` costs (per direction: the median over ``peers`` and its standard error, their
    own in quadrature with their spread; and their ``nvml_indices``), from other GPUs of one model in one run:
    ``peers``, each a fitted floor row (:func:`floor_rows`) with its reading windows' mean read time
    (:func:`reading_windows_us`). A peer tells it where its read-time term spans ``read_us`` (its cost there), or
    where its windows read within :data:`READ_TIME_SPREAD` of it (its cost per read); None where none does.
    Measured on 4x H200 (2026-11-28): at 336-354 us a read moved 14.9-15.0 kB H2D on three GPUs, at 579-616 us
    17.4-18.5 kB on all four."""
    costs: dict[str, list[tuple[float, float]]] = {d: [] for d in DIRECTIONS}
    used = []
    for row, window_us in peers:
        if row.get("status") != "per read" or not np.isfinite(read_us):
            continue
        lo, hi = row.get("read_us_min", np.nan), row.get("read_us_max", np.nan)
        covers = bool(row.get("read_time_term")) and \
            lo * (1 - READ_TIME_SPREAD) <= read_us <= hi * (1 + READ_TIME_SPREAD)
        if not covers and not abs(window_us - read_us) <= READ_TIME_SPREAD * read_us:
            continue
        used.append(int(row["nvml_index"]))
        r = float(np.clip(read_us, lo, hi)) if covers else window_us  # (no term: its per-us part is 0)
        for d in DIRECTIONS:
            costs[d].append((row[f"{d}_bytes_per_read"] + row[f"{d}_bytes_per_read_us"] * r,
                             float(np.nan_to_num(row.get(f"{d}_bytes_per_read_se", 0.0)))))
    if not used:
        return None
    out: dict[str, Any] = {"nvml_indices": used}
    for d, c in costs.items():
        cost, se = np.array(c).T
        out[d] = (float(np.median(cost)), float(np.sqrt(np.median(se ** 2) + np.var(cost))))
    return out


def gpu_sets(gpus: pd.Series) -> tuple[Callable[..., np.ndarray], list[int]]:
    """``holds(idx)``: per range, whether its ``gpus`` list holds GPU ``idx``; ``holds(None, known)``: whether it
    holds one not in ``known``; and every GPU the lists hold, ascending. Ranges share their lists
    (:func:`pcietrace.analysis.attribution.range_gpus`), so each distinct list is read once."""
    code, distinct = by_object(gpus.to_numpy(object))
    sets = [set(x) for x in distinct]

    def holds(idx: int | None, known: set[int] | None = None) -> np.ndarray:
        one = np.array([not s <= known if idx is None else idx in s for s in sets], bool)
        return one[code] if len(sets) else np.zeros(len(code), bool)
    return holds, sorted(int(i) for i in set().union(*sets))


def spans_by_gpu(ranges: pd.DataFrame) -> dict[int, np.ndarray]:
    """Each GPU's stretches of time (start, end; ns; shape (m, 2), in time order) that any of its ranges was open,
    by NVML index, from ``ranges`` carrying ``gpus`` (:func:`pcietrace.analysis.attribution.range_gpus`), for
    :func:`floor_model`: what it reads of them is where they were open (:func:`inside_spans`, :func:`union_ns`), so
    a long run's nested ranges are held as the few stretches of their outermost ones (:func:`union_spans`)."""
    if not len(ranges):
        return {}
    holds, gpus = gpu_sets(ranges["gpus"])
    a, b = (ranges[c].to_numpy(np.int64) for c in ("t_start_ns", "t_end_ns"))
    out = {}
    for idx in gpus:
        mine = holds(idx)
        out[idx] = union_spans(np.column_stack([a[mine], b[mine]]))
    return out


def _program_state(row: dict[str, Any], g: pd.DataFrame, spans_ns: np.ndarray | None,
                   window_read_us: tuple[np.ndarray, float] | None, one_cost: dict[str, float]) -> None:
    """Adds ``read_us_program``, ``{d}_bytes_per_read_program``, ``{d}_state_bytes_per_read`` and
    ``quiet_intervals`` to a fitted floor ``row`` (one GPU's samples ``g``; ``spans_ns``: see
    :func:`floor_model`; ``window_read_us``: with a read-time term, the reading windows' mean read times, us,
    and their mean over all their reads; ``one_cost``: per direction, the windows' cost per read fitted
    without the read-time term, B). Only samples inside the spans count: a program's start-up (before
    its CUDA context) reads a cold GPU its ranges never see. Where no sample lies inside the spans the read is
    taken at the windows' mean read time (the intercept alone would charge a read of 0 us)."""
    inside = inside_spans(g["t_ns"].to_numpy(np.int64), spans_ns)
    open_ns = union_ns(spans_ns) if spans_ns is not None and len(spans_ns) else 0
    row["reads_per_s_program"] = float(inside.sum() / (open_ns / 1e9)) if open_ns > 0 else np.nan
    read_ns = g["read_ns"].to_numpy()[inside] if "read_ns" in g and window_read_us is not None else np.zeros(0)
    r = np.nan
    if window_read_us is not None:  # not carried beyond what the windows measured
        per_window, overall = window_read_us
        r = float(np.clip(median(read_ns) / 1e3, per_window.min(), per_window.max())) if read_ns.size else overall
    row["read_us_program"] = r
    for d in DIRECTIONS:
        row[f"{d}_bytes_per_read_program"] = row[f"{d}_bytes_per_read"] + (
            row[f"{d}_bytes_per_read_us"] * r if np.isfinite(r) else 0.0)
    quiet = quiet_bytes(g, inside, row)
    row["quiet_intervals"] = int(quiet["h2d"].size)
    # the program's own quiet intervals measure a read in its state: charged where they are (their mean, as the
    # windows' fit: a floor is a sum over reads, and a read's bytes are skewed: the 8x H200's median sat 1-3 %
    # below the mean), but never above what the windows say a read costs with or without the read-time term,
    # whichever is higher (a program's own steady traffic would look the same). The read-time term alone lowered
    # a cold GPU's floor below what its quiet intervals showed (2x H200 GPU 1, four runs: idle calls H2D +19 ...
    # +52 kB against the app's truth; so: +3 ... +19 kB; one cost per read: -38 ... -19 kB)
    means = {d: float(np.mean(quiet[d])) if quiet[d].size >= STATE_RUN else np.nan for d in DIRECTIONS}
    windows = {d: max(row[f"{d}_bytes_per_read_program"], one_cost[d]) for d in DIRECTIONS}
    # quiet intervals dearer in either direction than that by more than a program's state moves a read
    # (STATE_MIN_SHARE) are not reads alone: charged as where there are too few, the read at the program's read
    # time, and stated with their spread, not their offset (2x H200, emit_nvtx forward ranges: 8-12 quiet
    # intervals at 21-22 kB H2D, 19-26 % above; one cost per read over cold windows, 16.9-18.3 kB, was charged
    # where the truth implied 13.3-16.1 kB a read: 1.5 MB ranges at -1.4 ... -2.5 %). Just above it the higher
    # cost is charged (8x H200: idle ranges' hundreds of quiet intervals, up to 6 % above; the read at the read
    # time alone put idle calls up to 17 kB further from the app's truth)
    apart = any(windows[d] > 0 and means[d] > windows[d] * (1 + STATE_MIN_SHARE[d]) for d in DIRECTIONS)
    for d in DIRECTIONS:
        row[f"{d}_bytes_per_read_quiet"] = means[d]
        if means[d] > 0 and not apart:  # (NaN: too few quiet intervals; <= 0: not a read's cost)
            row[f"{d}_bytes_per_read_program"] = min(means[d], windows[d])
        # where the charge lies below the windows' higher cost, the program's busy intervals (neither state) may
        # cost either: the gap is in the state spread, as the quiet mean's offset is where it lies above what is
        # charged, unless they are not reads alone (2x H200, a 1 s range of 731 reads: D2H 22,884 B a read by the
        # windows, 21,880 quiet; the range read +490 kB against its truth with ±448 kB stated)
        charged = row[f"{d}_bytes_per_read_program"]
        below = max(windows[d] - charged, 0.0) if means[d] > 0 else 0.0
        spread = state_bytes_per_read(quiet[d] - (means[d] if apart else charged))
        row[f"{d}_state_bytes_per_read"] = below + spread


def union_spans(spans_ns: np.ndarray) -> np.ndarray:
    """The stretches (start, end; ns; shape (m, 2), in time order) that any of ``spans_ns`` (start, end; ns;
    overlapping, nested and touching ones joined) was open: at any time, inside one of them as inside one of
    ``spans_ns`` (ends included)."""
    if not len(spans_ns):
        return np.zeros((0, 2), np.int64)
    order = np.argsort(spans_ns[:, 0], kind="stable")
    a, b = spans_ns[order, 0], spans_ns[order, 1]
    reach = np.maximum.accumulate(b)  # the furthest end so far: a span starting past it opens a new stretch
    new = np.flatnonzero(np.concatenate([[True], a[1:] > reach[:-1]]))
    return np.column_stack([a[new], np.maximum.reduceat(reach, new)])


def union_ns(spans_ns: np.ndarray) -> int:
    """How long (ns) any of ``spans_ns`` (start, end; ns; overlapping and nested ones counted once) was open."""
    stretches = union_spans(spans_ns)
    return int((stretches[:, 1] - stretches[:, 0]).sum())


def inside_spans(t_ns: np.ndarray, spans_ns: np.ndarray | None) -> np.ndarray:
    """Which sample times ``t_ns`` (ascending) lie inside any of ``spans_ns`` (start, end; ns); None or empty:
    all."""
    if spans_ns is None or not len(spans_ns):
        return np.ones(t_ns.size, bool)
    opened = counted_by(t_ns, np.sort(spans_ns[:, 0]))
    opened -= counted_by(t_ns, np.sort(spans_ns[:, 1]), strict=True)  # (open: started at or before, not ended before)
    return opened > 0


def quiet_intervals(g: pd.DataFrame, row: dict[str, Any] | pd.Series) -> np.ndarray:
    """Per sample interval of one GPU's samples ``g`` (``len(g) - 1``), whether it is quiet: under
    :data:`QUIET_FACTOR` x the floor of ``row`` (``{d}_bytes_per_read_program``, ``{d}_background_Bps``) in both
    directions, and not across a counter jump (its bytes are unknown)."""
    t = g["t_ns"].to_numpy(np.int64)
    quiet = ~jumps(g)
    terms = [(g[f"{c}_bytes"].to_numpy(), row[f"{d}_background_Bps"], _charged(row, d)) for d, c in DIRECTIONS.items()]
    for lo in range(0, quiet.size, INTERVAL_CHUNK):  # (a chunk's limits made and compared while in cache)
        hi = min(lo + INTERVAL_CHUNK, quiet.size)
        dt_s = np.diff(t[lo:hi + 1]) / 1e9  # (each interval's length, s)
        for y, background_bps, per_read in terms:
            limit = dt_s * background_bps
            limit += per_read
            np.maximum(limit, 1.0, out=limit)
            limit *= QUIET_FACTOR
            quiet[lo:hi] &= np.diff(y[lo:hi + 1]) < limit
    return quiet


#: Sample intervals :func:`quiet_intervals` judges at a time: an hour's 6e6 per GPU, each step over all of them
#: at once, went to memory and back a dozen times (0.11 s a call, 24 calls for 8 GPUs; 0.04 s in chunks).
INTERVAL_CHUNK = 1 << 16


def busy_reads(g: pd.DataFrame, row: dict[str, Any] | pd.Series, first: np.ndarray, after: np.ndarray) -> np.ndarray:
    """How many of the reads ``first`` ... ``after - 1`` of one GPU's samples ``g`` (each range's, as
    :func:`pcietrace.analysis.attribution.gpu_sums` counts them) ended a sample interval that was not quiet
    (:func:`quiet_intervals`: the program's launch streams or copies in it; the first sample's, with no interval
    before it, counts as busy)."""
    at = np.zeros(len(g) + 1, np.int64)
    at[1:2] = 1
    np.cumsum(~quiet_intervals(g, row), out=at[2:])
    at[2:] += 1
    return at[after] - at[first]


def quiet_bytes(g: pd.DataFrame, inside: np.ndarray, row: dict[str, Any] | pd.Series) -> dict[str, np.ndarray]:
    """Per direction, the bytes less the background (B, one read each, in time order) of one GPU's quiet sample
    intervals (:func:`quiet_intervals`) between two samples ``inside`` the program's ranges."""
    t = g["t_ns"].to_numpy(np.int64)
    quiet = quiet_intervals(g, row)
    quiet &= inside[1:] & inside[:-1]
    dt_s = np.diff(t)[quiet] / 1e9
    out = {}
    for d, c in DIRECTIONS.items():  # (only theirs: the quiet intervals' bytes less the background)
        y = np.diff(g[f"{c}_bytes"].to_numpy())[quiet].astype(float)
        y -= row[f"{d}_background_Bps"] * dt_s
        out[d] = y
    return out


def state_bytes_per_read(resid: np.ndarray, run: int | None = None) -> float:
    """How far (bytes per read, 95 %) the cost of a read strayed from the floor's in a program's quiet sample
    intervals (``resid``: bytes over the floor, one read each, in time order), for as long as a state lasts:
    their mean offset plus the part of the 2.5/97.5 percentiles (larger side) of the means over every ``run``
    consecutive ones that independent reads do not explain (those percentiles over the same intervals in
    :data:`SHUFFLES` shuffled orders, or draws of :data:`MAX_SHUFFLED` of them where there are more, subtracted
    in quadrature). One interval's bytes jitter with the counter's 0.2 ms updates and from read to read; charged
    x every read of a range as if it lasted, that jitter alone widened the 8x H200's idle calls' error 2-3x. 0
    with fewer than ``run`` (default :data:`STATE_RUN`) quiet intervals."""
    run = run or STATE_RUN
    if resid.size < run:
        return 0.0
    offset = float(np.mean(resid))
    centred = np.asarray(resid, float) - offset
    rng = np.random.default_rng(0)
    spread = _run_spread(centred, run)
    shuffled = (rng.permutation(centred) if centred.size <= MAX_SHUFFLED else
                centred[rng.integers(0, centred.size, MAX_SHUFFLED)] for _ in range(SHUFFLES))
    independent = float(np.mean([_run_spread(x, run) for x in shuffled]))
    return abs(offset) + float(np.sqrt(max(spread ** 2 - independent ** 2, 0.0)))


def _run_spread(x: np.ndarray, run: int) -> float:
    """The larger side of the 2.5/97.5 percentiles of the means over every ``run`` consecutive values of ``x``."""
    total = np.zeros(x.size + 1)
    np.cumsum(x, out=total[1:])
    means = total[run:] - total[:-run]  # (running sums: one pass, where a convolution costs ``run`` passes)
    means /= run
    lo, hi = np.percentile(means, [2.5, 97.5], overwrite_input=True)
    return float(max(abs(lo), abs(hi)))


def _cov(model_row: pd.Series, direction: str) -> np.ndarray:
    """The 3x3 covariance of the floor's terms (:data:`TERMS`) from their standard errors and correlations;
    terms a model (or an older one) lacks count as exact."""
    se = np.array([float(model_row.get(f"{direction}_{t}_se", 0.0) or 0.0) for t in TERMS])
    corr = np.eye(3)
    for (i, j), name in (((0, 2), "floor_corr"), ((0, 1), "corr_read_vs_read_us"),
                         ((1, 2), "corr_read_us_vs_background")):
        c = model_row.get(f"{direction}_{name}", 0.0)
        corr[i, j] = corr[j, i] = 0.0 if c is None or np.isnan(c) else c
    return corr * np.outer(se, se)


def floor_err_bytes(model_row: pd.Series, direction: str, reads: np.ndarray, duration_ns: np.ndarray,
                    read_us: np.ndarray | None = None, busy: np.ndarray | None = None) -> np.ndarray:
    """Half-width of the 95 % interval of :func:`floor_bytes` for the same intervals: the fitted terms'
    (Student t, from their covariance), the GPU's state while the program ran (a state lasts many reads, so it
    adds up over them: ``{d}_state_bytes_per_read`` x reads, and each of the ``busy`` reads (:func:`busy_reads`;
    None: every read) at least :data:`STATE_MIN_SHARE` of its cost) and, where the model has a read-time term,
    the reads of an interval that sat apart in read time (``read_us``: their summed time, us; see
    :func:`read_us_apart`), in quadrature. NaN without a floor or with no degrees of freedom left."""
    shape = np.shape(reads)
    if model_row["status"] == "no floor" or not model_row.get("dof"):
        return np.full(shape, np.nan)
    n = np.asarray(reads, float)
    r = float(model_row.get("read_us_program", np.nan))
    g = np.stack(np.broadcast_arrays(n, n * (r if np.isfinite(r) else 0.0), np.asarray(duration_ns, float) / 1e9),
                 axis=-1)
    fit = t975(model_row["dof"]) * np.sqrt(np.maximum(
        np.einsum("...i,ij,...j->...", g, _cov(model_row, direction), g), 0.0))
    per_read = float(model_row.get(f"{direction}_state_bytes_per_read", 0.0) or 0.0)
    least = STATE_MIN_SHARE[direction] * abs(float(_charged(model_row, direction)))
    state = per_read * n + max(least - per_read, 0.0) * (n if busy is None else np.asarray(busy, float))
    # reads of a range in a state of their own (slower or faster): their cost moved, either way (both seen)
    per_us = abs(float(model_row.get(f"{direction}_bytes_per_read_us", 0.0) or 0.0))
    apart = per_us * read_us_apart(model_row, n, read_us) * n
    return np.sqrt(fit ** 2 + state ** 2 + apart ** 2)


def read_us_apart(model_row: pd.Series, reads: np.ndarray, read_us: np.ndarray | None) -> np.ndarray:
    """How far (us, >= 0) each interval's reads took longer or shorter than the program's read time
    (``read_us_program``): their mean (``read_us``: the reads' summed time, us; kept within the windows' mean
    read times), where at least :data:`STATE_RUN` reads sat :data:`RANGE_READ_TIME_SPREAD` apart; else 0, and
    0 without a read-time term."""
    n = np.asarray(reads, float)
    r0 = float(model_row.get("read_us_program", np.nan) or np.nan)
    lo, hi = (float(model_row.get(k, np.nan) or np.nan) for k in ("read_us_min", "read_us_max"))
    if read_us is None or not model_row.get("read_time_term") or not np.isfinite([lo, hi, r0]).all():
        return np.zeros(n.shape)
    off = np.abs(np.clip(np.divide(read_us, n, out=np.full(n.shape, r0), where=n > 0), lo, hi) - r0)
    return np.where((n >= STATE_RUN) & (off > RANGE_READ_TIME_SPREAD * r0), off, 0.0)


def _charged(model_row: dict[str, Any] | pd.Series, direction: str) -> float:
    """What each read of the program is charged (``{d}_bytes_per_read_program``; a model made before the
    read-time term: ``{d}_bytes_per_read``)."""
    per_read = model_row.get(f"{direction}_bytes_per_read_program", np.nan)
    return model_row[f"{direction}_bytes_per_read"] if per_read is None or not np.isfinite(per_read) else per_read


def floor_bytes(model_row: pd.Series, direction: str, reads: np.ndarray, duration_ns: np.ndarray) -> np.ndarray:
    """Floor bytes of intervals with ``reads`` counter reads lasting ``duration_ns``, each read at its cost in
    the program's state (:func:`_charged`; NaN without a floor)."""
    if model_row["status"] == "no floor":
        return np.full(np.shape(reads), np.nan)
    background = model_row[f"{direction}_background_Bps"] * np.asarray(duration_ns, float) / 1e9
    return _charged(model_row, direction) * np.asarray(reads, float) + background
