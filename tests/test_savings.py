"""Attach's graph-savings prediction against measured savings (pcietrace/analysis/savings.py), on real attach
runs recorded on the H100: eager/graphed pairs of the demo apps (tests/data/attach_h100_slowed), and an eager
run (tests/data/attach_h100_python) whose "graphed" side is that real run with one range's time replaced
(SYNTHETIC, labelled per test); the compared savings table at 80 columns."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from pcietrace.analysis import analyze
from pcietrace.analysis.savings import LAUNCH_BOUND_FACTOR, per_launch_saving_us, predict_ms, savings
from pcietrace.cli import main
from pcietrace.session import Session


@pytest.fixture(scope="module")
def eager(data_dir):
    s = Session.load(data_dir / "attach_h100_python")
    return s, analyze(s)


def test_launch_bound_range_saves_its_own_time_per_launch_minus_a_graph_kernel(eager) -> None:
    s, res = eager
    costs = s.meta["launch_costs"]
    p = predict_ms(res["range_instances"], costs).set_index("name")
    r = p.loc["eager_launches"]
    us_per_launch = r["excl_ns"] / 1e3 / r["eager_launches"]
    assert us_per_launch <= LAUNCH_BOUND_FACTOR * max(costs["host_us_per_eager_launch"], costs["wall_us_per_kernel_eager"])
    assert r["launch_bound"]
    assert r["predicted_ms"] == pytest.approx(r["eager_launches"] * (us_per_launch - costs["wall_us_per_kernel_graph"]) / 1e3)
    # the parent launched nothing itself: it saves what its child saves, not launches x a GPU-bound figure
    assert p.loc["demo_app", "own_eager_launches"] == 0
    assert p.loc["demo_app", "predicted_ms"] == pytest.approx(r["predicted_ms"])
    assert (p.drop(index=["eager_launches", "demo_app"])["predicted_ms"] == 0).all()


def test_gpu_bound_ranges_save_only_the_gpu_overhead(eager) -> None:
    costs = dict(eager[0].meta["launch_costs"])
    slow = 10 * LAUNCH_BOUND_FACTOR * costs["host_us_per_eager_launch"]
    per, bound = per_launch_saving_us(slow, costs)
    assert not bound and per == pytest.approx(costs["wall_us_per_kernel_eager"] - costs["wall_us_per_kernel_graph"])
    costs.update(gpu_us_per_kernel_eager=1.71, gpu_us_per_kernel_graph=0.79)  # H100 `run` gpu_time, empty kernel
    assert per_launch_saving_us(slow, costs) == (pytest.approx(1.71 - 0.79), False)


SLOWED = ("python", "cpp")


def _pair(data_dir, app: str, host: str, timed: bool = True) -> pd.Series:
    """The eager_launches row of :func:`savings` for a real eager/graphed pair of tests/data/attach_h100_slowed;
    ``timed`` False: the eager recording without its call timing (as recorded before the library timed calls)."""
    from pcietrace.schema import TIMING_COLUMNS

    d = data_dir / "attach_h100_slowed"
    e = Session.load(d / f"{app}-{host}-eager")
    if not timed:
        e.events = e.events.drop(columns=list(TIMING_COLUMNS))
    return savings(analyze(e), analyze(Session.load(d / f"{app}-{host}-graph"))).set_index("name").loc["eager_launches"]


@pytest.mark.parametrize("app", SLOWED)
def test_a_slowed_host_is_not_taken_for_a_busy_gpu(data_dir, app: str) -> None:
    """Real runs on the H100 with a busy loop sharing the app's CPU: the demo's range took 8.9-12.4 us per
    launch, over 2x the host cost of a launch, and the rule without call timing called it GPU-bound (its saving
    off by -59 / -74 %). The library's timing shows the host never waited in a synchronize call, so it is
    launch-bound, and the prediction is within the goal of 20 % of the saving measured against the graphed run."""
    untimed, timed = _pair(data_dir, app, "slowed", timed=False), _pair(data_dir, app, "slowed")
    assert not untimed["launch_bound"] and untimed["error_pct"] < -50, untimed
    assert timed["launch_bound"] and abs(timed["error_pct"]) <= 20, timed


@pytest.mark.parametrize("app", SLOWED)
def test_call_timing_changes_nothing_where_the_host_kept_its_pace(data_dir, app: str) -> None:
    """The same apps with the CPU to themselves: both rules call the range launch-bound and predict the same."""
    untimed, timed = _pair(data_dir, app, "plain", timed=False), _pair(data_dir, app, "plain")
    assert timed["launch_bound"] and untimed["launch_bound"]
    assert timed["predicted_ms"] == pytest.approx(untimed["predicted_ms"], rel=1e-3)
    assert abs(timed["error_pct"]) <= 20, timed


def test_ranges_that_wait_for_the_gpu_say_so(data_dir) -> None:
    """On the real recordings: the copy range and the graph-replay range spend nearly all their time inside
    cuStreamSynchronize; the eager range spends its time launching (inside launch calls) and almost none waiting."""
    for run in sorted((data_dir / "attach_h100_slowed").iterdir()):
        inst = analyze(Session.load(run))["range_instances"].set_index("name")
        wait = inst["sync_wait_ns"] / inst["duration_ns"]
        assert wait["h2d_copy"] > 0.95 and wait["graph_launch"] > 0.85, (run.name, wait)
        if run.name.endswith("-graph"):  # the 20,000 kernels replayed as one graph, waited for
            assert wait["eager_launches"] > 0.9 and inst.loc["eager_launches", "launch_call_ns"] == 0, run.name
        else:
            assert wait["eager_launches"] < 0.01, (run.name, wait)
            assert 0.6 < inst.loc["eager_launches", "launch_call_ns"] / inst.loc["eager_launches", "duration_ns"] < 1


def _graphed(res: dict[str, pd.DataFrame], ms: float) -> dict[str, pd.DataFrame]:
    """SYNTHETIC graphed run: the real eager run with eager_launches (and its parent) shortened to ``ms``."""
    rg = res["ranges"].copy()
    cut = rg.loc[rg["name"] == "eager_launches", "incl_ms"].iloc[0] - ms
    rg.loc[rg["name"].isin(["eager_launches", "demo_app"]), "incl_ms"] -= cut
    rg.loc[rg["name"] == "eager_launches", ["eager_launches", "graph_launches"]] = [0, 1]
    return {"ranges": rg}


def test_savings_table_measures_and_scores_both_predictions(eager) -> None:
    s, res = eager
    costs = s.meta["launch_costs"]
    graph_ms = 20000 * costs["wall_us_per_kernel_graph"] / 1e3  # what 20,000 empty graph kernels take on the GPU
    sv = savings(res, _graphed(res, graph_ms)).set_index("name")
    row = sv.loc["eager_launches"]
    eager_ms = res["ranges"].set_index("name").loc["eager_launches", "incl_ms"]
    assert row["measured_ms"] == pytest.approx(eager_ms - graph_ms)
    assert row["predicted_ms"] == pytest.approx(res["ranges"].set_index("name").loc["eager_launches", "graph_savings_ms"])
    assert row["error_pct"] == pytest.approx((row["predicted_ms"] - row["measured_ms"]) / row["measured_ms"] * 100)
    assert abs(row["error_pct"]) < 1  # this synthetic graphed run is exactly the model's assumption
    assert sv.loc["demo_app", "measured_ms"] == pytest.approx(row["measured_ms"])
    assert pd.isna(sv.loc["idle", "error_pct"])  # nothing saved, nothing to score
    assert sv.loc["graph_launch", "predicted_ms"] == 0


def test_savings_without_costs_or_ranges() -> None:
    assert list(savings({}, {}).columns)[:2] == ["domain", "name"]


def test_compare_dispatches_two_attach_runs(data_dir, tmp_path, capsys) -> None:
    a = tmp_path / "eager"
    Session.load(data_dir / "attach_h100_python").save(a)
    assert main(["compare", str(a), str(data_dir / "attach_h100_python"), "--json"]) == 0
    rows = pd.DataFrame(json.loads(capsys.readouterr().out))
    assert set(rows["name"]) >= {"eager_launches", "demo_app", "h2d_copy"}
    assert (rows["measured_ms"].abs() < 1e-9).all()  # the same run twice saves nothing
    assert main(["compare", str(a), str(a)]) == 0
    assert "predicted" in capsys.readouterr().out
    assert main(["compare", str(a), str(a), str(a)]) == 2


def test_uncounted_launches_leave_launch_bound_unknown_not_no(data_dir, capsys) -> None:
    # real H100 run with --no-count-launches: whether a range was launch-bound is unknown, not "no"
    nocount = str(data_dir / "attach_h100_nocount")
    res = analyze(Session.load(nocount))
    assert res["range_instances"]["launch_bound"].isna().all()
    sv = savings(res, res)
    assert len(sv) and sv["launch_bound"].isna().all() and sv["predicted_ms"].isna().all()
    assert main(["compare", nocount, nocount]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "0.00" in line]
    assert rows and not any(line.rstrip().endswith(("no", "yes")) for line in rows), rows
    counted = analyze(Session.load(data_dir / "attach_h100_python"))["range_instances"]["launch_bound"]
    assert counted.dtype == bool  # counted launches: yes or no, as before


def test_gpu_busy_time_when_known_replaces_the_launch_bound_guess(eager) -> None:
    """SYNTHETIC GPU busy times on the real run's instances: captured whole, a range keeps its kernels' GPU
    time (each at least a graph kernel's) and saves the rest; a parent's own part excludes its children's."""
    s, res = eager
    costs = s.meta["launch_costs"]
    inst = res["range_instances"].copy()
    i = inst.index[inst["name"] == "eager_launches"][0]
    parent = inst.index[inst["name"] == "demo_app"][0]
    t_ms = inst.at[i, "excl_ns"] / 1e6
    for busy_frac in (0.2, 1.0):
        inst["gpu_busy_ns"], inst["gpu_short_ns"] = float("nan"), float("nan")
        inst.loc[[i, parent], "gpu_busy_ns"] = busy_frac * inst.at[i, "excl_ns"]  # the parent's kernels are the child's
        inst.loc[[i, parent], "gpu_short_ns"] = 0.1 * t_ms * 1e6
        p = predict_ms(inst, costs).set_index("name")
        assert p.loc["eager_launches", "predicted_ms"] == pytest.approx(max(0.0, t_ms - busy_frac * t_ms - 0.1 * t_ms))
        assert p.loc["demo_app", "predicted_ms"] == pytest.approx(p.loc["eager_launches", "predicted_ms"])


# -- real GPU: the demo apps eager and graphed under attach -------------------------------------------------
APPS = __import__("pathlib").Path(__file__).parent / "apps"


def _attach_pair(tmp_path, name: str, cmd: list[str], graphed_cmd: list[str], eager_opts: tuple[str, ...] = ()) -> pd.DataFrame:
    import subprocess
    import sys

    for tag, c, opts in (("eager", cmd, eager_opts), ("graph", graphed_cmd, ())):
        p = subprocess.run([sys.executable, "-m", "pcietrace", "attach", *opts, "-o", str(tmp_path / f"{name}-{tag}"), "--", *c],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
    p = subprocess.run([sys.executable, "-m", "pcietrace", "compare", str(tmp_path / f"{name}-eager"),
                        str(tmp_path / f"{name}-graph"), "--json"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    sv = pd.DataFrame(json.loads(p.stdout)).set_index("name")
    print(sv.to_string())
    return sv


def _check(sv: pd.DataFrame) -> None:
    e = sv.loc["eager_launches"]
    assert e["eager_launches"] == 20000 and e["graph_launches_graphed"] == 1, e
    assert e["measured_ms"] > 0, e
    assert abs(e["error_pct"]) <= 20, e  # the goal for the demo apps
    # A range with no launches: nothing to save, nothing predicted. (Its measured difference is the app's own
    # copy time in two processes, not ours: on the H100 one 256 MiB pinned copy took 4.9 ms in 20 of 24 runs
    # and 5.6-11.2 ms in 4, in eager and graphed runs alike, 2026-11-22.)
    c = sv.loc["h2d_copy"]
    assert c["calls_eager"] == c["calls_graphed"] == 1, c
    assert c["eager_launches"] == 0 and c["graph_launches_graphed"] == 0 and c["predicted_ms"] == 0, c


@pytest.mark.gpu
@pytest.mark.parametrize("opts", [(), ("--gpu-time",)], ids=["launch-counts", "gpu-time"])
def test_savings_prediction_on_the_python_demo(tmp_path, opts) -> None:
    import sys

    app = [sys.executable, str(APPS / "demo_nvtx.py")]
    _check(_attach_pair(tmp_path, "py", [*app, "20000", "1000", "256"], [*app, "--graphed", "20000", "1000", "256"], opts))


@pytest.mark.gpu
def test_savings_prediction_on_pytorch_decode_from_gpu_time(tmp_path) -> None:
    # PyTorch spends ~27 us of host time per operator, all of which a graph removes: only the GPU's own busy
    # time (attach --gpu-time) tells that apart from a GPU-bound range
    import sys

    pytest.importorskip("torch")
    app = [sys.executable, str(APPS.parent.parent / "examples" / "decode_nvtx.py"), "--batch-sizes", "1,64", "--steps", "20"]
    sv = _attach_pair(tmp_path, "decode", app, [*app, "--graph"], ("--gpu-time",))
    ranges = analyze(Session.load(tmp_path / "decode-eager"))["ranges"].set_index("name")
    for b in (1, 64):
        step = sv.loc[f"decode_step_b{b}"]
        assert step["graph_launches_graphed"] == 20 and step["measured_ms"] > 0, step
        assert abs(step["error_pct"]) <= 20, step  # the goal for a PyTorch app
        r = ranges.loc[f"decode_step_b{b}"]
        assert 0 < r["gpu_busy_ms"] < r["incl_ms"], r[["gpu_busy_ms", "incl_ms"]]


@pytest.mark.gpu
def test_savings_prediction_on_the_cpp_demo(tmp_path) -> None:
    import shutil
    import subprocess

    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc: C++ demo not built")
    exe = tmp_path / "demo_nvtx"
    subprocess.run(["nvcc", "-O2", "-o", str(exe), str(APPS / "demo_nvtx.cu"), "-ldl"], check=True)
    _check(_attach_pair(tmp_path, "cpp", [str(exe), "20000", "1000", "256"], [str(exe), "--graphed", "20000", "1000", "256"]))


def test_savings_table_fits_80_columns_and_prints_range_names_as_written(copy, monkeypatch, capsys) -> None:
    # was: the range column squeezed to nothing and 'launch-bound' cut at 80 columns; a range name with
    # markup ('loss[/total]') was read as markup (a rich MarkupError traceback)
    eager, graphed = copy("attach_h100_decode/decode-eager-gputime"), copy("attach_h100_decode/decode-graph")
    for folder in (eager, graphed):
        events = pd.read_parquet(folder / "events.parquet")
        events["message"] = events["message"].replace("batch_1", "loss[/total]")
        events.to_parquet(folder / "events.parquet")
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["compare", str(eager), str(graphed)]) == 0
    out = capsys.readouterr().out
    assert "…" not in out and max(map(len, out.splitlines())) <= 80
    names = ["loss[/total]", "batch_4", "batch_16", "batch_64"]
    assert all(n in out for n in names) and "predicted" in out and "bound" in out


def test_predictions_of_instances_filtered_or_reordered_read_their_own_nesting(data_dir) -> None:
    """predict_ms takes each instance's parent from the saved row positions only while they still name its parent
    in the frame given: on instances filtered or reordered it finds the nesting again, with the same predictions
    as a frame without the positions (a real 8-GPU torchrun recording, nested ranges)."""
    s = Session.load(data_dir / "attach_h200x8_torchrun")
    inst, costs = analyze(s)["range_instances"], s.meta["launch_costs"]
    assert (inst["parent"] >= 0).any()  # (nested: the positions are in use)
    for part in (inst, inst[inst["depth"] > 0], inst.iloc[::-1], inst.iloc[::3]):
        got = predict_ms(part, costs)
        want = predict_ms(part.drop(columns="parent"), costs)
        pd.testing.assert_series_equal(got["predicted_ms"], want["predicted_ms"])
        pd.testing.assert_series_equal(got["parent"], want["parent"])


def test_a_graphed_run_with_no_graph_launch_is_said(data_dir, capsys) -> None:
    """Two unrelated attach runs (neither graphed) compare as eager vs graphed: a note says that the second made
    no graph launch, so its "saved" is not what graphs save (a fuzzer's: -254 ms saved, +15,716 % errors, no
    word); a graphed second run has no such note."""
    assert main(["compare", str(data_dir / "attach_h200_hooks"), str(data_dir / "attach_h100_emit_nvtx")]) == 0
    assert "made no graph launch" in capsys.readouterr().err
    assert main(["compare", str(data_dir / "attach_h100_python"), str(data_dir / "attach_h100_python")]) == 0
    assert "made no graph launch" not in capsys.readouterr().err


def test_a_graphed_run_whose_launches_were_not_counted_gets_no_such_note(data_dir, capsys) -> None:
    """--no-count-launches: its graph launches are unknown, not none (a reviewer's case)."""
    nocount = str(data_dir / "attach_h100_nocount")
    assert main(["compare", nocount, nocount]) == 0
    assert "made no graph launch" not in capsys.readouterr().err


def _deep_chain(n: int) -> pd.DataFrame:
    """SIMULATED range instances of one thread: ``n`` steps whose pops were forgotten (each nested in the one
    before), the odd ones NCCL's set-up (not capturable), beside a thread of two ordinary ranges."""
    import numpy as np

    k = np.arange(n)
    steps = pd.DataFrame({"pid": 1, "tid": 1, "kind": "push", "depth": k, "domain": "app",
                          "name": np.where(k % 2, "ncclCommInitRank", "step"), "t_start_ns": k * 1000,
                          "t_end_ns": n * 1000 + 1, "eager_launches": 10 * (n - k), "graph_launches": 0,
                          "excl_ns": 1000.0, "sync_wait_ns": np.nan})
    other = pd.DataFrame({"pid": 1, "tid": 2, "kind": "push", "depth": [0, 1], "domain": "app",
                          "name": ["fwd", "layer"], "t_start_ns": [0, 10], "t_end_ns": [500, 400],
                          "eager_launches": [30, 20], "graph_launches": 0, "excl_ns": [100.0, 300.0],
                          "sync_wait_ns": np.nan})
    return pd.concat([steps, other], ignore_index=True)


@pytest.mark.parametrize("rec", ["attach_h200x8_torchrun", "attach_h100_emit_nvtx", "attach_h200_serve", None])
def test_deep_nesting_read_a_level_at_a_time_gives_the_same_savings(data_dir, monkeypatch, rec) -> None:
    """Past :data:`pcietrace.analysis.nesting.MANY_LEVELS` levels the savings' passes read each level's rows alone
    (a pop forgotten in a loop: a 70,000-deep trace's report took 23 s in passes over every row, now 1.8 s): the same
    predictions, bit for bit, and the same outermost capturable ranges, on real recordings and a SIMULATED chain."""
    from pcietrace.analysis import nesting, savings as sv

    if rec is None:
        inst = _deep_chain(300)
        inst["parent"] = nesting.parents(inst)
        costs = Session.load(data_dir / "attach_h100_python").meta["launch_costs"]
    else:
        s = Session.load(data_dir / rec)
        inst, costs = analyze(s)["range_instances"], s.meta["launch_costs"]
    parent = nesting.parents(inst)
    monkeypatch.setattr(nesting, "MANY_LEVELS", 10**9)  # (every row in each level's pass)
    plain = (sv.predict_ms(inst, costs), sv.outermost_capturable(inst, parent))
    monkeypatch.setattr(nesting, "MANY_LEVELS", 0)
    deep = (sv.predict_ms(inst, costs), sv.outermost_capturable(inst, parent))
    pd.testing.assert_series_equal(deep[0]["predicted_ms"], plain[0]["predicted_ms"], check_exact=True)
    pd.testing.assert_series_equal(deep[1], plain[1])
    assert plain[0]["predicted_ms"].notna().any() and plain[1].any()
