"""Ranges of several threads or processes working at once on one GPU (pcietrace/analysis/overlap.py): the counters
are per GPU, so each is charged the others' bytes too, and a note says where, on real recordings made on the lent
H200s and H100: an inference server's worker threads (tests/apps/serve_app.py), a second process copying beside the
first (tests/apps/procs_app.py), a C++ app's four copying threads, and training apps whose autograd thread works
while the main thread waits in ``backward()`` (no note)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pcietrace.analysis import analyze, attribution, names, nesting, overlap
from pcietrace.session import Session


def _ranges(folder):
    """A recording's ranges (with ``worked``), each one's parent row and group, as attach's analysis reads them."""
    s = Session.load(folder)
    ranges = attribution.process_ranges(s.events, s.meta.get("gpus", []))
    return ranges, nesting.parent_rows(ranges.index, nesting.parents(ranges)), names.group_names(ranges["name"], "op")


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
    assert p["gpu"] == 0 and p["processes"] == 1 and p["threads"] == 4 and p["at_once"] == 4
    assert 0 < p["shared_ms"] <= p["open_ms"] and "model" in p["names"]
    # what the note says: the requests, one per worker at a time, add up to more than the GPU moved in the run
    inst, whole = res["range_instances"], res["whole_run"]
    requests = inst[(inst["name"] == "request") & (inst["domain"] == "serve")]
    assert requests["h2d_bytes"].sum() > whole["h2d_bytes"].sum()
    assert "worked" not in inst  # (read for the note alone)


def test_the_shared_time_is_the_time_two_threads_working_ranges_were_open_counted_on_a_grid(data_dir) -> None:
    """The sweep's figures against a brute-force count of the same ranges on a 2 us grid."""
    ranges, up, group = _ranges(data_dir / "attach_h200_serve")
    (found,) = overlap.concurrent(ranges, up, group)
    worked = ranges["worked"].to_numpy()
    holds_working = np.isin(np.arange(len(ranges)), up[(up >= 0) & worked])
    w = ranges[worked & ~holds_working & (ranges["kind"] == "push").to_numpy()]
    step = 2_000
    grid = np.arange(int(w["t_start_ns"].min()), int(w["t_end_ns"].max()), step)
    threads = {}
    for key, g in w.groupby(["pid", "tid"]):
        on = np.zeros(grid.size, bool)
        for a, b in zip(g["t_start_ns"], g["t_end_ns"]):
            on[(grid >= a) & (grid < b)] = True
        threads[key] = on
    count = np.sum(list(threads.values()), axis=0)
    shared = [k for k, on in threads.items() if (on & (count >= 2)).any()]  # (the threads that shared: the workers)
    assert found["threads"] == len(shared) == 4 and found["at_once"] == count.max()
    assert found["shared_ms"] == pytest.approx((count >= 2).sum() * step / 1e6, rel=0.02)
    assert found["open_ms"] == pytest.approx((count >= 1).sum() * step / 1e6, rel=0.02)


def test_a_second_process_copying_beside_the_first_is_said_with_both_ranges(data_dir) -> None:
    """tests/apps/procs_app.py on the lent H200: its ``both_at_once`` copies 8 x 8 MiB H2D in each of two processes
    at once (copies only: no kernel launched in either range); its other phases take turns."""
    res = analyze(Session.load(data_dir / "attach_h200_procs"))
    (note,) = _notes(res)
    assert note.params["processes"] == 2 and note.params["threads"] == 2 and note.params["at_once"] == 2
    assert set(note.params["names"].split(", ")) == {"both_at_once", "worker_h2d_8x8MiB"}


@pytest.mark.parametrize("folder", ["attach_h200_hooks", "attach_h100_emit_nvtx", "attach_h200x2_epoch",
                                    "attach_h200_cupy"])
def test_a_program_whose_threads_take_turns_is_not_said_to_share(data_dir, folder) -> None:
    """Training (the main thread waits in ``backward()`` while the autograd thread works: ranges on two threads)
    and a one-thread CuPy program."""
    res = analyze(Session.load(data_dir / folder))
    assert not _notes(res)
    if folder != "attach_h200_cupy":
        assert res["range_instances"].groupby("pid")["tid"].nunique().max() >= 2  # (its ranges are on two threads)


def test_a_cpp_apps_copying_threads_are_said_once_with_their_range(data_dir) -> None:
    res = analyze(Session.load(data_dir / "attach_h100_blind_cpp"))
    (note,) = _notes(res)
    assert note.params["at_once"] >= 2 and "thread_h2d" in note.params["names"]


def test_a_start_end_range_over_the_run_is_not_a_thread_working_beside_autograd(data_dir) -> None:
    """A start/end range's work is its process's, every thread's: over a training run (the real hooks recording,
    one such range added, worked: SIMULATED) it is not a range working beside the autograd thread's."""
    ranges, up, group = _ranges(data_dir / "attach_h200_hooks")
    main = ranges[ranges["depth"] == 0].iloc[0]
    epoch = ranges.iloc[:1].assign(kind="start", name="epoch", depth=0, pid=main["pid"], tid=main["tid"],
                                   t_start_ns=ranges["t_start_ns"].min(), t_end_ns=ranges["t_end_ns"].max(),
                                   worked=True)
    both = pd.concat([ranges, epoch], ignore_index=True)
    assert overlap.concurrent(both, np.append(up, -1), pd.concat([group.astype(str), pd.Series(["epoch"])])) == []
    assert overlap.concurrent(ranges, up, group) == []


def test_a_marker_range_inside_each_workers_range_leaves_the_note_as_it_was(data_dir) -> None:
    """A range in which its thread did no GPU work (a marker, a tokenizer's range) inside each working range:
    SIMULATED on the real server recording, 1 us children; the working ranges stay working, the note the same."""
    ranges, up, group = _ranges(data_dir / "attach_h200_serve")
    (before,) = overlap.concurrent(ranges, up, group)
    worked = ranges["worked"].to_numpy()
    kids = ranges[worked].assign(name="mark", worked=False, depth=ranges["depth"][worked] + 1,
                                 t_end_ns=ranges["t_start_ns"][worked] + 1_000)
    kids["t_start_ns"] = kids["t_end_ns"] - 1_000
    (after,) = overlap.concurrent(pd.concat([ranges, kids], ignore_index=True),
                                  np.concatenate([up, np.flatnonzero(worked)]),
                                  pd.concat([group.astype(str), pd.Series(["mark"] * len(kids))], ignore_index=True))
    assert after == before


def test_ranges_whose_thread_launched_or_copied_are_the_ones_that_worked(data_dir) -> None:
    """``worked``: the range's own thread launched or copied while it was open. The server's main thread, waiting
    on its workers inside ``serve_threads``, did neither; its bulk copies' ranges did, with no launch."""
    ranges, _, _ = _ranges(data_dir / "attach_h200_serve")
    worked = ranges.groupby("name", observed=True)["worked"].all()
    assert not worked["serve_threads"] and worked[["bulk_h2d", "bulk_d2h", "copy", "preprocess", "model"]].all()
    launches = ranges.groupby("name", observed=True)[["eager_launches", "graph_launches"]].sum().sum(axis=1)
    assert (launches[["bulk_h2d", "bulk_d2h", "copy", "preprocess"]] == 0).all()


@pytest.mark.parametrize("folder", ["attach_h200x4_dense", "attach_h200_serve"])
def test_worked_is_what_the_ranges_own_thread_did_from_its_push_to_its_pop(data_dir, folder) -> None:
    """``worked`` against the events themselves, thread by thread: any event after the range's own push, to its pop,
    naming a device launched or copied on. A push's devices are what its thread did before it, so a range whose work
    came just before a child opened (emit_nvtx's ``aten::layer_norm`` around an ``aten::empty``) worked."""
    s = Session.load(data_dir / folder)
    ranges = attribution.process_ranges(s.events, s.meta.get("gpus", []))
    want = np.zeros(len(ranges), bool)
    for (pid, tid), ev in s.events.groupby(["pid", "tid"]):
        t = ev["t_ns"].to_numpy(np.int64)
        did = np.concatenate([[0], np.cumsum(ev["devmask"].to_numpy(np.uint64) != 0)])
        mine = np.flatnonzero(((ranges["pid"] == pid) & (ranges["tid"] == tid) & (ranges["kind"] == "push")).to_numpy())
        first = np.searchsorted(t, ranges["t_start_ns"].to_numpy(np.int64)[mine], "left") + 1  # (past its push)
        last = np.searchsorted(t, ranges["t_end_ns"].to_numpy(np.int64)[mine], "right")
        want[mine] = did[np.maximum(last, first)] > did[first]
    push = (ranges["kind"] == "push").to_numpy()
    assert (ranges["worked"].to_numpy()[push] == want[push]).all()
    assert want[push].any() and not want[push].all()
