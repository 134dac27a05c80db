"""Attach on the real recordings that showed its bugs (tests/data/recordings, copied from shared/recordings):
a run whose idle windows no sample covered must say `no floor`, never floor-removed bytes; a recording
without device information is charged to every sampled GPU, with a note; samples that stop early give
`no data`, never 0 bytes; a long sampling gap marks the ranges it overlaps."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pcietrace.analysis import analyze, attribution
from pcietrace.session import Session

from conftest import notes_text

REC = "recordings"


@pytest.fixture(scope="module")
def no_floor(data_dir) -> tuple[Session, dict]:
    s = Session.load(data_dir / REC / "attach-h100-cpp-no-floor")
    return s, analyze(s)


def test_no_floor_is_said_not_hidden(no_floor, capsys, data_dir, monkeypatch) -> None:
    s, res = no_floor
    assert res["floor"]["status"].tolist() == ["no floor"]
    rg = res["ranges"]
    assert (rg["status"] == "no floor").all() and rg["h2d_bytes"].isna().all() and rg["d2h_bytes"].isna().all()
    assert (rg["h2d_raw_bytes"] > 0).any()  # the raw counter change is still there for the reader
    assert any("no floor" in n for n in notes_text(res))
    from pcietrace.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    assert main(["report", str(data_dir / REC / "attach-h100-cpp-no-floor")]) == 0
    out = capsys.readouterr().out
    assert "no floor" in out
    assert main(["report", str(data_dir / REC / "attach-h100-cpp-no-floor"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert all(r["h2d_bytes"] is None for r in doc["results"]["ranges"])


def test_recording_without_device_info_charges_every_sampled_gpu(data_dir) -> None:
    s = Session.load(data_dir / REC / "attach-h200x4-torchrun-ddp")
    res = analyze(s)
    fl = res["floor"].set_index("nvml_index")["status"]
    assert fl[1] == "no floor" and (fl.drop(1) != "no floor").all()  # GPU 1's idle windows had no samples
    inst = res["range_instances"]
    assert (inst["gpus_rule"] == "all sampled").all()
    assert all(list(g) == [0, 1, 2, 3] for g in inst["gpus"])
    assert any("no device information" in n for n in notes_text(res))
    whole = res["whole_run"]  # launches per GPU unknown: left out, not the program's total on every row
    assert whole["eager_launches"].isna().all() and (whole["program_eager_launches"] > 0).all()
    assert any("launches per GPU are unknown" in n for n in notes_text(res))


def _torchrun_session(data_dir) -> Session:
    return Session.load(data_dir / REC / "attach-h200x4-torchrun-ddp")


def test_samples_that_stop_early_give_no_data_not_zero(data_dir) -> None:
    s = _torchrun_session(data_dir)
    ranges = attribution.ranges_from_events(s.events)
    last = ranges["t_start_ns"].quantile(0.5)
    # cut GPU 2's samples halfway through the program: its later ranges cannot be measured
    s.samples = s.samples[~((s.samples["nvml_index"] == 2) & (s.samples["t_ns"] > last))]
    inst = analyze(s)["range_instances"]
    late = inst[inst["t_end_ns"] > last]
    assert len(late) and (late["status"] == "no data").all() and late["h2d_bytes"].isna().all()
    early = inst[inst["t_end_ns"] < last - 1e6]
    # earlier ranges keep the status they had (GPU 1 of this recording has no floor), never "no data"
    assert len(early) and "no data" not in set(early["status"])


def test_a_sampling_stall_marks_the_ranges_it_overlaps(data_dir) -> None:
    s = _torchrun_session(data_dir)
    inst0 = analyze(s)["range_instances"]
    r = inst0.sort_values("duration_ns").iloc[len(inst0) // 2]
    mid = (r["t_start_ns"] + r["t_end_ns"]) // 2
    # drop 10 ms of GPU 1's samples around the middle of one range: a stall of the sampler
    s.samples = s.samples[~((s.samples["nvml_index"] == 1) & (abs(s.samples["t_ns"] - mid) < 5_000_000))]
    inst = analyze(s)["range_instances"]
    hit = inst[(inst["t_start_ns"] < mid + 5e6) & (inst["t_end_ns"] > mid - 5e6)]
    assert (hit["stalls"] > 0).all()
    assert (inst.loc[inst["t_end_ns"] < mid - 2e7, "stalls"] == 0).any()


def test_a_gap_that_could_hide_a_wrap_is_an_error_for_its_ranges() -> None:
    # CONSTRUCTED: samples every 0.5 ms with one 100 ms hole (a saturated Gen5 link wraps 32 bits in ~67 ms)
    t = np.concatenate([np.arange(0, 50_000_000, 500_000), np.arange(150_000_000, 200_000_000, 500_000)])
    cum = pd.DataFrame({"nvml_index": 0, "t_ns": t, "rx_bytes": t / 1e3, "tx_bytes": t / 1e4})
    ranges = pd.DataFrame({"pid": 1, "tid": 1, "kind": "push", "depth": 0, "t_start_ns": [10_000_000, 40_000_000],
                           "t_end_ns": [20_000_000, 160_000_000], "gpus": [[0], [0]]})
    floor = pd.DataFrame([{"nvml_index": 0, "status": "rate only", "h2d_bytes_per_read": 0.0, "d2h_bytes_per_read": 0.0,
                           "h2d_background_Bps": 0.0, "d2h_background_Bps": 0.0}])
    out = attribution.attribute(ranges, cum, floor)
    assert out["status"].tolist() == ["ok", "wrap risk"]
    assert out["h2d_bytes"].iloc[0] == pytest.approx(1e4) and np.isnan(out["h2d_bytes"].iloc[1])
    # 64-bit counters cannot wrap in 100 ms: the same gap costs nothing there
    assert attribution.attribute(ranges, cum, floor, {0: {"bits": 64}})["status"].tolist() == ["ok", "ok"]


@pytest.fixture(scope="module")
def torchrun8(data_dir) -> tuple[Session, dict, pd.DataFrame]:
    """`bench/attach_truth.py torchrun` on the lent 8x H200 (one process per GPU; samples outside the measured
    ranges and idle windows thinned to every 20th) and the same app's own truth, measured without attach."""
    return _with_truth(data_dir / "attach_h200x8_torchrun")


def _with_truth(path: Path) -> tuple[Session, dict, pd.DataFrame]:
    """A recorded attach run, its analysis, and the app's own truth beside it (``truth.json``: ``ranges``)."""
    s = Session.load(path)
    truth = pd.DataFrame(json.loads((path / "truth.json").read_text())["ranges"])
    return s, analyze(s), truth


def _ours_per_rank_and_range(res: dict) -> pd.DataFrame:
    """Attach's mean bytes per call and stated errors per (rank, range) of the truth app's ranges, where rank r
    ran on GPU r (one GPU per process or thread)."""
    inst = res["range_instances"]
    inst = inst[inst["domain"] == "truth"].assign(rank=lambda d: d["gpus"].str[0])
    cols = [f"{d}_{c}" for d in ("h2d", "d2h") for c in ("bytes", "edge_bytes", "floor_err_bytes")]
    return inst.groupby(["rank", "name"])[cols].mean()


def test_each_rank_is_charged_only_its_own_gpu(torchrun8) -> None:
    s, res, _ = torchrun8
    inst = res["range_instances"]
    mine = inst[inst["domain"] == "truth"]
    per_pid = mine.groupby("pid")["gpus"].agg(lambda g: {tuple(x) for x in g})
    assert len(per_pid) == 8 and all(len(v) == 1 and len(next(iter(v))) == 1 for v in per_pid)
    assert sorted(next(iter(v))[0] for v in per_pid) == list(range(8))  # eight ranks, eight distinct GPUs
    assert (mine["gpus_rule"] == "thread").all()
    assert (res["floor"]["status"] == "per read").all() and len(res["floor"]) == 8


def test_each_gpu_row_of_the_whole_run_counts_its_own_ranks_launches(torchrun8) -> None:
    s, res, _ = torchrun8
    whole = res["whole_run"].set_index("nvml_index")
    ev = s.events[s.events["event"] != "kernel"]
    last = ev.groupby("pid").tail(1).set_index("pid")
    inst = res["range_instances"]
    rank_gpu = inst[inst["domain"] == "truth"].groupby("pid")["gpus"].first().map(lambda g: g[0])
    for pid, gpu in rank_gpu.items():  # one process per GPU: its row holds that process's launches, no other's
        assert whole.loc[gpu, "eager_launches"] == last.loc[pid, "eager_process"] > 3000 * 5
        assert whole.loc[gpu, "graph_launches"] == last.loc[pid, "graph_process"] > 0
    assert (whole["program_eager_launches"] == whole["eager_launches"].sum()).all()
    assert not any("no GPU's whole-run row" in n for n in notes_text(res))


#: SIMULATED injection events for launches_by_gpu: the columns it reads, and two GPUs named by bus id.
EVENT_COLUMNS = ["t_ns", "pid", "tid", "event", "id", "message", "devmask", "eager_thread", "graph_thread",
                 "eager_process", "graph_process"]
TWO_GPUS = [{"nvml_index": 0, "bus_id": "0000:00:06.0"}, {"nvml_index": 1, "bus_id": "0000:00:07.0"}]


def _eager_by_gpu(rows: list[tuple], gpus: list[dict]) -> dict[int, float]:
    """Eager launches per NVML index that launches_by_gpu finds in ``rows`` (EVENT_COLUMNS tuples)."""
    ev = pd.DataFrame(rows, columns=EVENT_COLUMNS)
    return attribution.launches_by_gpu(ev, gpus).set_index("nvml_index")["eager_launches"].to_dict()


def test_launches_on_several_gpus_between_two_events_are_in_no_row() -> None:
    """SIMULATED events (the real single-process trace, attach_h200x2_threads, has one GPU per thread): thread 1 launches 5 kernels
    on ordinal 0, then 7 across ordinals 0 and 1 before its next event; thread 2 announces ordinal 1 with its
    first launch (a "cudevice" event, devmask not yet set) and launches 2 more there."""
    rows = [(1, 9, 1, "cudevice", 0, "0000:00:06.0", 0, 1, 0, 1, 0),
            (2, 9, 1, "push", 0, "a", 1, 5, 0, 5, 0),
            (3, 9, 2, "cudevice", 1, "0000:00:07.0", 0, 1, 0, 6, 0),
            (4, 9, 2, "pop", 0, "", 2, 3, 0, 8, 0),
            (5, 9, 1, "pop", 0, "", 3, 12, 0, 15, 0)]
    assert _eager_by_gpu(rows, TWO_GPUS) == {0: 5, 1: 3}  # thread 2's announced launch counts on ordinal 1; thread 1's 7 nowhere


def test_launches_on_a_sampled_and_an_unsampled_gpu_between_two_events_are_in_no_row() -> None:
    """SIMULATED events: a thread launches 4 kernels on ordinal 0 (sampled), then 6 across ordinals 0 and 1
    (ordinal 1's GPU not sampled) before its next event: those 6 are not charged to GPU0 alone."""
    rows = [(1, 9, 1, "cudevice", 0, "0000:00:06.0", 0, 1, 0, 1, 0),
            (2, 9, 1, "push", 0, "a", 1, 4, 0, 4, 0),
            (3, 9, 1, "cudevice", 1, "0000:00:07.0", 1, 5, 0, 5, 0),
            (4, 9, 1, "pop", 0, "", 3, 10, 0, 10, 0)]
    assert _eager_by_gpu(rows, TWO_GPUS[:1]) == {0: 4}
    assert _eager_by_gpu(rows, TWO_GPUS) == {0: 4, 1: 0}  # both sampled: still several GPUs, no row


def test_a_one_gpu_process_s_other_threads_launches_count_on_its_gpu() -> None:
    """SIMULATED events, as PyTorch's backward pass makes them: the main thread's ranges, and an autograd thread
    that launches with no event of its own (its 30 launches show only in the process count). The process
    launched on one GPU (its one "cudevice" event), so they are that GPU's; with a second GPU in the same
    process they are in no row."""
    one = [(1, 9, 1, "cudevice", 0, "0000:00:06.0", 0, 1, 0, 1, 0),
           (2, 9, 1, "push", 0, "step", 1, 5, 0, 5, 0),
           (3, 9, 1, "pop", 0, "", 1, 10, 0, 40, 0),
           (4, 9, 1, "exit", 0, "", 0, 10, 0, 40, 0)]
    assert _eager_by_gpu(one, TWO_GPUS) == {0: 40, 1: 0}
    two = one + [(0, 9, 3, "cudevice", 1, "0000:00:07.0", 0, 1, 0, 1, 0)]
    assert _eager_by_gpu(two, TWO_GPUS) == {0: 10, 1: 1}  # the main thread's own 10 and the announcing launch; 29 in no row


def test_rank_ranges_match_the_apps_own_truth(torchrun8) -> None:
    _, res, truth = torchrun8
    ours = _ours_per_rank_and_range(res)
    checked = 0
    for r in truth.itertuples():
        o = ours.loc[(r.rank, r.range)]
        for d in ("h2d", "d2h"):
            want, got = getattr(r, f"{d}_truth"), o[f"{d}_bytes"]
            if want > 5e5:  # copies and launch bursts: the figures users read
                assert got == pytest.approx(want, rel=0.03), (r.rank, r.range, d)
                checked += 1
            else:  # tens of kB (the app's own NVML reads): within the stated error (edges + floor)
                assert abs(got - want) <= o[f"{d}_edge_bytes"] + o[f"{d}_floor_err_bytes"] + 0.01 * want, \
                    (r.rank, r.range, d)
    assert checked == 8 * 7  # per rank: eager H2D and D2H, the H2D copies both ways, the D2H copy


def test_every_idle_call_is_within_its_stated_error_of_the_truth(torchrun8) -> None:
    """The floor's own 95 % interval is part of the stated error: the edges alone left some idle calls out."""
    _, res, truth = torchrun8
    inst = res["range_instances"]
    idle = inst[(inst["domain"] == "truth") & (inst["name"] == "idle_20ms")].assign(rank=lambda d: d["gpus"].str[0])
    want = truth[truth["range"] == "idle_20ms"].set_index("rank")
    for d in ("h2d", "d2h"):
        off = (idle[f"{d}_bytes"] - idle["rank"].map(want[f"{d}_truth"])).abs()
        assert (idle[f"{d}_floor_err_bytes"] > 0).all()
        assert (off <= idle[f"{d}_edge_bytes"] + idle[f"{d}_floor_err_bytes"]).all(), d
    assert len(idle) == 8 * 5


@pytest.fixture(scope="module")
def threads2(data_dir) -> tuple[Session, dict, pd.DataFrame]:
    """`bench/attach_truth.py threads` on the lent 2x H200: ONE process, one thread per GPU (cuda.bindings,
    each thread makes its GPU's primary context current and reads its own GPU's counters), and the same
    app's own truth measured without attach (``rank`` = the thread's GPU)."""
    return _with_truth(data_dir / "attach_h200x2_threads")


def test_one_process_with_a_thread_per_gpu_charges_each_thread_s_ranges_its_own_gpu(threads2) -> None:
    s, res, _ = threads2
    inst = res["range_instances"]
    mine = inst[inst["domain"] == "truth"]
    assert mine["pid"].nunique() == 1  # one process ...
    per_tid = mine.groupby("tid")["gpus"].agg(lambda g: {tuple(x) for x in g})
    assert len(per_tid) == 2 and sorted(next(iter(v)) for v in per_tid) == [(0,), (1,)]  # ... a GPU per thread
    assert all(len(v) == 1 for v in per_tid) and (mine["gpus_rule"] == "thread").all()
    assert (res["floor"]["status"] == "per read").all() and len(res["floor"]) == 2
    # launches: each GPU's whole-run row holds its own thread's, as the injection library counted them
    whole = res["whole_run"].set_index("nvml_index")
    last = s.events[s.events["tid"].isin(per_tid.index)].groupby("tid").tail(1).set_index("tid")
    for tid, gpus in per_tid.items():
        gpu = next(iter(gpus))[0]
        assert whole.loc[gpu, "eager_launches"] == last.loc[tid, "eager_thread"] > 3000 * 5
        assert whole.loc[gpu, "graph_launches"] == last.loc[tid, "graph_thread"] > 5
    assert (whole["program_eager_launches"] == whole["eager_launches"].sum()).all()


def test_each_thread_s_ranges_hold_exactly_the_launches_the_app_made_in_them(threads2) -> None:
    """Per range call, not only per whole run (that check compares the library's per-thread counter with itself):
    eager_N holds N eager launches and no graph launch, graph one graph launch and no eager launch, the copies
    and the sleep none, on either thread; each call's process-wide count holds at least its own (the other
    thread launches alongside)."""
    _, res, _ = threads2
    inst = res["range_instances"]
    mine = inst[inst["domain"] == "truth"]
    want_eager = pd.to_numeric(mine["name"].str.extract(r"^eager_(\d+)$", expand=False)).fillna(0).astype(int)
    assert (want_eager > 0).any() and (mine["name"] == "graph").any()
    assert (mine["eager_launches"] == want_eager).all()
    assert (mine["graph_launches"] == (mine["name"] == "graph").astype(int)).all()
    assert (mine["eager_launches_process"] >= mine["eager_launches"]).all()
    assert (mine["graph_launches_process"] >= mine["graph_launches"]).all()


def test_the_bench_finds_each_threads_rank_and_stops_on_a_thread_it_cannot_match(threads2) -> None:
    """bench/attach_truth.py matches range instances to the app's ranks by (pid, tid); the app's rows are made
    here from the real recording's threads (rank = the thread's GPU). A thread with no truth row stops the bench
    (was: its ranges silently dropped out of the comparison, which then read all within error)."""
    from attach_truth import ranks

    _, res, _ = threads2
    inst = res["range_instances"]
    mine = inst[inst["domain"] == "truth"]
    attached = mine.groupby(["pid", "tid"])["gpus"].first().str[0].rename("rank").reset_index()
    assert ranks(attached, mine) == mine["gpus"].str[0].tolist()
    with pytest.raises(SystemExit, match="match no truth row"):
        ranks(attached.iloc[:1], mine)


def test_thread_ranges_match_the_apps_own_truth(threads2) -> None:
    """Every direction of every range within its stated error (edges + the floor's 95 % interval); those of
    more than 1 MB (the copies, eager H2D) within 3 %. Eager D2H (0.88 MB) is +5.0 % on GPU 0 in this
    recording, inside its stated error."""
    _, res, truth = threads2
    ours = _ours_per_rank_and_range(res)
    big = 0
    for r in truth.itertuples():
        o = ours.loc[(r.rank, r.range)]
        for d in ("h2d", "d2h"):
            want, got = getattr(r, f"{d}_truth"), o[f"{d}_bytes"]
            assert abs(got - want) <= o[f"{d}_edge_bytes"] + o[f"{d}_floor_err_bytes"] + 0.01 * want, (r.rank, r.range, d)
            if want > 1e6:
                assert got == pytest.approx(want, rel=0.03), (r.rank, r.range, d)
                big += 1
    assert big == 2 * 6  # per GPU: eager H2D, both directions of both H2D copies, the D2H copy's D2H


def test_the_whole_run_states_its_floor_error(data_dir) -> None:
    """Over 7.7 s of decode on the lent H100 the floor subtracted is ~200 MB per direction: its 95 % interval
    is stated beside the bytes (a recording whose whole run is `wrap risk` has neither)."""
    res = analyze(Session.load(data_dir / "attach_h100_decode" / "decode-eager-gputime"))
    w = res["whole_run"].iloc[0]
    assert w["status"] == "ok" and res["floor"]["dof"].item() == 6  # 8 idle windows, two terms fitted
    for d in ("h2d", "d2h"):
        assert 0 < w[f"{d}_floor_err_bytes"] < 0.1 * w[f"{d}_bytes"]


@pytest.mark.parametrize("recording", [f"{REC}/attach-h200x4-torchrun-ddp", "attach_h200x8_torchrun",
                                       "attach_h100_idle_zero"])
def test_floor_fit_and_its_errors_match_scipy_s_least_squares(data_dir, recording) -> None:
    """The floor's terms and standard errors on real idle windows, against scipy's curve_fit: per read,
    ordinary least squares without an intercept; rate only, the windows' mean rate (least squares weighted
    by 1/duration, as the rate was before the errors were added), not an unweighted slope."""
    from scipy.optimize import curve_fit

    from pcietrace.analysis import counters, floor

    s = Session.load(data_dir / recording)
    cum = counters.cumulative_bytes(s.samples, s.counters)
    fl = floor.floor_model(cum, s.windows, sorted(cum["nvml_index"].unique())).set_index("nvml_index")
    aw = floor.aligned_windows(cum, s.windows)
    checked = set()
    for idx, g in aw.groupby("nvml_index"):
        m, x = fl.loc[idx], (g["reads"].to_numpy(float), g["duration_s"].to_numpy())
        if m["dof"] == 0:  # one window, one term: no error estimate, and nothing says 0
            assert m[["h2d_background_Bps_se", "h2d_floor_corr", "d2h_floor_corr"]].isna().all()
            continue
        for d in ("h2d", "d2h"):
            y = g[f"{d}_bytes"].to_numpy()
            if m["read_time_term"]:  # three terms: per read, per us of read time, background
                x3 = (x[0], g["read_us"].to_numpy(), x[1])
                p, cov = curve_fit(lambda x, a, c, b: a * x[0] + c * x[1] + b * x[2], x3, y, p0=[1e4, 10, 1e5])
                se = np.sqrt(np.diag(cov))
                # three nearly collinear terms: curve_fit's iterations stop ~1e-5 short of the exact optimum, so
                # the terms must agree far inside their own standard errors, and their errors to 1e-4
                for k, term in enumerate(floor.TERMS):
                    assert abs(m[f"{d}_{term}"] - p[k]) < 1e-3 * se[k], (idx, d, term)
                    assert m[f"{d}_{term}_se"] == pytest.approx(se[k], rel=1e-4), (idx, d, term)
                corr = cov / np.outer(se, se)
                assert m[f"{d}_corr_read_vs_read_us"] == pytest.approx(corr[0, 1], abs=1e-4)
                assert m[f"{d}_corr_read_us_vs_background"] == pytest.approx(corr[1, 2], abs=1e-4)
                assert m[f"{d}_floor_corr"] == pytest.approx(corr[0, 2], abs=1e-4)
                checked.add("read time")
                continue
            elif m["status"] == "per read":
                p, cov = curve_fit(lambda x, a, b: a * x[0] + b * x[1], x, y, p0=[1e4, 1e5])
                assert m[f"{d}_bytes_per_read"] == pytest.approx(p[0], rel=1e-6)
                assert m[f"{d}_bytes_per_read_se"] == pytest.approx(np.sqrt(cov[0, 0]), rel=1e-6)
                assert m[f"{d}_floor_corr"] == pytest.approx(cov[0, 1] / np.sqrt(cov[0, 0] * cov[1, 1]), rel=1e-6)
            else:
                p, cov = curve_fit(lambda x, b: b * x[1], x, y, p0=[1e5], sigma=np.sqrt(x[1]))
                p, cov = [0.0, p[0]], np.diag([0.0, cov[0, 0]])
                assert m[f"{d}_background_Bps"] == pytest.approx(m[f"{d}_Bps"], rel=1e-9)
            assert m[f"{d}_background_Bps"] == pytest.approx(p[1], rel=1e-6)
            assert m[f"{d}_background_Bps_se"] == pytest.approx(np.sqrt(cov[1, 1]), rel=1e-6)
        checked.add(m["status"])
    # (the 8x H200's and H100's windows before the program read cold GPUs: a read-time term on every GPU)
    assert checked == ({"rate only"} if "ddp" in recording else {"per read", "read time"})


#: The start of a script run with the real injection library (LD_PRELOAD, launch counting by interposition)
#: over the fake driver of tests/native/fake_libcuda.c: ``run(n, dev)`` makes n launches on ordinal ``dev``.
FAKE_LAUNCHER = r"""
import ctypes, os, sys, threading
import nvtx
cuda = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
fn = ctypes.c_void_p()
assert cuda.cuGetProcAddress_v2(b"cuLaunchKernel", ctypes.byref(fn), 12000, ctypes.c_ulonglong(0), None) == 0
launch = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3)(fn.value)
device = ctypes.c_int.in_dll(cuda, "fake_device")
def run(n, dev):
    device.value = dev
    for _ in range(n):
        launch(None, 1, 1, 1, 1, 1, 1, 0, None, None, None)
"""
#: The fake driver's two ordinals as GPU records (its bus ids: 0000:00:(06 + ordinal).0).
FAKE_GPUS = [{"nvml_index": i, "bus_id": f"0000:00:0{6 + i}.0"} for i in (0, 1)]

#: Launches on ordinals 0 and 1 from the main thread, a second thread and a forked child, with NVTX ranges
#: between them.
FORK_SCRIPT = FAKE_LAUNCHER + r"""
nvtx.push_range("a"); run(3, 0); nvtx.pop_range()
def other():
    nvtx.push_range("b"); run(2, 1); nvtx.pop_range()
t = threading.Thread(target=other); t.start(); t.join()
run(4, 0)  # counted at the main thread's next event: in the parent, after the fork
pid = os.fork()
if pid == 0:  # the child: 3 launches on a new thread, then 6 on the forking one, the first before its first event
    def child():
        nvtx.push_range("d"); run(3, 1); nvtx.pop_range()
    t = threading.Thread(target=child); t.start(); t.join()
    run(1, 1); nvtx.push_range("c"); run(4, 1); nvtx.pop_range(); run(1, 1)
    sys.exit(0)
os.waitpid(pid, 0)
run(4, 0)
"""


def _over_fake_driver(tmp_path: Path, script: str, cupti_source: str | None = None,
                      args: tuple[str, ...] = ()) -> pd.DataFrame:
    """Runs ``script`` with the real injection library in attach's environment (launch counting by
    interposition) over the fake driver, built here with the C compiler; with ``cupti_source``, a stand-in
    libcupti built from it and kernel records on (``--gpu-time``); ``args``: the script's. Returns the trace's
    events. Skips where nvtx, a C compiler or the built library is missing."""
    import shutil
    import subprocess
    import sys

    from pcietrace.errors import UsageError
    from pcietrace.record.trace import read_traces
    from pcietrace.record.attach import injection_env

    pytest.importorskip("nvtx")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    traces = tmp_path / "traces"
    traces.mkdir()
    try:
        env = injection_env(traces, "interpose", None, [0, 1], False, gpu_time=cupti_source is not None)
    except UsageError:
        pytest.skip("the injection library is not built (python3 setup.py build_ext --inplace)")
    build = [cc, "-O2", "-shared", "-fPIC"]
    subprocess.run([*build, "-Wl,-soname,libcuda.so.1", "-o", str(tmp_path / "libcuda.so.1"),
                    str(Path(__file__).parent / "native" / "fake_libcuda.c")], check=True)
    env["LD_LIBRARY_PATH"] = str(tmp_path)
    if cupti_source is not None:
        (tmp_path / "cupti.c").write_text(cupti_source)
        subprocess.run([*build, "-o", str(tmp_path / "libcupti_standin.so"), str(tmp_path / "cupti.c")], check=True)
        env["PCIETRACE_CUPTI"] = str(tmp_path / "libcupti_standin.so")
    proc = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return read_traces(traces)


def test_launches_per_gpu_from_the_injection_library_with_threads_and_fork(tmp_path) -> None:
    """The real library over a fake driver (no GPU): every launch of the parent's two threads and of its
    forked child's two is on the GPU it was made on, once; the forking thread's first launches in the child
    are not mixed with the launches its parent had not yet reported at the fork, nor counted with its
    parent's."""
    ev = _over_fake_driver(tmp_path, FORK_SCRIPT)
    assert ev["pid"].nunique() == 2 and (ev["event"] == "exit").sum() == 2
    got = attribution.launches_by_gpu(ev, FAKE_GPUS).set_index("nvml_index")["eager_launches"].to_dict()
    assert got == {0: 3 + 4 + 4, 1: 2 + 3 + 6}
    assert sum(got.values()) == ev.groupby("pid").tail(1)["eager_process"].sum()


#: One thread on ordinal 0 throughout but for its copies, each made with ordinal 1 current (as PyTorch's
#: ``x.to("cuda:1")`` sets it for the copy alone): a range of launches, a range of a copy to ordinal 1, and one of
#: both; the copies' arguments forwarded whole (the fake records the size).
COPY_SCRIPT = FAKE_LAUNCHER + r"""
fetched = {}
for name in (b"cuMemcpyHtoDAsync", b"cuMemcpyDtoHAsync"):
    assert cuda.cuGetProcAddress_v2(name, ctypes.byref(fn), 12000, ctypes.c_ulonglong(0), None) == 0
    fetched[name] = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_ulonglong, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)(fn.value)
def copy(name, nbytes, dev):
    device.value = dev
    assert fetched[name](0x1000, None, nbytes, None) == 0
    assert ctypes.c_size_t.in_dll(cuda, "fake_last_nbytes").value == nbytes
    device.value = 0
nvtx.push_range("launches"); run(2, 0); nvtx.pop_range()
nvtx.push_range("to_gpu1"); copy(b"cuMemcpyHtoDAsync", 1 << 20, 1); nvtx.pop_range()
nvtx.push_range("both"); run(1, 0); copy(b"cuMemcpyDtoHAsync", 3 << 20, 1); nvtx.pop_range()
"""


def test_a_range_is_charged_the_gpu_its_copy_ran_on(tmp_path) -> None:
    """The real library over a fake driver (no GPU): a copy names the device current when it was made, as a
    launch does, so a range whose only work is a copy to another GPU than the one current at its edges is
    charged that GPU (on 2x H200, PyTorch's ``.to("cuda:1")`` from a thread on cuda:0 read 72 MB H2D as 0 B on
    GPU 0). The launches per GPU still count launches only."""
    ev = _over_fake_driver(tmp_path, COPY_SCRIPT)
    ranges = attribution.range_gpus(attribution.ranges_from_events(ev), ev, FAKE_GPUS).set_index("name")
    assert ranges.loc["launches", "gpus"] == [0]
    assert ranges.loc["to_gpu1", "gpus"] == [0, 1]  # (0: current at its edges)
    assert ranges.loc["both", "gpus"] == [0, 1]
    assert (ranges["gpus_rule"] == "thread").all()
    assert attribution.launches_by_gpu(ev, FAKE_GPUS).set_index("nvml_index")["eager_launches"].to_dict() == {0: 2, 1: 0}


#: An outer range on ordinal 0 with ranges nested in it that launch nothing: the thread's device set by the driver's
#: cuCtxSetCurrent between them (as cudaSetDevice and ``torch.cuda.set_device`` do), and once behind the library's
#: back (the fake's own word), then left alone for 20 ms.
SET_DEVICE_SCRIPT = FAKE_LAUNCHER + r"""
import time
assert cuda.cuGetProcAddress_v2(b"cuCtxSetCurrent", ctypes.byref(fn), 12000, ctypes.c_ulonglong(0), None) == 0
set_current = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(fn.value)
def nested(name):
    nvtx.push_range(name); nvtx.pop_range()
run(1, 1); run(1, 0)  # (each ordinal named by a launch)
nvtx.push_range("outer")
nested("on0")
set_current(2); nested("on1")
set_current(1); nested("on0_again")
by_name = ctypes.CDLL(None).cuCtxSetCurrent  # (the first definition in the program: a C++ program's link to it)
by_name(ctypes.c_void_p(2)); nested("on1_by_name")
by_name(ctypes.c_void_p(1)); nested("on0_by_name")
device.value = 1; time.sleep(0.02); nested("unseen_switch")
nvtx.pop_range()
"""


#: Ten launches in a range on ordinal 0, the fake driver's GPU count set first; writes how often the driver was
#: asked for the device at the last nine to the file named by argv[1].
ONE_GPU_SCRIPT = FAKE_LAUNCHER + r"""
ctypes.c_int.in_dll(cuda, "fake_device_count").value = int(sys.argv[2])
asked = ctypes.c_int.in_dll(cuda, "fake_device_asked")
nvtx.push_range("r"); run(1, 0); before = asked.value; run(9, 0); after = asked.value; nvtx.pop_range()
open(sys.argv[1], "w").write(str(after - before))
"""


@pytest.mark.parametrize("gpus", [1, 2])
def test_a_process_that_sees_one_gpu_is_not_asked_its_device_at_each_launch(tmp_path, gpus) -> None:
    """The real library over a fake driver (no GPU): where the driver counts one GPU, every launch is on ordinal
    0 and the driver is asked once, at the first (its cuCtxGetDevice, cold, was most of a counted PyTorch launch's
    cost); where it counts more, at every launch."""
    out = tmp_path / "asked"
    ev = _over_fake_driver(tmp_path, ONE_GPU_SCRIPT, args=(str(out), str(gpus)))
    assert int(out.read_text()) == (0 if gpus == 1 else 9)
    got = attribution.launches_by_gpu(ev, FAKE_GPUS).set_index("nvml_index")["eager_launches"].to_dict()
    assert got == {0: 10, 1: 0}
    ranges = attribution.range_gpus(attribution.ranges_from_events(ev), ev, FAKE_GPUS).set_index("name")
    assert ranges.loc["r", "gpus"] == [0]


def test_a_nested_range_takes_the_device_its_thread_set_last(tmp_path) -> None:
    """The real library over a fake driver (no GPU): a range edge inside its thread's counted range takes the
    device its thread's last asking edge found (asking the driver at every edge was half a nested edge's cost),
    so a context call that passes through the library (cuCtxSetCurrent: cudaSetDevice; fetched from the driver
    or called by name) must make the next edge ask again, and a change the library never saw is found within a
    millisecond."""
    ev = _over_fake_driver(tmp_path, SET_DEVICE_SCRIPT)
    pushes = ev[ev["event"] == "push"].set_index("message")
    names = ["outer", "on0", "on1", "on0_again", "on1_by_name", "on0_by_name", "unseen_switch"]
    assert pushes.loc[names, "dev"].tolist() == [0, 0, 1, 0, 1, 0, 1]
    ranges = attribution.range_gpus(attribution.ranges_from_events(ev), ev, FAKE_GPUS).set_index("name")
    assert ranges.loc["on1", "gpus"] == [1] and ranges.loc["on0", "gpus"] == [0]


#: A STAND-IN libcupti with the activity API (no GPU): cuptiActivityFlushAll hands the injection library one
#: kernel record (CUpti_ActivityKernel layout: kind at 0, start at 16, end at 24, deviceId at 40) of device
#: ``fake_kernel_device`` per ``fake_pending``, on the calling thread, as CUPTI does on a forced flush.
FAKE_CUPTI_ACTIVITY = r"""
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <time.h>
typedef void (*request_fn)(uint8_t **, size_t *, size_t *);
typedef void (*complete_fn)(void *, uint32_t, uint8_t *, size_t, size_t);
static request_fn request; static complete_fn complete;
int fake_pending, fake_kernel_device;
enum { RECORD = 64 };
int cuptiActivityRegisterCallbacks(request_fn r, complete_fn c) { request = r; complete = c; return 0; }
int cuptiActivityEnable(int kind) { return 0; }
int cuptiActivityRegisterTimestampCallback(uint64_t (*clock)(void)) { return 0; }
int cuptiActivityGetNumDroppedRecords(void *ctx, uint32_t stream, size_t *n) { *n = 0; return 0; }
int cuptiActivityGetNextRecord(uint8_t *buf, size_t valid, void **rec) {
    uint8_t *next = *rec ? (uint8_t *)*rec + RECORD : buf;
    if (next + RECORD > buf + valid) return 12;  /* CUPTI_ERROR_MAX_LIMIT_REACHED: no more records */
    *rec = next; return 0;
}
int cuptiActivityFlushAll(uint32_t flag) {
    if (!fake_pending) return 0;
    uint8_t *buf; size_t size, max;
    request(&buf, &size, &max);
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t start = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec - 1000, end = start + 500;
    uint32_t kind = 10, dev = (uint32_t)fake_kernel_device;
    size_t n = 0;
    for (; fake_pending > 0; --fake_pending, n += RECORD) {
        memset(buf + n, 0, RECORD); memcpy(buf + n, &kind, 4); memcpy(buf + n + 16, &start, 8);
        memcpy(buf + n + 24, &end, 8); memcpy(buf + n + 40, &dev, 4);
    }
    complete(NULL, 0, buf, size, n);
    return 0;
}
"""

#: Launches on ordinals 1, then 0; then the main thread flushes CUPTI (a kernel record of ordinal 1) before
#: its next event of its own.
FLUSH_SCRIPT = FAKE_LAUNCHER + r"""
assert ctypes.CDLL(os.environ["CUDA_INJECTION64_PATH"]).InitializeInjection() == 1
cupti = ctypes.CDLL(os.environ["PCIETRACE_CUPTI"])
nvtx.push_range("b"); run(2, 1); nvtx.pop_range()
run(3, 0)
ctypes.c_int.in_dll(cupti, "fake_kernel_device").value = 1
ctypes.c_int.in_dll(cupti, "fake_pending").value = 1
assert cupti.cuptiActivityFlushAll(1) == 0
nvtx.push_range("c"); nvtx.pop_range()
"""


def test_a_cupti_kernel_line_leaves_the_flushing_threads_launches_to_its_next_event(tmp_path) -> None:
    """The real library over a fake driver and a STAND-IN CUPTI (no GPU): a kernel record written by the thread
    that flushed CUPTI's buffer does not take that thread's launches since its previous event (they were on
    another GPU than the kernel's): they stay on the GPU they were made on."""
    ev = _over_fake_driver(tmp_path, FLUSH_SCRIPT, FAKE_CUPTI_ACTIVITY)
    said = dict(zip(ev["event"], ev["message"]))
    assert said["gputime"].startswith("on (CUPTI kernel activity")
    kernels = ev[ev["event"] == "kernel"]
    assert len(kernels) == 1 and kernels["dev"].iloc[0] == 1 and kernels["devmask"].iloc[0] == 0
    got = attribution.launches_by_gpu(ev, FAKE_GPUS).set_index("nvml_index")["eager_launches"].to_dict()
    assert got == {0: 3, 1: 2}


def test_idle_ranges_are_unbiased_where_the_gpu_was_cold_before_the_program(data_dir, monkeypatch) -> None:
    """The H100 idle-zero run (idle ranges move nothing: truth 0): the idle windows before the program read a GPU
    with no context for a while, whose reads took longer and cost more bytes. With one cost per read from the
    windows alone the floor came out too high inside the ranges (every idle call negative); the read-time term
    and the ranges' quiet intervals each take it out."""
    from pcietrace.analysis import floor

    s = Session.load(data_dir / "attach_h100_idle_zero")

    def idle_calls() -> tuple[pd.DataFrame, pd.DataFrame]:
        res = analyze(s)
        inst = res["range_instances"]
        return inst[(inst["domain"] == "truth") & (inst["name"] == "idle_20ms")], res["floor"]

    idle, fl = idle_calls()
    assert fl["read_time_term"].all() and (fl["h2d_bytes_per_read_us"] > 0).all()
    monkeypatch.setattr(floor, "STATE_RUN", 10**9)  # no quiet intervals: the windows' read-time term alone
    term_only, _ = idle_calls()
    monkeypatch.setattr(floor, "READ_TIME_SPREAD", np.inf)  # and one cost per read: as before both
    before, fl_before = idle_calls()
    assert not fl_before["read_time_term"].any() and len(idle) == len(term_only) == len(before) == 5
    for d in ("h2d", "d2h"):
        err = idle[f"{d}_edge_bytes"] + idle[f"{d}_floor_err_bytes"]
        assert (idle[f"{d}_bytes"].abs() <= err).all(), d
        assert (before[f"{d}_bytes"] < 0).all(), d  # the bias this fixes
        for fixed in (idle, term_only):
            assert abs(fixed[f"{d}_bytes"].mean()) < 0.3 * abs(before[f"{d}_bytes"].mean()), d


def test_a_state_the_idle_windows_never_saw_is_in_the_stated_error(data_dir, monkeypatch) -> None:
    """H100, idle-zero again (truth 0): in two idle calls the reads got slow and cheap (12.5 kB instead of 16 kB,
    14 reads in a row). The floor's fit alone states ~10 kB there; the spread of the program's quiet intervals
    (the state term) widens it to cover them, and only where the state moved: the other H100 run stays narrow."""
    from pcietrace.analysis import floor

    def idle_calls(name: str) -> pd.DataFrame:
        inst = analyze(Session.load(data_dir / name))["range_instances"]
        return inst[(inst["domain"] == "truth") & (inst["name"] == "idle_20ms")]

    def within(idle: pd.DataFrame, d: str) -> pd.Series:
        return idle[f"{d}_bytes"].abs() <= idle[f"{d}_edge_bytes"] + idle[f"{d}_floor_err_bytes"]

    moved, steady = idle_calls("attach_h100_idle_state"), idle_calls("attach_h100_idle_zero")
    fl = analyze(Session.load(data_dir / "attach_h100_idle_state"))["floor"].iloc[0]
    for d in ("h2d", "d2h"):  # reads cheaper in the ranges' quiet intervals than the windows say: charged that
        windows = fl[f"{d}_bytes_per_read"] + fl[f"{d}_bytes_per_read_us"] * fl["read_us_program"]
        assert fl[f"{d}_bytes_per_read_program"] == fl[f"{d}_bytes_per_read_quiet"] < windows, d
    for d in ("h2d", "d2h"):
        assert within(moved, d).all() and within(steady, d).all(), d
        assert moved[f"{d}_floor_err_bytes"].min() > 2 * steady[f"{d}_floor_err_bytes"].max(), d
    monkeypatch.setattr(floor, "STATE_RUN", 10**9)  # no state term: the fit's error alone
    assert not within(idle_calls("attach_h100_idle_state"), "h2d").all()


def test_with_the_truth_read_outside_its_ranges_every_range_of_2_ms_is_within_5_percent(data_dir) -> None:
    """`bench/attach_truth.py torchrun --reads-outside` on the lent 2x H200: each rank reads
    its counters 6 ms before each push and after each pop, so attach's ranges hold none of the app's own reads,
    and a range's truth is its window minus an empty range's read the same way (``gap_ref``). With the reads
    inside the ranges, the same call's eager D2H read +3.0 / +5.4 % against a truth that holds only part of
    those reads' bytes; here it must be within 5 % like every other direction of a range >= 2 ms that moves
    more than 0.5 MB, and every direction within what attach states (edges + the floor's 95 % interval)."""
    from attach_truth import outside_truth, truth_rows

    path = data_dir / "attach_h200x2_torchrun_outside"
    rows, _ = truth_rows(path / "truth_alone.jsonl")
    assert (rows["reads"] == "outside").all() and (rows["range"] == "gap_ref").any()
    truth = outside_truth(rows).groupby(["rank", "range"])[["h2d", "d2h"]].median()
    res = analyze(Session.load(path))
    ours = _ours_per_rank_and_range(res)
    inst = res["range_instances"]
    ms = inst[inst["domain"] == "truth"].assign(rank=lambda d: d["gpus"].str[0]).groupby(["rank", "name"])[
        "duration_ns"].mean() / 1e6
    assert set(truth.index) <= set(ours.index) and len(truth) == 2 * 7
    big = 0
    for (rank, name), t in truth.iterrows():
        o = ours.loc[(rank, name)]
        for d in ("h2d", "d2h"):
            want, got = t[d], o[f"{d}_bytes"]
            assert abs(got - want) <= o[f"{d}_edge_bytes"] + o[f"{d}_floor_err_bytes"] + 0.01 * abs(want), (rank, name, d)
            if ms[(rank, name)] >= 2 and want > 5e5:
                assert got == pytest.approx(want, rel=0.05), (rank, name, d)
                big += 1
    assert big == 2 * 4  # per rank: eager H2D and D2H, h2d_256MiB both ways


def test_issue_7s_goal_as_the_benches_judge_it_on_the_h100_pytorch_recording(data_dir) -> None:
    """bench/_goals.py, the one judge of bench/attach_truth.py and bench/blind_attach.py: a direction is held to 5 %
    only where it moves >= 1 MB per call in a range of >= 2 ms, else to attach's stated error. On the real H100
    PyTorch recording (truth read outside the ranges) every direction of every range meets it, and the %-checked
    ones are eager H2D and both directions of the 256 MiB copy. attach_truth.py used to hold the 3.6 ms graph
    range's ~15 kB of H2D (the instruments' own reads) to 5 % and print it as failed (session 18's H100 run:
    -5.4 kB against a stated 39.8 kB)."""
    from _goals import checked_in_pct, meets_goal
    from attach_truth import outside_truth, truth_rows

    path = data_dir / "attach_h100_torch_outside"
    rows, _ = truth_rows(path / "truth_alone.jsonl")
    truth = outside_truth(rows).groupby("range")[["h2d", "d2h"]].median()
    inst = analyze(Session.load(path))["range_instances"]
    calls = inst[(inst["domain"] == "truth") & (inst["name"] != "gap_ref")].groupby("name")
    pct, judged = set(), 0
    for name, g in calls:
        ms = g["duration_ns"].mean() / 1e6
        for d in ("h2d", "d2h"):
            want, got = truth.loc[name, d], g[f"{d}_bytes"].mean()
            stated = (g[f"{d}_edge_bytes"] + g[f"{d}_floor_err_bytes"]).mean()
            assert meets_goal(want, got, stated + 0.01 * abs(want), ms), (name, d, want, got, stated)
            judged += 1
            if checked_in_pct(want, ms):
                pct.add((name, d))
    assert judged == 14
    assert pct == {("eager_3000", "h2d"), ("h2d_256MiB", "h2d"), ("h2d_256MiB", "d2h")}
    # the judge is not lenient: the graph range's H2D held to 5 % would fail, and 5 % off a big one fails
    graph = calls.get_group("graph")
    assert not checked_in_pct(truth.loc["graph", "h2d"], graph["duration_ns"].mean() / 1e6)
    assert abs(graph["h2d_bytes"].mean() / truth.loc["graph", "h2d"] - 1) > 0.05
    big = truth.loc["h2d_256MiB", "h2d"]
    assert not meets_goal(big, big * 1.06, big, 5.0)


def test_a_range_whose_reads_sat_apart_in_read_time_states_that_in_its_error(data_dir, monkeypatch) -> None:
    """H100, PyTorch, truth read outside the ranges: in the first two eager calls the reads
    took ~400-420 us against the program's ~318 us and moved ~1.6 kB D2H less each, so those calls read 140-180 kB
    under their truth (the median call's window minus gap_ref's); the later calls are within 1.6 %. The floor
    cannot know the sign of such a state (slow reads moved more bytes on a GPU with no context), so it states
    it: |bytes per read us| x how far the range's reads sat apart x its reads joins the floor error. Without that
    term the two calls were outside their stated error; the state spread now also holds the windows' cost above
    the quiet mean, and the term still widens theirs."""
    from attach_truth import outside_truth, truth_rows
    from pcietrace.analysis import floor

    path = data_dir / "attach_h100_torch_outside"
    rows, _ = truth_rows(path / "truth_alone.jsonl")
    truth = outside_truth(rows).groupby("range")[["h2d", "d2h"]].median()

    def eager(res: dict) -> pd.DataFrame:
        inst = res["range_instances"]
        return inst[(inst["domain"] == "truth") & (inst["name"] == "eager_3000")].reset_index(drop=True)

    def off(calls: pd.DataFrame, d: str) -> pd.Series:
        return (calls[f"{d}_bytes"] - truth.loc["eager_3000", d]).abs() - calls[f"{d}_edge_bytes"] - calls[f"{d}_floor_err_bytes"]

    s = Session.load(path)
    calls = eager(analyze(s))
    fl = analyze(s)["floor"].iloc[0]
    assert fl["read_time_term"] and fl["d2h_bytes_per_read_us"] < 0  # the windows saw the slow, cheaper reads too
    slow = calls["d2h_bytes"] < 0.9 * truth.loc["eager_3000", "d2h"]
    assert slow.sum() == 2 and (calls.loc[~slow, "d2h_bytes"] / truth.loc["eager_3000", "d2h"] - 1).abs().max() < 0.016
    for d in ("h2d", "d2h"):
        assert (off(calls, d) <= 0).all(), d
    monkeypatch.setattr(floor, "RANGE_READ_TIME_SPREAD", float("inf"))  # the term off
    assert (off(eager(analyze(s)), "d2h")[slow] > off(calls, "d2h")[slow] + 10e3).all()


@pytest.mark.parametrize("recording, big_directions, past_2_percent", [
    ("attach_h100_blind", 11, ()),      # PyTorch: every copy's payload direction, and four >1 MB reverse directions
    ("attach_h100_blind_cpp", 13, ()),  # C++: eight copies' payload directions, five >1 MB reverse directions
    ("attach_h100_blind_graphs", 10, ()),  # graphs, streams, threads: six copies' payload directions, four reverse
    ("attach_h200_loader", 5, (("epoch", "d2h"),)),  # a DataLoader's epoch, an eval pass, a checkpoint
    ("attach_h200_compile", 0, ()),  # eager, torch.compile, its CUDA graphs: < 1 MB a call, launches counted
    ("attach_h200x2_pipeline", 4, ()),  # one thread, two GPUs: copies made with the other GPU current
    # module hooks, bf16 autocast, AdamW, emit_nvtx: the backward pass launched by autograd's thread
    ("attach_h200_hooks", 5, (("amp_train", "d2h"), ("emit_train", "d2h"))),
    # CuPy alone: its own NVTX, a non-blocking stream's set()/get(), ElementwiseKernel and RawKernel, a captured graph
    ("attach_h200_cupy", 6, ()),
    # a second process on the same GPU (torch.multiprocessing, spawn): its copies, and both processes' at once
    ("attach_h200_procs", 5, ()),
])
def test_the_blind_oracles_copies_are_read_within_2_percent(data_dir, recording: str, big_directions: int,
                                                            past_2_percent: tuple[tuple[str, str], ...]) -> None:
    """`bench/blind_attach.py` on the lent H100: apps written from the README alone, their truth read 6 ms
    outside each range (minus an empty window's). The PyTorch one (`--app torch`): its copies
    of 0.2-1.3 ms follow idle time (an edge rule that did not read right after a range opened put them at -35 ...
    -94 %, within its wide bound). The C++ one (`--app cpp`): a named NVTX3 domain with a registered
    string, nvtxRangePushEx, 2D copies, unified-memory prefetches both ways, cudaHostRegister'ed memory,
    cooperative, Ex, per-thread-stream and graph launches, 4 threads. The third (`--app
    graphs`): copies inside replayed CUDA graphs, a side stream's copy beside compute, a pageable .cpu(), a
    capture with no replay (torch's own 2 fill_ kernels at capture begin are its eager launches), a start/end
    range ended on a worker thread, 50 short ranges inside one. Two more on the lent H200:
    `--app loader` (an epoch of 12 steps fed by a DataLoader with 2 forked workers and pinned memory, fp16 with
    GradScaler, `loss.item()` each step; an eval pass; `torch.save` of the model and AdamW state) and `--app
    compile` (the same loop eager, under torch.compile's Triton kernels and under its CUDA graphs; kernels counted by
    torch.profiler). And `--app pipeline` on the lent 2x H200: a model split over two GPUs in one thread, a 64 MiB
    copy to and from cuda:1 made from a thread on cuda:0 (its truth both GPUs' bytes; before copies named their GPU
    those ranges were charged GPU 0 alone: 72 MB H2D read as 0 B). And `--app hooks` on the lent H200:
    a transformer annotated by module hooks, trained with bf16 autocast and AdamW, once
    plainly and once under emit_nvtx; its launches counted by torch.profiler (before, each training call read
    the 412 of its 1,068 launches its own thread made). Every direction within attach's stated bound, every
    launch count the app knows exact (eager and graph), and every direction moving > 1 MB within 2 % but those
    listed: the loader's epoch D2H (2.2 MB a call, +2.7 %, within its stated +-118 kB) holds ~60 sampler reads a
    call, 1.4 MB of floor, so 2 % of the range is 3 % of one read's cost; the hooks app's training D2H (1.2 MB a
    call, +2.8 and +4.5 %, within +-290 and +-134 kB) holds 32-41 reads, ~0.8 MB of floor, and a read there costs
    ~2 kB more than idle (docs/lab/bench/read_cost_busy.py), which the floor states but cannot charge."""
    rows = [json.loads(x) for x in (data_dir / recording / "truth_alone.jsonl").read_text().splitlines()]
    every = pd.DataFrame([r for r in rows if r.get("kind") == "range"])  # inner and worker-thread ranges too
    every["domain"] = every["domain"].fillna("default") if "domain" in every else "default"
    every["graph"] = every["graph_launches_expected"].fillna(0) if "graph_launches_expected" in every else 0
    every["captured"] = every.get("captured_expected", pd.Series(float("nan"), every.index))
    calls = every[every["truth"]]
    truth = calls.groupby(["domain", "name"])[["h2d_bytes", "d2h_bytes"]].median()
    launches = every.groupby(["domain", "name"])[["launches_expected", "graph", "captured"]].first()
    inst = analyze(Session.load(data_dir / recording))["range_instances"]
    ours = inst.groupby(["domain", "name"]).mean(numeric_only=True)
    assert set(truth.index) <= set(ours.index) and (inst["status"] == "ok").all()
    big = 0
    for key, t in truth.iterrows():
        for d in ("h2d", "d2h"):
            want, got = t[f"{d}_bytes"], ours.loc[key, f"{d}_bytes"]
            assert abs(got - want) <= ours.loc[key, f"{d}_edge_bytes"] + ours.loc[key, f"{d}_floor_err_bytes"], (key, d)
            if want > 1e6:
                within = got == pytest.approx(want, rel=0.02)
                assert within != ((key[1], d) in past_2_percent), (key, d, got / want - 1)  # (a miss fixed: unlist it)
                big += 1
    assert big == big_directions
    for key, want in launches.iterrows():
        mine = inst[(inst["domain"] == key[0]) & (inst["name"] == key[1])]
        assert len(mine) == (every["name"] == key[1]).sum(), key  # every call seen, worker threads' included
        if pd.isna(want["launches_expected"]):  # (the app could not count them)
            continue
        assert (mine["eager_launches"] == want["launches_expected"] - want["graph"]).all(), key
        assert (mine["graph_launches"] == want["graph"]).all(), key
        if pd.notna(want.get("captured")):  # the graphs app's capture with no replay: captured, in neither count
            assert (mine["captured_launches"] == want["captured"]).all(), key


def test_exact_edge_reads_swapped_with_the_samplers_are_left_out(data_dir, monkeypatch) -> None:
    """`bench/blind_attach.py --app cpp --attach-args=--exact-edges` on the lent H100 (a library whose
    reads did not take turns): the program's threads read the counters at their edges while the sampler
    read, and 69 of 2,036 reads, merged by their midpoints, saw the counters in the other order. Kept, their
    step back passed for a quiet interval and the step after it for a busy one, so a read's cost in the
    program came out 169 B D2H (the windows': 21.8 kB) and the idle range +455 kB D2H a call against a truth
    of 0, ten times its bound. Left out, every idle call is within its bound, and a read costs what the
    windows say. (Kept, the state spread now holds the windows' cost above that quiet mean, and with it the
    idle calls' error.)"""
    from pcietrace.analysis import counters

    rec = data_dir / "attach_h100_blind_cpp_exact"
    rows = [json.loads(x) for x in (rec / "truth_alone.jsonl").read_text().splitlines()]
    truth = pd.DataFrame([r for r in rows if r.get("name") == "idle_12ms"])[["h2d_bytes", "d2h_bytes"]].median()

    def idle_and_floor() -> tuple[pd.DataFrame, pd.Series]:
        res = analyze(Session.load(rec))
        inst = res["range_instances"]
        return inst[inst["name"] == "idle_12ms"], res["floor"].iloc[0]

    idle, fl = idle_and_floor()
    assert len(idle) == 8
    for d in ("h2d", "d2h"):
        assert ((idle[f"{d}_bytes"] - truth[f"{d}_bytes"]).abs()
                <= idle[f"{d}_edge_bytes"] + idle[f"{d}_floor_err_bytes"]).all(), d
        assert fl[f"{d}_bytes_per_read_program"] == pytest.approx(fl[f"{d}_bytes_per_read"], rel=0.05), d
    monkeypatch.setattr(counters, "in_order", lambda tx, rx: np.ones(tx.size, bool))  # every read kept
    idle, fl = idle_and_floor()
    assert ((idle["d2h_bytes"] - truth["d2h_bytes"]) > 5 * idle["d2h_edge_bytes"]).all()
    assert fl["d2h_bytes_per_read_program"] < 0.05 * fl["d2h_bytes_per_read"]
    assert fl["d2h_state_bytes_per_read"] >= fl["d2h_bytes_per_read"] - fl["d2h_bytes_per_read_program"]


def test_an_inference_servers_phases_meet_the_apps_own_truth(data_dir) -> None:
    """`bench/blind_attach.py --app serve --calls 4` on the lent H200 (tests/apps/serve_app.py: four worker threads
    on streams of their own serving requests, a decode loop replaying a CUDA graph, bulk copies). Every direction
    within attach's stated bound of the alone run's median call, but the workers' phase, whose own calls moved
    75.4-77.2 MB H2D (the app's allocations: +-789 kB about the median, against attach's +-153 kB): within the
    bound of the alone run's calls' range. The copies within 0.5 %; the decode loop's 64 graph launches a call
    exact, and no launch counted in a range whose thread made none (the workers' phase: its thread waits)."""
    rows = [json.loads(x) for x in (data_dir / "attach_h200_serve" / "truth_alone.jsonl").read_text().splitlines()]
    meta = rows[0]
    calls = pd.DataFrame([r for r in rows if r.get("kind") == "range"])
    truth = calls.groupby("name")[["h2d_bytes", "d2h_bytes"]].agg(["median", "min", "max"])
    inst = analyze(Session.load(data_dir / "attach_h200_serve"))["range_instances"]
    ours = inst[inst["domain"] == "default"].groupby("name")
    mean = ours.mean(numeric_only=True)
    assert set(truth.index) == set(meta["order"]) <= set(mean.index)
    for name in meta["order"]:
        for d in ("h2d", "d2h"):
            t, got = truth.loc[name, f"{d}_bytes"], mean.loc[name, f"{d}_bytes"]
            bound = mean.loc[name, f"{d}_edge_bytes"] + mean.loc[name, f"{d}_floor_err_bytes"]
            if name == "serve_threads":
                assert t["min"] - bound <= got <= t["max"] + bound, (name, d)
                assert d == "d2h" or t["max"] - t["min"] > 2 * bound  # (why: the app's own spread)
            else:
                assert abs(got - t["median"]) <= bound, (name, d)
        payload = meta["payloads"][name]
        for d in ("h2d", "d2h"):
            if payload[d] >= 16 * 2**20:  # the bulk copies (and the workers' batches): within 0.5 % of the truth
                assert mean.loc[name, f"{d}_bytes"] == pytest.approx(truth.loc[name, (f"{d}_bytes", "median")],
                                                                     rel=0.005 if name != "serve_threads" else 0.015)
    counts = ours[["eager_launches", "graph_launches"]].sum() / ours.size().to_frame().values
    assert counts.loc["graph_decode", "graph_launches"] == meta["graph_replays"]
    assert (counts.loc[["graph_decode", "bulk_h2d", "bulk_d2h", "serve_threads"], "eager_launches"] == 0).all()
