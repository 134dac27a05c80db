"""Counter samples -> cumulative bytes -> bytes per window, and the background floor.

Column conventions (all frames): ``nvml_index`` GPU; ``t_ns`` CLOCK_MONOTONIC ns; ``tx_bytes`` bytes the
GPU sent (device->host, D2H); ``rx_bytes`` bytes the GPU received (host->device, H2D). Byte counts
include PCIe TLP headers, as NVML counts them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

#: Fastest a x16 Gen5 link can move (B/s), used only to say whether a gap between samples could hide a wrap.
MAX_LINK_BPS = 64e9


def could_hide_wrap(t_ns: np.ndarray, read_ns: np.ndarray | None = None,
                    counter: dict[str, Any] | None = None) -> np.ndarray:
    """Per step between consecutive samples (times ``t_ns``, reads taking ``read_ns``, ns): whether the GPU's
    saturated link (:func:`link_bps`) could move ``2**bits`` bytes over it, i.e. wrap the counter unseen (then
    the step's bytes are unknown). The step spans what :func:`movable_bytes` spans, not the bare gap: a read's
    values apply anywhere in it, and one read that stalls for 50 ms can hide a wrap behind a 40 ms gap (real
    4x H200 torchrun recording). ``counter``: the GPU's record (:attr:`pcietrace.session.Session.counters`;
    ``bits`` default 32)."""
    c = counter or {}
    limit, bps = 2 ** int(c.get("bits") or 32), link_bps(c)
    t_ns = np.asarray(t_ns, dtype=np.int64)
    if t_ns.size > 1:  # (no step can: the longest gap and the longest read together move less; the common case)
        longest = float(np.max(read_ns)) if read_ns is not None and len(read_ns) else 0.0
        if (longest + float(np.max(np.diff(t_ns))) + COUNTER_UPDATE_NS) / 1e9 * bps < limit:
            return np.zeros(t_ns.size - 1, bool)
    return movable_bytes(t_ns, read_ns, bps) >= limit


#: How often NVML's PCIe byte counters change (measured on the lent H100/H200, driver 580): ~0.2 ms.
COUNTER_UPDATE_NS = 200_000


#: PCIe transfers per second and lane (GT/s) by generation: one bit per lane each, before encoding.
GT_PER_LANE = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0, 7: 128.0}


def link_bps(counter: dict[str, Any]) -> float:
    """The most bytes per second one direction of a GPU's link can move (B/s, from its highest generation and
    width, ``pcie_gen_max``/``pcie_width_max`` of its ``counter`` record, :attr:`Session.counters`; before
    encoding), never under :data:`MAX_LINK_BPS` (unknown: that): counter steps and resets, edges and wraps are
    judged against it, so a Gen6 GPU's copies are never taken for resets."""
    gt, width = GT_PER_LANE.get(int(counter.get("pcie_gen_max") or 0)), counter.get("pcie_width_max")
    return max(MAX_LINK_BPS, gt * 1e9 * int(width) / 8) if gt and width else MAX_LINK_BPS


def median(x: np.ndarray) -> float:
    """``np.median(x)`` (NaN for none); integers spread over no more values than they number (a sampler's gaps:
    a handful of distinct ones, where a selection crawls over the ties) counted instead, the same value."""
    x = np.asarray(x)
    if x.dtype.kind not in "iu" or x.size < 2:
        return float(np.median(x)) if x.size else float("nan")
    lo, hi = int(x.min()), int(x.max())
    if hi - lo >= x.size:
        return float(np.median(x))
    below = np.cumsum(np.bincount(x - lo if lo else x, minlength=hi - lo + 1))  # (how many at or below each value)
    k = x.size // 2
    upper = lo + int(np.searchsorted(below, k, "right"))  # (the values of ranks k and, for an even count, k - 1)
    return float(upper) if x.size % 2 else (float(lo + int(np.searchsorted(below, k - 1, "right"))) + float(upper)) / 2


def read_ns_of(samples: pd.DataFrame) -> np.ndarray:
    """How long each sample's read took (ns), as recorded and held (32 bits where they fit: no copy; widen before
    summing them); 0 for frames without the column (made by hand)."""
    return samples["read_ns"].to_numpy() if "read_ns" in samples else np.zeros(len(samples), np.int64)


def value_span_ns(t_ns: np.ndarray, read_ns: np.ndarray | None = None) -> np.ndarray:
    """Per step between consecutive samples (read midpoints ``t_ns``, reads taking ``read_ns``, ns): the time
    between the earliest and the latest moment the two reads' values can apply (ns): the gap between their
    midpoints, half of each read and one counter update."""
    t_ns = np.asarray(t_ns, dtype=np.int64)
    if read_ns is None:
        return np.diff(t_ns) + float(COUNTER_UPDATE_NS)
    read_ns = np.asarray(read_ns)  # (as held: summed as floats, exact, with no widened copy)
    span = np.add(read_ns[1:], read_ns[:-1], dtype=np.float64)
    span /= 2
    span += np.diff(t_ns)
    span += COUNTER_UPDATE_NS
    return span


def movable_bytes(t_ns: np.ndarray, read_ns: np.ndarray | None = None, max_bps: float = MAX_LINK_BPS) -> np.ndarray:
    """Per step between consecutive samples: the most bytes a saturated link (``max_bps``, B/s) moves over its
    :func:`value_span_ns`."""
    span = value_span_ns(t_ns, read_ns)
    span /= 1e9
    span *= max_bps
    return span


def unwrap(raw: np.ndarray, bits: int = 32, t_ns: np.ndarray | None = None,
           read_ns: np.ndarray | None = None, max_bps: float = MAX_LINK_BPS) -> np.ndarray:
    """Cumulative bytes since the first sample from raw counter values that wrap at ``2**bits``.

    Each step is taken modulo ``2**bits``, so one wrap between consecutive samples is undone; two wraps
    between samples (more than 4.29 GB unseen for 32 bits) cannot be, and :func:`sample_gaps` flags them.

    ``t_ns`` (the samples' times): reads from different processes (background sampler, boundary probe, edge
    reads) are merged by the midpoints of reads that take up to milliseconds, so two overlapping reads can
    land in the other order than the counter values they saw: the counter seems to step back a few KB, which
    modulo ``2**bits`` reads as a ~4.29 GB step (real 8x H200 run: GPU4's floor came out 3.5 GB/s). A step of
    more than half the counter's range that a saturated link could not move between the reads
    (:func:`movable_bytes`, with the reads' times ``read_ns``: their values apply anywhere in them, so a 60 GB/s
    copy between reads of a few ms 40 ms apart moves more than the midpoints' gap allows) is taken as the
    step back it is (negative): the cumulative values are then the counter values each read saw.
    """
    raw = np.asarray(raw)
    if raw.size == 0:
        return np.zeros(0, np.int64)
    movable = movable_bytes(t_ns, read_ns, max_bps) if t_ns is not None else None
    out = np.zeros(raw.size, np.int64)
    np.cumsum(_steps(raw, bits, movable), out=out[1:])
    return out


def _steps(raw: np.ndarray, bits: int, movable: np.ndarray | None) -> np.ndarray:
    """:func:`unwrap`'s steps between consecutive raw values (int64): modulo ``2**bits``, those of more than half
    the range that no link could move (``movable``, bytes per step; None: not judged) taken as steps back."""
    steps = np.subtract(raw[1:], raw[:-1], dtype=np.uint64, casting="unsafe")  # (wraps modulo 2**64 ...)
    if bits < 64:
        steps &= np.uint64((1 << bits) - 1)  # ... and the mask makes it modulo 2**bits
    signed = steps.view(np.int64)  # (the same values below 2**63; 64 bits: a step back is negative already)
    if movable is not None and bits < 64:
        big = np.flatnonzero(steps >= np.uint64(1 << (bits - 1)))  # (few: judged one by one)
        back = big[steps[big].astype(np.float64) > movable[big]]
        signed[back] -= 1 << bits
    return signed


def integrate_rate(t_ns: np.ndarray, kb_per_s: np.ndarray) -> np.ndarray:
    """Cumulative bytes from throughput samples (NVML's pre-555 API: KB/s over ~20 ms), trapezoid rule."""
    t = np.asarray(t_ns, dtype=np.float64) / 1e9
    r = np.asarray(kb_per_s, dtype=np.float64) * 1000.0
    if t.size == 0:
        return np.zeros(0)
    return np.concatenate([[0.0], np.cumsum(np.diff(t) * (r[1:] + r[:-1]) / 2)])


def in_order(tx_bytes: np.ndarray, rx_bytes: np.ndarray) -> np.ndarray:
    """Which samples of one GPU (cumulative bytes in time order) agree with the order of the reads before them:
    neither direction below the highest value read before. Reads of several readers merged by their midpoints
    (``--exact-edges``: the program's threads read at their edges while the sampler reads; NVML serializes
    them, so a read's midpoint can lie a wait away from when its values were taken) can land in the other
    order than the values they saw. Such a step back is two reads swapped, not traffic: kept, its negative
    step and the larger one after it would be taken for a quiet interval and a busy one (the C++ blind app's
    idle range, H100: +455 kB D2H per call against a truth of 0). One reader's samples never step back."""
    if tx_bytes.size < 2:
        return np.ones(tx_bytes.size, bool)
    keep = np.ones(tx_bytes.size, bool)
    keep[1:] = (tx_bytes[1:] >= np.maximum.accumulate(tx_bytes)[:-1]) & (rx_bytes[1:] >= np.maximum.accumulate(rx_bytes)[:-1])
    return keep


def impossible_steps(movable: np.ndarray, *steps: np.ndarray) -> np.ndarray:
    """Which steps between consecutive samples (the counters' ``steps``, bytes, one per step) no link could make:
    more bytes, either way, than a saturated link moves between the earliest and the latest time the two reads'
    values can apply (``movable``: :func:`movable_bytes`, the gap between their midpoints, half of each read, one
    counter update). Two reads swapped step back far less than that (:func:`in_order`); a counter that was reset
    (or jumped) steps by up to its whole range, which a 0.5 ms gap cannot hold. :func:`cumulative_bytes` takes
    such a step as 0: the values after a counter reset continue from the last one before it, so later intervals
    keep their bytes (the interval across it is unknown, which its ``jump`` flag says)."""
    jumped = np.zeros(movable.size, bool)
    for step in steps:
        jumped |= step > movable
        back = np.flatnonzero(step < 0)  # (few: their size judged apart, no absolute copy of every step)
        jumped[back] |= -step[back] > movable[back]
    return jumped


#: Samples in a row that :func:`in_order` may leave out as reads swapped with the ones before them; a longer run is
#: a counter that stepped back (:func:`_held_back`). Reads merged from several readers (``--exact-edges``, H100
#: C++ blind app) left out runs of up to 9 samples (4.7 ms, up to 18 MB below the highest read).
SWAPPED_READS = 64


def _held_back(keep: np.ndarray, t_ns: np.ndarray, read_ns: np.ndarray | None) -> np.ndarray:
    """The first sample of each run of more than :data:`SWAPPED_READS` samples in a row that ``keep`` (:func:`in_order`)
    leaves out, where the run also lasts longer than the read before it took (the highest value so far, kept: a
    read held up for tens of ms can carry a value from late in its span, and the reads inside that span stay below
    it without any reset)."""
    out = np.flatnonzero(~keep)
    if out.size <= SWAPPED_READS:
        return np.zeros(0, np.int64)
    starts = out[np.r_[True, np.diff(out) > 1]]
    ends = out[np.r_[np.diff(out) > 1, True]]
    long = ends - starts + 1 > SWAPPED_READS
    starts, ends = starts[long], ends[long]
    if read_ns is not None and starts.size:
        lasts = t_ns[np.minimum(ends + 1, t_ns.size - 1)] - t_ns[starts - 1]
        starts = starts[lasts > read_ns[starts - 1]]
    return starts


def _accumulate(g: pd.DataFrame, bits: int, movable: np.ndarray, jumped: np.ndarray, into: tuple[np.ndarray, ...],
                find: bool = False) -> bool:
    """One GPU's counters (``g``: its samples, "fields" mode) as bytes since its first sample, each direction's
    unwrapped steps summed into ``into`` (tx, rx) in place; the steps at ``jumped`` taken as 0, or (``find``) the
    steps no link could move added to ``jumped`` (:func:`impossible_steps`) and kept. Whether any step is back."""
    back = False
    for y, col in zip(into, ("tx_raw", "rx_raw")):
        step = _steps(g[col].to_numpy(), bits, movable)
        if find:
            jumped |= impossible_steps(movable, step)
        else:
            step[jumped] = 0
        back = back or bool(step.size and step.min() < 0)
        y[:1] = 0
        if y.dtype == step.dtype:
            np.cumsum(step, out=y[1:])
        else:
            y[1:] = np.cumsum(step)
        del step
    return back


def per_gpu(df: pd.DataFrame) -> Any:
    """``df.groupby("nvml_index")`` (sorted, each GPU's rows in their order), as slices where the rows already
    come by GPU (samples and :func:`cumulative_bytes` do): no sort, no copy of a long recording's rows."""
    idx = df["nvml_index"].to_numpy()
    if not idx.size:
        return iter(())
    if (idx[1:] < idx[:-1]).any():
        return iter(df.groupby("nvml_index", sort=True))
    cut = np.flatnonzero(idx[1:] != idx[:-1]) + 1
    bounds = np.r_[0, cut, idx.size]
    return ((idx[a], df.iloc[a:b]) for a, b in zip(bounds[:-1], bounds[1:]))


def cumulative_bytes(samples: pd.DataFrame, counters: dict[int, dict[str, Any]]) -> pd.DataFrame:
    """Raw samples (see ``SAMPLE_COLUMNS``) -> ``nvml_index, t_ns, tx_bytes, rx_bytes`` (bytes since the
    GPU's first sample), ``read_ns`` (how long that sample's read took, as recorded; the floor's cost of a
    read grows with it) and ``jump`` (the interval up to this sample held a step no link could move, a
    counter reset: its bytes are unknown, :func:`impossible_steps`; the values go on from before it).
    ``counters`` gives each GPU's ``mode`` ("fields"/"throughput"), ``bits`` and, where known,
    ``pcie_gen_max``/``pcie_width_max`` (:func:`link_bps`). Samples that step back against the reads before
    them (:func:`in_order`) are left out, but a counter that stays below its last value for longer than reads
    swapped could (:func:`_held_back`) was reset: a jump, the samples after it kept."""
    if not len(samples):
        return pd.DataFrame(columns=CUMULATIVE_COLUMNS)
    gpu = samples["nvml_index"].to_numpy()
    if (gpu[1:] < gpu[:-1]).any():  # (rows not by GPU: put in GPU order once, each GPU's rows in their order)
        samples = samples.iloc[np.argsort(gpu, kind="stable")]
    modes = {int(i): counters.get(int(i), {"mode": "fields", "bits": 32})["mode"] for i, _ in per_gpu(samples)}
    n = len(samples)
    # filled GPU by GPU (no per-GPU frames concatenated: one copy of the new columns); times, reads and the GPU
    # column are the samples' own, shared, where every sample is kept
    out = {c: np.empty(n, np.int64 if all(m == "fields" for m in modes.values()) else np.float64)
           for c in ("tx_bytes", "rx_bytes")}
    keep, jump = None, np.zeros(n, bool)  # (keep: made where a GPU's samples step back)
    at = 0
    for idx, g in per_gpu(samples):
        c = counters.get(int(idx), {"mode": "fields", "bits": 32})
        t = g["t_ns"].to_numpy(np.int64)
        mine = slice(at, at + t.size)
        tx, rx = out["tx_bytes"][mine], out["rx_bytes"][mine]  # (filled in place)
        if c["mode"] == "fields":
            # each direction's steps unwrapped (:func:`unwrap`) and summed straight into its column, one direction
            # at a time; where a step no link could move lies in either (:func:`impossible_steps`, rare: a reset),
            # both summed again with it taken as 0. The link's reach over each step is found once for all.
            movable = movable_bytes(t, g["read_ns"].to_numpy() if "read_ns" in g else None, link_bps(c))
            jumped = np.zeros(max(t.size - 1, 0), bool)
            back = _accumulate(g, c["bits"], movable, jumped, (tx, rx), find=True)
            if jumped.any():
                _accumulate(g, c["bits"], movable, jumped, (tx, rx))
            k = in_order(tx, rx) if back else None
            read = read_ns_of(g) if "read_ns" in g else None
            for _ in range(3):  # (a counter that stays below its last value: a reset the link could have moved, not
                # two reads swapped: its step, the most negative near the run's start, taken as a jump)
                stuck = _held_back(k, t, read) if k is not None else np.zeros(0, np.int64)
                if not stuck.size:
                    break
                for s0 in stuck:  # (the step into the run, or one of the next few where a swapped read came first)
                    lo, hi = s0 - 1, min(s0 + 7, t.size - 1)
                    fall = np.minimum(np.diff(tx[lo:hi + 1]), np.diff(rx[lo:hi + 1]))
                    jumped[lo + int(np.argmin(fall))] = True
                _accumulate(g, c["bits"], movable, jumped, (tx, rx))
                k = in_order(tx, rx)
            del movable
        else:
            jumped = np.zeros(max(t.size - 1, 0), bool)
            tx[:], rx[:] = integrate_rate(t, g["tx_raw"].to_numpy()), integrate_rate(t, g["rx_raw"].to_numpy())
            k = in_order(tx, rx)
        # (no step back: every sample in order, :func:`in_order` has nothing to leave out)
        if k is None or k.all():
            jump[at + 1:at + t.size] = jumped
        else:
            # a jump belongs to the interval it lies in, also where in_order leaves out the sample after it
            keep = np.ones(n, bool) if keep is None else keep
            keep[mine] = k
            jumps_before = np.concatenate([[0], np.cumsum(jumped)])
            jump[at + np.flatnonzero(k)] = np.diff(jumps_before[k], prepend=0) > 0
        at += t.size
    # (the GPU and read columns as loaded, 32 bits where they fit: shared, not widened; what reads them widens)
    cols = {"nvml_index": samples["nvml_index"].to_numpy(), "t_ns": samples["t_ns"].to_numpy(np.int64),
            "read_ns": read_ns_of(samples), **out,
            "jump": jump}
    if keep is not None:
        cols = {k: v[keep] for k, v in cols.items()}
    return pd.DataFrame({c: cols[c] for c in CUMULATIVE_COLUMNS}, copy=False)


#: The columns of :func:`cumulative_bytes`.
CUMULATIVE_COLUMNS = ["nvml_index", "t_ns", "tx_bytes", "rx_bytes", "read_ns", "jump"]


def jumps(g: pd.DataFrame) -> np.ndarray:
    """One GPU's :func:`cumulative_bytes` rows -> per gap between consecutive samples, whether a counter
    jump lies in it (frames without the column, made by hand: none)."""
    return g["jump"].to_numpy(bool)[1:] if "jump" in g else np.zeros(max(len(g) - 1, 0), bool)


def resets(cum: pd.DataFrame) -> pd.Series:
    """Per GPU (index ``nvml_index``): how many counter resets its :func:`cumulative_bytes` hold, a run of
    consecutive sample gaps with a jump counting once (a read that straddles a reset can step impossibly on
    both sides: its two fields, or it and the read after it, saw different sides of it)."""
    if not len(cum):
        return pd.Series(dtype=int)
    j = cum["jump"].to_numpy(bool)  # (a GPU's first sample never has one: no run spans two GPUs)
    first = j.copy()
    first[1:] &= ~j[:-1]
    gpu = cum["nvml_index"].to_numpy()
    if (gpu[1:] < gpu[:-1]).any():
        return pd.Series(first, index=cum["nvml_index"]).groupby(level=0).sum()
    at = np.r_[0, np.flatnonzero(gpu[1:] != gpu[:-1]) + 1]  # (rows by GPU: counted per run, no index built)
    counts = np.diff(np.searchsorted(np.flatnonzero(first), np.r_[at, gpu.size]))
    return pd.Series(counts, index=pd.Index(gpu[at], name="nvml_index"))


def counted_by(t_ns: np.ndarray, x_ns: np.ndarray, strict: bool = False) -> np.ndarray:
    """Per time of ``t_ns`` (ascending): how many of ``x_ns`` (any order) lie at or before it (``strict``: before
    it), as ``np.searchsorted(np.sort(x_ns), t_ns, "left" if strict else "right")`` gives, found from the side of
    the fewer: each of ``x_ns`` placed among the samples and counted up, one pass over a GPU's samples where
    searching each of them would cost a search apiece."""
    at = np.searchsorted(t_ns, x_ns, "right" if strict else "left")  # (x counts from the sample at ``at`` on)
    counts = np.bincount(at, minlength=t_ns.size + 1)[:t_ns.size]
    return np.cumsum(counts, out=counts)


def gaps_overlapping(t: np.ndarray, flags: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How many flagged gaps (between ``t[k]`` and ``t[k+1]``, ns) overlap each interval [``a``, ``b``] (ns)."""
    flagged = np.flatnonzero(flags)  # (few: counted by searching them, not by a running count over every gap)
    if not flagged.size:
        return np.zeros(np.broadcast(a, b).shape, np.int64)
    lo = np.clip(np.searchsorted(t, a, "right") - 1, 0, flags.size)
    hi = np.clip(np.searchsorted(t, b, "left"), 0, flags.size)
    return np.searchsorted(flagged, np.maximum(hi, lo)) - np.searchsorted(flagged, lo)


#: The columns of :func:`sample_gaps` (the ``sampling`` result table).
SAMPLING_COLUMNS = ["nvml_index", "samples", "rate_hz", "median_gap_us", "max_gap_us", "median_read_us", "wrap_risk",
                    "counter_jumps"]


def sample_gaps(samples: pd.DataFrame, counters: dict[int, dict[str, Any]] | None = None,
                cum: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per GPU: samples, sample rate (Hz), median and max gap (us), whether any step between samples is long
    enough that a saturated link could have wrapped the counter unseen (``wrap_risk``; ``counters``: each
    GPU's record, :func:`could_hide_wrap`) and ``counter_jumps`` (counter resets, :func:`resets`, in ``cum``, the
    samples' :func:`cumulative_bytes`; 0 without it)."""
    rows = []
    jumped = resets(cum) if cum is not None and "jump" in cum else pd.Series(dtype=int)
    for idx, g in per_gpu(samples):
        t = g["t_ns"].to_numpy(np.int64)
        d = np.diff(t) if t.size > 1 else np.array([0])
        span_s = (t[-1] - t[0]) / 1e9 if t.size > 1 else float("nan")
        rows.append({"nvml_index": int(idx), "samples": int(t.size),
                     "rate_hz": (t.size - 1) / span_s if t.size > 1 and span_s > 0 else float("nan"),
                     "median_gap_us": median(d) / 1e3, "max_gap_us": float(d.max()) / 1e3,
                     "median_read_us": median(g["read_ns"].to_numpy()) / 1e3,
                     "wrap_risk": bool(could_hide_wrap(t, read_ns_of(g), (counters or {}).get(int(idx))).any()),
                     "counter_jumps": int(jumped.get(idx, 0))})
    return pd.DataFrame(rows, columns=SAMPLING_COLUMNS)


#: The columns of :func:`wrap_gaps`.
WRAP_GAP_COLUMNS = ["nvml_index", "gaps", "longest_span_ms", "longest_read_ms"]


def wrap_gaps(cum: pd.DataFrame, counters: dict[int, dict[str, Any]] | None, t0_ns: int, t1_ns: int) -> pd.DataFrame:
    """Per GPU with any: the steps between its samples (``cum``: :func:`cumulative_bytes`) that overlap
    [``t0_ns``, ``t1_ns``] and could hide a counter wrap (:func:`could_hide_wrap`; counter jumps left out, they
    are counted apart, :func:`resets`): how many (``gaps``), the longest one's :func:`value_span_ns` (ms) and the
    longer of the two reads around it (ms; a read that long is the sampler stalling inside NVML)."""
    rows = []
    for idx, g in per_gpu(cum):
        t, read_ns = g["t_ns"].to_numpy(np.int64), read_ns_of(g)
        if t.size < 2:
            continue
        hide = could_hide_wrap(t, read_ns, (counters or {}).get(int(idx))) & ~jumps(g) & (t[1:] > t0_ns) & (t[:-1] < t1_ns)
        if hide.any():
            span = np.where(hide, value_span_ns(t, read_ns), -1)
            k = int(np.argmax(span))
            rows.append({"nvml_index": int(idx), "gaps": int(hide.sum()), "longest_span_ms": span[k] / 1e6,
                         "longest_read_ms": max(read_ns[k], read_ns[k + 1]) / 1e6})
    return pd.DataFrame(rows, columns=WRAP_GAP_COLUMNS)


def window_bytes(cum: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """``windows`` plus ``duration_s``, ``tx_bytes``, ``rx_bytes`` (counter change between the window's
    start and end, linearly interpolated between samples) and ``samples`` (samples inside the window).
    Windows not covered by samples, or across a counter jump (:func:`cumulative_bytes`), get NaN bytes."""
    out = windows.copy()
    out["duration_s"] = (out["t_end_ns"] - out["t_start_ns"]) / 1e9
    for col in ("tx_bytes", "rx_bytes"):
        out[col] = np.nan
    out["samples"] = 0
    for idx, g in per_gpu(cum):
        t = g["t_ns"].to_numpy(np.int64)
        sel = (out["nvml_index"] == idx).to_numpy()
        a, b = out.loc[sel, "t_start_ns"].to_numpy(np.int64), out.loc[sel, "t_end_ns"].to_numpy(np.int64)
        covered = (a >= t[0]) & (b <= t[-1]) & (gaps_overlapping(t, jumps(g), a, b) == 0)
        for col in ("tx_bytes", "rx_bytes"):
            y = g[col].to_numpy(np.float64)
            out.loc[sel, col] = np.where(covered, np.interp(b, t, y) - np.interp(a, t, y), np.nan)
        out.loc[sel, "samples"] = np.searchsorted(t, b) - np.searchsorted(t, a)
    return out


#: The columns of :func:`floor` (a run's or a graphs run's ``floor`` result table; attach's is
#: :data:`pcietrace.analysis.floor.FLOOR_COLUMNS`).
RATE_FLOOR_COLUMNS = ["nvml_index", "tx_Bps", "tx_Bps_std", "rx_Bps", "rx_Bps_std", "windows", "reads_per_s"]


def floor(wb: pd.DataFrame) -> pd.DataFrame:
    """Background traffic from the idle windows, per GPU: ``tx_Bps``/``rx_Bps`` (mean bytes per second),
    their standard deviations over windows, ``windows`` (how many idle windows) and ``reads_per_s``
    (counter reads per second during them: NVML reads are PCIe traffic too, part of this floor)."""
    idle = wb[wb["mode"] == "idle"].dropna(subset=["tx_bytes", "rx_bytes"])
    rows = []
    for idx, g in idle.groupby("nvml_index"):
        tx, rx = g["tx_bytes"] / g["duration_s"], g["rx_bytes"] / g["duration_s"]
        rows.append({"nvml_index": int(idx), "tx_Bps": tx.mean(), "tx_Bps_std": tx.std(ddof=1),
                     "rx_Bps": rx.mean(), "rx_Bps_std": rx.std(ddof=1), "windows": len(g),
                     "reads_per_s": (g["samples"] / g["duration_s"]).mean()})
    return pd.DataFrame(rows, columns=RATE_FLOOR_COLUMNS)


def subtract_floor(wb: pd.DataFrame, fl: pd.DataFrame) -> pd.DataFrame:
    """Adds ``tx_net_bytes``/``rx_net_bytes``: window bytes minus floor rate x window duration (NaN for a GPU
    with no floor: its windows' background is unknown, not 0)."""
    out = wb.merge(fl[["nvml_index", "tx_Bps", "rx_Bps"]], on="nvml_index", how="left")
    for d in ("tx", "rx"):
        out[f"{d}_net_bytes"] = out[f"{d}_bytes"].astype(float) - out[f"{d}_Bps"].astype(float) * out["duration_s"]
    return out.drop(columns=["tx_Bps", "rx_Bps"])


#: The columns of :func:`rates` (the ``rates`` timeline).
RATES_COLUMNS = ["nvml_index", "t_ns", "rx_Bps", "tx_Bps"]


def rates(cum: pd.DataFrame, bin_ns: int = 1_000_000) -> pd.DataFrame:
    """Counter rates for timelines: per GPU and ``bin_ns`` bin, ``t_ns`` (bin start), ``rx_Bps``/``tx_Bps``
    (bytes per second over the bin, from the cumulative counters interpolated at bin edges; NaN over a counter
    jump, whose bytes are unknown: :func:`cumulative_bytes`)."""
    parts = []
    for idx, g in per_gpu(cum):
        t = g["t_ns"].to_numpy(np.int64)
        if t.size < 2:
            continue
        edges = np.arange(t[0], t[-1], bin_ns, dtype=np.int64)
        if edges.size < 2:
            continue
        part = {"nvml_index": int(idx), "t_ns": edges[:-1]}
        unknown = gaps_overlapping(t, jumps(g), edges[:-1], edges[1:]) > 0  # (rebased there: it would read 0)
        # the samples around each edge, the only ones interpolation reads (no float copy of every sample)
        around = np.searchsorted(t, edges, "right") - 1
        around = np.unique(np.concatenate([around, around + 1]).clip(0, t.size - 1))
        for col in ("rx_bytes", "tx_bytes"):
            y = np.interp(edges, t[around], g[col].to_numpy()[around].astype(float))
            part[col.replace("_bytes", "_Bps")] = np.where(unknown, np.nan, np.diff(y) / (bin_ns / 1e9))
        parts.append(pd.DataFrame(part))
    return pd.concat(parts, ignore_index=True)[RATES_COLUMNS] if parts else pd.DataFrame(columns=RATES_COLUMNS)
