"""`pcietrace merge`: real attach recordings (tests/data) merged as the nodes of one job, locally and on a Dask
LocalCluster; the -o patterns, labels and clock offset attach records for it."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from pcietrace.analysis import merge as merge_analysis

from conftest import DATA, notes_text

TORCHRUN = DATA / "attach_h200x2_torchrun_outside"  # two GPUs, two ranks: one "node" of the job
THREADS = DATA / "attach_h200x2_threads"
ADJACENT = DATA / "attach_h200x4_adjacent"  # two "nodes" of a 4x H200 job (node-0, node-1) and their truths


def as_node(src: Path, dst: Path, host: str, label: str | None, offset_ns: int | None) -> Path:
    """A copy of recording ``src`` as if recorded on ``host`` with ``attach --label label`` (and a clock offset)."""
    shutil.copytree(src, dst)
    doc = json.loads((dst / "report.json").read_text())
    doc["meta"]["node"] = {"host": host, "label": label, "launcher": {"NODE_RANK": host[-1]},
                           "clock": None if offset_ns is None else
                           {"realtime_minus_monotonic_ns": offset_ns, "uncertainty_ns": 50, "reads": 15}}
    (dst / "report.json").write_text(json.dumps(doc))
    return dst


@pytest.fixture(scope="module")
def nodes(tmp_path_factory) -> list[Path]:
    """Three nodes: the torchrun recording twice (two hosts, 7 ms apart on the wall clock) and the threads one."""
    d = tmp_path_factory.mktemp("nodes")
    return [as_node(TORCHRUN, d / "a", "host-a", "node0", 1_800_000_000_000_000_000),
            as_node(TORCHRUN, d / "b", "host-b", "node1", 1_800_000_000_007_000_000),
            as_node(THREADS, d / "c", "host-c", None, 1_800_000_000_003_000_000)]


@pytest.fixture(scope="module")
def merged(nodes, tmp_path_factory) -> Path:
    from pcietrace import multinode

    return multinode.merge(nodes, tmp_path_factory.mktemp("out") / "merged", workers=2)


def _tables(path: Path) -> dict[str, pd.DataFrame]:
    from pcietrace import multinode

    return multinode.load(path).results


def test_a_dask_cluster_merges_to_the_same_report(nodes, merged, tmp_path) -> None:
    """The same recordings merged on a Dask LocalCluster (in-process workers) and on local processes: every
    result table equal."""
    distributed = pytest.importorskip("distributed")
    from pcietrace import multinode

    with distributed.LocalCluster(n_workers=2, processes=False, dashboard_address=None) as cluster:
        out = multinode.merge(nodes, tmp_path / "dask", scheduler=cluster.scheduler_address)
    local, dask = _tables(merged), _tables(out)
    assert json.loads((out / "report.json").read_text())["meta"]["merged"]["engine"].startswith("dask")
    assert local.keys() == dask.keys()
    for name in local:
        pd.testing.assert_frame_equal(local[name], dask[name], check_like=False, obj=name)
    assert len(local["range_instances"]) and len(local["rates"])


def test_ranges_are_the_sum_of_the_nodes_and_each_node_is_its_own_recording(nodes, merged) -> None:
    import pcietrace

    t = _tables(merged)
    alone = {n.name: pcietrace.load(n) for n in nodes}
    by_host = t["ranges_by_host"]
    assert list(by_host.groupby("node", sort=False).size().index) == ["node0", "node1", "host-c"]
    for node, path in zip(["node0", "node1", "host-c"], nodes):
        mine = by_host[by_host["node"] == node].drop(columns=merge_analysis.NODE_COLUMNS).reset_index(drop=True)
        pd.testing.assert_frame_equal(mine, alone[path.name].ranges.reset_index(drop=True), obj=node)
    summed = t["ranges"].set_index(["domain", "name"])
    parts = by_host.groupby(["domain", "name"])
    for col in ("calls", "h2d_bytes", "d2h_bytes", "h2d_edge_bytes", "eager_launches", "incl_ms", "short_calls"):
        pd.testing.assert_series_equal(summed[col].sort_index(), parts[col].sum().sort_index().astype(summed[col].dtype),
                                       check_names=False, obj=col)
    assert (summed["nodes"] == parts["node"].nunique().reindex(summed.index)).all()
    # (a range's calls in its parent: summed where every node placed it there, unknown where they differ)
    agree = (parts[["parent_domain", "parent_name"]].nunique() == 1).all(axis=1)
    expected = parts["parent_calls"].sum().where(agree).reindex(summed.index)
    assert ((summed["parent_calls"] == expected) | (summed["parent_calls"].isna() & expected.isna())).all()
    assert (~agree).any() and agree.any()  # (the threads node has truth ranges at the top, the torchrun ones not)
    assert (summed["parent_calls"].dropna() <= summed["calls"][summed["parent_calls"].notna()]).all()
    apart = by_host.assign(parent_name=lambda d: d["parent_name"].where(d["node"] != "node1", "elsewhere"))
    moved = merge_analysis.sum_ranges(apart).set_index(["domain", "name"])["parent_calls"]
    shared = parts["node"].agg(lambda n: "node1" in set(n) and n.nunique() > 1).reindex(moved.index)
    assert shared.any() and (moved.isna() == shared).all()
    rows = by_host[(by_host["domain"] == "truth") & (by_host["name"] == "h2d_256MiB")]
    assert summed.loc[("truth", "h2d_256MiB"), "gpus"] == sorted(f"{r.node}:{i}" for r in rows.itertuples() for i in r.gpus)
    assert {"node0:1", "node1:1"} <= set(summed.loc[("truth", "h2d_256MiB"), "gpus"])


def test_rows_name_their_node_and_times_are_on_the_wall_clock(nodes, merged) -> None:
    import datetime

    import pcietrace

    # (the report's date is its recording's, the earliest node's; the merge's own is kept beside its nodes)
    meta = json.loads((merged / "report.json").read_text())["meta"]
    created = [json.loads((n / "report.json").read_text())["meta"]["created"] for n in nodes]
    when = [datetime.datetime.strptime(c, "%Y-%m-%dT%H:%M:%S%z") for c in created]
    assert meta["created"] == created[when.index(min(when))]
    assert datetime.datetime.strptime(meta["merged"]["created"], "%Y-%m-%dT%H:%M:%S%z") > max(when)

    t = _tables(merged)
    for name in ("range_instances", "whole_run", "floor", "sampling", "rates", "ranges_by_host"):
        assert list(t[name].columns[:3]) == merge_analysis.NODE_COLUMNS, name
        assert set(t[name]["host"]) >= {"host-a", "host-b"}, name
    inst = t["range_instances"]
    alone = pcietrace.load(nodes[1]).range_instances
    b = inst[inst["node"] == "node1"].reset_index(drop=True)
    assert (b["t_start_ns"] - alone["t_start_ns"] == 1_800_000_000_007_000_000).all()
    a = inst[inst["node"] == "node0"].reset_index(drop=True)
    assert ((b["t_start_ns"] - a["t_start_ns"]) == 7_000_000).all()  # the same recording, 7 ms later
    assert set(t["whole_run"].loc[t["whole_run"]["host"] == "host-c", "label"].isna()) == {True}


def test_report_load_compare_and_every_format_read_a_merged_report(merged, tmp_path, capsys) -> None:
    """`report` in every format with --plot and --perfetto, `compare` and pcietrace.load on a merged report."""
    pytest.importorskip("matplotlib")
    import pcietrace
    from pcietrace.cli import main

    for fmt in ("table", "json", "csv", "md", "prometheus"):
        assert main(["report", str(merged), "--format", fmt]) == 0, fmt
        out = capsys.readouterr().out
        assert "node1" in out and "h2d_256MiB" in out, fmt
    assert main(["report", str(merged), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {r["host"] for r in doc["results"]["whole_run"]} == {"host-a", "host-b", "host-c"}
    assert main(["report", str(merged), "--plot", str(tmp_path / "plots"), "--perfetto", str(tmp_path / "t.json")]) == 0
    assert (tmp_path / "plots" / "attach_timeline.png").stat().st_size
    trace = json.loads((tmp_path / "t.json").read_text())
    groups = [e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"]
    assert [g.split(":")[0] for g in groups if "PCIe counters" in g] == ["node0", "node1", "host-c"]
    ranges = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["name"] == "h2d_256MiB"]
    by_pid: dict[int, list[float]] = {}
    for e in ranges:
        by_pid.setdefault(e["pid"] >> 22, []).append(e["ts"])
    assert [round(b - a, 3) for a, b in zip(sorted(by_pid[1]), sorted(by_pid[2]))] == [7000.0] * len(by_pid[1])
    r = pcietrace.load(merged)
    assert len(r.ranges) and "node1" in r.summary["lines"][0]
    assert main(["compare", str(merged), str(merged)]) == 0
    assert "ncclCommInitRankConfig" in capsys.readouterr().out


def test_instances_of_a_merged_report_are_written_every_call_with_its_node(merged, tmp_path, capsys) -> None:
    """A merged report holds every call of every node (its JSON's range_instances): --instances writes them all,
    each naming its node (it once exited 0 and wrote nothing, then refused)."""
    from pcietrace.cli import main

    assert main(["report", str(merged), "--format", "json"]) == 0
    calls = json.loads(capsys.readouterr().out)["results"]["range_instances"]
    assert main(["report", str(merged), "--instances", str(tmp_path / "i.parquet")]) == 0
    got = pd.read_parquet(tmp_path / "i.parquet")
    assert len(got) == len(calls) > 0 and got["node"].nunique() > 1


def test_two_recordings_of_one_node_name_are_refused_in_one_line(nodes, tmp_path, capsys) -> None:
    from pcietrace.cli import main

    twin = as_node(TORCHRUN, tmp_path / "twin", "host-a", "node0", 0)
    assert main(["merge", str(nodes[0]), str(twin), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--label" in err and not (tmp_path / "out").exists()


def test_a_run_report_is_refused_in_one_line(nodes, tmp_path, capsys) -> None:
    from pcietrace.cli import main

    assert main(["merge", str(nodes[0]), str(DATA / "h100_run"), "-o", str(tmp_path / "out"), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "merge takes attach recordings" in err, err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.partial-*"))


def test_scheduler_without_dask_is_one_line(nodes, tmp_path, monkeypatch, capsys) -> None:
    from pcietrace.cli import main
    from pcietrace.multinode import DASK_MISSING

    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    assert main(["merge", *map(str, nodes[:2]), "-o", str(tmp_path / "out"), "--scheduler", "tcp://127.0.0.1:1"]) == 2
    assert capsys.readouterr().err == f"pcietrace: error: {DASK_MISSING}\n"
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", "tcp://127.0.0.1:1")
    assert main(["merge", *map(str, nodes[:2]), "-o", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == f"pcietrace: error: {DASK_MISSING}\n"


def test_a_node_without_a_clock_offset_keeps_its_own_times_and_says_so(tmp_path) -> None:
    from pcietrace import multinode

    a = as_node(TORCHRUN, tmp_path / "a", "host-a", None, 10**18)
    b = as_node(TORCHRUN, tmp_path / "b", "host-b", None, None)
    t = _tables(multinode.merge([a, b], tmp_path / "out", workers=1))
    assert any("host-b: recorded no clock offset" in n for n in notes_text(t))
    inst = t["range_instances"]
    assert (inst.loc[inst["node"] == "host-a", "t_start_ns"].to_numpy()
            - inst.loc[inst["node"] == "host-b", "t_start_ns"].to_numpy() == 10**18).all()


def test_merge_workers_leave_ctrl_c_to_the_parent_which_stops_them_at_once() -> None:
    """Ctrl-C reaches every process of the group: a merge worker ignores it (it printed a traceback of its own,
    and one that died holding the pool's lock hung the merge in 2 of 5 tries), and the parent, interrupted,
    stops its workers instead of waiting for their work (a node's analysis can take minutes)."""
    import signal

    from pcietrace import multinode

    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with multinode.executor(2, None) as ex:
            assert ex.submit(signal.getsignal, signal.SIGINT).result(timeout=60) == signal.SIG_IGN
            pids = [p.pid for p in ex._processes.values()]
            ex.submit(time.sleep, 60)
            raise KeyboardInterrupt

    def running(pid: int) -> bool:  # (reaped by the pool, or a zombie: not running)
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False
    while any(map(running, pids)) and time.monotonic() - start < 30:
        time.sleep(0.05)
    assert not any(map(running, pids)) and time.monotonic() - start < 30


def test_merging_recordings_whose_programs_never_ran_at_once_warns(tmp_path, capsys) -> None:
    """Two nodes of one job ran together; a recording of another program, a day apart, is merged with a warning
    naming the nodes whose programs ran at no time another's did."""
    from pcietrace.cli import main

    job = DATA / "attach_h200x4_adjacent"
    assert main(["merge", str(job / "node-0"), str(job / "node-1"), "-o", str(tmp_path / "job")]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(["merge", str(job / "node-0"), str(DATA / "attach_h200_max_depth"), "-o", str(tmp_path / "two")]) == 0
    err = capsys.readouterr().err
    assert "ran at no time any other node's did" in err and "different jobs" in err


def test_output_patterns_expand_host_label_pid_and_variables() -> None:
    import socket

    from pcietrace.errors import UsageError
    from pcietrace.record.node import expand_output

    env = {"SLURM_NODEID": "3"}
    assert expand_output("runs/j-%h-%q{SLURM_NODEID}-%l-%%", "gpu01", env) == f"runs/j-{socket.gethostname()}-3-gpu01-%"
    assert expand_output("r-%p", None, env) == f"r-{os.getpid()}"
    for bad, why in (("r-%q{NODE_RANK}", "not set"), ("r-%l", "--label"), ("r-%x", "unknown pattern %x")):
        with pytest.raises(UsageError, match=why):
            expand_output(bad, None, env)


def test_the_clock_offset_agrees_with_a_read_of_both_clocks() -> None:
    """The offset and its uncertainty overlap what one bracket monotonic / realtime / monotonic allows."""
    from pcietrace.record.node import clock_offset

    c = clock_offset()
    m0, r, m1 = time.monotonic_ns(), time.clock_gettime_ns(time.CLOCK_REALTIME), time.monotonic_ns()
    lo, hi = c["realtime_minus_monotonic_ns"] - c["uncertainty_ns"], c["realtime_minus_monotonic_ns"] + c["uncertainty_ns"]
    assert lo <= r - m0 and hi >= r - m1 and c["uncertainty_ns"] >= 0


def test_attach_records_its_node_and_expands_its_folder(monkeypatch, tmp_path, attach_stand_ins) -> None:
    """`attach --label` with -o patterns under torchrun's variables: the folder named from them, and the meta
    holding the host, label, launcher variables and clock offset that merge reads."""
    from pcietrace.cli import main
    from pcietrace.record.node import LAUNCHER_VARS

    monkeypatch.setenv("GROUP_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "head")
    argv = _attach_argv(tmp_path / "node-%q{GROUP_RANK}-%l")
    argv.insert(1, "--label")
    argv.insert(2, "gpus23")
    assert main(argv) == 0
    meta = json.loads((tmp_path / "node-1-gpus23" / "report.json").read_text())["meta"]
    node = meta["node"]
    assert node["label"] == "gpus23" and node["host"] == meta["host"]
    assert node["launcher"] == {k: os.environ[k] for k in LAUNCHER_VARS if k in os.environ}
    assert node["launcher"]["GROUP_RANK"] == "1" and node["clock"]["uncertainty_ns"] >= 0


from test_attach import _attach_argv, attach_stand_ins  # noqa: E402,F401 -- the stand-in GPU and samplers


def _truth_for(recording: Path, dst: Path, swap: bool = False, scale: float = 1.0) -> Path:
    """The recording's truth (its app run alone, reads outside the ranges) with the attached run's pid and tid
    of each rank (the process whose ranges were charged the rank's GPU); ``swap``: the ranks' pids exchanged,
    ``scale``: every truth byte count scaled."""
    import pcietrace

    inst = pcietrace.load(recording).range_instances
    inst = inst[inst["domain"] == "truth"]
    who = {int(g[0]): (int(p), int(t)) for p, t, g in zip(inst["pid"], inst["tid"], inst["gpus"])}
    if swap:
        who = {0: who[1], 1: who[0]}
    rows = [json.loads(x) for x in (recording / "truth_alone.jsonl").read_text().splitlines() if x.strip()]
    for r in rows:
        if "range" in r:
            r["pid"], r["tid"] = who[r["rank"]]
            r["h2d"], r["d2h"] = round(r["h2d"] * scale), round(r["d2h"] * scale)
    dst.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dst


def test_the_multinode_check_passes_a_good_job_and_fails_a_wrong_gpu_or_wrong_bytes(tmp_path, capsys) -> None:
    """bench/multinode_check.py (the check bench/multinode_torchrun.sh runs on 4 GPUs) on the recorded 2x H200
    torchrun job merged as two nodes, with its recorded truth: it passes; with node1's ranks' processes swapped
    (each charged the other's GPU), or node0's truth 20 % higher, it fails."""
    from multinode_check import main as check

    from pcietrace import multinode

    a = as_node(TORCHRUN, tmp_path / "a", "host-a", "node0", 10**18)
    b = as_node(TORCHRUN, tmp_path / "b", "host-b", "node1", 10**18 + 5_000_000)
    out = multinode.merge([a, b], tmp_path / "merged", workers=1)
    good = [f"--truth=node0={_truth_for(a, tmp_path / 't0.jsonl')}", f"--truth=node1={_truth_for(b, tmp_path / 't1.jsonl')}"]
    assert check([str(out), *good]) == 0
    text = capsys.readouterr().out
    assert "ranks charged their own GPU on their own node: 4 of 4" in text and text.rstrip().endswith("PASS")
    swapped = [good[0], f"--truth=node1={_truth_for(b, tmp_path / 's1.jsonl', swap=True)}"]
    assert check([str(out), *swapped]) == 1
    assert "own GPU on their own node: 2 of 4" in capsys.readouterr().out
    off = [f"--truth=node0={_truth_for(a, tmp_path / 'o0.jsonl', scale=1.2)}", good[1]]
    assert check([str(out), *off]) == 1
    assert capsys.readouterr().out.rstrip().endswith("FAIL")
    # the job run alone (the truth values) may give each node other global ranks (c10d's rendezvous order): its
    # rows are matched by the rank's GPU on its node
    renumbered = tmp_path / "alone0.jsonl"
    rows = [json.loads(x) for x in Path(good[0].split("=", 2)[2]).read_text().splitlines()]
    renumbered.write_text("".join(json.dumps({**r, "rank": r["rank"] + 2} if "rank" in r else r) + "\n" for r in rows))
    assert check([str(out), *good, f"--alone=node0={renumbered}"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("PASS")


def test_a_two_node_job_whose_copies_follow_a_launch_only_range_meets_its_goal(tmp_path, capsys) -> None:
    """tests/data/attach_h200x4_adjacent: bench/multinode_torchrun.sh's job as it failed its GPU test on a lent 4x
    H200 (2 of 6 runs passed, 2026-11-28). Its 64 MiB copy range starts 39 us after the launch-only `eager_3000`
    ends, and once a read of 2.4 ms in flight made one sample interval hold both edges and the whole copy (71 MB),
    which each edge's rule gave its own range. Split halfway, eager_3000 read 12.4 MB against 5.5 and the copy
    65.3 against 72.4 MB, within their stated errors (+-24 and +-35 MB) but past the goal: 26 of 28 ranges. Split
    as the two ranges' undisputed calls have it, the check passes."""
    from multinode_check import main as check

    from pcietrace import multinode

    out = multinode.merge([ADJACENT / "node-0", ADJACENT / "node-1"], tmp_path / "merged", workers=1)
    truths = [f"--{kind}=node{k}={ADJACENT / f'truth-{part}node{k}.jsonl'}"
              for k in (0, 1) for kind, part in (("truth", ""), ("alone", "alone-"))]
    assert check([str(out), *truths]) == 0
    text = capsys.readouterr().out
    assert "ranges within the goal: 28 of 28" in text and "own GPU on their own node: 4 of 4" in text


@pytest.mark.gpu
def test_a_two_node_torchrun_job_on_4_gpus_is_merged_within_its_truth(tmp_path) -> None:
    """bench/multinode_torchrun.sh on a machine with 4 GPUs (skips with fewer, or without torch)."""
    import subprocess

    pytest.importorskip("torch")
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    if listed.count("GPU ") < 4:
        pytest.skip("needs 4 GPUs")
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PY=sys.executable, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(["bash", str(root / "bench" / "multinode_torchrun.sh"), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.rstrip().endswith("PASS"), done.stdout[-4000:]


def test_a_merged_report_of_older_recordings_leaves_out_what_they_did_not_record(merged) -> None:
    """Nodes recorded before a meta key existed (here quiet_sample_interval_ms) leave it out of the merged meta,
    never null (which the schema refuses for a setting); the settings they did record are the first node's."""
    meta = json.loads((merged / "report.json").read_text())["meta"]
    first = json.loads((TORCHRUN / "report.json").read_text())["meta"]
    assert "quiet_sample_interval_ms" not in first and "quiet_sample_interval_ms" not in meta
    for key in ("sample_interval_ms", "idle_sample_interval_ms", "launch_counter", "slow_domains"):
        assert meta[key] == first[key] is not None
