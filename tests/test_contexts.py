"""GPU time per empty eager kernel over several CUDA contexts (``pcietrace run --contexts N``).

On one H200 a context draws its level: 1.29-1.45 us over 18 contexts, within 0.1 % inside one
(bench/eager_gpu_truth.py; its saved runs in tests/data/bench). tests/data/h200x2_run_contexts is a real run with 5 contexts per GPU;
tests/data/h100_run predates contexts and must keep its figures. The ``measure`` runs are SIMULATED (the
simulated device draws a context's level, ``sim.CONTEXT_SD``), to drive other numbers of contexts.
"""

from __future__ import annotations

import pytest

import pcietrace
from pcietrace.analysis import analyze
from pcietrace.analysis.launch import context_levels, primary
from pcietrace.record.run import CONTEXT_BURSTS
from pcietrace.session import Session

from conftest import DATA


def test_a_real_run_takes_the_median_over_its_contexts() -> None:
    s = Session.load(DATA / "h200x2_run_contexts")
    levels = context_levels(s.bursts, s.contexts)
    per_burst = s.contexts.assign(us=s.contexts["gpu_ns"] / s.contexts["launches"] / 1e3)
    inside = per_burst.groupby(["nvml_index", "context"])["us"].agg(lambda x: (x.max() - x.min()) / x.median())
    between = levels.groupby("nvml_index")["eager_gpu_us"].agg(lambda x: (x.max() - x.min()) / x.median())
    assert (inside < 0.005).all() and (between > 3 * inside.max()).all(), (inside, between)  # a context is one draw
    gt = analyze(s)["gpu_time"]
    for idx, lv in levels.groupby("nvml_index"):
        assert sorted(lv["context"]) == list(range(s.meta["plan"]["gpu_time_contexts"]))
        row = gt[(gt["nvml_index"] == idx) & (gt["kernel_us"] == 0)].iloc[0]
        assert row["eager_contexts"] == len(lv)
        assert row["eager_gpu_us"] == pytest.approx(lv["eager_gpu_us"].median())
        assert (row["eager_gpu_us_min"], row["eager_gpu_us_max"]) == (lv["eager_gpu_us"].min(), lv["eager_gpu_us"].max())
        assert row["gpu_speedup"] == pytest.approx(row["eager_gpu_us"] / row["graph_gpu_us"])


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


def test_compare_bound_covers_how_far_runs_over_contexts_moved() -> None:
    # bench/eager_gpu_truth.py's saved runs (real: H100 and 2x H200, 5 contexts each, 2026-11-22)
    import json

    from _stats import pair_p95_pct

    from pcietrace.analysis.compare import run_to_run_pct

    folder = DATA / "bench"
    for name in ("eager_gpu_truth_h100_5contexts.json", "eager_gpu_truth_h200x2_5contexts.json"):
        runs = json.loads((folder / name).read_text())["runs"]
        assert len(runs) >= 4 and all(r["contexts"] == 5 for r in runs)
        assert pair_p95_pct([r["eager_gpu_us"] for r in runs]) <= run_to_run_pct("GPU time / empty kernel, eager")


def test_prometheus_carries_the_contexts_range(capsys) -> None:
    parser = pytest.importorskip("prometheus_client.openmetrics.parser")
    from pcietrace.cli import main

    folder = DATA / "h200x2_run_contexts"
    assert main(["report", str(folder), "--format", "prometheus"]) == 0
    fams = {f.name: f for f in parser.text_string_to_metric_families(capsys.readouterr().out)}
    fam = fams["pcietrace_kernel_gpu_eager_contexts_seconds"]
    got = {(x.labels["gpu"], x.labels["stat"]): x.value for x in fam.samples}
    gt = analyze(Session.load(folder))["gpu_time"]
    for r in gt[gt["kernel_us"] == 0].itertuples():
        assert got[(str(r.nvml_index), "min")] == pytest.approx(r.eager_gpu_us_min / 1e6)
        assert got[(str(r.nvml_index), "max")] == pytest.approx(r.eager_gpu_us_max / 1e6)
    assert main(["report", str(DATA / "h100_run"), "--format", "prometheus"]) == 0
    assert "eager_contexts" not in capsys.readouterr().out  # one context: no range to export


def test_the_many_gpu_sentence_gives_the_contexts_range() -> None:
    from pcietrace.analysis.summary import _range_text, run_lines

    res = analyze(Session.load(DATA / "h200x2_run_contexts"))
    gt = res["gpu_time"][res["gpu_time"]["kernel_us"] == 0]
    want = _range_text(gt["eager_gpu_us_min"].min(), gt["eager_gpu_us_max"].max(), ".2f")
    line, = run_lines(res["per_gpu"], detail_gpus=1)  # one sentence over both GPUs
    assert f"eager GPU time {want} us over the CUDA contexts measured" in line, line
    old = analyze(Session.load(DATA / "h200x2_run"))  # recorded before contexts: no such clause
    assert "CUDA contexts" not in " ".join(run_lines(old["per_gpu"], detail_gpus=1))
