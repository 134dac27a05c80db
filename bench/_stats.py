"""Small statistics the bench/ scripts share: medians with bootstrap intervals, spreads in %; and the order of
rounds that rotate their configurations.

Kept out of the package (only the benchmarks use them), except the interquartile spread, which is the
package's own (:func:`pcietrace.analysis.spread.iqr_pct`: the same figure the reports print).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from pcietrace.analysis.spread import iqr_pct  # noqa: F401 - the package's (bench scripts import it from here)


def pct_diff(x: float, ref: float) -> float:
    """(x - ref) / ref in %; NaN where either is missing or ref is 0."""
    if x is None or ref is None or not np.isfinite(x) or not np.isfinite(ref) or ref == 0:
        return float("nan")
    return (x - ref) / ref * 100


def median_ci(values: Sequence[float], level: float = 0.95, draws: int = 10_000,
              seed: int = 0) -> tuple[float, float, float]:
    """(median, lo, hi): the median of ``values`` and its percentile-bootstrap ``level`` interval
    (``draws`` resamples with replacement; seeded, so a rerun on the same numbers prints the same).
    With few values it is optimistic: for 7 normal values it held the true median ~90 % of the time."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return (float("nan"),) * 3
    boot = np.median(np.random.default_rng(seed).choice(v, size=(draws, v.size), replace=True), axis=1)
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(boot, [tail, 100 - tail])
    return float(np.median(v)), float(lo), float(hi)


def rotated(items: Sequence, r: int) -> list:
    """``items`` rotated left by ``r``: round ``r``'s order, so each configuration runs first in turn."""
    k = r % len(items)
    return list(items[k:]) + list(items[:k])


def range_pct(values: Sequence[float]) -> float:
    """(max - min) over the median, in %: the spread of a few repeats (0 for one value)."""
    v = np.asarray(values, dtype=float)
    med = np.median(v)
    return float((v.max() - v.min()) / med * 100) if med else float("nan")


def pair_p95_pct(values: Sequence[float]) -> float:
    """95th percentile, over every pair of values, of their difference in % of the pair's mean: how far two
    runs of one machine differ (pcietrace.analysis.compare.RUN_TO_RUN_PCT is set from it). NaN under 2 values."""
    v = np.asarray(values, dtype=float)
    i, j = np.triu_indices(v.size, k=1)
    if not i.size:
        return float("nan")
    return float(np.percentile(np.abs(v[i] - v[j]) / ((np.abs(v[i]) + np.abs(v[j])) / 2) * 100, 95))
