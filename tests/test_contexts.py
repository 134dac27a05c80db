"""GPU time per empty eager kernel over several CUDA contexts (``pcietrace run --contexts N``).

On one H200 a context draws its level: 1.29-1.45 us over 18 contexts, within 0.1 % inside one
(reports/eager-gpu-time-20261122). The runs here are SIMULATED (the simulated device draws a context's level,
``sim.CONTEXT_SD``): no real recording has fresh contexts to test the bookkeeping on without a GPU. The real
recording below predates them and must keep its figures.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import pcietrace
from pcietrace.analysis import analyze
from pcietrace.analysis.launch import context_levels, primary
from pcietrace.record.run import CONTEXT_BURSTS
from pcietrace.session import Session

DATA = Path(__file__).parent / "data"


def test_eager_gpu_time_is_the_median_over_contexts() -> None:
    run = pcietrace.measure(simulate=True, quick=True, window_s=0.02, latency=False, contexts=4)
    fresh = run.session.contexts
    assert sorted(fresh["context"].unique()) == [1, 2, 3]
    assert (fresh.groupby("context").size() == CONTEXT_BURSTS).all()
    levels = context_levels(run.session.bursts, fresh)
    assert sorted(levels["context"]) == [0, 1, 2, 3]
    assert levels["eager_gpu_us"].nunique() == 4  # SIMULATED: each context drew its own level
    row = run.gpu_time[run.gpu_time["kernel_us"] == 0].iloc[0]
    assert row["eager_contexts"] == 4
    assert row["eager_gpu_us"] == pytest.approx(levels["eager_gpu_us"].median())
    assert row["eager_gpu_us_min"] == levels["eager_gpu_us"].min() < row["eager_gpu_us_max"] == levels["eager_gpu_us"].max()
    assert row["eager_gap_us"] == pytest.approx(row["eager_gpu_us"] - row["measured_us"])
    longer = run.gpu_time[run.gpu_time["kernel_us"] > 0]
    assert (longer["eager_contexts"] == 1).all() and (longer["eager_gpu_us_min"] == longer["eager_gpu_us"]).all()
    assert "over 4 CUDA contexts" in str(run)
    assert run.per_gpu["eager_gpu_us"].iloc[0] == row["eager_gpu_us"]


def test_one_context_records_none_and_says_nothing_of_contexts() -> None:
    run = pcietrace.measure(simulate=True, quick=True, window_s=0.02, latency=False, contexts=1)
    assert not len(run.session.contexts)
    assert (run.gpu_time["eager_contexts"] == 1).all() and "CUDA contexts" not in str(run)


def test_a_real_run_recorded_before_contexts_keeps_its_figures() -> None:
    s = Session.load(DATA / "h100_run")
    gt = analyze(s)["gpu_time"]
    b = primary(s.bursts)
    b = b[(b["mode"] == "eager") & (b["kernel_us"] == gt["kernel_us"].min())]
    assert not len(s.contexts) and (gt["eager_contexts"] == 1).all()
    assert gt["eager_gpu_us"].iloc[0] == pytest.approx((b["gpu_ns"] / b["launches"] / 1e3).median())
    assert (gt["eager_gpu_us_min"] == gt["eager_gpu_us"]).all() and (gt["eager_gpu_us_max"] == gt["eager_gpu_us"]).all()


def test_contexts_out_of_range_are_refused(capsys) -> None:
    from pcietrace.cli import main

    for bad in ("0", "17", "x"):
        with pytest.raises(SystemExit) as exc:
            main(["run", "--simulate", "--contexts", bad])
        assert exc.value.code == 2
    assert "1..16 contexts" in capsys.readouterr().err
