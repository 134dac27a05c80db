"""The eager GPU time's bookkeeping over CUDA contexts when a run is not whole (review of "GPU time per
empty eager kernel over several CUDA contexts"), on the real 2x H200 run with 5 contexts per GPU
(tests/data/h200x2_run_contexts): a context whose bursts all ran dry, a GPU whose fresh-context steps
stopped part-way or never ran, a NaN burst, dry bursts in the run's own context. Every expected figure is
derived from the recording's own bursts."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from pcietrace.analysis import analyze
from pcietrace.analysis.launch import context_levels, gpu_time, primary
from pcietrace.session import Session

from conftest import DATA


@pytest.fixture(scope="module")
def run() -> Session:
    return Session.load(DATA / "h200x2_run_contexts")


def _per_kernel_us(b: pd.DataFrame) -> pd.Series:
    return b["gpu_ns"] / b["launches"] / 1e3


def _own_level(s: Session, idx: int) -> float:
    """Context 0: the median of the run's own saturated eager bursts at the shortest kernel."""
    b = primary(s.bursts)
    b = b[(b["nvml_index"] == idx) & (b["mode"] == "eager") & (b["kernel_us"] == 0) & b["saturated"].astype(bool)]
    return float(_per_kernel_us(b).median())


def _fresh_levels(contexts: pd.DataFrame, idx: int) -> pd.Series:
    c = contexts[(contexts["nvml_index"] == idx) & contexts["saturated"].astype(bool)]
    return _per_kernel_us(c).groupby(c["context"]).median()


def _shortest(gt: pd.DataFrame, idx: int) -> pd.Series:
    return gt[(gt["nvml_index"] == idx) & (gt["kernel_us"] == 0)].iloc[0]


def test_a_context_whose_bursts_all_ran_dry_is_left_out(run) -> None:
    c = run.contexts.copy()
    dry = (c["nvml_index"] == 1) & (c["context"] == 2)
    c.loc[dry, "saturated"] = False
    row = _shortest(gpu_time(run.bursts, run.calibration, c), 1)
    levels = [_own_level(run, 1), *_fresh_levels(c, 1)]
    assert row["eager_contexts"] == len(levels) == 4
    assert row["eager_gpu_us"] == pytest.approx(np.median(levels))
    assert (row["eager_gpu_us_min"], row["eager_gpu_us_max"]) == pytest.approx((min(levels), max(levels)))
    assert bool(row["saturated"])  # every figure behind the median came from a full queue
    other = _shortest(gpu_time(run.bursts, run.calibration, run.contexts), 0)
    assert _shortest(gpu_time(run.bursts, run.calibration, c), 0).equals(other)  # GPU0 untouched


def test_a_gpu_whose_fresh_context_steps_stopped_part_way(run) -> None:
    # GPU1's run ended (failed or Ctrl-C) after its second fresh context: steps are whole or absent
    c = run.contexts[(run.contexts["nvml_index"] == 0) | (run.contexts["context"] <= 2)]
    gt = gpu_time(run.bursts, run.calibration, c)
    levels = [_own_level(run, 1), *_fresh_levels(c, 1)]
    row = _shortest(gt, 1)
    assert row["eager_contexts"] == 3 and row["eager_gpu_us"] == pytest.approx(np.median(levels))
    assert _shortest(gt, 0)["eager_contexts"] == 5


def test_a_gpu_without_fresh_contexts_keeps_its_own_median(run) -> None:
    c = run.contexts[run.contexts["nvml_index"] == 0]
    gt = gpu_time(run.bursts, run.calibration, c)
    row = _shortest(gt, 1)
    b = primary(run.bursts)
    b = b[(b["nvml_index"] == 1) & (b["mode"] == "eager") & (b["kernel_us"] == 0)]
    assert row["eager_contexts"] == 1 and row["eager_gpu_us"] == pytest.approx(_per_kernel_us(b).median())
    assert row["eager_gpu_us_min"] == row["eager_gpu_us_max"] == row["eager_gpu_us"]


def test_a_nan_burst_counts_for_nothing(run) -> None:
    c = run.contexts.copy()
    c.loc[(c["nvml_index"] == 0) & (c["context"] == 3), "gpu_ns"] = math.nan  # a whole context unreadable
    levels = context_levels(run.bursts, c)
    assert np.isfinite(levels["eager_gpu_us"]).all() and 3 not in set(levels[levels["nvml_index"] == 0]["context"])
    row = _shortest(gpu_time(run.bursts, run.calibration, c), 0)
    assert row["eager_contexts"] == 4 and np.isfinite(row["eager_gpu_us"])


def test_dry_bursts_in_the_runs_own_context(run) -> None:
    b = run.bursts.copy()
    own = (b["nvml_index"] == 0) & (b["mode"] == "eager") & (b["kernel_us"] == 0) & (b["path"] == "native")
    b.loc[b.index[own][:3], "saturated"] = False  # three of its 16 bursts outlasted the blocker
    with_contexts = _shortest(gpu_time(b, run.calibration, run.contexts), 0)
    assert bool(with_contexts["saturated"]) and with_contexts["eager_contexts"] == 5  # dry ones left out
    alone = _shortest(gpu_time(b, run.calibration, None), 0)
    assert not bool(alone["saturated"])  # one context: the median includes them, an upper bound (starred)


def test_every_renderer_carries_the_contexts(run) -> None:
    import io
    import json

    from pcietrace.report.output import emit

    res = analyze(run)
    gt, per_gpu = res["gpu_time"], res["per_gpu"]
    shortest = gt[gt["kernel_us"] == 0].set_index("nvml_index")
    for fmt in ("csv", "md", "json"):
        out = io.StringIO()
        emit(run.meta, res, {}, fmt, out=out)
        assert "eager_gpu_us_min" in out.getvalue() and "eager_contexts" in out.getvalue(), fmt
    doc = json.loads(out.getvalue())
    for r in doc["results"]["per_gpu"]:
        assert r["eager_contexts"] == shortest.loc[r["nvml_index"], "eager_contexts"] == 5
        assert r["eager_gpu_us_min"] <= r["eager_gpu_us"] <= r["eager_gpu_us_max"]
    assert gt["eager_contexts"].dtype.kind == "i" and len(per_gpu) == 2


@pytest.mark.parametrize("column, value, says", [("launches", 0, "contexts.launches"),
                                                 ("gpu_ns", -1.0, "contexts.gpu_ns"),
                                                 ("gpu_ns", math.nan, "contexts.gpu_ns"),
                                                 ("context", 0, "contexts.context")])
def test_broken_context_bursts_are_refused_not_figured(run, column, value, says) -> None:
    from pcietrace.errors import DataError

    c = run.contexts.copy()
    c.loc[c.index[4], column] = value
    broken = Session(meta=run.meta, samples=run.samples, windows=run.windows, bursts=run.bursts, contexts=c,
                     e2e=run.e2e, calibration=run.calibration, latency=run.latency)
    with pytest.raises(DataError, match=says):
        analyze(broken)
    assert len(analyze(run)["gpu_time"])  # the recording as it is passes
