"""`pcietrace graphs`: the native loops on a FAKE driver, the strategies' bookkeeping on the SIMULATED device,
the analysis, the save / report / compare round trip, and its tables at 80 columns. GPU tests marked gpu."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console
from rich.table import Table

from pcietrace.analysis import analyze
from pcietrace.analysis.graphs import summary
from pcietrace.analysis.summary import summarize
from pcietrace.cli import main
from pcietrace.device.graphs import COUNT_COLUMNS, STRATEGIES
from pcietrace.record.graphs import GraphsPlan
from pcietrace.report import console
from pcietrace.session import Session

from conftest import DATA, ROOT, checkout_env, plain

NATIVE = Path(__file__).parent / "native"
GRAPHS = [ROOT / "tests/data/graphs_h100", ROOT / "tests/data/graphs_h100_pipelined"]


# -- the native loops (pt_graphs.c) on a fake libcuda ---------------------------------------------------
@pytest.fixture(scope="module")
def fake_cuda(tmp_path_factory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the fake driver")
    try:
        from pcietrace.device.native import library

        library()
    except Exception as exc:  # noqa: BLE001 - any reason the native library is not there
        pytest.skip(f"native library not built: {exc}")
    out = tmp_path_factory.mktemp("fakecuda") / "libcuda.so.1"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), "-Wl,-soname,libcuda.so.1",
                    str(NATIVE / "fake_cuda.c")], check=True)
    return out


def _child(fake: Path, *args: str, fail: str | None = None) -> dict:
    env = checkout_env()
    env.pop("FAKE_CUDA_FAIL", None)
    if fail:
        env["FAKE_CUDA_FAIL"] = fail
    p = subprocess.run([sys.executable, str(NATIVE / "graphs_child.py"), str(fake), *args], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_native_loops_on_a_fake_driver(fake_cuda: Path) -> None:
    """Every strategy executes exactly the parameter sets asked for, counts what the strategy implies, keeps
    its graphs across calls, and frees everything on close; synchronous and pipelined alike."""
    out = _child(fake_cuda, "loops")
    order = [0, 1, 2, 0, 2, 1, 1, 0]  # as in graphs_child.py: 8 iterations over 3 sets, 7 kernels
    for mode in ("sync", "pipelined"):
        res = {s: out[f"{s}/{mode}"] for s in STRATEGIES}
        for s, r in res.items():
            assert r["executed_ok"], s
            assert r["walls_positive"] and r["param_sets"] == order
            assert r["live_graphs"] == 0 and r["live_execs"] == 0, s
        c = {s: r["counts"] for s, r in res.items()}
        assert c["eager"]["eager_launches"] == 8 * 7 and c["eager"]["graph_launches"] == 0
        assert c["recapture"]["captures"] == c["recapture"]["instantiations"] == 8
        assert (c["exec_update"]["captures"], c["exec_update"]["instantiations"], c["exec_update"]["updates"]) == (8, 1, 7)
        assert c["node_update"]["captures"] == 0 and c["node_update"]["instantiations"] == 1
        # node updates touch only changed nodes: sets 1 and 2 share 4 of 7 nodes, so 1<->2 changes 3
        changes = {frozenset({0, 1}): 7, frozenset({0, 2}): 7, frozenset({1, 2}): 3}
        expected = sum(changes[frozenset({a, b})] for a, b in zip([0] + order, order) if a != b)
        assert c["node_update"]["node_updates"] == expected
        assert (c["recognize"]["instantiations"], c["recognize"]["cache_hits"]) == (3, 5)
        assert all(c[s]["graph_launches"] == 8 for s in STRATEGIES if s != "eager")


@pytest.mark.parametrize("fail,strategy,call", [("cuGraphInstantiateWithFlags:2", "recognize", "cuGraphInstantiateWithFlags"),
                                                ("cuLaunchKernel:3", "recapture", "cuLaunchKernel (capture)")])
def test_native_failure_names_the_call_and_ends_the_capture(fake_cuda: Path, fail: str, strategy: str, call: str) -> None:
    out = _child(fake_cuda, "fail", strategy, fail=fail)
    assert out["error"] == {"call": call, "code": 999, "name": "FAKE_INJECTED_ERROR"}
    assert out["after"] == 2  # the stream can capture again: the failed capture was ended
    assert out["live_graphs"] == 0 and out["live_execs"] == 0


def test_real_device_class_and_record_loop_on_a_fake_driver(fake_cuda: Path) -> None:
    """CudaGraphsDevice (on a stub GPU object) under record(): sizes 5 and 9, 4 iterations x 2 rounds."""
    out = _child(fake_cuda, "record")
    assert out["status"] == "complete" and out["windows"] == 2 * (5 * 2 + 2)  # per size: 10 strategy + 2 idle
    for n in (5, 9):
        c = {s: out["counts"][f"{n}/{s}"] for s in STRATEGIES}
        assert c["recognize"]["instantiations"] == 5 and c["recognize"]["cache_hits"] == 3
        assert c["eager"]["eager_launches"] == 8 * n and c["recapture"]["instantiations"] == 8
    assert out["executed"] == sum(n + 5 * 8 * n for n in (5, 9))  # + one warm-up iteration per size
    assert out["live_graphs"] == 0 and out["live_execs"] == 0
    assert out["backend_closed"] == 1  # leaving `with device:` closed the backend it was given


def test_failed_exec_update_reinstantiates(fake_cuda: Path) -> None:
    out = _child(fake_cuda, "fail", "exec_update", fail="cuGraphExecUpdate:2")
    c = out["counts"]
    assert (c["update_failures"], c["instantiations"], c["updates"], c["captures"]) == (1, 2, 6, 8)


# -- SIMULATED device ------------------------------------------------------------------------------------
def _sim_run(tmp_path: Path, *extra: str) -> tuple[Session, dict[str, pd.DataFrame]]:
    out = tmp_path / "g"
    assert main(["graphs", "--simulate", "--kernels", "40,120", "--iterations", "10", "--rounds", "2",
                 "-o", str(out), *extra]) == 0
    s = Session.load(out)
    return s, analyze(s)


@pytest.fixture(scope="module")
def sim(tmp_path_factory) -> tuple[Session, dict[str, pd.DataFrame]]:
    return _sim_run(tmp_path_factory.mktemp("sim"), "--sync-each-iteration")  # per-iteration times (break-even)


def test_simulated_counts_follow_the_strategies(sim) -> None:
    s, res = sim
    assert s.meta["kind"] == "graphs" and s.meta["simulated"] and "SIMULATED" in s.meta["timing"]
    g = res["graphs"].set_index(["kernels", "strategy"])
    iters = 10 * 2
    for n in (40, 120):
        assert g.loc[(n, "recognize"), "instantiations"] == 5  # P = 5 parameter sets
        assert g.loc[(n, "recognize"), "cache_hits"] == iters - 5
        assert g.loc[(n, "recapture"), ["captures", "instantiations"]].tolist() == [iters, iters]
        assert g.loc[(n, "exec_update"), ["captures", "instantiations", "updates"]].tolist() == [iters, 1, iters - 1]
        assert g.loc[(n, "node_update"), ["captures", "instantiations"]].tolist() == [0, 1]
        assert g.loc[(n, "eager"), "eager_launches"] == iters * n
        assert g.loc[(n, "eager"), "speedup"] == 1.0


def test_graphs_table_is_consistent_with_the_iterations(sim) -> None:
    """Summary figures derived from the raw iteration rows: mean = total / iterations, speedup = eager mean
    / mean and inside its interval, counts = sums, bytes per iteration from the windows."""
    s, res = sim
    g = res["graphs"]
    for r in g.itertuples():
        it = s.graphs[(s.graphs["kernels"] == r.kernels) & (s.graphs["strategy"] == r.strategy)]
        eager = s.graphs[(s.graphs["kernels"] == r.kernels) & (s.graphs["strategy"] == "eager")]
        assert r.wall_us_mean == pytest.approx(it["wall_ns"].sum() / len(it) / 1e3)
        assert r.wall_us_mean_lo <= r.wall_us_mean <= r.wall_us_mean_hi
        assert r.speedup == pytest.approx(eager["wall_ns"].mean() / it["wall_ns"].mean())
        assert r.speedup_lo <= r.speedup <= r.speedup_hi
        for c in COUNT_COLUMNS:
            assert getattr(r, c) == it[c].sum()
    # eager moves the launch bytes of every kernel; a graph launch far fewer (the model's H2D per launch)
    eager = g[g["strategy"] == "eager"].set_index("kernels")["h2d_bytes_per_iter"]
    p = s.meta["sim_params"]
    for n in (40, 120):
        assert eager[n] == pytest.approx(n * p["eager_rx_bytes"], rel=0.05)
    rec = g[g["strategy"] == "recognize"]
    assert (rec["h2d_bytes_per_iter"].to_numpy() < eager.to_numpy() / 5).all()


def test_break_even_is_instantiation_over_saving(sim) -> None:
    s, res = sim
    g = res["graphs"]
    for r in g[g["strategy"] != "eager"].itertuples():
        assert r.break_even_reuses == pytest.approx(r.build_us / r.saving_us_per_reuse)
    assert g.loc[g["strategy"] == "eager", "break_even_reuses"].isna().all()


def test_orders_random_and_all_new(tmp_path) -> None:
    _, res = _sim_run(tmp_path, "--order", "all-new", "--strategies", "eager,recognize")
    g = res["graphs"].set_index(["kernels", "strategy"])
    assert g.loc[(40, "recognize"), "instantiations"] == 20 and g.loc[(40, "recognize"), "cache_hits"] == 0
    assert GraphsPlan(order="random", param_sets=3).order_of(10).max() < 3
    assert GraphsPlan(order="all-new", iterations=4, rounds=2).parameter_sets(7).shape == (8, 7)


def test_pipelined_takes_times_per_window(tmp_path) -> None:
    s, res = _sim_run(tmp_path, "--pipelined", "--strategies", "eager,recognize")
    assert s.meta["graphs_plan"]["sync"] is False
    g = res["graphs"]
    assert g["launch_us"].isna().all()  # a pipelined iteration's own time is not defined
    for r in g.itertuples():
        it = s.graphs[(s.graphs["kernels"] == r.kernels) & (s.graphs["strategy"] == r.strategy)]
        assert r.wall_us_mean == pytest.approx(it.groupby("round")["wall_ns"].mean().mean() / 1e3)


def test_report_json_and_compare_round_trip(sim, tmp_path, capsys) -> None:
    s, res = sim
    path = tmp_path / "copy"
    s.save(path)
    again = analyze(Session.load(path))
    pd.testing.assert_frame_equal(again["graphs"], res["graphs"])
    capsys.readouterr()
    assert main(["report", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["meta"]["kind"] == "graphs" and len(doc["results"]["graphs"]) == len(res["graphs"])
    assert main(["report", str(path)]) == 0
    text = capsys.readouterr().out
    assert "SIMULATED" in text and "recognize" in text and "break-even" in text
    assert main(["compare", str(path), str(path), "--json"]) == 0
    cmp = pd.DataFrame(json.loads(capsys.readouterr().out)["results"]["compare"])
    row = cmp[cmp["metric"] == "graphs 40 kernels, recognize: speedup over eager"].iloc[0]
    value_a = next(c for c in cmp.columns if c.startswith("value:A: copy (SIMULATED") and "SIMULATED" in c)
    assert row[value_a] == pytest.approx(
        res["graphs"].set_index(["kernels", "strategy"]).loc[(40, "recognize"), "speedup"])


def test_empty_summary_has_columns() -> None:
    from pcietrace.analysis.graphs import SUMMARY_COLUMNS

    assert list(summary(pd.DataFrame(), pd.DataFrame()).columns) == SUMMARY_COLUMNS


@pytest.mark.parametrize("argv", [["--order", "sometimes"], ["--strategies", "recognize"], ["--kernels", "0"],
                                  ["--strategies", "eager,magic"], ["--iterations", "1"]])
def test_bad_arguments_are_one_line(argv: list[str], capsys) -> None:
    try:
        rc = main(["graphs", "--simulate", "--no-save", *argv])
    except SystemExit as exc:  # argparse's own checks exit from the parser
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "error" in err


def test_simulated_costs_name_their_source() -> None:
    from pcietrace.device.graphs_sim import GraphSimCosts

    c = GraphSimCosts.default()
    assert "ASSUMED" in c.source and "a real H100" in c.source  # read off a real run, the rest said to be assumed
    assert all(v >= 0 for k, v in vars(c).items() if isinstance(v, float))


# -- real GPU ------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_graphs_on_a_real_gpu(tmp_path) -> None:
    out = tmp_path / "g"
    assert main(["graphs", "--kernels", "50,200", "--iterations", "12", "--rounds", "2", "-o", str(out)]) == 0
    s = Session.load(out)
    res = analyze(s)
    shown = ["kernels", "strategy", "wall_us_median", *COUNT_COLUMNS, "h2d_bytes_per_iter", "h2d_ci95"]
    table = res["graphs"][shown].to_string()
    print(table)
    g = res["graphs"].set_index(["kernels", "strategy"])
    assert "native" in s.meta["timing"] and not s.meta["simulated"], s.meta["timing"]
    for n in (50, 200):
        assert g.loc[(n, "recognize"), "instantiations"] == 5, table
        assert g.loc[(n, "exec_update"), "updates"] + g.loc[(n, "exec_update"), "update_failures"] == 23, table
        assert g.loc[(n, "node_update"), "captures"] == 0, table
        # eager launches move ~1.8 KB H2D each on Hopper; a graph launch a few hundred bytes, and recognize's
        # 5 instantiations (~1.1 kB per node each, tests/data/graphs_h100) over 24 iterations ~0.24 kB per kernel:
        # ~7x expected (bytes, not timings; NVML's own reads add ~15 kB to a few-ms window)
        assert g.loc[(n, "eager"), "h2d_bytes_per_iter"] > 5 * g.loc[(n, "recognize"), "h2d_bytes_per_iter"], table
        assert (g.loc[n, "wall_us_median"] > 0).all(), table
    # kernels of 2-8 us: an iteration takes at least the kernels' own time
    for r in res["graphs"].itertuples():
        assert r.wall_us_median >= 2 * r.kernels, table


@pytest.mark.gpu
def test_graphs_on_a_real_gpu_loads_the_kernel_once_and_closes_its_gpu(tmp_path, monkeypatch) -> None:
    from pcietrace.device import cuda

    gpus, compiled = [], []
    real_compile = cuda.Gpu.compile

    def watched(self, source: str, name: str):  # noqa: ANN202
        gpus.append(self)
        compiled.append(name)
        return real_compile(self, source, name)

    monkeypatch.setattr(cuda.Gpu, "compile", watched)
    assert main(["graphs", "--kernels", "20", "--iterations", "2", "--rounds", "1", "--no-save"]) == 0
    assert compiled == ["pt_spin"]  # the backend's; the graphs device launches that one
    assert all(g.context is None for g in gpus)  # closed: module, stream and context released


@pytest.mark.gpu
def test_graphs_orders_on_a_real_gpu(tmp_path) -> None:
    out = tmp_path / "g"
    assert main(["graphs", "--kernels", "30", "--iterations", "6", "--rounds", "1", "--order", "all-new",
                 "--pipelined", "-o", str(out)]) == 0
    g = analyze(Session.load(out))["graphs"].set_index("strategy")
    table = g[list(COUNT_COLUMNS)].to_string()
    print(table)
    assert g.loc["recognize", "instantiations"] == 6 and g.loc["recognize", "cache_hits"] == 0, table


def test_real_h100_graphs_run(data_dir) -> None:
    """`pcietrace graphs --kernels 504,2520` recorded on the lent H100 (tests/data/graphs_h100): every strategy
    did exactly what it is defined to do, and its counter bytes say where the traffic went."""
    s = Session.load(data_dir / "graphs_h100")
    g = analyze(s)["graphs"].set_index(["kernels", "strategy"])
    p = s.meta["graphs_plan"]["param_sets"]
    for n in (504, 2520):
        it = int(g.loc[(n, "eager"), "iterations"])
        assert g.loc[(n, "recognize"), ["instantiations", "captures", "cache_hits"]].tolist() == [p, p, it - p]
        assert g.loc[(n, "recapture"), ["captures", "instantiations"]].tolist() == [it, it]
        assert g.loc[(n, "exec_update"), ["instantiations", "updates", "update_failures"]].tolist() == [1, it - 1, 0]
        assert g.loc[(n, "node_update"), ["captures", "instantiations"]].tolist() == [0, 1]
        # eager: ~1.8 kB of submission per kernel; a prepared graph moves a few % of that per iteration
        eager = g.loc[(n, "eager"), "h2d_bytes_per_iter"]
        assert 1500 * n < eager < 2100 * n
        for strategy in ("exec_update", "node_update", "recognize"):
            assert g.loc[(n, strategy), "h2d_bytes_per_iter"] < 0.1 * eager
        # re-instantiating every iteration uploads the graph again: more than half the eager bytes
        assert g.loc[(n, "recapture"), "h2d_bytes_per_iter"] > 0.5 * eager
        assert g.loc[(n, "recognize"), "speedup_lo"] > 1 > g.loc[(n, "recapture"), "speedup_hi"]


def test_a_pipelined_run_leaves_the_break_even_unknown_not_never(capsys) -> None:
    """Real pipelined H100 graphs run: an iteration's own time is unknown there (no synchronize per iteration),
    so the saving per reuse and the break-even are unknown too; graphs were faster, so "never" would be wrong."""
    path = ROOT / "tests" / "data" / "graphs_h100_pipelined"
    s = Session.load(path)
    assert s.meta["graphs_plan"]["sync"] is False
    g = analyze(s)["graphs"]
    graphed = g[g["strategy"] != "eager"]
    assert graphed["build_us"].notna().all() and graphed["saving_us_per_reuse"].isna().all()
    assert (graphed["speedup_lo"] > 1).any()  # graphs paid off in this run
    assert graphed["break_even_reuses"].isna().all()
    assert main(["report", str(path)]) == 0
    assert "never" not in capsys.readouterr().out


def test_a_synchronized_run_keeps_its_break_even() -> None:
    """Real synchronized H100 graphs run: every strategy that instantiated has a finite break-even where an
    iteration with its graph ready beat eager."""
    g = analyze(Session.load(DATA / "graphs_h100"))["graphs"]
    graphed = g[(g["strategy"] != "eager") & (g["saving_us_per_reuse"] > 0)]
    assert len(graphed) and (graphed["break_even_reuses"] == graphed["build_us"] / graphed["saving_us_per_reuse"]).all()


def test_graphs_is_pipelined_by_default_and_says_its_answer_first(tmp_path) -> None:
    # was: a synchronize after every iteration by default (capture and update could not overlap the GPU's work,
    # unlike the seed's loop), no answer-first sentence, and a banner ending "Replace with figures from a real
    # H100 `pcietrace graphs` run"
    from pcietrace.analysis.summary import summarize
    from pcietrace.cli import build_parser
    from pcietrace.report import console

    s, res = _sim_run(tmp_path)
    assert s.meta["graphs_plan"]["sync"] is False
    assert build_parser().parse_args(["graphs", "--sync-each-iteration"]).sync_each_iteration is True
    lines = summarize(s.meta, res)["lines"]
    fastest = res["graphs"][res["graphs"]["strategy"] != "eager"].sort_values("speedup").groupby("kernels").tail(1)
    for r in fastest.itertuples():
        assert any(f"{r.kernels:,} kernels per iteration: {r.strategy} is fastest, {r.speedup:.2f}x eager" in x
                   for x in lines)
    assert "pipelined" in lines[-1]
    banner = console.parts(s.meta, res, summarize(s.meta, res))[0].renderable.plain
    assert "Replace with" not in banner and "a real H100" in banner


def test_the_simulated_model_reproduces_the_real_runs_it_was_read_off(tmp_path) -> None:
    """graphs_sim.json's costs were read off the real H100 runs: simulated, each strategy's speedup over eager
    lands within 0.05 of the real run's, pipelined and synchronized alike."""
    for real, extra in (("graphs_h100_pipelined", []), ("graphs_h100", ["--sync-each-iteration"])):
        r = analyze(Session.load(ROOT / "tests" / "data" / real))["graphs"].set_index(["kernels", "strategy"])["speedup"]
        out = tmp_path / real.replace("/", "_")
        assert main(["graphs", "--simulate", "--kernels", "504", "-o", str(out), *extra]) == 0
        sim = analyze(Session.load(out))["graphs"].set_index(["kernels", "strategy"])["speedup"]
        assert (sim - r.reindex(sim.index)).abs().max() < 0.05, (real, sim, r)


@pytest.mark.parametrize("width", [80])
@pytest.mark.parametrize("path", GRAPHS, ids=lambda p: p.name)
def test_graphs_tables_fit_the_terminal(path: Path, width: int) -> None:
    # was: at 80 columns the strategy column was squeezed to nothing (rows without names) and every time,
    # interval and byte cell was cut with '…'
    s = Session.load(path)
    res = analyze(s)
    parts = console.parts(s.meta, res, summarize(s.meta, res), detail=True)
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=False, color_system=None)
    for part in parts:
        con.print(part)
    lines = buf.getvalue().splitlines()
    assert "…" not in buf.getvalue() and max(map(len, lines)) <= width
    graphs = [t for t in parts if isinstance(t, Table) and str(t.title).startswith("CUDA graphs")]
    assert len(graphs) == 2 * res["graphs"]["kernels"].nunique()
    for t in graphs:
        for col in t.columns:
            for cell in col._cells:  # every line of every cell whole on one output line
                assert all(any(part in line for line in lines) for part in plain(cell).splitlines()), (t.title, cell)
        assert [plain(c) for c in t.columns[0]._cells] == list(res["graphs"]["strategy"].unique())
