"""Least-squares line with 95 % confidence intervals (Student t), for bytes against launches."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def linear_fit(x: Any, y: Any) -> dict[str, float]:
    """Fit ``y = intercept + slope * x``.

    Returns ``slope``, ``slope_ci95`` (half-width), ``intercept``, ``intercept_ci95``, ``r2`` and ``n``.
    Half-widths are NaN with fewer than three points (no degrees of freedom left for an error estimate).
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    n = int(x.size)
    nan = float("nan")
    if n < 2 or np.ptp(x) == 0:
        return {"slope": nan, "slope_ci95": nan, "intercept": nan, "intercept_ci95": nan, "r2": nan, "n": n}
    from scipy import stats  # here, not at import: scipy.stats alone takes ~1 s to import

    r = stats.linregress(x, y)
    t = stats.t.ppf(0.975, n - 2) if n > 2 else nan
    return {"slope": float(r.slope), "slope_ci95": float(t * r.stderr) if n > 2 else nan,
            "intercept": float(r.intercept), "intercept_ci95": float(t * r.intercept_stderr) if n > 2 else nan,
            "r2": float(r.rvalue**2) if not math.isnan(r.rvalue) else nan, "n": n}
