"""Attach: event parsing and range pairing on real injection output, attribution maths, the report; a program
that cannot run is refused before measuring."""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pcietrace.analysis import analyze, attribution
from pcietrace.analysis.savings import predict_ms
from pcietrace.record.trace import read_traces
from pcietrace.session import Session

from conftest import notes_text, one_line_exit_2
from injected import run_nvtx_program


@pytest.fixture()
def events(data_dir, tmp_path) -> pd.DataFrame:
    shutil.copy(data_dir / "attach" / "nvtx_python_threads.tsv", tmp_path / "trace-7551.tsv")
    return read_traces(tmp_path)


def test_real_nvtx_events_pair_into_ranges(events) -> None:
    assert set(events["event"]) == {"nvtx", "push", "pop", "start", "end", "mark"}
    r = attribution.ranges_from_events(events).set_index("name")
    assert r.loc["outer", "domain"] == "demo" and r.loc["outer", "depth"] == 0
    assert r.loc["inner tab x", "domain"] == "default" and r.loc["inner tab x", "depth"] == 1
    assert r.loc["thread range", "tid"] != r.loc["outer", "tid"]
    assert r.loc["startend", "kind"] == "start"
    # the start/end range encloses the thread's range although they live on different threads
    assert r.loc["startend", "t_start_ns"] < r.loc["thread range", "t_start_ns"] < r.loc["startend", "t_end_ns"]
    assert r["closed"].all() and len(r) == 4


def test_unclosed_ranges_of_a_crashed_process_are_closed_at_its_last_event(events) -> None:
    crashed = events[events["t_ns"] < events.loc[events["message"] == "inner tab x", "t_ns"].iloc[0] + 1]
    r = attribution.ranges_from_events(crashed)
    assert len(r) == 2 and not r["closed"].any() and (r["t_end_ns"] == crashed["t_ns"].max()).all()


def _counters(t0: int, t1: int, step: int, rate_bps: float) -> pd.DataFrame:
    """CONSTRUCTED counter trace (not measured): constant rate, for attribution arithmetic."""
    t = np.arange(t0, t1, step, dtype=np.int64)
    y = (t - t0) / 1e9 * rate_bps
    return pd.DataFrame({"nvml_index": 0, "t_ns": t, "rx_bytes": y, "tx_bytes": y / 10})


def _floor(h2d_bps: float, h2d_per_read: float = 0.0) -> pd.DataFrame:
    """CONSTRUCTED floor model of GPU 0."""
    return pd.DataFrame([{"nvml_index": 0, "status": "per read", "windows": 2, "reads_per_s": 0.0,
                          "h2d_bytes_per_read": h2d_per_read, "d2h_bytes_per_read": 0.0, "h2d_background_Bps": h2d_bps,
                          "d2h_background_Bps": 0.0, "h2d_Bps": h2d_bps, "d2h_Bps": 0.0}])


def _on_gpu0(ranges: pd.DataFrame, events: pd.DataFrame) -> pd.DataFrame:
    return attribution.range_gpus(ranges, events, [{"nvml_index": 0, "bus_id": "0000:00:06.0"}])


def test_attribution_inclusive_exclusive_and_floor(events) -> None:
    r = _on_gpu0(attribution.ranges_from_events(events), events)
    assert (r["gpus_rule"] == "all sampled").all()  # this trace predates device tracking
    t0, t1 = int(events["t_ns"].min()) - 10**6, int(events["t_ns"].max()) + 10**6
    cum = _counters(t0, t1, 100_000, 1e9)  # 1 GB/s everywhere, 0.1 ms samples
    a = attribution.attribute(r, cum, _floor(0.25e9)).set_index("name")
    outer, inner = a.loc["outer"], a.loc["inner tab x"]
    assert outer["h2d_bytes"] == pytest.approx(0.75 * outer["duration_ns"], rel=1e-6)  # 1 GB/s minus the floor
    assert outer["excl_h2d_bytes"] == pytest.approx(outer["h2d_bytes"] - inner["h2d_bytes"])
    assert outer["excl_ns"] == outer["duration_ns"] - inner["duration_ns"]
    s = attribution.summarize(a.reset_index(), {"host_us_per_eager_launch": 4.0, "host_us_per_graph_launch": 2.0,
                                                "wall_us_per_kernel_eager": 5.0, "wall_us_per_kernel_graph": 1.0},
                              short_ns=7.5e6).set_index("name")  # the thread's range lasted ~5 ms, outer ~10 ms
    assert s.loc["thread range", "short_calls"] == 1 and s.loc["outer", "short_calls"] == 0
    assert s.loc["outer", "calls"] == 1 and np.isnan(s.loc["outer", "h2d_bytes_per_launch"])


def test_launch_counts_overhead_and_savings() -> None:
    # CONSTRUCTED events: a range on thread 1 in which the thread made 100 eager and 2 graph launches
    # while another thread made 50 more in a range of its own open across it (side by side: not the range's);
    # 12 us per launch: GPU-bound (> 2x the 5 us host cost below)
    ev = pd.DataFrame([
        {"t_ns": -10, "tid": 2, "event": "push", "domain": "d", "id": 0, "depth": 0, "eager_thread": 0, "graph_thread": 0,
         "eager_process": 10, "graph_process": 0, "message": "other", "pid": 5},
        {"t_ns": 0, "tid": 1, "event": "push", "domain": "d", "id": 0, "depth": 0, "eager_thread": 10, "graph_thread": 0,
         "eager_process": 10, "graph_process": 0, "message": "step", "pid": 5},
        {"t_ns": 1_200_000, "tid": 1, "event": "pop", "domain": "d", "id": 0, "depth": 0, "eager_thread": 110, "graph_thread": 2,
         "eager_process": 160, "graph_process": 2, "message": "", "pid": 5},
        {"t_ns": 1_300_000, "tid": 2, "event": "pop", "domain": "d", "id": 0, "depth": 0, "eager_thread": 50, "graph_thread": 0,
         "eager_process": 160, "graph_process": 2, "message": "", "pid": 5}])
    r = attribution.ranges_from_events(ev)
    r = r[r["name"] == "step"].reset_index(drop=True)
    assert r[["eager_launches", "graph_launches", "eager_launches_process"]].iloc[0].tolist() == [100, 2, 150]
    a = attribution.attribute(_on_gpu0(r, ev), _counters(-10**6, 2 * 10**6, 10**5, 0.0), _floor(0.0))
    costs = {"host_us_per_eager_launch": 4.0, "host_us_per_graph_launch": 2.0, "wall_us_per_kernel_eager": 5.0,
             "wall_us_per_kernel_graph": 1.0}
    a = a.assign(graph_savings_ms=predict_ms(a, costs)["predicted_ms"])  # as analysis does for attach runs
    s = attribution.summarize(a, costs, short_ns=0).iloc[0]
    assert s["launch_overhead_ms"] == pytest.approx((100 * 4 + 2 * 2) / 1e3)
    assert s["graph_savings_ms"] == pytest.approx(100 * 4 / 1e3)


def test_attach_session_analyses_renders_and_exports(events, tmp_path, capsys, monkeypatch) -> None:
    from pcietrace.cli import main
    from pcietrace.report.perfetto import write_trace

    t0, t1 = int(events["t_ns"].min()), int(events["t_ns"].max())
    cum = _counters(t0 - 10**9, t1 + 10**9, 500_000, 2e6)
    samples = pd.DataFrame({"nvml_index": 0, "t_ns": cum["t_ns"], "read_ns": 150_000,
                            "tx_raw": (cum["tx_bytes"].round().astype(np.int64) % 2**32).astype(np.uint64),
                            "rx_raw": (cum["rx_bytes"].round().astype(np.int64) % 2**32).astype(np.uint64)})
    meta = {"kind": "attach", "command": ["python", "app.py"], "t_app_start_ns": t0, "t_app_end_ns": t1, "exit_code": 0,
            "gpus": [{"nvml_index": 0, "name": "CONSTRUCTED", "counter": {"mode": "fields", "bits": 32}}],
            "sample_interval_ms": 0.5, "launch_costs": None, "processes": [{"pid": 7551, "nvtx": True, "cupti": "-", "ranges": 4}]}
    windows = pd.DataFrame([{"nvml_index": 0, "mode": "idle", "t_start_ns": t0 - 10**9, "t_end_ns": t0 - 10**6}])
    s = Session(meta=meta, samples=samples, windows=windows, events=events)
    res = analyze(s)
    assert res["floor"]["h2d_Bps"].item() == pytest.approx(2e6, rel=1e-3)
    assert abs(res["whole_run"]["h2d_bytes"].item()) < 1e3  # all traffic was floor
    assert set(res["ranges"]["name"]) == {"outer", "inner tab x", "startend", "thread range"}
    s.save(tmp_path / "att", None)
    write_trace(s, res, tmp_path / "trace.json")
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == 4 and any(e["ph"] == "C" for e in trace["traceEvents"])
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["report", str(tmp_path / "att")]) == 0
    out = capsys.readouterr().out
    assert "PCIe bytes per NVTX range" in out and "Launches per NVTX range" in out and "Whole run" in out
    assert "process followed: pid" in out  # (one process: a line, not a table)


def test_edge_values_put_a_range_s_burst_inside_it() -> None:
    # CONSTRUCTED (ns, bytes): idle at 0.1 B/ns until t=10, a burst of 100 B somewhere in (10, 20], idle after.
    t = np.array([0, 10, 20, 30])
    y = np.array([0.0, 1.0, 102.0, 103.0])
    start, err_start = attribution.edge_values(t, y, np.array([12]), "start")
    end, err_end = attribution.edge_values(t, y, np.array([18]), "end")
    # a range pushed at 12 and popped at 18 holds the burst: only the idle rate runs on past its edges
    assert start[0] == pytest.approx(1.2) and end[0] == pytest.approx(101.8)
    # the bound is the worst case: every byte of the interval on the other side (no cap binds at these rates)
    assert err_start[0] == pytest.approx(102.0 - 1.2) and err_end[0] == pytest.approx(101.8 - 1.0)


def test_edge_values_bound_reaches_past_a_read_in_flight_at_the_edge() -> None:
    # CONSTRUCTED on the shape of a 4x H100 call (dense_torchrun, emit_train): reads every 2 ms, 0.8 ms long; a
    # range pushes 0.1 ms after the midpoint of a read, whose value is taken at its end, after the range's 16 MiB
    # copy (0.3 ms at 55 GB/s). The estimate puts that read before the push (its midpoint is); its value holds
    # the copy, so the range reads none of it. The bound must reach the read before (the truth: 40 kB there).
    t = np.array([0, 2_000_000, 4_000_000, 6_000_000], np.int64)
    half = 400_000
    early, late = t - half - attribution.COUNTER_UPDATE_NS, t + half
    copy = 16 * 2**20
    y = np.array([0.0, 40e3, 80e3 + copy, 120e3 + copy])
    push = np.array([2_100_000])
    est, err = attribution.edge_values(t, y, push, "start", early, late)
    truth = 40e3 + 5e3  # (the read before, and 0.1 ms of 20 B/us after it)
    assert est[0] >= y[1]  # the estimate: the read's value, copy and all, before the push
    assert abs(est[0] - truth) <= err[0]
    # what the link moves in the read's 0.3 ms past the push bounds it too: of 32 MiB more before it, no more
    # than 19.2 MB can be after the push
    y2 = y + np.array([0, 2 * copy, 2 * copy, 2 * copy])
    est2, err2 = attribution.edge_values(t, y2, push, "start", early, late)
    assert est2[0] - err2[0] == pytest.approx(y2[1] - attribution.MAX_LINK_BPS * 300e-6)


def test_edge_values_run_the_previous_range_s_copy_on_to_the_edge() -> None:
    # CONSTRUCTED: a copy at 10 B/ns until t=15 (the previous range's), then quiet; the next range starts at 15
    t = np.array([0, 10, 20, 30])
    y = np.array([0.0, 100.0, 150.0, 150.0])
    est, _ = attribution.edge_values(t, y, np.array([15]), "start")
    assert est[0] == pytest.approx(150.0)  # every byte of the copy before the edge, none in the new range


def test_edge_values_spread_the_floor_s_share_evenly() -> None:
    # CONSTRUCTED: idle on both sides, each interval holding one read of 20 B: the floor's share, spread
    # evenly as the floor model counts it, so idle ranges come out unbiased
    t = np.array([0, 100, 200, 300])
    y = np.array([0.0, 20.0, 40.0, 60.0])
    for side in ("start", "end"):
        est, _ = attribution.edge_values(t, y, np.array([125]), side, floor_bytes_per_read=20.0)
        assert est[0] == pytest.approx(25.0), side


def test_edge_values_charge_no_more_than_the_link_can_move() -> None:
    # CONSTRUCTED: 60 MB moved between samples 1 ms apart, after idle; a range starts 0.1 ms before the later
    # sample, whose value applies by its time at the latest: at 64 GB/s no more than 6.4 MB can be after the edge
    t = np.array([0, 1_000_000, 2_000_000, 3_000_000])
    y = np.array([0.0, 10.0, 60e6 + 10, 60e6 + 20])
    est, err = attribution.edge_values(t, y, np.array([1_900_000]), "start", early=t, late=t)
    bps = attribution.MAX_LINK_BPS
    assert est[0] == pytest.approx(y[2] - bps * 100e-6)
    # and no more than 57.6 MB before it: the bound is what the link allows either side, not the whole 60 MB
    assert err[0] == pytest.approx(y[1] + bps * 900e-6 - est[0])


def test_real_attach_run_on_the_h100(data_dir, h100, tmp_path, capsys) -> None:
    """The demo app (tests/apps/demo_nvtx.py 20000 1000 1024) recorded under `pcietrace attach` on the
    lent H100: every range carries what it should, within its stated edge error (+ floor noise)."""
    s = Session.load(data_dir / "attach_h100_python")
    res = analyze(s)
    rg = res["ranges"].set_index("name")
    per_launch = analyze(h100)["per_launch"].query("mode == 'eager' and direction == 'h2d'")["bytes_per_call"].item()
    eager = rg.loc["eager_launches"]
    assert eager["eager_launches"] == 20000 and eager["graph_launches"] == 0
    assert eager["h2d_bytes"] == pytest.approx(20000 * per_launch, rel=0.05)
    assert rg.loc["graph_launch", "graph_launches"] == 1 and rg.loc["graph_launch", "eager_launches"] == 0
    for quiet in ("graph_launch", "idle", "worker_thread"):
        assert abs(rg.loc[quiet, "h2d_bytes"]) < 1e6 + rg.loc[quiet, "h2d_edge_bytes"]
    assert rg.loc["h2d_copy", "h2d_bytes"] == pytest.approx(1024 * 2**20 * 1.078, rel=0.05)  # TLP overhead measured
    assert rg.loc["demo_app", "excl_ms"] < rg.loc["demo_app", "incl_ms"] / 10
    assert s.meta["exit_code"] == 0 and s.meta["processes"][0]["cupti"].startswith("launch counting on")
    assert res["whole_run"]["eager_launches"].item() >= 20000
    from pcietrace.cli import main

    assert main(["report", str(data_dir / "attach_h100_python"), "--perfetto", str(tmp_path / "t.json")]) == 0
    trace = json.loads((tmp_path / "t.json").read_text())
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"eager_launches", "graph_launch", "h2d_copy", "idle", "worker_thread", "demo_app"} <= names
    assert main(["report", str(data_dir / "h100_run"), "--perfetto", str(tmp_path / "x.json")]) == 2


def test_sigterm_reaches_the_program_and_attach_survives_to_save(tmp_path, as_in_a_terminal) -> None:
    """`timeout`/`kill` on pcietrace during attach: the program is told the same signal, pcietrace waits for it
    and gets its exit code back (then saves, like after Ctrl-C) instead of dying with the samples unsaved."""
    import os
    import signal
    import sys
    import threading
    import time

    from pcietrace.record.attach import run_program

    ready = tmp_path / "ready"
    prog = ("import pathlib, signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))\n"
            f"pathlib.Path({str(ready)!r}).touch()\n"
            "time.sleep(30)\n")

    def terminate_us() -> None:
        while not ready.exists():
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    threading.Thread(target=terminate_us, daemon=True).start()
    rc, t0, t1 = run_program([sys.executable, "-c", prog], dict(os.environ))
    assert rc == 7 and t1 - t0 < 20e9  # the program's own answer to SIGTERM, well before its sleep ended
    assert signal.getsignal(signal.SIGTERM) is before


def test_threads_take_the_trace_a_block_at_a_time_and_nothing_is_counted_lost(tmp_path) -> None:
    # the real injection library (driven through NVTX's injection hook by the nvtx package; no GPU needed): each
    # thread takes a block of records and of string space (pt_inject.c, block_take), so the records a thread never
    # wrote lie between the others, zero; they are no event and no loss, and every thread's edges come back
    from pcietrace.record.trace import EVENT_DTYPE, HEADER_DTYPE

    prog = ("import nvtx, threading\n"
            "def work(k):\n    for i in range(5):\n        nvtx.push_range(f'w{k}.{i}')\n        nvtx.pop_range()\n"
            "ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]\n"
            "[t.start() for t in ts]\n[t.join() for t in ts]\n")
    run_nvtx_program(tmp_path, prog)
    ev = read_traces(tmp_path)
    (trace,) = tmp_path.glob("trace-*.bin")
    with open(trace, "rb") as f:  # (the header alone: the file is sparse, as large as the trace may grow)
        taken = int(np.frombuffer(f.read(HEADER_DTYPE.itemsize), HEADER_DTYPE)[0]["events_taken"])
    assert taken // EVENT_DTYPE.itemsize > len(ev)  # blocks were taken and not filled...
    assert ev.attrs["bad_lines"] == 0  # ...and no record is said lost for it
    assert (ev["t_ns"] > 0).all() and (ev["event"] != "").all()
    pushes = ev[ev["event"] == "push"]
    assert sorted(pushes["message"]) == sorted(f"w{k}.{i}" for k in range(4) for i in range(5))
    assert pushes.groupby("tid").size().tolist() == [5] * 4
    assert (ev["event"] == "pop").sum() == 20


def test_a_signal_handlers_ranges_inside_the_threads_own_edges_are_all_recorded(tmp_path) -> None:
    # the real injection library, driven as NVTX drives it by a C program (tests/native/signal_edges.c) whose
    # SIGALRM handler, every 20 us, opens and closes a range while its main loop does the same: a handler's event
    # that lands inside the thread's own (its block's ends half moved, the grow or open lock held) takes bytes of
    # its own and waits on no lock (a block shared with it had two events in one record; the lock, a hang)
    from pcietrace.record.trace import read_traces
    from injected import run_native_program

    pairs = 300_000
    out, traces = run_native_program(tmp_path, "signal_edges.c", str(pairs))
    handled = int(out)
    assert handled > 100  # (the handler did run inside the loop)
    ev = read_traces(traces)
    pushes = ev.loc[ev["event"] == "push", "message"].astype(str).value_counts()
    assert pushes.to_dict() == {"main": pairs, "signal": handled}
    assert (ev["event"] == "pop").sum() == pairs + handled
    assert ev.attrs["bad_lines"] == 0 and "tracefull" not in set(ev["event"])


def test_a_signal_handlers_edge_inside_its_threads_driver_lookup_does_not_enter_the_loader(tmp_path) -> None:
    # the real injection library in a program without the CUDA driver (tests/native/signal_loader.c): the library
    # asks the loader for the driver at most every 10 ms, and the program's own dlopen raises SIGALRM inside each
    # ask, whose handler opens and closes a range. Its edge must not ask again from inside the ask (the loader's
    # lock is held by the call it interrupted: a hang in ~1 of 50 runs of signal_edges.c beside a CPU hog)
    from pcietrace.record.trace import read_traces
    from injected import run_native_program

    out, traces = run_native_program(tmp_path, "signal_loader.c", "200", cflags=("-rdynamic",), timeout=60)
    asks, nested, handled = map(int, out.split())
    assert asks >= 3 and handled >= 2  # (the library asked several times; the handler ran inside those asks)
    assert nested == 0
    ev = read_traces(traces)
    assert (ev.loc[ev["event"] == "push", "message"].astype(str) == "signal").sum() == handled


@pytest.mark.parametrize("outer", ["", "nvtx.push_range('outer')\n"], ids=["outermost", "nested"])
def test_a_full_trace_file_is_said_not_silently_cut(tmp_path, outer) -> None:
    # the real injection library with a trace file too small for what the program writes (the nvtx package
    # drives it through NVTX's injection hook; no GPU needed); the ranges outermost, or nested in one (a nested
    # edge writes by a path of its own)
    from pcietrace.record.trace import read_traces
    from pcietrace.record.attach import processes
    from pcietrace.schema import TRACE_FULL

    prog = "import nvtx\n" + outer + "for i in range(2000):\n    nvtx.push_range(f'step{i}')\n    nvtx.pop_range()\n"
    run_nvtx_program(tmp_path, prog, PCIETRACE_TRACE_BYTES="65536")
    ev = read_traces(tmp_path)
    full = ev[ev["event"] == TRACE_FULL]
    assert len(full) == 1 and full["id"].iloc[0] == 65536
    assert (ev["event"] == "push").sum() < 2000  # the rest really was lost...
    assert ev["event"].iloc[-1] == TRACE_FULL  # ...and the marker is at the first event that did not make it
    assert full["t_ns"].iloc[0] >= ev["t_ns"].iloc[-2]
    assert read_traces(tmp_path).equals(ev)  # the file was cut to its lines: reading it again gives the same
    assert processes(ev)[0]["trace_full"]
    assert processes(ev)[0]["cupti"].startswith("not loaded")  # no CUDA call: nothing to count
    assert processes(ev, "none")[0]["cupti"] == "off (--no-count-launches)"  # not counted is not "no launches"


def test_trace_lines_keep_messages_one_field_and_every_push_its_pop(tmp_path) -> None:
    # the real injection library writes its lines field by field (no snprintf): a message's tabs and newlines
    # become spaces and it is cut at 1,023 bytes; a domain name is cut at 255, so no line is too long to write
    # (a push once dropped for its length left its pop to close the range around it); no driver loaded: the
    # device field is -1
    from pcietrace.record.trace import read_traces

    prog = ("import nvtx\nnvtx.push_range('a\\tb\\nc', domain='d1')\nnvtx.pop_range(domain='d1')\n"
            "nvtx.push_range('x' * 1500)\nnvtx.pop_range()\n"
            "nvtx.push_range('outer')\nnvtx.push_range('x' * 1023, domain='y' * 2000)\n"
            "nvtx.pop_range(domain='y' * 2000)\nnvtx.pop_range()\n")
    run_nvtx_program(tmp_path, prog)
    ev = read_traces(tmp_path)
    pushes = ev[ev["event"] == "push"]
    assert pushes["message"].tolist() == ["a b c", "x" * 1023, "outer", "x" * 1023], pushes["message"].tolist()
    assert pushes["domain"].tolist() == ["d1", "default", "default", "y" * 255]
    assert (ev["event"] == "pop").sum() == 4 and (ev["dev"] == -1).all()
    assert ev[ev["event"] == "pop"]["domain"].iloc[-2] == "y" * 255  # the inner pop, cut as its push was
    assert (ev["t_ns"].diff().dropna() >= 0).all() and ev["tid"].nunique() == 1


def _five_ranges_trace(tmp_path) -> Path:
    """The trace file the real injection library writes into ``tmp_path`` for five push/pop ranges (nvtx drives
    it)."""
    prog = "import nvtx\nfor i in range(5):\n    nvtx.push_range(f'step{i}')\n    nvtx.pop_range()\n"
    run_nvtx_program(tmp_path, prog)
    return next(tmp_path.glob("trace-*.bin"))


def test_the_report_notes_a_full_trace(data_dir) -> None:
    # the real H100 recording with a TRACE_FULL marker added after its last event (CONSTRUCTED marker)
    from pcietrace.analysis import analyze
    from pcietrace.schema import TRACE_FULL
    from pcietrace.session import Session

    s = Session.load(data_dir / "attach_h100_python")
    s.events = pd.concat([s.events, s.events.tail(1).assign(event=TRACE_FULL, id=2**28)], ignore_index=True)
    notes = " ".join(notes_text(analyze(s)))
    assert "trace file filled up (256 MiB)" in notes and "PCIETRACE_TRACE_BYTES" in notes


def test_a_hung_calibration_is_killed_and_said_in_one_line() -> None:
    # the child here just sleeps (time.sleep stands in for a driver call that never returns)
    import time

    from pcietrace.errors import PcietraceError
    from pcietrace.record.attach import calibrate_in_child

    t0 = time.monotonic()
    with pytest.raises(PcietraceError, match="did not finish within 0.5 s"):
        calibrate_in_child(30, timeout_s=0.5, fn=time.sleep)
    assert time.monotonic() - t0 < 10  # killed, not waited for
    assert calibrate_in_child(0, timeout_s=30, fn=abs) == 0  # an answer comes back


def test_a_calibration_child_that_dies_fails_at_once_not_at_the_timeout() -> None:
    # os._exit stands in for a crash in the driver: the child ends without an answer
    import math
    import os
    import time

    from pcietrace.errors import PcietraceError
    from pcietrace.record.attach import calibrate_in_child

    t0 = time.monotonic()
    with pytest.raises(PcietraceError, match=r"ended without an answer \(exit code 3"):
        calibrate_in_child(3, timeout_s=60, fn=os._exit)
    assert time.monotonic() - t0 < 30
    with pytest.raises(ValueError, match="math domain error"):  # the child's own exception comes back as is
        calibrate_in_child(-1, timeout_s=60, fn=math.sqrt)


def test_the_calibration_records_make_every_launch_cost_on_the_simulated_device() -> None:
    """attach's on-the-spot calibration measured on the SIMULATED device and turned into launch costs as the
    command does (record/ measures, analysis.costs computes): each the simulated device's own cost per launch
    (host-bound eager; graph kernels back to back at the GPU's gap)."""
    from pcietrace.analysis.costs import LAUNCH_COST_KEYS, from_records
    from pcietrace.device.sim import SimBackend, SimDevice, SimParams
    from pcietrace.record.attach import calibration_records
    from pcietrace.record.generate import LaunchGenerator

    p = SimParams.default()
    costs = from_records(*calibration_records(LaunchGenerator(SimBackend(SimDevice(p, seed=3)))), "SIMULATED")
    model_ns = [p.host_ns_eager, p.host_ns_graph, max(p.host_ns_eager, p.gap_ns_eager),
                max(p.host_ns_graph / 100, p.gap_ns_graph)]
    assert [costs[k] for k in LAUNCH_COST_KEYS] == pytest.approx([ns / 1e3 for ns in model_ns], rel=0.02)
    assert costs["source"] == "SIMULATED"


@pytest.mark.gpu
def test_the_on_the_spot_calibration_gives_every_launch_cost() -> None:
    """GPU 0, as ``pcietrace attach`` calibrates: the records come back from the child and make every launch
    cost, each positive, a graph's kernel cheaper per kernel than an eager one's (K=100, empty kernels)."""
    from pcietrace.analysis.costs import LAUNCH_COST_KEYS
    from pcietrace.config import AttachConfig
    from pcietrace.workflow import _launch_costs

    costs = _launch_costs(AttachConfig(command=("true",)), 0)
    assert all(np.isfinite(costs[k]) and costs[k] > 0 for k in LAUNCH_COST_KEYS), costs
    assert costs["wall_us_per_kernel_graph"] < costs["wall_us_per_kernel_eager"]
    assert costs["source"] == "measured on the spot"


@pytest.mark.parametrize("terminal", [False, True])
def test_sigint_is_passed_on_once(monkeypatch, tmp_path, terminal) -> None:
    # SIGINT to pcietrace while the program runs: passed on, unless pcietrace is a terminal's foreground job
    # (then Ctrl-C reached the program from the terminal already; here nothing else sends it, so it gets 0)
    import os
    import signal
    import sys
    import threading
    import time

    from pcietrace import signals
    from pcietrace.record import attach

    monkeypatch.setattr(signals, "terminal_foreground", lambda pid=0: terminal)
    out, ready = tmp_path / "count", tmp_path / "ready"
    # (sent once the program's handler is in place, not after a fixed second: a loaded machine may take longer)
    prog = ("import pathlib, signal, sys, time\nn = []\nsignal.signal(signal.SIGINT, lambda *a: n.append(1))\n"
            f"pathlib.Path({str(ready)!r}).touch()\n"
            "time.sleep(2.0)\nopen(sys.argv[1], 'w').write(str(len(n)))\n")

    def interrupt_us() -> None:
        while not ready.exists():
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_us, daemon=True).start()
    rc, _, _ = attach.run_program([sys.executable, "-c", prog, str(out)], dict(os.environ))
    assert rc == 0 and out.read_text() == ("0" if terminal else "1")


FAKE_CUPTI = """
int subscribed;
int cuptiSubscribe(void **sub, void *callback, void *userdata) { ++subscribed; *sub = 0; return 0; }
int cuptiEnableCallback(unsigned enable, void *sub, int domain, unsigned cbid) { return 0; }
"""


@pytest.mark.parametrize("counter", ["cupti", "none"])
def test_gpu_time_without_launch_counting_subscribes_no_launch_callbacks(tmp_path, counter) -> None:
    # --gpu-time --no-count-launches: CUDA loads the injection library for the kernel records, but "do not count
    # launches" must not turn CUPTI's launch callbacks on (~0.6-0.9 us per launch). The real library's CUDA entry
    # point is called here the way the driver calls it, against a STAND-IN libcupti (no activity API, no GPU)
    import subprocess
    import sys

    from pcietrace.record.trace import read_traces
    from pcietrace.record.attach import injection_env

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the stand-in CUPTI library")
    (tmp_path / "cupti.c").write_text(FAKE_CUPTI)
    fake = tmp_path / "libcupti_standin.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(fake), str(tmp_path / "cupti.c")], check=True)
    traces = tmp_path / "traces"
    traces.mkdir()
    env = injection_env(traces, counter, None, [0], False, gpu_time=True)
    env["PCIETRACE_CUPTI"] = str(fake)
    env.pop("LD_PRELOAD", None)
    prog = ("import ctypes, os\n"
            "lib = ctypes.CDLL(os.environ['CUDA_INJECTION64_PATH'])\n"
            "assert lib.InitializeInjection() == 1\n"
            "print(ctypes.c_int.in_dll(ctypes.CDLL(os.environ['PCIETRACE_CUPTI']), 'subscribed').value)\n")
    out = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=60, check=True)
    ev = read_traces(traces)
    said = dict(zip(ev["event"], ev["message"]))
    assert said["gputime"].startswith("off: CUPTI activity API missing")  # the stand-in has no activity API
    if counter == "none":
        assert out.stdout.strip() == "0" and "cupti" not in said
    else:
        assert out.stdout.strip() == "1" and said["cupti"].startswith("launch counting on")


@pytest.mark.parametrize("stdin_from_terminal", [True, False])
def test_a_terminal_foreground_job_is_seen_with_stdin_redirected(tmp_path, stdin_from_terminal) -> None:
    # a real pseudo-terminal made the controlling terminal of a new session (as a shell's foreground job has
    # one): `pcietrace attach ... < file` still gets Ctrl-C from it, so SIGINT must not be passed on again; a
    # program that started its own session gets no Ctrl-C from it, so SIGINT must be passed on to that one
    import os
    import subprocess
    import sys

    master, slave = os.openpty()
    prog = ("import os, sys\n"
            "os.close(os.open(sys.argv[1], os.O_RDWR))  # a session leader's first terminal becomes its own\n"
            "import subprocess\n"
            "from pcietrace.signals import terminal_foreground as _terminal_foreground\n"
            "p = subprocess.Popen(['sleep', '30'])\n"
            "q = subprocess.Popen(['sleep', '30'], start_new_session=True)  # a program that left our group\n"
            "print(_terminal_foreground(), _terminal_foreground(p.pid), _terminal_foreground(q.pid))\n"
            "p.kill(), q.kill()\n")
    try:
        out = subprocess.run([sys.executable, "-c", prog, os.ttyname(slave)], start_new_session=True,
                             stdin=slave if stdin_from_terminal else subprocess.DEVNULL, capture_output=True,
                             text=True, timeout=60, check=True)
    finally:
        os.close(master), os.close(slave)
    assert out.stdout.split() == ["True", "True", "False"]
    # and without a controlling terminal (a new session that opened none): not a terminal's job
    no_terminal = prog.replace("os.close(os.open(sys.argv[1], os.O_RDWR))", "pass")
    none = subprocess.run([sys.executable, "-c", no_terminal, "x"], start_new_session=True, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60, check=True)
    assert none.stdout.split() == ["False"] * 3


def test_a_forked_childs_events_carry_its_own_thread_id(tmp_path) -> None:
    # the real injection library through nvtx: a child forked by a thread that had already written events
    # writes its own trace with its own thread id (its main thread's id is its pid), not the parent's
    prog = ("import os, nvtx\nnvtx.push_range('parent')\nnvtx.pop_range()\npid = os.fork()\n"
            "if pid == 0:\n    nvtx.push_range('child')\n    nvtx.pop_range()\n    os._exit(0)\nos.waitpid(pid, 0)\n")
    run_nvtx_program(tmp_path, prog)
    ev = read_traces(tmp_path)
    assert ev["pid"].nunique() == 2
    assert (ev["tid"] == ev["pid"]).all(), ev[["pid", "tid", "event", "message"]]
    ranges = attribution.ranges_from_events(ev).set_index("name")
    assert ranges.loc["child", "tid"] == ranges.loc["child", "pid"] != ranges.loc["parent", "pid"]


def test_names_from_many_threads_come_back_whole_in_their_records(tmp_path) -> None:
    # the real injection library (nvtx drives it) from 4 threads at once: each record keeps its own strings (they
    # are taken from one shared part), a name's tab and newline print as spaces, a long name is cut at 1,023 bytes
    prog = ("import nvtx, threading\n"
            "def work(k):\n"
            "    for i in range(500):\n"
            "        nvtx.push_range(f'op\\t{k}\\n{i} ' + 'x' * (i % 50), domain='d%d' % k)\n"
            "        nvtx.pop_range(domain='d%d' % k)\n"
            "ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\n"
            "nvtx.mark('y' * 5000)\n")
    run_nvtx_program(tmp_path, prog)
    ev = read_traces(tmp_path)
    push = ev[ev["event"] == "push"]
    assert len(push) == 2000 and ev.attrs["bad_lines"] == 0
    k = push["domain"].str.slice(1).astype(int)
    i = push["message"].str.split(" ").str[2].astype(int)
    assert (push["message"] == [f"op {a} {b} " + "x" * (b % 50) for a, b in zip(k, i)]).all()
    assert (push.groupby("tid")["domain"].nunique() == 1).all()  # a thread's records carry its own domain
    assert ev.loc[ev["event"] == "mark", "message"].tolist() == ["y" * 1023]


def test_event_times_are_the_samplers_clock_from_every_thread(tmp_path) -> None:
    # the real injection library times its events by the TSC between CLOCK_MONOTONIC anchors once its clock is
    # calibrated (10 ms after load): every event lands between the program's own clock reads around it, and a
    # thread's events never go back; 4 threads write ~60 MB (more than the grower keeps ready ahead of them)
    prog = ("import nvtx, threading, time, json, sys\n"
            "out = []\n"
            "def work(k):\n"
            "    name = 'x' * 200\n"
            "    for i in range(60000):\n"
            "        a = time.monotonic_ns(); nvtx.push_range(name); b = time.monotonic_ns(); nvtx.pop_range()\n"
            "        if i % 997 == 0: out.append((threading.get_native_id(), i, a, b))\n"
            "time.sleep(0.02)\n"
            "ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\n"
            "json.dump(out, sys.stdout)\n")
    proc = run_nvtx_program(tmp_path, prog, timeout=120)
    ev = read_traces(tmp_path)
    push = ev[ev["event"] == "push"]
    assert len(push) == 240_000 and ev.attrs["bad_lines"] == 0
    edges = ev[ev["event"].isin(["push", "pop"])]  # (in time order: a thread's clock going back would swap a pair)
    assert (edges.groupby("tid")["event"].agg(lambda e: "".join(e.str[1])) == "uo" * 60000).all()
    nth = push.groupby("tid").cumcount()
    at = push.assign(i=nth.to_numpy()).set_index(["tid", "i"])["t_ns"]
    for tid, i, a, b in json.loads(proc.stdout):
        assert a - 1_000 <= at[(tid, i)] <= b + 1_000, (tid, i, a, at[(tid, i)], b)


def test_a_record_cut_short_by_a_killed_process_is_left_out_and_counted(tmp_path) -> None:
    # records from the real injection library (nvtx drives it); one of them never committed, as a process killed
    # while copying it into its trace leaves it (CONSTRUCTED cut: its commit byte cleared)
    import numpy as np

    from pcietrace.record.trace import EVENT_DTYPE, HEADER_DTYPE

    f = _five_ranges_trace(tmp_path)
    whole = read_traces(tmp_path)
    h = np.fromfile(f, HEADER_DTYPE, count=1)[0]
    cut = int(h["events_at"]) + 3 * EVENT_DTYPE.itemsize + EVENT_DTYPE.fields["commit"][1]  # the fourth record
    with open(f, "r+b") as fh:
        fh.seek(cut)
        fh.write(b"\0")
    ev = read_traces(tmp_path)
    assert ev.attrs["bad_lines"] == 1 and len(ev) == len(whole) - 1
    # (the same values; the names' categories come in the order the records that hold them do)
    pd.testing.assert_frame_equal(ev, whole.drop(index=3).reset_index(drop=True), check_categorical=False)


class _StandInSampler:
    """Stands in for CounterSampler in attach's Recording (SIMULATED: no NVML): records its calls."""

    started = stopped = 0
    fail_start: BaseException | None = None

    def __init__(self, indices, **kw) -> None:
        self.modes = {i: {"mode": "fields", "bits": 32} for i in indices}

    def start(self) -> None:
        type(self).started += 1
        if type(self).fail_start is not None:
            raise type(self).fail_start

    def stop(self) -> pd.DataFrame:
        type(self).stopped += 1
        from pcietrace.collectors import empty_samples
        return empty_samples()


@pytest.fixture
def stand_in(monkeypatch):
    from pcietrace import collectors

    class S(_StandInSampler):
        pass

    monkeypatch.setattr(collectors, "CounterSampler", S)
    return S


def _leftovers(rec) -> list[bool]:
    import os
    return [rec.trace_dir.exists(), os.path.exists(rec.edge_file)]


def test_a_trace_that_cannot_be_read_still_stops_the_samplers_and_removes_the_page(stand_in, monkeypatch) -> None:
    """The samplers stop before the traces are read: an unreadable trace leaves no sampler running and no
    edge page or trace folder behind (before, read_traces ran first and its error skipped the rest)."""
    from pcietrace.record import attach
    from pcietrace.session import Session

    stopped_when_read: list[int] = []

    def unreadable(_):
        stopped_when_read.append(stand_in.stopped)
        raise OSError("trace unreadable")

    monkeypatch.setattr(attach, "read_traces", unreadable)
    with pytest.raises(OSError):
        with attach.Recording([0, 1], 500_000, 1.0, 5_000_000) as rec:
            rec.collect(Session(meta={}), [], "interpose")
    assert stopped_when_read == [1] and stand_in.started == 1 and _leftovers(rec) == [False, False]


@pytest.mark.parametrize("failure", [RuntimeError("sampler failed on GPU 0"), KeyboardInterrupt()])
def test_a_sampler_that_fails_or_is_interrupted_at_start_leaves_nothing_behind(stand_in, failure) -> None:
    from pcietrace.record import attach

    stand_in.fail_start = failure
    rec = attach.Recording([0], 500_000, 1.0, 5_000_000)
    with pytest.raises(type(failure)):
        with rec:
            pass
    assert _leftovers(rec) == [False, False]


def test_a_sampler_that_refuses_its_settings_leaves_no_page_or_folder(monkeypatch) -> None:
    """The real CounterSampler refuses an idle interval beyond its limit (one line, exit 2 upstream)."""
    from pcietrace.collectors import edges
    from pcietrace.errors import UsageError
    from pcietrace.record import attach

    made: list[str] = []
    real = edges.create
    monkeypatch.setattr(edges, "create", lambda: made.append(real()) or made[-1])
    before = set(Path(tempfile.gettempdir()).glob("pcietrace-*"))
    with pytest.raises(UsageError):
        attach.Recording([0], 500_000, 1.0, 10**12)
    assert made and not Path(made[0]).exists()
    assert set(Path(tempfile.gettempdir()).glob("pcietrace-*")) == before


class _StandInAttachSampler(_StandInSampler):
    """The stand-in sampler with the calls attach's idle windows make (SIMULATED: no NVML)."""

    def pause(self, paused: bool = True) -> None:
        pass

    def hold_fast(self, on: bool = True) -> None:
        pass

    def stop(self) -> pd.DataFrame:
        """Two reads of GPU 0 a second apart (a saved run needs two; what they hold is not looked at)."""
        super().stop()
        import time

        t = time.monotonic_ns()
        return pd.DataFrame({"nvml_index": [0, 0], "t_ns": [t - 10**9, t], "read_ns": [300_000] * 2,
                             "tx_raw": np.array([0, 1000], np.uint64), "rx_raw": np.array([0, 1000], np.uint64)})


@pytest.fixture
def attach_stand_ins(monkeypatch):
    """`pcietrace attach` on a stand-in GPU with stand-in samplers (SIMULATED: no CUDA, no NVML); the
    Recordings made are listed in the returned ``made``, the sampler class is ``S``."""
    from pcietrace import collectors
    from pcietrace.collectors import nvml, topology
    from pcietrace.device import cuda
    from pcietrace.record import attach

    class S(_StandInAttachSampler):
        pass

    monkeypatch.setattr(collectors, "CounterSampler", S)
    monkeypatch.setattr(cuda, "bus_ids", lambda: ["0000:00:06.0"])
    monkeypatch.setattr(nvml, "index_for_bus_id", lambda bus_id: 0)
    monkeypatch.setattr(nvml, "gpu_info", lambda i: nvml.GpuInfo(i, "FAKE (no GPU)", "none", "0000:00:06.0",
                                                                   *[None] * 5))
    monkeypatch.setattr(nvml, "driver_version", lambda: "none (stand-in)")
    monkeypatch.setattr(topology, "collect", lambda gpus=None, sysfs_root="/sys": None)
    made: list = []
    real_init = attach.Recording.__init__

    def init(self, *a, **k) -> None:
        real_init(self, *a, **k)
        made.append(self)

    monkeypatch.setattr(attach.Recording, "__init__", init)
    return S, made


def _attach_argv(out, *program: str) -> list[str]:
    import sys

    return ["attach", "--gpu", "0", "--no-calibrate", "--idle-s", "0.01", "-o", str(out), "--",
            sys.executable, "-c", *(program or ["pass"])]


def test_attach_whose_trace_cannot_be_read_leaves_no_staging_folder(attach_stand_ins, monkeypatch, tmp_path,
                                                                    capsys) -> None:
    """`pcietrace attach` whose traces cannot be read: one line, exit 2, and nothing left behind (was: the
    hidden staging folder stayed in the reports folder, since the save that would have published or discarded
    it never ran)."""
    from pcietrace.cli import main
    from pcietrace.record import attach

    S, made = attach_stand_ins

    def unreadable(_):
        raise OSError("trace unreadable")

    monkeypatch.setattr(attach, "read_traces", unreadable)
    rc = main(_attach_argv(tmp_path / "rec"))
    err = capsys.readouterr().err
    assert rc == 2 and err.strip().splitlines()[-1] == "pcietrace: error: trace unreadable", err
    assert "Traceback" not in err and S.stopped == 1
    assert list(tmp_path.iterdir()) == [] and _leftovers(made[0]) == [False, False]


def test_attach_whose_save_fails_does_not_exit_0(attach_stand_ins, monkeypatch, tmp_path, capsys) -> None:
    """A program that ran fine but whose run could not be saved: the failure is said in one line and the exit
    code is not the program's 0 (was 0: a script could not tell that nothing was saved); a failing program's
    own exit code still passes through. Nothing left behind either way."""
    from pcietrace.cli import main
    from pcietrace.session import Session

    S, made = attach_stand_ins

    def disk_full(self, directory, results=None):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Session, "save", disk_full)
    assert main(_attach_argv(tmp_path / "rec")) == 2
    assert "could not save" in capsys.readouterr().err
    assert main(_attach_argv(tmp_path / "rec", "raise SystemExit(3)")) == 3
    assert "could not save" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [] and not any(any(_leftovers(r)) for r in made)


def test_a_stop_cut_short_by_a_signal_is_finished_on_leaving(stand_in, monkeypatch) -> None:
    """A third signal (the one that no longer waits for the save) raised inside the samplers' stop as attach
    collects: leaving the Recording stops them again (was: collect marked them stopped before stopping them, so
    leaving skipped the stop and the sampler processes outlived the run)."""
    from pcietrace.record import attach
    from pcietrace.session import Session

    class CutShort(stand_in):
        def stop(self):
            if type(self).stopped == 0:
                type(self).stopped += 0.5  # begun, not finished
                raise KeyboardInterrupt
            return super().stop()

    from pcietrace import collectors

    monkeypatch.setattr(collectors, "CounterSampler", CutShort)
    with pytest.raises(KeyboardInterrupt):
        with attach.Recording([0], 500_000, 1.0, 5_000_000) as rec:
            rec.collect(Session(meta={}), [], "interpose")
    assert CutShort.stopped == 1.5 and _leftovers(rec) == [False, False]


def test_a_program_the_system_cannot_execute_is_refused_in_one_line_with_nothing_saved(attach_stand_ins, tmp_path,
                                                                                       capsys) -> None:
    """An executable file the kernel refuses (ENOEXEC: no #! line, not a binary) passes the up-front PATH check;
    it is refused in one line with nothing saved, as a missing program is (was: idle windows measured, 'saved
    to DIR' of a failed attach run, then 'cannot start' on a second line)."""
    from pcietrace.cli import main

    S, made = attach_stand_ins
    prog = tmp_path / "not-a-program"
    prog.write_bytes(b"\x00\x01 neither a script nor a binary\n")
    prog.chmod(0o755)
    out = tmp_path / "reports" / "rec"
    argv = _attach_argv(out)
    rc = main(argv[:argv.index("--") + 1] + [str(prog)])
    err = capsys.readouterr().err
    assert rc == 2 and "saved" not in err and err.count("pcietrace: error") == 1, err
    assert err.strip().splitlines()[-1].startswith("pcietrace: error: cannot start"), err
    assert not out.exists() and list(out.parent.iterdir()) == [] and not any(any(_leftovers(r)) for r in made)


@pytest.mark.parametrize("which", [1, 2])
def test_a_signal_in_an_idle_window_before_or_after_the_program_ends_with_one_line(which, attach_stand_ins,
                                                                                     monkeypatch, tmp_path,
                                                                                     capsys) -> None:
    """SIGTERM (as Terminated) in the idle windows before (1) or after (2) the program, on stand-in GPUs and
    samplers (SIMULATED): one line saying what was saved and where, exit 143, the run saved (before the program:
    as a failed attach run), the samplers stopped once, nothing left behind."""
    from pcietrace.cli import main
    from pcietrace.session import Session
    from pcietrace.signals import Terminated

    S, made = attach_stand_ins
    holds: list[bool] = []

    def hold_fast(self, on: bool = True) -> None:
        holds.append(on)
        if on and len(holds) == 2 * which - 1:
            raise Terminated(signal.SIGTERM)

    monkeypatch.setattr(S, "hold_fast", hold_fast)
    out = tmp_path / "rec"
    assert main(_attach_argv(out)) == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    what = ("what was recorded before the program ran" if which == 1 else
            "the run (the program had ended, exit code 0)")
    left = "" if which == 1 else f"; no Perfetto trace (`pcietrace report {out} --perfetto FILE` writes it)"
    assert err.strip().splitlines()[-1] == (f"pcietrace: interrupted: saved {what} to {out}; "
                                            f"`pcietrace report {out}` shows it{left}"), err
    assert "saved to" not in err and err.count("interrupted") == 1 and "Traceback" not in err
    assert Session.load(out).meta["kind"] == ("attach-failed" if which == 1 else "attach")
    assert not (out / "trace.json").exists()
    assert S.stopped == 1 and list(tmp_path.iterdir()) == [out] and not any(_leftovers(made[0]))


def test_a_perfetto_trace_that_cannot_be_written_still_says_the_run_is_saved(attach_stand_ins, monkeypatch, tmp_path,
                                                                            capsys) -> None:
    """The run saved, then its trace.json fails (disk full): one line says the run is saved and how to write the
    trace later, no partial trace.json stays, and the program's exit code passes through (was: exit 2 and no
    word that the run was saved). SIMULATED stand-in GPU and samplers."""
    from pcietrace.cli import main
    from pcietrace.report import perfetto
    from pcietrace.session import Session

    def disk_full(session, results, path) -> None:
        path.write_text("{")  # part of it, then the disk fills
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(perfetto, "write_trace", disk_full)
    out = tmp_path / "rec"
    assert main(_attach_argv(out)) == 0
    err = capsys.readouterr().err
    assert "could not write the Perfetto trace" in err and "the run is saved there" in err
    assert "Perfetto trace:" not in err and not (out / "trace.json").exists()
    assert Session.load(out).meta["status"] == "complete"


def test_a_signal_as_the_recording_is_made_leaves_no_page_or_folder(attach_stand_ins, monkeypatch, tmp_path,
                                                                   capsys) -> None:
    """SIGINT arriving just as attach's Recording has made its trace folder and edge page (before anything owns
    them): they are released and nothing is saved (was: the signal escaped between making them and the clean-up
    taking them over). SIMULATED stand-in GPU and samplers."""
    import os
    import signal as sig

    from pcietrace.cli import main
    from pcietrace.record import attach

    S, made = attach_stand_ins
    made_init = attach.Recording.__init__  # (the fixture's, which lists what was made)

    def init_then_signal(self, *a, **k) -> None:
        made_init(self, *a, **k)
        os.kill(os.getpid(), sig.SIGINT)  # as if Ctrl-C came right here

    monkeypatch.setattr(attach.Recording, "__init__", init_then_signal)
    out = tmp_path / "rec"
    assert main(_attach_argv(out)) == 130
    assert len(made) == 1 and _leftovers(made[0]) == [False, False]
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert S.started == 0  # the samplers never started


def test_a_signal_that_cuts_the_collection_short_ends_with_one_line_nothing_saved(attach_stand_ins, monkeypatch,
                                                                                   tmp_path, capsys) -> None:
    """A third signal (no longer held) raised as the samplers stop after the program: nothing was read, so
    nothing is saved: the one line says so, exit 130, no staging folder, page or trace folder left behind.
    SIMULATED stand-in GPU and samplers."""
    from pcietrace.cli import main

    S, made = attach_stand_ins
    real_stop = S.stop

    def stop_cut_short(self):
        if S.stopped == 0:
            S.stopped += 1
            raise KeyboardInterrupt
        return real_stop(self)

    monkeypatch.setattr(S, "stop", stop_cut_short)
    out = tmp_path / "rec"
    assert main(_attach_argv(out)) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "pcietrace: interrupted: nothing saved", err
    assert "saved to" not in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == [] and not any(_leftovers(made[0]))


def test_launches_of_threads_without_ranges_are_said_not_silently_dropped(data_dir) -> None:
    """The 4x H200 torchrun DDP recording: each rank's autograd threads, which have no NVTX range, launch the
    backward pass (7,680 of each rank's 10,332 launches) while `train_step` is open on the rank's own thread,
    which made 440 of them a call: `train_step` counts them all, as its process did. A note says so; the
    recording of threads that each open their own ranges gets none."""
    from pcietrace.analysis import analyze, attribution
    from pcietrace.session import Session

    s = Session.load(data_dir / "recordings" / "attach-h200x4-torchrun-ddp")
    per = attribution.launches_by_untraced_threads(s.events).set_index("pid")
    ranks = per[per["launches"] > 0]
    assert len(ranks) == 4 and (ranks["untraced"] > 0.5 * ranks["launches"]).all()
    res = analyze(s)
    inst = res["range_instances"]
    step = inst[inst["name"] == "train_step"]
    assert (step["eager_launches"] == step["eager_launches_process"]).all() and (step["eager_launches"] > 440).all()
    note = [n for n in notes_text(res) if "no NVTX range" in n]
    assert note and f"{int(ranks['untraced'].sum()):,} of {int(ranks['launches'].sum()):,} launches" in note[0]
    assert not [n for n in notes_text(analyze(Session.load(data_dir / "attach_h200x2_threads"))) if "no NVTX range" in n]


def test_the_report_is_shown_before_the_perfetto_trace_is_written(attach_stand_ins, monkeypatch, tmp_path,
                                                                  capsys) -> None:
    """After a long job the user waits for the report, not for the trace (seconds at millions of ranges): the
    report is rendered first, then trace.json is written and named on its own line. SIMULATED stand-in GPU and
    samplers."""
    from pcietrace import commands
    from pcietrace.cli import main
    from pcietrace.report import perfetto

    order: list[str] = []
    emit, write_trace = commands._emit, perfetto.write_trace
    monkeypatch.setattr(commands, "_emit", lambda *a: (order.append("report"), emit(*a))[1])
    monkeypatch.setattr(perfetto, "write_trace", lambda *a: (order.append("trace"), write_trace(*a))[1])
    out = tmp_path / "rec"
    assert main(_attach_argv(out)) == 0
    err = capsys.readouterr().err
    assert order == ["report", "trace"]
    assert f"saved to {out}\n" in err and f"Perfetto trace: {out / 'trace.json'}" in err.splitlines()[-1]
    assert json.loads((out / "trace.json").read_text())["traceEvents"]


@pytest.mark.parametrize("raised", [BrokenPipeError(32, "Broken pipe"), SystemExit(1)], ids=["oserror", "rich"])
def test_a_report_piped_to_a_closed_reader_still_leaves_the_perfetto_trace(attach_stand_ins, monkeypatch,
                                                                            tmp_path, raised) -> None:
    """`pcietrace attach ... | head`: the pipe closes while the report is printed; the trace, written after the
    report, is written all the same (exit 1, as for any broken pipe; rich's console says it by SystemExit(1),
    which the run's later steps did not outlast). SIMULATED stand-in GPU and samplers."""
    from pcietrace import commands
    from pcietrace.cli import main

    def closed(*args) -> None:
        raise raised

    monkeypatch.setattr(commands, "_emit", closed)
    out = tmp_path / "rec"
    if isinstance(raised, SystemExit):
        with pytest.raises(SystemExit) as exited:
            main(_attach_argv(out))
        assert exited.value.code == 1
    else:
        assert main(_attach_argv(out)) == 1
    assert json.loads((out / "trace.json").read_text())["traceEvents"]


def test_a_signal_while_the_perfetto_trace_is_written_leaves_the_run_saved_and_no_partial_trace(
        attach_stand_ins, monkeypatch, tmp_path, capsys) -> None:
    """Ctrl-C once the report is shown, while trace.json is being written: no partial trace.json, one line
    saying the run is saved and how to write the trace, exit 130. SIMULATED stand-in GPU and samplers."""
    from pcietrace.cli import main
    from pcietrace.report import perfetto
    from pcietrace.session import Session

    def cut_short(session, results, path) -> None:
        path.write_text("{")
        raise KeyboardInterrupt

    monkeypatch.setattr(perfetto, "write_trace", cut_short)
    out = tmp_path / "rec"
    assert main(_attach_argv(out)) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (f"pcietrace: interrupted: the Perfetto trace was not written into {out}; "
                                            f"the run is saved there and `pcietrace report {out} --perfetto FILE` "
                                            "writes it later")
    assert not (out / "trace.json").exists() and Session.load(out).meta["status"] == "complete"
    assert sorted(p.name for p in out.iterdir() if "trace" in p.name) == []


def test_a_second_signal_in_the_traces_clean_up_leaves_no_temporary_file(attach_stand_ins, monkeypatch, tmp_path,
                                                                          capsys) -> None:
    """A second Ctrl-C lands while the trace's writer removes its temporary file (its own clean-up cut short):
    attach removes it, and says its one line. SIMULATED stand-in GPU and samplers."""
    import os

    from pcietrace.cli import main
    from pcietrace.report import perfetto

    def cut_twice(session, results, path) -> None:
        (path.parent / f".{path.name}.{os.getpid()}.tmp").write_text("{")  # (left by the second signal)
        raise KeyboardInterrupt

    monkeypatch.setattr(perfetto, "write_trace", cut_twice)
    out = tmp_path / "rec"
    assert main(_attach_argv(out)) == 130
    assert "the Perfetto trace was not written" in capsys.readouterr().err.strip().splitlines()[-1]
    assert sorted(p.name for p in out.iterdir() if "trace" in p.name) == []


def test_a_signal_while_the_report_is_shown_says_the_run_is_saved_and_the_trace_is_not(attach_stand_ins, monkeypatch,
                                                                                       tmp_path, capsys) -> None:
    """Ctrl-C while the report prints (a long table, --plot): the run is saved; one line says so and that the
    Perfetto trace, which comes after the report, was not written and how to write it; exit 130. SIMULATED
    stand-in GPU and samplers."""
    from pcietrace import commands
    from pcietrace.cli import main

    def interrupted(*args) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(commands, "_emit", interrupted)
    out = tmp_path / "rec"
    assert main(_attach_argv(out)) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        f"pcietrace: interrupted: saved the run (the program had ended, exit code 0) to {out}; `pcietrace report "
        f"{out}` shows it; no Perfetto trace (`pcietrace report {out} --perfetto FILE` writes it)"), err
    assert err.count("interrupted") == 1 and not (out / "trace.json").exists()


def test_a_perfetto_trace_out_of_memory_is_one_line_and_the_run_stays_saved(attach_stand_ins, monkeypatch, tmp_path,
                                                                            capsys) -> None:
    """A trace that runs out of memory (a long run) ends attach in one line, not a traceback; the run is saved
    and the program's exit code passes through. SIMULATED stand-in GPU and samplers."""
    from pcietrace.cli import main
    from pcietrace.report import perfetto
    from pcietrace.session import Session

    def no_memory(session, results, path) -> None:
        raise MemoryError()

    monkeypatch.setattr(perfetto, "write_trace", no_memory)
    out = tmp_path / "rec"
    assert main(_attach_argv(out)) == 0
    err = capsys.readouterr().err
    assert "could not write the Perfetto trace" in err and "MemoryError" in err and "Traceback" not in err
    assert Session.load(out).meta["status"] == "complete"


def test_an_analysis_out_of_memory_is_one_line_naming_the_saved_recording(attach_stand_ins, monkeypatch, tmp_path,
                                                                          capsys) -> None:
    """A long run whose analysis runs out of memory: attach saves the recording all the same and says in one
    line where, and how to report it; `report` of it then says the same in one line. SIMULATED stand-in GPU."""
    from pcietrace.analysis.kinds import attach as kind
    from pcietrace.cli import main
    from pcietrace.session import Session

    def no_memory(*_a, **_k) -> None:
        raise MemoryError()

    monkeypatch.setattr(kind, "attribute", no_memory)
    out = tmp_path / "rec"
    assert main(_attach_argv(out)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == (
        f"pcietrace: error: out of memory analysing the run; the recording is saved to {out}: "
        f"`pcietrace report {out}` on a machine with more memory")
    assert len(Session.load(out).samples)  # the raw recording, kept
    assert main(["report", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"pcietrace: error: out of memory analysing {out} (")


def test_the_perfetto_trace_is_bounded(data_dir, tmp_path) -> None:
    """However long the run: each counter track at most ``max_points`` points, at most ``max_ranges`` ranges,
    outermost first, and the file says how many of how many."""
    from pcietrace.analysis import analyze
    from pcietrace.report.perfetto import write_trace
    from pcietrace.session import Session

    s = Session.load(data_dir / "attach_h100_blind_graphs")
    res = analyze(s)
    inst = res["range_instances"]
    outer = int((inst["depth"] == 0).sum())
    info = write_trace(s, res, tmp_path / "t.json", max_points=100, max_ranges=outer + 1)
    trace = json.loads((tmp_path / "t.json").read_text())
    ev = pd.DataFrame(trace["traceEvents"])
    pcie = ev[(ev["ph"] == "C") & (ev["pid"] == 0)]
    assert 0 < pcie.groupby("tid").size().max() <= 100 < res["rates"].groupby("nvml_index").size().min()
    assert 0 < (ev["ph"] == "C").sum() - len(pcie) <= 100  # the one process's launch track
    shown = ev[ev["ph"] == "X"]
    assert len(shown) == outer + 1 < len(inst) and set(inst.loc[inst["depth"] == 0, "name"]) <= set(shown["name"])
    assert trace["otherData"]["ranges_shown"] == outer + 1 and trace["otherData"]["ranges_recorded"] == len(inst)
    assert info["bytes"] == (tmp_path / "t.json").stat().st_size
    # the total bytes per GPU survive the coarser bins (the mean rate over whole bins)
    fine = res["rates"].groupby("nvml_index")["rx_Bps"].mean()
    assert pcie.groupby("tid")["args"].apply(lambda a: np.mean([x.get("H2D (RX)", np.nan) for x in a])).iloc[0] * 1e6 == \
        pytest.approx(fine.iloc[0], rel=0.05)


@pytest.mark.parametrize("program", ["/nonexistent/app", "no-such-program-pcietrace", "/etc/passwd", "/etc"])
def test_attach_to_a_program_that_cannot_run_is_one_line_before_measuring(program, capsys) -> None:
    # was (on a GPU machine): idle windows measured, 'saved to DIR' (a failed attach run), then
    # 'pcietrace: error: cannot start ...': two lines and a folder for nothing
    assert f"attach cannot run {program!r}" in one_line_exit_2(["attach", "--", program, "x"], capsys)


CHDIR_APP = """
import os, subprocess, sys, time
os.chdir(sys.argv[1])  # (a job script that moves to its work folder before its first range)
import nvtx
with nvtx.annotate("moved"):
    time.sleep(0.02)
with nvtx.annotate("parent"):
    subprocess.run([sys.executable, "-c", "import nvtx, time\\nwith nvtx.annotate('child'): time.sleep(0.02)"],
                   cwd="/", check=True)
"""


def test_a_program_that_changes_folder_keeps_its_ranges_under_a_relative_output(tmp_path) -> None:
    """attach with a relative -o (the default, runs/..., is one) on stand-in GPUs: the program moves to another
    folder before its first range and starts a child in a third. The library opened the trace folder by the
    relative name from there: every range was lost, with "No NVTX ranges were seen"."""
    import os
    import subprocess
    import sys

    pytest.importorskip("nvtx")
    from injected import injection_library_or_skip

    injection_library_or_skip()
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "app.py").write_text(CHDIR_APP)
    (tmp_path / "elsewhere").mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(root / "tests" / "apps" / "attach_fake_gpu.py"), "attach", "--gpu", "0",
                           "--no-calibrate", "--idle-s", "0.1", "-o", "rec", "--json", "--", sys.executable, "app.py",
                           str(tmp_path / "elsewhere")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = sorted(r["name"] for r in json.loads(proc.stdout)["results"]["ranges"])
    assert names == ["child", "moved", "parent"], names
    assert not list((tmp_path / "elsewhere").iterdir())  # (nothing written where the program went)
