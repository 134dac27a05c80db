"""Properties of attach's edge rule (:func:`pcietrace.analysis.attribution.edge_values`) on CONSTRUCTED samples
(hypothesis), and on the real attach recordings in tests/data: where the estimate lies, how its error bound
is formed, that it grows with the edge's time, and that the bound holds for any traffic the link could move."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcietrace.analysis import analyze, attribution
from pcietrace.analysis.counters import COUNTER_UPDATE_NS, MAX_LINK_BPS
from pcietrace.session import Session

CAP = MAX_LINK_BPS / 1e9  # bytes per ns
SIDES = ("start", "end")

# sample times (ns) with gaps of at least 0.1 ms, as attach's sampler keeps
times = st.lists(st.integers(100_000, 5_000_000), min_size=1, max_size=8).map(
    lambda gaps: np.cumsum([1_000_000] + gaps).astype(np.int64))
floor_args = st.tuples(st.floats(0, 50_000), st.floats(0, 1.0))  # floor_bytes_per_read, floor_bytes_per_ns


def _interval(t: np.ndarray, edge: np.ndarray) -> np.ndarray:
    return np.clip(np.searchsorted(t, edge, side="right") - 1, 0, t.size - 2)


@settings(max_examples=200, deadline=None)
@given(t=times, data=st.data(), side=st.sampled_from(SIDES), fl=floor_args)
def test_the_estimate_lies_between_the_samples_around_the_edge_and_its_error_is_not_negative(t, data, side, fl) -> None:
    # any non-decreasing counter, also one that moves more than the link could (the caps' fallback)
    steps = data.draw(st.lists(st.floats(0, 1e9), min_size=t.size - 1, max_size=t.size - 1))
    y = np.concatenate([[0.0], np.cumsum(steps)])
    edge = np.array(data.draw(st.lists(st.integers(int(t[0]), int(t[-1])), min_size=1, max_size=6)), np.int64)
    # values that applied at their sample's time: the samples around an edge bound it
    est, err = attribution.edge_values(t, y, edge, side, t, t, *fl)
    i = _interval(t, edge)
    assert np.all(est >= y[i]) and np.all(est <= y[i + 1])
    assert np.all(err >= 0)
    # and with read windows (the default: one counter update either side), the error is still >= 0
    assert np.all(attribution.edge_values(t, y, edge, side, None, None, *fl)[1] >= 0)


@settings(max_examples=200, deadline=None)
@given(t=times, data=st.data(), side=st.sampled_from(SIDES), fl=floor_args)
def test_where_no_cap_binds_the_error_is_every_byte_on_the_far_side_of_the_estimate(t, data, side, fl) -> None:
    # at most 1 MB per interval and edges >= 20 us from a sample: the link moves 1.28 MB in 20 us, no cap binds
    steps = data.draw(st.lists(st.floats(0, 1e6), min_size=t.size - 1, max_size=t.size - 1))
    y = np.concatenate([[0.0], np.cumsum(steps)])
    k = data.draw(st.integers(0, t.size - 2))
    edge = np.array([t[k] + int(data.draw(st.floats(0.2, 0.8)) * (t[k + 1] - t[k]))], np.int64)
    est, err = attribution.edge_values(t, y, edge, side, t, t, *fl)
    assert err == pytest.approx(np.maximum(est - y[k], y[k + 1] - est), abs=1e-6)


def _realizable(data: st.DataObject, t: np.ndarray, edge: int | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, object]:
    """A counter the link could have moved (piecewise linear, at most MAX_LINK_BPS), read by reads of up to
    0.8 ms around each sample time whose values apply anywhere in [read start - one update, read end], as
    :func:`attribution.value_curve` states: (t, y, early, late, counter(x)). With ``edge`` (ns), the values of
    reads begun after it applied from it on (a value one counter update old is what edge_values' bound leaves
    out); a read in flight at the edge applied on either side of it."""
    knots = np.sort(np.array(data.draw(st.lists(st.integers(int(t[0]) - 2_000_000, int(t[-1]) + 2_000_000),
                                                min_size=2, max_size=12, unique=True)), np.int64))
    share = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.0, 0.01, 0.3, 1.0]), min_size=knots.size - 1,
                                        max_size=knots.size - 1)))
    c = np.concatenate([[0.0], np.cumsum(share * CAP * np.diff(knots))])
    counter = lambda x: np.interp(x, knots, c)  # noqa: E731 (flat before and after the knots)
    half = np.array(data.draw(st.lists(st.integers(0, 400_000), min_size=t.size, max_size=t.size)), np.int64)
    latch = np.array(data.draw(st.lists(st.floats(0, 1), min_size=t.size, max_size=t.size)))
    early, late = t - half - COUNTER_UPDATE_NS, t + half
    applied = early + latch * (late - early)
    if edge is not None:
        applied = np.where(t - half >= edge, np.maximum(applied, edge), applied)
    y = counter(applied)
    # the recording's order: value_curve pairs the k-th smallest value with the k-th earliest window
    return np.sort(t), np.sort(y), np.sort(early), np.sort(late), counter


@settings(max_examples=300, deadline=None)
@given(t=times.filter(lambda t: t.size >= 2), data=st.data(), side=st.sampled_from(SIDES), fl=floor_args)
def test_the_stated_error_holds_for_any_traffic_the_link_could_move(t, data, side, fl) -> None:
    # (also where a read was in flight at the edge: 4x H100, a range read 2 % of its 16 MiB copy before the bound
    # reached past such a read)
    edge = np.array([data.draw(st.integers(int(t[0]), int(t[-1])))], np.int64)
    t, y, early, late, counter = _realizable(data, t, int(edge[0]))
    est, err = attribution.edge_values(t, y, edge, side, early, late, *fl)
    assert np.all(np.abs(counter(edge) - est) <= err + 1e-9 * (1 + np.abs(est)))


@settings(max_examples=200, deadline=None)
@given(t=times.filter(lambda t: t.size >= 2), data=st.data(), side=st.sampled_from(SIDES), fl=floor_args)
def test_the_estimate_grows_with_the_edge_s_time(t, data, side, fl) -> None:
    t, y, early, late, _ = _realizable(data, t)
    edge = np.sort(np.array(data.draw(st.lists(st.integers(int(t[0]) - 1_000_000, int(t[-1]) + 1_000_000),
                                               min_size=2, max_size=20)), np.int64))
    est, _ = attribution.edge_values(t, y, edge, side, early, late, *fl)
    assert np.all(np.diff(est) >= -1e-6 * (1 + np.abs(est[1:])))


def test_two_samples_equal_times_and_edges_outside_the_samples() -> None:
    # CONSTRUCTED: two samples only; then a repeated sample time
    t, y = np.array([0, 1_000_000], np.int64), np.array([0.0, 1e6])
    for side in SIDES:
        est, err = attribution.edge_values(t, y, np.array([-5_000_000, 500_000, 9_000_000]), side, t, t)
        # outside the samples the edge is clamped to the first/last one: its value, nothing uncertain
        assert est[0] == 0.0 and est[2] == 1e6 and err[0] == 0.0 and err[2] == 0.0
        assert 0.0 <= est[1] <= 1e6 and err[1] == pytest.approx(max(est[1], 1e6 - est[1]))
    t2, y2 = np.array([0, 1_000_000, 1_000_000, 2_000_000], np.int64), np.array([0.0, 10.0, 20.0, 30.0])
    est, err = attribution.edge_values(t2, y2, np.array([1_000_000, 1_500_000]), "start", t2, t2)
    assert np.all(np.isfinite(est)) and np.all(est >= [10.0, 20.0]) and np.all(est <= [20.0, 30.0])


@pytest.mark.parametrize("name", ["attach_h100_blind", "attach_h200x2_threads", "attach_h100_torch_outside"])
def test_real_recordings_edges_are_finite_and_their_errors_not_negative(data_dir, name) -> None:
    """Real attach recordings: every range's edge error is finite and not negative."""
    inst = analyze(Session.load(data_dir / name))["range_instances"]
    for d in ("h2d", "d2h"):
        e = inst[f"{d}_edge_bytes"]
        assert e.notna().all() and (e >= 0).all() and np.isfinite(e).all(), d


def test_a_pop_and_the_next_push_in_one_interval_do_not_both_take_its_bytes() -> None:
    # CONSTRUCTED (ns, bytes): quiet at 0.01 B/ns, then 5 MB between t=2 ms and 3 ms, quiet after. Range A
    # pops at 2.3 ms and range B pushes at 2.4 ms: by the rule A holds the interval's traffic (the next
    # interval is quiet) and B does too (the previous one is)
    t = np.arange(6, dtype=np.int64) * 1_000_000
    y = np.array([0.0, 1e4, 2e4, 5e6 + 3e4, 5e6 + 4e4, 5e6 + 5e4])
    a, b = np.array([1_500_000, 2_400_000]), np.array([2_300_000, 3_500_000])  # A, B
    (ya, ea), (yb, eb) = (attribution.edge_values(t, y, x, side, t, t) for x, side in ((a, "start"), (b, "end")))
    assert yb[0] > ya[1]  # A's end past B's start: both count the bytes between
    mine = np.ones(2, bool)
    (ya2, ea2), (yb2, eb2) = attribution.growing_edges(a, b, ya, yb, ea, eb, mine)
    assert yb2[0] <= ya2[1] and yb2[0] == pytest.approx((yb[0] + ya[1]) / 2)  # they meet halfway
    assert (yb2[0] - ya2[0]) + (yb2[1] - ya2[1]) == pytest.approx(yb[1] - ya[0])  # together: the whole span
    # the bound grows by the shift, so it still holds where either estimate was right
    assert eb2[0] == pytest.approx(eb[0] + yb[0] - yb2[0]) and ea2[1] == pytest.approx(ea[1] + ya2[1] - ya[1])
    # the edges that grew already are unchanged
    assert ya2[0] == ya[0] and yb2[1] == yb[1] and ea2[0] == ea[0] and eb2[1] == eb[1]


def _back_to_back_calls(disputed: int) -> tuple[np.ndarray, ...]:
    """CONSTRUCTED: 4 calls of range A (100 kB each, name 0) then range B (a 5 MB copy, name 1); in ``disputed``
    of them (the last ones) A's end and B's start share a sample interval holding B's copy, and each edge's
    estimate claims the copy (A's end: the next interval is quiet; B's start: the previous one is)."""
    a, b, ya, yb = [], [], [], []
    y = 0.0
    for c in range(4):
        t0, split = c * 10_000_000, c >= 4 - disputed
        a += [t0, t0 + (3_100_000 if split else 5_000_000)]
        b += [t0 + 3_000_000, t0 + 6_000_000]
        ya += [y, y + 1e5]
        yb += [y + 1e5 + (5e6 if split else 0.0), y + 1e5 + 5e6]
        y += 1e5 + 5e6
    return (np.array(a, np.int64), np.array(b, np.int64), np.array(ya), np.array(yb), np.zeros(8), np.zeros(8),
            np.ones(8, bool), np.array([0, 1] * 4))


def test_a_disputed_interval_goes_as_the_ranges_other_calls_have_it() -> None:
    a, b, ya, yb, ea, eb, mine, names = _back_to_back_calls(disputed=1)
    (ya2, ea2), (yb2, eb2) = attribution.growing_edges(a, b, ya, yb, ea, eb, mine, names)
    got = yb2 - ya2
    assert got[6] == pytest.approx(1e5) and got[7] == pytest.approx(5e6)  # as their undisputed calls: the copy B's
    assert got[6] + got[7] == pytest.approx(yb[7] - ya[6])  # together: the whole span, as before
    assert eb2[6] == pytest.approx(5e6) and ea2[7] == 0  # the bound grew by the shift: it holds either way
    (ya3, _), (yb3, _) = attribution.growing_edges(a, b, ya, yb, ea, eb, mine)  # without names: halfway
    assert (yb3 - ya3)[6] == pytest.approx(1e5 + 2.5e6)
    assert np.array_equal(np.delete(got, [6, 7]), np.delete(yb - ya, [6, 7]))  # undisputed calls as they were


def test_a_dispute_beside_a_small_one_is_settled_with_it() -> None:
    """The disputed call's copy range also ends 10 kB past the next call's start (a read in flight there): one
    run of three edges in dispute, settled together (a 4x H200 run's 64 MiB copy, left halfway when only a pop
    and a push alone were settled)."""
    a, b, ya, yb, ea, eb, mine, names = _back_to_back_calls(disputed=1)
    a, b, ya, yb, ea, eb, mine, names = (np.r_[x, x[:2]] for x in (a, b, ya, yb, ea, eb, mine, names))
    a[8:], b[8:] = a[8:] + 40_000_000, b[8:] + 40_000_000  # a fifth call, undisputed
    ya[8:], yb[8:] = ya[8:] + 4 * (1e5 + 5e6), yb[8:] + 4 * (1e5 + 5e6)
    ya[8] -= 1e4  # its start estimate 10 kB before the last copy's end
    (ya2, _), (yb2, _) = attribution.growing_edges(a, b, ya, yb, ea, eb, mine, names)
    got = yb2 - ya2
    assert got[6] == pytest.approx(1e5, abs=2e4) and got[7] == pytest.approx(5e6, abs=2e4)


def test_a_dispute_no_call_settles_meets_halfway() -> None:
    """Every call disputed: no undisputed call says how the bytes go, so each dispute meets halfway."""
    a, b, ya, yb, ea, eb, mine, names = _back_to_back_calls(disputed=4)
    (ya2, _), (yb2, _) = attribution.growing_edges(a, b, ya, yb, ea, eb, mine, names)
    assert np.allclose((yb2 - ya2)[0::2], 1e5 + 2.5e6) and np.allclose((yb2 - ya2)[1::2], 2.5e6)


@pytest.mark.parametrize("name", ["attach_h100_blind", "attach_h100_idle_zero", "attach_h100_idle_state"])
def test_real_back_to_back_ranges_count_no_byte_twice(data_dir, name) -> None:
    """Real H100 recordings (one GPU): two ranges of a thread at one depth, one after the other, together
    hold no more than a range from the first's push to the second's pop (before the fix, a pop and the next
    push in one sample interval both took up to 6 MB: `inner_h2d` -> `inner_d2h`, `eager_3000` ->
    `h2d_64MiB`)."""
    from pcietrace.analysis import counters

    s = Session.load(data_dir / name)
    res = analyze(s)
    inst = res["range_instances"]
    pairs = []
    for _, g in inst[inst["kind"] == "push"].groupby(["pid", "tid", "depth"]):
        g = g.sort_values("t_start_ns")
        pairs += [(g.iloc[k], g.iloc[k + 1]) for k in range(len(g) - 1)]
    assert len(pairs) > 20
    first = pd.DataFrame([p[0] for p in pairs])
    second = pd.DataFrame([p[1] for p in pairs])
    both = first.assign(t_end_ns=second["t_end_ns"].to_numpy())
    assert (second["t_start_ns"].to_numpy() >= first["t_end_ns"].to_numpy()).all()
    ranges = pd.concat([first, second, both], ignore_index=True)[attribution.RANGE_COLUMNS + ["gpus"]]
    at = attribution.attribute(ranges, counters.cumulative_bytes(s.samples, s.counters), res["floor"])
    n = len(pairs)
    for d in ("h2d", "d2h"):
        raw = at[f"{d}_raw_bytes"].to_numpy()
        assert np.all(raw[:n] + raw[n:2 * n] <= raw[2 * n:] + 1e-6 * np.abs(raw[2 * n:]) + 1), d


def _dense_calls(data: st.DataObject) -> tuple[pd.DataFrame, pd.DataFrame, object]:
    """CONSTRUCTED: a GPU's counter the link could have moved (piecewise linear, bursts at up to the link's rate),
    read every 0.5 ms, and short calls of two names one after another, several to a sample interval (as
    emit_nvtx makes them): the ranges, the samples, and the counter."""
    t = np.arange(0, 12_000_001, 500_000, dtype=np.int64) + 1_000_000
    knots = np.sort(np.array(data.draw(st.lists(st.integers(0, 14_000_000), min_size=2, max_size=30, unique=True)),
                             np.int64))
    share = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.0, 0.001, 0.05, 1.0]), min_size=knots.size - 1,
                                        max_size=knots.size - 1)))
    c = np.concatenate([[0.0], np.cumsum(share * CAP * np.diff(knots))])
    counter = lambda x: np.interp(x, knots, c)  # noqa: E731
    latch = np.array(data.draw(st.lists(st.floats(0, 1), min_size=t.size, max_size=t.size)))
    gaps = data.draw(st.lists(st.integers(0, 300_000), min_size=4, max_size=80))
    lengths = data.draw(st.lists(st.integers(1_000, 400_000), min_size=len(gaps), max_size=len(gaps)))
    starts = 1_200_000 + np.cumsum(np.array(gaps) + np.r_[0, lengths[:-1]])
    ends = starts + np.array(lengths)
    keep = ends < t[-1] - 200_000
    # a read's value up to one counter update old, but not from before an edge that came before the read
    # (what edge_values' bound leaves out: _realizable)
    edges = np.sort(np.r_[starts[keep], ends[keep]])
    before = np.searchsorted(edges, t, "right") - 1
    applied = t - latch * COUNTER_UPDATE_NS
    y = counter(np.where(before >= 0, np.maximum(applied, edges[np.maximum(before, 0)]), applied))
    n = int(keep.sum())
    names = np.array(data.draw(st.lists(st.sampled_from(["op", "op", "other"]), min_size=n, max_size=n)), object)
    ranges = pd.DataFrame({"pid": 1, "tid": 1, "domain": "default", "name": names, "kind": "push",
                           "t_start_ns": starts[keep], "t_end_ns": ends[keep], "depth": 1, "eager_launches": 0,
                           "graph_launches": 0, "closed": True})
    ranges["gpus"] = [[0]] * n
    samples = pd.DataFrame({"nvml_index": 0, "t_ns": t, "rx_bytes": y, "tx_bytes": y / 2})
    return ranges, samples, counter


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_dense_group_s_total_and_each_call_lie_within_their_stated_errors(data) -> None:
    """Each call's change lies within its estimate +- its edge error (at least 0, at most what the link moves in
    its time), and each name's total within its summed estimate +- the total's edge error, which takes what
    consecutive calls' edges share once (:func:`attribution.shared_edges`): for any traffic the link could move."""
    ranges, samples, counter = _dense_calls(data)
    if not len(ranges):
        return
    groups = pd.factorize(ranges["name"])[0]
    sums = attribution.gpu_sums(ranges, samples, pd.DataFrame(), groups=groups)
    shared = sums.pop("shared")
    inst = attribution.attribute(ranges, None, pd.DataFrame(), sums=sums)
    names = pd.unique(ranges["name"])
    by = pd.DataFrame({"domain": "default", "group": names, **{f"{d}_shared_bytes": shared[d] for d in ("h2d", "d2h")}})
    summary = attribution.summarize(inst, None, 0, shared=by).set_index("name")
    truth = counter(ranges["t_end_ns"].to_numpy()) - counter(ranges["t_start_ns"].to_numpy())
    for d, scale in (("h2d", 1.0), ("d2h", 0.5)):
        est, err = inst[f"{d}_raw_bytes"].to_numpy(), inst[f"{d}_edge_bytes"].to_numpy()
        slack = 2 * CAP + 1e-6 * (1 + np.abs(est))  # (edges at whole ns: what the link moves in 2 ns)
        assert np.all(np.abs(truth * scale - est) <= err + slack), d
        for name in names:
            mine = (ranges["name"] == name).to_numpy()
            s = summary.loc[name]
            assert s[f"{d}_edge_bytes"] <= err[mine].sum() + 1e-6
            assert abs(truth[mine].sum() * scale - s[f"{d}_raw_bytes"]) <= s[f"{d}_edge_bytes"] + slack[mine].sum(), \
                (d, name)


def test_a_gpu_with_one_sample_gives_bytes_as_floats_that_the_edges_can_meet_on() -> None:
    """One sample of a GPU (integer counters, as read): every edge takes its value, as floats; integers failed
    where a pop and the next push meet halfway (a fuzzer's SIMULATED session: a traceback)."""
    t, y = np.array([5], np.int64), np.array([1000], np.int64)
    a, b = np.array([1, 3]), np.array([2, 4])
    (ya, ea), = attribution.edge_values_of(t, (y,), a, "start", None, None, (0.0,), (0.0,))
    (yb, eb), = attribution.edge_values_of(t, (y,), b, "end", None, None, (0.0,), (0.0,))
    assert ya.dtype.kind == yb.dtype.kind == "f" and (ya == 1000).all() and (eb == 0).all()
    (ga, _), (gb, _) = attribution.growing_edges(a, b, ya, yb, ea, eb, np.ones(2, bool))
    assert (ga == 1000).all() and (gb == 1000).all()
