"""GPU busy time per range (attach --gpu-time) and the graph-savings prediction built on it, on real
recordings from the lent H100 (tests/data/attach_h100_decode): examples/decode_nvtx.py, batch 1/4/16/64,
30 steps each, attached eager with --gpu-time and attached again as one CUDA graph per step."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pcietrace.analysis import analyze, gpu_time
from pcietrace.analysis.savings import savings
from pcietrace.session import Session
from conftest import notes_text


@pytest.fixture(scope="module")
def decode(data_dir):
    runs = {}
    for tag in ("decode-eager-gputime", "decode-graph"):
        s = Session.load(data_dir / "attach_h100_decode" / tag)
        runs[tag] = (s, analyze(s))
    return runs


def test_cupti_sees_every_kernel_the_interposer_counted(decode) -> None:
    s, res = decode["decode-eager-gputime"]
    inst = res["range_instances"]
    assert gpu_time.recording_pids(s.events) == set(inst["pid"])
    # two independent counts of the same launches: CUPTI kernel records vs the launch trampolines
    assert (inst["gpu_kernels"] == inst["eager_launches"]).all() and (inst["eager_launches"] > 0).all()


def test_busy_time_is_the_union_of_kernel_intervals_inside_each_range(decode) -> None:
    s, res = decode["decode-eager-gputime"]
    k = gpu_time.kernels(s.events)
    inst = res["range_instances"]
    for r in inst.sample(8, random_state=0).itertuples():
        a, b = r.t_start_ns, r.t_end_ns
        clipped = np.clip(k["t_end_ns"], a, b) - np.clip(k["t_start_ns"], a, b)
        # one stream: kernels never overlap, so the union is the plain sum of what lies inside the range
        assert r.gpu_busy_ns == pytest.approx(clipped.sum())
        assert 0 < r.gpu_busy_ns < r.duration_ns


def test_without_gpu_time_figures_are_unknown_not_zero(decode) -> None:
    _, res = decode["decode-graph"]
    assert res["ranges"]["gpu_busy_ms"].isna().all()
    inst = res["range_instances"]
    assert "gpu_busy_ns" not in inst or inst["gpu_busy_ns"].isna().all()


def test_prediction_from_gpu_time_is_within_20_percent_of_the_measured_saving(decode) -> None:
    # truth: eager minus graphed range time, measured in two real runs; the prediction only sees the eager one
    (_, eager), (_, graphed) = decode["decode-eager-gputime"], decode["decode-graph"]
    sv = savings(eager, graphed).set_index("name")
    steps = sv.loc[[f"decode_step_b{b}" for b in (1, 4, 16, 64)]]
    assert (steps["measured_ms"] > 0.5 * steps["eager_ms"]).all()  # host-bound: graphs remove most of it
    assert (steps["error_pct"].abs() <= 20).all(), steps[["measured_ms", "predicted_ms", "error_pct"]]
    # a parent that launched nothing itself saves what its children save
    assert sv.loc["batch_1", "predicted_ms"] == pytest.approx(sv.loc["decode_step_b1", "predicted_ms"], rel=0.01)


def test_the_launch_count_model_alone_misses_pytorch_host_time(decode) -> None:
    # the same eager run with its GPU-time records dropped: PyTorch's ~27 us per operator looks GPU-bound
    (s, _), (_, graphed) = decode["decode-eager-gputime"], decode["decode-graph"]
    blind = Session(meta=s.meta, samples=s.samples, events=s.events[~s.events["event"].isin(["kernel", "gputime"])], windows=s.windows)
    sv = savings(analyze(blind), graphed).set_index("name")
    assert (sv.loc[["decode_step_b1", "decode_step_b64"], "error_pct"] < -50).all()


def test_summary_states_the_whole_run_saving_from_the_outermost_ranges(decode) -> None:
    s, res = decode["decode-eager-gputime"]
    outer = res["ranges"].set_index("name").loc[[f"batch_{b}" for b in (1, 4, 16, 64)], "graph_savings_ms"].sum()
    assert res["whole_run"]["program_graph_savings_ms"].iloc[0] == pytest.approx(outer)


def test_kernels_cupti_could_not_time_are_left_out_and_said(decode) -> None:
    # the real recording with three kernel records rewritten as CUPTI writes a kernel it could not time
    # (start = end = 0; CONSTRUCTED): busy times are those of the run without them, and a note says so
    from pcietrace.analysis import analyze
    from pcietrace.session import Session

    s, _ = decode["decode-eager-gputime"]
    picked = s.events.index[s.events["event"] == "kernel"][[10, 500, 5000]]
    zeroed = s.events.astype({"message": str})  # (loaded strings are categories: a new value needs plain strings)
    zeroed.loc[picked, "t_ns"], zeroed.loc[picked, "message"] = 0, "0"
    res = analyze(Session(meta=s.meta, samples=s.samples, events=zeroed, windows=s.windows))
    without = analyze(Session(meta=s.meta, samples=s.samples, events=s.events.drop(picked), windows=s.windows))
    assert gpu_time.untimed(zeroed).to_dict() == {int(zeroed.loc[picked[0], "pid"]): 3}
    assert len(gpu_time.kernels(zeroed)) == len(gpu_time.kernels(s.events)) - 3
    assert res["range_instances"]["gpu_busy_ns"].equals(without["range_instances"]["gpu_busy_ns"])
    assert any("3 kernel records had no timestamps" in n for n in notes_text(res))
    assert not any("no timestamps" in n for n in notes_text(without))


def test_dropped_kernel_records_are_said(decode) -> None:
    # the real recording with a "dropped" event added as the library writes one when CUPTI reports drops
    # (CONSTRUCTED event)
    from pcietrace.analysis import analyze
    from pcietrace.session import Session

    s, _ = decode["decode-eager-gputime"]
    on = s.events[s.events["event"] == "gputime"].tail(1)
    thread = s.events[(s.events["pid"] == on["pid"].iloc[0]) & (s.events["tid"] == on["tid"].iloc[0])]
    counts = [c for c in s.events.columns if c.endswith(("_thread", "_process"))]  # as of the thread's last event
    ev = pd.concat([s.events, on.assign(message="dropped", id=42, **thread[counts].iloc[-1].to_dict())],
                   ignore_index=True)
    assert gpu_time.dropped(ev).to_dict() == {int(on["pid"].iloc[0]): 42} and gpu_time.dropped(s.events).empty
    notes = " ".join(notes_text(analyze(Session(meta=s.meta, samples=s.samples, events=ev, windows=s.windows))))
    assert "CUPTI dropped 42 kernel records" in notes


def test_uncounted_launches_are_unknown_not_zero(data_dir) -> None:
    # real H100 run with --gpu-time --no-count-launches: the kernels ran (CUPTI saw them), nothing counted them
    from pcietrace.analysis.summary import attach_lines

    s = Session.load(data_dir / "attach_h100_nocount")
    res = analyze(s)
    ranges = res["ranges"].set_index("name")
    assert ranges.loc["eager_launches", "gpu_busy_ms"] > 0
    for col in ("eager_launches", "graph_launches", "launch_overhead_ms", "graph_savings_ms"):
        assert ranges[col].isna().all(), col
    assert res["whole_run"]["eager_launches"].isna().all() and res["whole_run"]["program_graph_savings_ms"].isna().all()
    text = " ".join(attach_lines(s.meta, res))
    assert "launches not counted" in text and "launched kernels" not in text and "0 eager" not in text
    assert any("not counted" in n for n in notes_text(res))


def test_kernel_records_lost_at_exit_are_said(decode) -> None:
    s, _ = decode["decode-eager-gputime"]
    assert not len(gpu_time.missing(s.events))  # real run: as many records as eager launches, no note
    assert not any(n.code == "kernel_records_lost" for n in gpu_time.notes(s.events))
    # the same real events with the last 100 kernel records removed, as an os._exit before CUPTI's flush does
    k = s.events.index[s.events["event"] == "kernel"]
    cut = s.events.drop(k[-100:])
    miss = gpu_time.missing(cut)
    assert len(miss) == 1 and miss["eager_launches"].iloc[0] - miss["records"].iloc[0] == 100
    lost = [n.params for n in gpu_time.notes(cut) if n.code == "kernel_records_lost"]
    assert lost == [{"pid": miss["pid"].iloc[0], "records": miss["records"].iloc[0],
                     "eager_launches": miss["eager_launches"].iloc[0]}]
    assert any("lost when it ended" in n for n in notes_text({"notes": pd.DataFrame({"note": gpu_time.notes(cut)})}))
