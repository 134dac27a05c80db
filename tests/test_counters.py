"""Counter maths: unwrapping, integration, window bytes and the floor, on real H100 traces."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcietrace.analysis import counters
from conftest import notes_text


@given(start=st.integers(0, 2**32 - 1),
       steps=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=200))
@settings(max_examples=300, deadline=None)
def test_unwrap_recovers_any_sequence_of_sub_wrap_steps(start: int, steps: list[int]) -> None:
    truth = np.concatenate([[0], np.cumsum(np.array(steps, dtype=object))]).astype(object)
    raw = np.array([(start + int(x)) % 2**32 for x in truth], dtype=np.uint64)
    assert counters.unwrap(raw).tolist() == [int(x) for x in truth]


@given(steps=st.lists(st.integers(0, 2**40), min_size=1, max_size=50))
def test_unwrap_64_bit_counters_never_mask(steps: list[int]) -> None:
    raw = np.cumsum(np.array([0] + steps, dtype=np.uint64))
    assert counters.unwrap(raw, bits=64).tolist() == np.cumsum([0] + steps).tolist()


def test_unwrap_empty_and_single() -> None:
    assert counters.unwrap(np.array([], np.uint64)).size == 0
    assert counters.unwrap(np.array([7], np.uint64)).tolist() == [0]


def test_integrate_rate_of_a_constant_throughput() -> None:
    t = np.arange(0, 1_000_000_001, 20_000_000)  # 1 s of 20 ms samples
    cum = counters.integrate_rate(t, np.full(t.size, 500.0))  # 500 KB/s
    assert cum[-1] == pytest.approx(500_000.0)


def _trace(copy_traces: pd.DataFrame, name: str) -> pd.DataFrame:
    return copy_traces[copy_traces["trace"] == name]


@pytest.fixture(scope="module")
def copy_traces(data_dir) -> pd.DataFrame:
    return pd.read_parquet(data_dir / "copy_traces.parquet")


def _counted(tr: pd.DataFrame, col: str) -> tuple[float, float]:
    """(bytes counted in the copy window minus the pre-copy floor, bytes copied)."""
    cum = counters.unwrap(tr[col].to_numpy()).astype(float)
    t = tr["t_ns"].to_numpy()
    t0, t1 = int(tr["copy_start_ns"].iloc[0]), int(tr["copy_end_ns"].iloc[0])
    floor_bps = (np.interp(t0, t, cum) - cum[0]) / ((t0 - t[0]) / 1e9)
    counted = np.interp(t1, t, cum) - np.interp(t0, t, cum) - floor_bps * (t1 - t0) / 1e9
    return counted, float(tr["nbytes"].iloc[0] * tr["repeats"].iloc[0])


def test_real_trace_wraps_and_unwraps_to_the_copied_bytes(copy_traces: pd.DataFrame) -> None:
    # Recorded on the H100: 16 x 1 GiB pinned host->device copies = 17.2 GB, four-plus 32-bit wraps.
    wrap = _trace(copy_traces, "copy_h2d_1073741824x16")
    raw = wrap["rx_raw"].to_numpy().astype(np.int64)
    assert (np.diff(raw) < 0).sum() >= 4, "the recorded counter should wrap at least four times"
    counted, copied = _counted(wrap, "rx_raw")
    one, one_copied = _counted(_trace(copy_traces, "copy_h2d_1073741824x1"), "rx_raw")
    overhead = one / one_copied  # payload + TLP headers, measured on a copy that did not wrap
    assert 1.0 < overhead < 1.2
    assert counted == pytest.approx(copied * overhead, rel=0.02)


@pytest.mark.parametrize("direction,col", [("h2d", "rx_raw"), ("d2h", "tx_raw")])
def test_header_overhead_of_one_size_predicts_another(copy_traces, direction: str, col: str) -> None:
    big, big_n = _counted(_trace(copy_traces, f"copy_{direction}_1073741824x1"), col)
    small, small_n = _counted(_trace(copy_traces, f"copy_{direction}_268435456x1"), col)
    assert small == pytest.approx(small_n * big / big_n, rel=0.02)


def test_window_bytes_outside_the_samples_are_nan() -> None:
    cum = pd.DataFrame({"nvml_index": 0, "t_ns": [100, 200, 300], "tx_bytes": [0, 10, 20], "rx_bytes": [0, 5, 10]})
    win = pd.DataFrame({"nvml_index": [0, 0], "t_start_ns": [150, 50], "t_end_ns": [250, 250], "mode": "idle"})
    wb = counters.window_bytes(cum, win)
    assert wb["tx_bytes"].tolist()[0] == pytest.approx(10.0)
    assert np.isnan(wb["tx_bytes"].tolist()[1])
    assert wb["samples"].tolist() == [1, 2]


def test_sample_gaps_flag_a_gap_long_enough_to_hide_a_wrap() -> None:
    t = np.array([0, 1_000_000, 200_000_000])  # a 199 ms gap: a saturated Gen5 link wraps in ~67 ms
    s = pd.DataFrame({"nvml_index": 0, "t_ns": t, "read_ns": 100, "tx_raw": 0, "rx_raw": 0})
    assert counters.sample_gaps(s)["wrap_risk"].item() is True
    s2 = s.assign(t_ns=[0, 1_000_000, 2_000_000])
    assert counters.sample_gaps(s2)["wrap_risk"].item() is False


def test_a_read_that_stalls_can_hide_a_wrap_behind_a_short_gap(data_dir) -> None:
    """Real 4x H200 torchrun recording: on GPU 0 a read took 76.5 ms and its midpoint lay 41.9 ms from the
    one before. Its values apply anywhere in it, so the counter could have moved for ~80 ms, more than a
    saturated Gen5 x16 link needs to wrap it (~67 ms); the bare gap (41.9 ms) said no risk."""
    from pcietrace.session import Session
    s = Session.load(data_dir / "recordings" / "attach-h200x4-torchrun-ddp")
    g = s.samples[s.samples["nvml_index"] == 0]
    t, read_ns = g["t_ns"].to_numpy(np.int64), counters.read_ns_of(g)
    flags = counters.could_hide_wrap(t, read_ns, s.counters[0])
    k = int(np.argmax(flags))
    assert flags.any() and np.diff(t)[k] / 1e9 * counters.link_bps(s.counters[0]) < 2**32
    assert max(read_ns[k], read_ns[k + 1]) > 50e6  # the stalled read
    assert counters.sample_gaps(s.samples, s.counters)["wrap_risk"].all()
    # the report says why its whole run has no bytes: which GPU, how many intervals, the stalled read
    from pcietrace.analysis import analyze
    res = analyze(s)
    assert (res["whole_run"]["status"] == "wrap risk").all()
    wg = counters.wrap_gaps(counters.cumulative_bytes(s.samples, s.counters), s.counters, s.meta["t_app_start_ns"],
                            s.meta["t_app_end_ns"]).set_index("nvml_index")
    assert wg.loc[0, "gaps"] >= 1 and wg.loc[0, "longest_read_ms"] == pytest.approx(max(read_ns[k], read_ns[k + 1]) / 1e6)
    notes = [n for n in notes_text(res) if "could hide a wrap" in n]
    # one note for the four GPUs (they were four near-identical lines), each figure as its range over them
    assert len(notes) == 1 and notes[0].startswith("GPU0-3: the sampler stalled") and "76.5-" in notes[0]


def test_floor_and_its_subtraction_on_the_real_run(h100) -> None:
    cum = counters.cumulative_bytes(h100.samples, h100.counters)
    wb = counters.window_bytes(cum, h100.windows)
    fl = counters.floor(wb)
    row = fl.iloc[0]
    # On the lent H100 the idle floor is a few MB/s (mostly the sampler's own NVML reads, ~100/s).
    assert 0 < row["rx_Bps"] < 10e6 and 0 < row["tx_Bps"] < 10e6
    assert row["windows"] == 3 and 50 < row["reads_per_s"] < 200
    net = counters.subtract_floor(wb, fl)
    idle = net[net["mode"] == "idle"]
    assert idle["rx_net_bytes"].abs().max() < 0.1 * (row["rx_Bps"] * idle["duration_s"]).max()


@given(start=st.integers(0, 2**32 - 1), gaps_ms=st.lists(st.floats(0.05, 200.0), min_size=1, max_size=100),
       load=st.lists(st.floats(0.0, 1.0), min_size=100, max_size=100))
@settings(max_examples=200, deadline=None)
def test_unwrap_with_times_keeps_every_step_a_link_can_move(start: int, gaps_ms: list[float], load: list[float]) -> None:
    """Forward steps up to what a saturated link moves in each gap (also more than half the counter's range, over
    long gaps) stay forward when the samples' times are given."""
    t = np.concatenate([[0], np.cumsum(np.array(gaps_ms) * 1e6)]).astype(np.int64)
    movable = np.diff(t) / 1e9 * counters.MAX_LINK_BPS
    steps = np.minimum(np.floor(movable * np.array(load[:len(gaps_ms)])), 2**32 - 1).astype(np.int64)
    truth = np.concatenate([[0], np.cumsum(steps)])
    raw = ((start + truth) % 2**32).astype(np.uint64)
    assert counters.unwrap(raw, 32, t).tolist() == truth.tolist() == counters.unwrap(raw, 32).tolist()


def test_reads_merged_out_of_order_step_back_not_four_gigabytes_forward() -> None:
    """Real 8x H200 run: GPU4's boundary probe read (6.5 ms long) and the sampler's next read (3.2 ms) overlap,
    and sorted by their midpoints the counter steps back 11.8 kB, which modulo 2**32 read as +4.29 GB inside an
    idle window: GPU4's floor came out 3.5 GB/s and its bytes per launch low. Each step is now at most what
    the link could move in its gap, the sample that steps back is left out, and GPU4's figures agree with the
    other seven GPUs'."""
    from pathlib import Path

    from pcietrace.analysis import analyze
    from pcietrace.session import Session

    s = Session.load(Path(__file__).parent / "data" / "h200x8_run")
    cum = counters.cumulative_bytes(s.samples, s.counters)
    for idx, g in cum.groupby("nvml_index"):
        movable = np.diff(g["t_ns"].to_numpy()) / 1e9 * counters.MAX_LINK_BPS
        for col in ("tx_bytes", "rx_bytes"):
            assert (np.diff(g[col].to_numpy()) <= movable).all(), (idx, col)
    for col in ("tx_bytes", "rx_bytes"):  # the overlapping reads: the step back is left out (counters.in_order)
        assert (np.diff(cum.loc[cum["nvml_index"] == 4, col].to_numpy()) >= 0).all()
    assert (cum["nvml_index"] == 4).sum() < (s.samples["nvml_index"] == 4).sum()
    res = analyze(s)
    fl = res["floor"].set_index("nvml_index")
    others = fl.drop(index=4)
    for d in ("tx", "rx"):
        assert fl.loc[4, f"{d}_Bps"] <= others[f"{d}_Bps"].max() + 2 * others[f"{d}_Bps_std"].max()
    pl = res["per_launch"]
    eager = pl[pl["mode"] == "eager"].set_index(["nvml_index", "direction"])
    for d in ("h2d", "d2h"):
        peers = eager.xs(d, level="direction").drop(index=4)["bytes_per_call"]
        assert abs(eager.loc[(4, d), "bytes_per_call"] - peers.median()) <= eager.loc[(4, d), "ci95"]


@given(start=st.integers(0, 2**32 - 1), steps=st.lists(st.integers(0, 64_000_000), min_size=1, max_size=100),
       bits=st.sampled_from([32, 64]))
@settings(max_examples=200, deadline=None)
def test_one_reader_s_samples_are_all_kept(start: int, steps: list[int], bits: int) -> None:
    """A single reader's counters never step back (at most what the link moves in 1 ms between its 1 ms-apart
    reads; 32-bit ones wrap): counters.in_order leaves out none of them, quiet (equal) reads and wraps included;
    nor any throughput-mode sample (rates integrate to a non-decreasing total)."""
    raw = (start + np.cumsum([0] + steps, dtype=np.uint64)) % np.uint64(2**bits if bits < 64 else 2**63)
    t_ns = np.arange(raw.size, dtype=np.int64) * 1_000_000
    samples = pd.DataFrame({"nvml_index": 0, "t_ns": t_ns, "read_ns": 0, "tx_raw": raw, "rx_raw": raw})
    cum = counters.cumulative_bytes(samples, {0: {"mode": "fields", "bits": bits}})
    assert len(cum) == len(samples)
    assert cum["tx_bytes"].tolist() == np.cumsum([0] + steps).tolist()
    rates = samples.assign(tx_raw=np.array(steps[:1] + steps, np.uint64) % 10**7, rx_raw=0)
    assert len(counters.cumulative_bytes(rates, {0: {"mode": "throughput", "bits": 32}})) == len(samples)


def _recordings_of_one_reader() -> list:
    from pathlib import Path

    data = Path(__file__).parent / "data"
    found = sorted({p.parent for p in data.rglob("samples.parquet")})
    # the library's own edge reads ("ctr" events, --exact-edges) are a second reader; so is a run's boundary
    # probe, whose read overlapped the sampler's in h200x8_run (the test above)
    return [p for p in found if p.name != "h200x8_run" and (not (p / "events.parquet").exists()
            or "ctr" not in set(pd.read_parquet(p / "events.parquet", columns=["event"])["event"]))]


@pytest.mark.parametrize("recording", _recordings_of_one_reader(), ids=lambda p: p.name)
def test_in_order_keeps_every_sample_of_a_recording_with_one_reader(recording) -> None:
    """Real recordings whose samples come from the samplers alone: not one sample is left out."""
    from pcietrace.session import Session

    s = Session.load(recording)
    assert len(counters.cumulative_bytes(s.samples, s.counters)) == len(s.samples)


def _reset_counters(s, at_ns: int, to: str):
    """SIMULATED counter reset on a real recording: from the first sample at or after ``at_ns`` both raw
    counters of GPU 0 restart from another value (``to``: "zero"; "back", 1 GiB below; "ahead", 2 GiB + 1 MB
    above, which modulo 2**32 reads as a step forward) and count on as before."""
    raw = s.samples[["tx_raw", "rx_raw"]].to_numpy(np.uint64).astype(np.int64)
    k = int(np.searchsorted(s.samples["t_ns"].to_numpy(), at_ns))
    for j, col in enumerate(("tx_raw", "rx_raw")):
        base = {"zero": 0, "back": raw[k, j] - 2**30, "ahead": raw[k, j] + 2**31 + 10**6}[to]
        raw[k:, j] = (raw[k:, j] - raw[k, j] + base) % 2**32
        s.samples[col] = raw[:, j].astype(np.uint64)
    return s


@pytest.mark.parametrize("to", ["zero", "back", "ahead"])
def test_a_counter_reset_inside_a_range_makes_that_range_unknown_and_no_other(data_dir, to: str) -> None:
    """A 32-bit counter restarting from another value mid-run (never seen on the lent GPUs; a driver reload or
    a GPU reset would do it) steps by more than a link can move between two reads. Before, a step back was
    taken for reads swapped and every later sample left out until the counter caught up (later ranges
    read wrong or "no data"), and a step forward was counted as GBs of traffic. Now the range across it is
    'wrap risk' with no bytes, a note says so, and every other range reads as it did, on the real C++ blind
    oracle's H100 recording."""
    from pcietrace.analysis import analyze
    from pcietrace.session import Session

    clean = analyze(Session.load(data_dir / "attach_h100_blind_cpp"))["range_instances"]
    hit = clean[clean["name"] == "um_prefetch_to_gpu"].iloc[0]
    s = _reset_counters(Session.load(data_dir / "attach_h100_blind_cpp"), (hit.t_start_ns + hit.t_end_ns) // 2, to)
    res = analyze(s)
    assert len(counters.cumulative_bytes(s.samples, s.counters)) == len(s.samples)  # none left out
    assert res["sampling"]["counter_jumps"].tolist() == [1]
    assert any("jumped 1 time(s)" in n for n in notes_text(res))
    inst = res["range_instances"]
    across = (inst["t_start_ns"] < hit.t_end_ns) & (inst["t_end_ns"] > hit.t_start_ns)
    assert (inst.loc[across, "status"] == "wrap risk").all() and inst.loc[across, "h2d_bytes"].isna().all()
    others = ~across
    assert others.sum() >= 20 and (inst.loc[others, "status"] == clean.loc[others, "status"]).all()
    for col in ("h2d_bytes", "d2h_bytes", "h2d_edge_bytes", "d2h_edge_bytes"):
        assert np.allclose(inst.loc[others, col], clean.loc[others, col], rtol=1e-9, atol=1e-3, equal_nan=True), col
    assert res["whole_run"]["status"].tolist() == ["wrap risk"]


@pytest.mark.parametrize("to", ["zero", "back", "ahead"])
def test_a_counter_reset_inside_a_run_window_leaves_that_window_out(data_dir, to: str) -> None:
    """The same reset inside one of the real H100 run's four eager fit windows: that window has no bytes, the
    per-launch fit rests on the other three and stays within its 95 % interval of the clean run's, and the
    System table says the GPU's counter was reset."""
    from rich.console import Console

    from pcietrace.analysis import analyze
    from pcietrace.report.console import system_table
    from pcietrace.session import Session

    clean = analyze(Session.load(data_dir / "h100_run"))
    s = Session.load(data_dir / "h100_run")
    w = s.windows[(s.windows["purpose"] == "fit") & (s.windows["mode"] == "eager")].iloc[2]
    res = analyze(_reset_counters(s, (w.t_start_ns + w.t_end_ns) // 2, to))
    eager = lambda r: r["per_launch"][r["per_launch"]["mode"] == "eager"].set_index("direction")  # noqa: E731
    assert (eager(res)["n"] == eager(clean)["n"] - 1).all()
    diff = (eager(res)["bytes_per_call"] - eager(clean)["bytes_per_call"]).abs()
    assert (diff <= eager(clean)["ci95"] + eager(res)["ci95"]).all()
    assert res["fit_windows"]["h2d_net_bytes"].isna().sum() == 1 + clean["fit_windows"]["h2d_net_bytes"].isna().sum()
    con = Console(width=200, record=True)
    con.print(system_table(s.meta, res["sampling"]))
    assert "1 reset(s)" in con.export_text()


def test_a_counter_reset_leaves_the_rate_timeline_unknown_across_it_not_zero(data_dir) -> None:
    """The attach timeline (``rates``, plotted and exported to Perfetto) across the same SIMULATED reset: the
    values after it go on from before it, so a bin over the jump read as 0 B/s (traffic unknown shown as
    none). Now the bins over it are NaN, every other bin reads as on the clean recording, and the Perfetto
    trace stays valid JSON (no NaN literal) and leaves the unknown bins' values out."""
    import json

    from pcietrace.analysis import analyze
    from pcietrace.report.perfetto import chrome_trace
    from pcietrace.session import Session

    clean = analyze(Session.load(data_dir / "attach_h100_blind_cpp"))
    hit = clean["range_instances"][clean["range_instances"]["name"] == "um_prefetch_to_gpu"].iloc[0]
    s = _reset_counters(Session.load(data_dir / "attach_h100_blind_cpp"), (hit.t_start_ns + hit.t_end_ns) // 2, "zero")
    res = analyze(s)
    cum = counters.cumulative_bytes(s.samples, s.counters)
    k = int(np.flatnonzero(cum["jump"])[0])
    t_a, t_b = int(cum["t_ns"].iloc[k - 1]), int(cum["t_ns"].iloc[k])  # the interval holding the jump
    r, c = res["rates"], clean["rates"]
    assert len(r) == len(c) and (r["t_ns"] == c["t_ns"]).all()
    bin_ns = int(np.diff(r["t_ns"]).min())
    over = ((r["t_ns"] < t_b) & (r["t_ns"] + bin_ns > t_a)).to_numpy()
    assert over.sum() >= 1 and r.loc[over, ["rx_Bps", "tx_Bps"]].isna().all().all()
    assert np.allclose(r.loc[~over, ["rx_Bps", "tx_Bps"]], c.loc[~over, ["rx_Bps", "tx_Bps"]], rtol=1e-9, atol=1e-6)
    trace = chrome_trace(s.meta, res["rates"], res["range_instances"])
    json.dumps(trace, allow_nan=False)
    pcie = [e for e in trace["traceEvents"] if e["ph"] == "C" and e["pid"] == 0]
    assert len(pcie) == len(r) and sum(not e["args"] for e in pcie) == over.sum()


def test_a_fast_copy_between_two_long_reads_is_traffic_not_a_step_back(data_dir) -> None:
    """unwrap took a 32-bit step of more than half the counter's range as a step back where a saturated link
    could not move it between the two reads' MIDPOINTS, while the values apply anywhere in the reads
    (impossible_steps' span: the gap, half of each read, one counter update). The real 8x H200 torchrun
    recording has gaps of 40-45 ms between reads of 2-8 ms (GPU5: 17 of them): a SIMULATED copy at 60 GB/s
    (the fastest the lent GPUs' counters counted: 309 MB in a 5.2 ms gap on the 2x H200) across one moves
    more than 2**31 bytes, which read as ~2 GB back, too little for a reset, so every later sample was left
    out until the counter caught up. Now it is the traffic it is: no jump, no sample left out."""
    from pcietrace.session import Session

    s = Session.load(data_dir / "attach_h200x8_torchrun")
    gpu = s.samples["nvml_index"] == 5
    g = s.samples[gpu]
    t, read_ns = g["t_ns"].to_numpy(np.int64), g["read_ns"].to_numpy(np.int64)
    span_ns = np.diff(t) + (read_ns[1:] + read_ns[:-1]) / 2 + counters.COUNTER_UPDATE_NS
    copy = (60e9 * span_ns / 1e9).astype(np.int64)
    hit = np.flatnonzero((copy >= 2**31) & (copy > counters.MAX_LINK_BPS * np.diff(t) / 1e9))
    assert hit.size  # such gaps are in the recording
    k = int(hit[0])
    raw = g["rx_raw"].to_numpy(np.uint64).astype(np.int64)
    raw[k + 1:] = (raw[k + 1:] + copy[k]) % 2**32
    s.samples.loc[gpu, "rx_raw"] = raw.astype(np.uint64)
    cum = counters.cumulative_bytes(s.samples, s.counters)
    mine = cum[cum["nvml_index"] == 5]
    assert len(mine) == gpu.sum() and not mine["jump"].any()
    clean = counters.cumulative_bytes(Session.load(data_dir / "attach_h200x8_torchrun").samples, s.counters)
    before = clean.loc[clean["nvml_index"] == 5, "rx_bytes"].to_numpy()
    assert (mine["rx_bytes"].to_numpy()[k + 1:] - before[k + 1:] == copy[k]).all()


def test_a_run_gpu_without_a_floor_has_no_net_bytes(data_dir) -> None:
    """subtract_floor took a GPU with no floor (no idle window measured: here a SIMULATED reset inside each of
    the real H100 run's three idle windows, so none can be) for a floor of 0: the net bytes kept the
    background, and by_duration read up to +44 % D2H per launch (50 us kernels: 421 B against 293 B) and the
    graph fits up to 7x, with nothing to say so. Now they are unknown: no fit rests on them and every byte
    figure of that GPU is NaN, while its host and GPU timings stay as they were."""
    from pcietrace.analysis import analyze
    from pcietrace.session import Session

    clean = analyze(Session.load(data_dir / "h100_run"))
    s = Session.load(data_dir / "h100_run")
    for w in s.windows[s.windows["mode"] == "idle"].itertuples():
        s = _reset_counters(s, (w.t_start_ns + w.t_end_ns) // 2, "back")
    res = analyze(s)
    assert res["sampling"]["counter_jumps"].tolist() == [3] and not len(res["floor"])
    assert res["by_duration"][["h2d_bytes_per_launch", "d2h_bytes_per_launch"]].isna().all().all()
    assert len(res["by_duration"]) == len(clean["by_duration"])
    assert not len(res["per_launch"]) and res["fit_windows"][["h2d_net_bytes", "d2h_net_bytes"]].isna().all().all()
    gpu, was = res["per_gpu"].iloc[0], clean["per_gpu"].iloc[0]
    assert np.isnan([gpu["eager_h2d_bytes"], gpu["eager_d2h_bytes"], gpu["graph_fixed_h2d_bytes"]]).all()
    assert gpu["host_us_per_launch"] == was["host_us_per_launch"] and gpu["eager_gpu_us"] == was["eager_gpu_us"]


@pytest.mark.parametrize("offset", [0, 1])
def test_a_counter_reset_next_to_swapped_reads_moves_no_other_range_beyond_its_errors(data_dir, offset: int) -> None:
    """The real --exact-edges H100 recording has reads that land out of order (in_order leaves 69 out). A
    SIMULATED reset at such a read, or at the read after it, makes the rebased values go on from a read
    that may lie ahead of those after it, so a different set of samples is kept. Only ranges over the
    interval the jump is flagged in (between the kept samples around it) become 'wrap risk'; every other
    range keeps its status and moves by less than its own and the clean recording's stated errors."""
    from pcietrace.analysis import analyze
    from pcietrace.session import Session

    rec = data_dir / "attach_h100_blind_cpp_exact"
    s0 = Session.load(rec)
    clean = analyze(s0)["range_instances"]
    t = s0.samples["t_ns"].to_numpy()
    left_out = np.setdiff1d(t, counters.cumulative_bytes(s0.samples, s0.counters)["t_ns"].to_numpy())
    for t_swapped in left_out[::12]:
        s = _reset_counters(Session.load(rec), int(t[np.searchsorted(t, t_swapped) + offset]), "back")
        cum = counters.cumulative_bytes(s.samples, s.counters)
        assert cum["jump"].sum() == 1
        j = int(np.flatnonzero(cum["jump"])[0])
        inst = analyze(s)["range_instances"]
        across = (inst["t_start_ns"] < cum["t_ns"].iloc[j]) & (inst["t_end_ns"] > cum["t_ns"].iloc[j - 1])
        assert (inst.loc[across, "status"] == "wrap risk").all()
        assert (inst.loc[~across, "status"] == clean.loc[~across, "status"]).all()
        for d in ("h2d", "d2h"):
            errors = sum(r[f"{d}_{e}_bytes"].fillna(0) for r in (inst, clean) for e in ("edge", "floor_err"))
            assert ((inst[f"{d}_bytes"] - clean[f"{d}_bytes"]).abs()[~across] <= errors[~across]).all()


def _recordings() -> list:
    from pathlib import Path

    return sorted({p.parent for p in (Path(__file__).parent / "data").rglob("samples.parquet")})


@pytest.mark.parametrize("recording", _recordings(), ids=lambda p: p.name)
def test_no_real_recording_has_a_counter_jump(recording) -> None:
    """Every real recording, merged readers (--exact-edges, boundary probes) and 8 GPUs under torchrun
    included: real traffic never steps by more than a link moves between two reads' value times."""
    from pcietrace.session import Session

    s = Session.load(recording)
    assert not counters.cumulative_bytes(s.samples, s.counters)["jump"].any()


def test_a_faster_link_s_copies_are_not_taken_for_resets(data_dir) -> None:
    """Counter steps are judged against the GPU's own link (its recorded highest generation and width), never
    under a Gen5 x16's 64 GB/s: a SIMULATED step of 1.5x what a Gen5 x16 link moves between two of the real
    H100 run's reads is a reset on the H100 (Gen5) and, recorded as a Gen6 x16 GPU's, traffic, counted in full."""
    from pcietrace.session import Session

    s = Session.load(data_dir / "h100_run")
    k = len(s.samples) // 2
    t, read = s.samples["t_ns"].to_numpy(np.int64), s.samples["read_ns"].to_numpy(np.int64)
    step = int(1.5 * counters.movable_bytes(t[k - 1:k + 1], read[k - 1:k + 1])[0])
    for col in ("tx_raw", "rx_raw"):
        raw = s.samples[col].to_numpy(np.uint64).astype(np.int64)
        raw[k:] = (raw[k:] + step) % 2**32
        s.samples[col] = raw.astype(np.uint64)
    assert s.meta["gpus"][0]["pcie_gen_max"] == 5
    assert counters.cumulative_bytes(s.samples, s.counters)["jump"].sum() == 1
    clean = counters.cumulative_bytes(Session.load(data_dir / "h100_run").samples, s.counters)
    s.meta["gpus"][0].update(pcie_gen_max=6, pcie_width_max=16)
    gen = {g: {"pcie_gen_max": g, "pcie_width_max": 16} for g in (4, 5, 6)}
    assert counters.link_bps(gen[6]) == 2 * counters.link_bps(gen[5]) == 2 * counters.MAX_LINK_BPS
    assert counters.link_bps(gen[4]) == counters.link_bps({}) == counters.MAX_LINK_BPS  # (never under Gen5 x16's)
    cum = counters.cumulative_bytes(s.samples, s.counters)
    assert not cum["jump"].any()
    assert (cum["rx_bytes"] - clean["rx_bytes"]).tolist() == [0] * k + [step] * (len(cum) - k)


def test_a_faster_link_s_edges_can_move_more(data_dir) -> None:
    """What a range's edges can be off by grows with what the GPU's link can move: the real H100 attach
    recording, analysed as recorded (Gen5 x16) and relabelled as a Gen6 x16 GPU's: no edge error shrinks and
    some grow (those the link's rate bounds), and the ranges' status does not change."""
    from pcietrace.analysis import analyze
    from pcietrace.session import Session

    gen5 = analyze(Session.load(data_dir / "attach_h100_python"))["range_instances"]
    s = Session.load(data_dir / "attach_h100_python")
    s.meta["gpus"][0].update(pcie_gen_max=6, pcie_width_max=16)
    gen6 = analyze(s)["range_instances"]
    assert (gen6["status"] == gen5["status"]).all()
    cols = ["h2d_edge_bytes", "d2h_edge_bytes"]
    assert (gen6[cols] >= gen5[cols] - 1e-6).all().all() and (gen6[cols] > gen5[cols] + 1).any().any()


def test_a_reset_seen_by_one_field_first_counts_once(data_dir) -> None:
    """A read that straddles a reset: its TX field already restarted, its RX field not yet (the read after it
    sees both restarted). Both steps around it are impossible, one reset: the System table and the note say 1
    (SIMULATED on the real C++ blind H100 recording); the range over it is 'wrap risk' as with any reset."""
    from pcietrace.analysis import analyze
    from pcietrace.session import Session

    s = Session.load(data_dir / "attach_h100_blind_cpp")
    k = len(s.samples) // 2
    for col, at in (("tx_raw", k), ("rx_raw", k + 1)):
        raw = s.samples[col].to_numpy(np.uint64).astype(np.int64)
        raw[at:] = (raw[at:] - raw[at] + 2**30) % 2**32
        s.samples[col] = raw.astype(np.uint64)
    cum = counters.cumulative_bytes(s.samples, s.counters)
    assert cum["jump"].sum() == 2 and counters.resets(cum).tolist() == [1]
    res = analyze(s)
    assert res["sampling"]["counter_jumps"].tolist() == [1]
    assert any("jumped 1 time(s)" in n for n in notes_text(res))
