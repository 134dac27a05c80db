"""Latency statistics, the topology model and `compare`, on real H100 and H200 x2 reports."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from pcietrace.analysis import analyze
from pcietrace.analysis.compare import RUN_TO_RUN_PCT, compare, run_to_run_pct
from pcietrace.analysis.latency import summary, topology_model
from pcietrace.cli import main
from pcietrace.session import Session

from conftest import edit_report


@pytest.fixture(scope="module")
def h200(data_dir):
    return Session.load(data_dir / "h200x2_run")


@pytest.fixture(scope="module")
def h100l(data_dir):
    return Session.load(data_dir / "h100_run_latency")


def test_summary_median_interval_and_spread() -> None:
    # Constructed values (not measured): 1..11 us.
    lat = pd.DataFrame({"nvml_index": 0, "test": "t", "peer": -1, "repeat": range(11), "value_us": np.arange(1.0, 12.0)})
    s = summary(lat).iloc[0]
    assert s["median_us"] == 6 and s["n"] == 11 and s["p10_us"] == pytest.approx(2) and s["p90_us"] == pytest.approx(10)
    assert s["spread_pct"] == pytest.approx(5 / 6 * 100) and 0 < s["ci95_us"] <= 3


def test_real_h200_pair_has_nvlink_and_peer_reads(h200) -> None:
    topo = h200.meta["topology"]
    assert topo["matrix"] == [["X", "NV18"], ["NV18", "X"]]
    assert all(g["switch_levels"] == 0 for g in topo["gpus"])
    lat = analyze(h200)["latency"].set_index(["nvml_index", "test", "peer"])
    peer, host = lat.loc[(0, "peer_read_rtt", 1), "median_us"], lat.loc[(0, "host_read_rtt", -1), "median_us"]
    assert 0.3 < peer < host < 3  # NVLink peer reads beat PCIe reads of host memory on this machine


def test_topology_model_on_real_runs(h200) -> None:
    res = analyze(h200)
    m = res["topology_model"]
    assert set(m["nvml_index"]) == {0, 1}
    g0 = m[m["nvml_index"] == 0].sort_values("kernel_us")
    assert (g0["rtts_per_launch"] > 0).all() and g0["added_us_per_level"].iloc[0] == pytest.approx(0.3 * g0["rtts_per_launch"].iloc[0])
    assert g0["share_per_level_pct"].is_monotonic_decreasing  # matters most for the shortest kernels
    doubled = analyze(h200, us_per_level=0.6)["topology_model"]
    assert doubled["added_us_per_level"].iloc[0] == pytest.approx(2 * m["added_us_per_level"].iloc[0])


def test_model_maths_on_constructed_inputs() -> None:
    # Constructed (not measured): eager 2.0 us vs graph 1.0 us per empty kernel, 1.0 us round trip.
    gt = pd.DataFrame({"nvml_index": 0, "kernel_us": [0.0, 10.0], "eager_gpu_us": [2.0, 12.0], "graph_gpu_us": [1.0, 11.0]})
    lat = pd.DataFrame({"nvml_index": [0], "test": ["host_read_rtt"], "median_us": [1.0]})
    m = topology_model(gt, lat, {0: 2}, us_per_level=0.3)
    assert m["rtts_per_launch"].tolist() == [1.0, 1.0] and m["added_us_per_level"].tolist() == pytest.approx([0.3, 0.3])
    assert m["share_per_level_pct"].tolist() == pytest.approx([15.0, 2.5]) and m["switch_levels"].tolist() == [2, 2]


def test_compare_real_h100_and_h200(h100l, h200, capsys) -> None:
    cmp = compare([("A", analyze(h100l), h100l.meta), ("B", analyze(h200), h200.meta)])
    rows = cmp[cmp["gpu"] == "GPU0"].set_index("metric")
    eager = rows.loc["eager H2D bytes / launch"]
    assert eager["value:A"] == pytest.approx(eager["value:B"], rel=0.05)  # same driver, same launch path
    assert eager["significant:B"] in (True, False)
    # figures that move with the host's speed are judged against how far two runs of one machine differ
    # (run_to_run_pct, in % of the two values' mean), not only against one run's interval: launch + sync
    # differs by ~18 % of the mean with CIs of 0.1 us, within its bound; host cost (no interval) by its bound
    def mean_pct(r: pd.Series) -> float:
        return abs(r["delta:B"]) / ((abs(r["value:A"]) + abs(r["value:B"])) / 2) * 100

    sync = rows.loc["launch + sync (eager)"]
    assert abs(sync["delta:B"]) > sync["ci95:A"] + sync["ci95:B"] and mean_pct(sync) < sync["run_to_run_pct"]
    assert sync["significant:B"] is False and sync["run_to_run_pct"] == run_to_run_pct("launch + sync (eager)")
    host = rows.loc["host cost / eager launch"]
    assert host["significant:B"] is (bool(mean_pct(host) > host["run_to_run_pct"]))
    assert run_to_run_pct("graphs 504 kernels, recapture: time / iteration") == RUN_TO_RUN_PCT["graphs: time / iteration"]
    swapped = compare([("B", analyze(h200), h200.meta), ("A", analyze(h100l), h100l.meta)])
    back = swapped[swapped["gpu"] == "GPU0"].set_index("metric")["significant:A"]
    assert (back.dropna() == rows["significant:B"].reindex(back.dropna().index)).all()  # either run as baseline
    # the eager GPU time is drawn per CUDA context: judged against its run-to-run bound (H100 1.71 vs H200 1.40 us
    # is beyond it); the graph one has neither an interval nor a bound: not judged
    gpu = rows.loc["GPU time / empty kernel, eager"]
    assert gpu["run_to_run_pct"] == RUN_TO_RUN_PCT["GPU time / empty kernel, eager"]
    assert gpu["significant:B"] is (bool(mean_pct(gpu) > gpu["run_to_run_pct"])) and mean_pct(gpu) > 12
    assert rows.loc["GPU time / empty kernel, graph", "significant:B"] is None
    # both on the root bus: no switch level moved, so no expectation row (it printed an unknown as +0.000)
    assert "round trip expected from switch levels" not in rows.index


def test_compare_command(data_dir, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # keep rich from wrapping the metric names
    assert main(["compare", str(data_dir / "h100_run_latency"), str(data_dir / "h200x2_run")]) == 0
    out = capsys.readouterr().out
    assert "Comparison" in out and "H200" in out and "host read round trip" in out
    assert main(["compare", str(data_dir / "h200x2_run")]) == 2


def test_one_iqr_spread_for_the_tables_and_bench(data_dir) -> None:
    """The interquartile spread in % is spelled once: the latency table's ``spread_pct``, the host cost by
    language's ``iqr_pct`` and bench/'s ``iqr_pct`` are :func:`pcietrace.analysis.spread.iqr_pct`, the same
    figure as before over the real H100 run's raw values (pandas' linear quartiles)."""
    import _stats

    from pcietrace.analysis import launch
    from pcietrace.analysis.spread import iqr_pct

    assert _stats.iqr_pct is iqr_pct
    s = Session.load(data_dir / "h100_run_latency")
    res = analyze(s)
    for r in res["latency"].itertuples():
        v = s.latency[(s.latency["nvml_index"] == r.nvml_index) & (s.latency["test"] == r.test)
                      & (s.latency["peer"] == r.peer)]["value_us"]
        assert r.spread_pct == pytest.approx((v.quantile(0.75) - v.quantile(0.25)) / v.median() * 100)
    b = launch.shortest_eager(s.bursts if "path" in s.bursts else s.bursts.assign(path="python"))
    b = launch.kept_bursts(b.assign(us=b["host_ns"] / b["calls"] / 1e3), ["nvml_index", "path"])
    for r in res["host_cost_by_language"].itertuples():
        v = b[(b["nvml_index"] == r.nvml_index) & (b["path"] == r.path)]["us"]
        want = (v.quantile(0.75) - v.quantile(0.25)) / v.median() * 100 if len(v) >= launch.MIN_SPREAD_BURSTS else np.nan
        assert r.iqr_pct == pytest.approx(want, nan_ok=True)


def test_latency_simulate_runs_the_suite_without_a_gpu(tmp_path, capsys) -> None:
    # was: 'unrecognized arguments: --simulate' (run and graphs had it, latency did not)
    out = tmp_path / "lat"
    assert main(["latency", "--simulate", "--gpus", "2", "--repeats", "3", "-o", str(out), "--format", "json"]) == 0
    s = Session.load(out)
    assert s.meta["kind"] == "latency" and s.meta["simulated"] and len(s.meta["gpus"]) == 2
    res = analyze(s)
    assert set(res["latency"]["nvml_index"]) == {0, 1} and "host_read_rtt" in set(res["latency"]["test"])
    assert main(["compare", str(out), str(out)]) == 0  # saved like a latency run, for compare
    capsys.readouterr()
    assert main(["latency", "--gpus", "2"]) == 2  # --gpus without --simulate: one line, exit 2


def test_a_zero_host_round_trip_gives_no_topology_model(copy, capsys) -> None:
    # was: ZeroDivisionError (a traceback) dividing the eager GPU time's extra by a round trip of 0 us
    folder = copy("h100_run_latency")
    edit_report(folder, lambda doc: [r.__setitem__("value_us", 0.0) for r in doc["tables"]["latency"]])
    assert main(["report", str(folder), "--format", "json"]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert results["latency"] and not results["topology_model"]
