"""Ranges of several threads working at once on one GPU (pcietrace/analysis/overlap.py): the counters are per
GPU, so each is charged the others' bytes too, and a note says where, on real recordings: an inference server's
worker threads (tests/apps/serve_app.py on the lent H200), a C++ app's four copying threads, and training apps
whose autograd thread works while the main thread waits in ``backward()`` (no note)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pcietrace.analysis import analyze, overlap
from pcietrace.session import Session


@pytest.fixture(scope="module")
def serve(data_dir):
    s = Session.load(data_dir / "attach_h200_serve")
    return s, analyze(s)


def _notes(res) -> list:
    return [n for n in res["notes"]["note"] if getattr(n, "code", None) == "ranges_concurrent"]


def test_a_servers_worker_threads_are_said_to_share_their_gpu_and_their_ranges_add_up_past_it(serve) -> None:
    s, res = serve
    (note,) = _notes(res)
    p = note.params
    assert p["gpu"] == 0 and p["processes"] == 1 and p["threads"] >= 2 and p["at_once"] >= 2
    assert 0 < p["shared_ms"] <= p["open_ms"] and "model" in p["names"]
    # what the note claims: the requests, one per worker at a time, add up to more than the GPU moved in the run
    inst, whole = res["range_instances"], res["whole_run"]
    requests = inst[(inst["name"] == "request") & (inst["domain"] == "serve")]
    assert requests["h2d_bytes"].sum() > whole["h2d_bytes"].sum()


def test_the_shared_time_is_the_time_two_threads_working_ranges_were_open_counted_on_a_grid(serve) -> None:
    """The sweep's figure against a brute-force count of the same ranges on a 2 us grid."""
    _, res = serve
    inst = res["range_instances"]
    (found,) = overlap.concurrent(inst)
    parent = inst["parent"].to_numpy()
    launched = ((inst["eager_launches"] + inst["graph_launches"]) > 0).to_numpy()
    holds_working = np.isin(np.arange(len(inst)), parent[(parent >= 0) & launched])
    working = launched & ~holds_working & (inst["kind"] == "push").to_numpy()
    w = inst[working]
    t0 = int(w["t_start_ns"].min())
    step = 2_000
    grid = np.arange(t0, int(w["t_end_ns"].max()), step)
    threads = {}
    for (pid, tid), g in w.groupby(["pid", "tid"]):
        on = np.zeros(grid.size, bool)
        for a, b in zip(g["t_start_ns"], g["t_end_ns"]):
            on[(grid >= a) & (grid < b)] = True
        threads[(pid, tid)] = on
    count = np.sum(list(threads.values()), axis=0)
    shared = [k for k, on in threads.items() if (on & (count >= 2)).any()]  # (the threads that shared: the workers)
    assert found["threads"] == len(shared) == 4 and found["at_once"] == count.max()
    assert found["shared_ms"] == pytest.approx((count >= 2).sum() * step / 1e6, rel=0.02)
    assert found["open_ms"] == pytest.approx((count >= 1).sum() * step / 1e6, rel=0.02)


@pytest.mark.parametrize("folder", ["attach_h200_hooks", "attach_h100_emit_nvtx", "attach_h200x2_epoch"])
def test_training_whose_main_thread_waits_while_autograd_works_is_not_said_to_share(data_dir, folder) -> None:
    res = analyze(Session.load(data_dir / folder))
    assert not _notes(res)
    assert {"pid", "tid"} <= set(res["range_instances"].columns)
    assert res["range_instances"].groupby("pid")["tid"].nunique().max() >= 2  # (its ranges are on two threads)


def test_a_cpp_apps_copying_threads_are_said_once_with_their_range(data_dir) -> None:
    res = analyze(Session.load(data_dir / "attach_h100_blind_cpp"))
    (note,) = _notes(res)
    assert note.params["at_once"] >= 2 and "thread_h2d" in note.params["names"]


def test_a_start_end_range_over_the_run_is_not_a_thread_working_beside_autograd(data_dir) -> None:
    """A start/end range counts its process's launches, every thread's: over a training run (the real hooks
    recording, with one such range added: SIMULATED) it is not a range working beside the autograd thread's."""
    inst = analyze(Session.load(data_dir / "attach_h200_hooks"))["range_instances"]
    main = inst[inst["depth"] == 0].iloc[0]
    epoch = inst.iloc[:1].assign(kind="start", name="epoch", group="epoch", parent=-1, depth=0, pid=main["pid"],
                                 tid=main["tid"], t_start_ns=inst["t_start_ns"].min(), t_end_ns=inst["t_end_ns"].max(),
                                 eager_launches=inst["eager_launches_process"].sum(), graph_launches=0)
    both = pd.concat([inst, epoch], ignore_index=True)
    assert overlap.concurrent(both) == [] and overlap.concurrent(inst) == []


def test_a_marker_range_inside_each_workers_range_leaves_the_note_as_it_was(serve) -> None:
    """A range that launched nothing (a marker, a tokenizer's range) inside each working range: SIMULATED on the
    real server recording, 1 us children with no launches; the working ranges stay working, the note the same."""
    _, res = serve
    inst = res["range_instances"]
    (before,) = overlap.concurrent(inst)
    launched = (inst["eager_launches"] + inst["graph_launches"]) > 0
    kids = inst[launched].assign(parent=np.flatnonzero(launched.to_numpy()), depth=inst["depth"][launched] + 1,
                                 name="mark", group="mark", eager_launches=0, graph_launches=0,
                                 t_end_ns=inst["t_start_ns"][launched] + 1_000)
    kids["t_start_ns"] = kids["t_end_ns"] - 1_000
    (after,) = overlap.concurrent(pd.concat([inst, kids], ignore_index=True))
    assert after == before
