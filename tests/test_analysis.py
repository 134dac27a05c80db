"""Analyzer on the real H100 run (whole, or cut before a duration's graph step), and the fit / graph-per-node maths
on constructed inputs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from pcietrace.analysis import analyze, launch
from pcietrace.analysis.fit import linear_fit
from pcietrace.cli import main
from pcietrace.session import Session

from conftest import edit_report


@pytest.fixture(scope="module")
def res(h100):
    return analyze(h100)


def test_fit_recovers_an_exact_line() -> None:
    f = linear_fit([1, 2, 3, 4], [12, 22, 32, 42])
    assert f["slope"] == pytest.approx(10) and f["intercept"] == pytest.approx(2)
    assert f["slope_ci95"] == pytest.approx(0, abs=1e-9) and f["r2"] == pytest.approx(1)


def test_fit_confidence_interval_covers_the_truth_about_95_percent() -> None:
    rng = np.random.default_rng(1)
    x = np.array([1e4, 2.5e4, 5e4, 1e5])
    hits = 0
    for _ in range(400):
        f = linear_fit(x, 1800 * x + rng.normal(0, 2e6, x.size))
        hits += abs(f["slope"] - 1800) <= f["slope_ci95"]
    assert 0.90 <= hits / 400 <= 0.99


def test_fit_with_too_few_points_has_no_interval() -> None:
    f = linear_fit([1, 2], [3, 5])
    assert f["slope"] == pytest.approx(2) and np.isnan(f["slope_ci95"])
    assert np.isnan(linear_fit([1, 1, 1], [1, 2, 3])["slope"])


def test_graph_bytes_split_into_fixed_and_per_node() -> None:
    # Constructed fits (not measured): 250 B per graph launch + 1 B per node.
    fits = pd.DataFrame({"nvml_index": 0, "mode": "graph", "direction": "h2d", "graph_k": [1, 10, 100, 1000],
                         "bytes_per_call": [251.0, 260.0, 350.0, 1250.0]})
    pn = launch.per_node(fits)
    assert pn["fixed_bytes"].item() == pytest.approx(250) and pn["per_node_bytes"].item() == pytest.approx(1)


def test_real_eager_bytes_per_launch(res) -> None:
    pl = res["per_launch"].set_index(["mode", "graph_k", "direction"])
    h2d, d2h = pl.loc[("eager", 1, "h2d")], pl.loc[("eager", 1, "d2h")]
    # H100 / driver 580: ~1.8 KB host->device and ~0.3 KB device->host per eager launch.
    assert 1500 < h2d["bytes_per_call"] < 2200 and h2d["ci95"] < 0.05 * h2d["bytes_per_call"]
    assert 200 < d2h["bytes_per_call"] < 400
    assert h2d["r2"] > 0.99 and bool(h2d["intercept_ok"])


def test_real_graphs_move_far_fewer_bytes_per_kernel(res) -> None:
    pl = res["per_launch"].set_index(["mode", "graph_k", "direction"])
    eager = pl.loc[("eager", 1, "h2d"), "bytes_per_call"]
    assert pl.loc[("graph", 100, "h2d"), "bytes_per_kernel"] < eager / 50
    pn = res["per_node"].set_index("direction")
    assert 0 < pn.loc["h2d", "per_node_bytes"] < 10 < pn.loc["h2d", "fixed_bytes"] < eager


def test_real_bytes_per_launch_are_flat_across_kernel_durations(res) -> None:
    bd = res["by_duration"]
    assert sorted(bd["kernel_us"]) == [0, 2, 5, 10, 20, 50]
    h = bd["h2d_bytes_per_launch"]
    assert (h.max() - h.min()) / h.median() < 0.05  # the published finding: independent of kernel size


def test_real_graph_speedup_shrinks_as_kernels_grow(res) -> None:
    sp = res["speedup"].sort_values("kernel_us")
    assert sp["speedup"].iloc[0] > 2 and sp["speedup"].is_monotonic_decreasing
    assert sp["speedup"].iloc[-1] == pytest.approx(1, abs=0.1)
    gt = res["gpu_time"]
    assert gt["saturated"].all() and (gt["eager_gap_us"] > gt["graph_gap_us"]).all()


def test_real_cpu_cost_and_calibration(res) -> None:
    cc = res["cpu_cost"].set_index("mode")
    assert 1 < cc.loc["eager", "host_us_per_call"] < 20
    assert cc.loc["graph", "host_us_per_kernel"] < cc.loc["eager", "host_us_per_kernel"]
    cal = res["calibration"]
    assert (abs(cal["measured_us"] - cal["kernel_us"]) < 0.1).all()


def test_analyze_tolerates_a_session_with_no_data() -> None:
    from pcietrace.session import Session

    out = analyze(Session(meta={"gpus": []}))
    assert all(len(v) == 0 for v in out.values())


@pytest.mark.parametrize("table", ["bursts", "e2e"])
def test_a_run_stopped_between_a_durations_eager_and_graph_steps_reports(table, tmp_path, data_dir, capsys) -> None:
    """The real H100 run cut where Ctrl-C between a duration's eager and graph step leaves it (the first eager
    burst or end-to-end loop recorded, its graph partner not): `report` renders the eager figures and leaves the
    graph ones out (it raised KeyError: 'graph')."""
    s = Session.load(data_dir / "h100_run")
    t = getattr(s, table)
    setattr(s, table, t.loc[:t.index[t["mode"] == "graph"][0] - 1])
    if table == "bursts":
        s.e2e = s.e2e.iloc[:0]  # (the loops come after the bursts)
    s.meta["status"] = "interrupted"
    s.save(tmp_path / "run")
    assert main(["report", str(tmp_path / "run"), "--format", "json"]) == 0
    res = json.loads(capsys.readouterr().out)["results"]
    key, eager, graph = {"bursts": ("gpu_time", "eager_gpu_us", "graph_gpu_us"),
                         "e2e": ("speedup", "eager_wall_us", "graph_wall_us")}[table]
    rows = res[key]
    assert len(rows) == 1 and rows[0][eager] > 0 and rows[0][graph] is None
    if table == "bursts":  # the eager bursts kept the queue full: not an upper bound for want of a graph burst
        full = analyze(Session.load(data_dir / "h100_run"))["gpu_time"]
        assert rows[0]["saturated"] == bool(full.loc[full["kernel_us"] == rows[0]["kernel_us"], "saturated"].iloc[0])
    assert main(["report", str(tmp_path / "run")]) == 0


@pytest.mark.parametrize("table", ["bursts", "e2e"])
def test_a_run_with_eager_timings_only_renders_graph_figures_as_unknown(table, copy, capsys) -> None:
    # was: KeyError ('us_per_kernel', 'graph') / 'graph' (a traceback) where no graph burst or loop was kept,
    # as in a run cut short between its eager and graph steps
    folder = copy("h100_run")
    edit_report(folder, lambda doc: doc["tables"].__setitem__(
        table, [r for r in doc["tables"][table] if r["mode"] == "eager"]))
    assert main(["report", str(folder), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = doc["results"]["gpu_time" if table == "bursts" else "speedup"]
    graph = "graph_gpu_us" if table == "bursts" else "graph_wall_us"
    eager = "eager_gpu_us" if table == "bursts" else "eager_wall_us"
    assert rows and all(r[graph] is None and r[eager] > 0 for r in rows)
    assert main(["report", str(folder)]) == 0 and "Traceback" not in capsys.readouterr().err
