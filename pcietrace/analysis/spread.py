"""Spread of repeated measurements, in % of their median (one spelling for the package and bench/)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def iqr_pct(values: Any, min_values: int = 1) -> float:
    """Interquartile range over the median, in % (linear-interpolated quartiles, as numpy and pandas take
    them); NaN under ``min_values`` values (too few to speak of a spread) or where the median is 0."""
    v = np.asarray(values, dtype=float)
    if v.size < max(min_values, 1):
        return math.nan
    q1, med, q3 = np.percentile(v, [25, 50, 75])
    return float((q3 - q1) / med * 100) if med else math.nan


def t975(dof: Any) -> Any:
    """Student t's 97.5th percentile at ``dof`` degrees of freedom (a 95 % two-sided interval's multiplier), from
    scipy.special, whose import is a fifth of scipy.stats' (~0.2 s against ~1 s: a report pays it once)."""
    from scipy.special import stdtrit

    return stdtrit(dof, 0.975)
