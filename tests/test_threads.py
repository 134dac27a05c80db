"""Which threads' launches a push/pop range counts (pcietrace/analysis/threads.py): its own thread's, and those
its process's other threads made while it was open outside their own ranges; on CONSTRUCTED events (each event
carries its thread's and its process's cumulative counts, as the injection library writes them) and on real
recordings of PyTorch training steps, whose backward pass PyTorch launches from its autograd threads."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcietrace.analysis import analyze, attribution, threads
from pcietrace.session import Session


def _events(rows: list[tuple[int, int, str, str, int]]) -> pd.DataFrame:
    """CONSTRUCTED: (t_ns, tid, push/pop/launch, name, launches) rows of one process; "launch" rows only count
    (a thread's launches between its events), depth from each thread's pushes and pops."""
    thread: dict[int, int] = {}
    depth: dict[int, int] = {}
    process = 0
    out = []
    for t, tid, kind, name, n in rows:
        thread[tid] = thread.get(tid, 0) + n
        process += n
        if kind == "launch":
            continue
        d = depth.get(tid, 0)
        depth[tid] = d + 1 if kind == "push" else d - 1
        out.append({"t_ns": t, "tid": tid, "event": kind, "domain": "default", "id": 0,
                    "depth": d if kind == "push" else d - 1, "eager_thread": thread[tid], "graph_thread": 0,
                    "eager_process": process, "graph_process": 0, "message": name if kind == "push" else "",
                    "pid": 7})
    return pd.DataFrame(out)


def _launches(rows: list[tuple[int, int, str, str, int]]) -> dict[str, int]:
    r = attribution.ranges_from_events(_events(rows))
    return dict(zip(r["name"].astype(str), r["eager_launches"].astype(int)))


def test_a_thread_with_no_range_launches_for_the_ranges_open_on_others() -> None:
    """PyTorch's autograd thread (no NVTX) launches the backward pass while the calling thread waits in it."""
    got = _launches([(0, 1, "push", "step", 0), (10, 1, "push", "forward", 0), (20, 1, "launch", "", 30),
                     (30, 1, "pop", "", 0), (40, 1, "push", "backward", 0), (45, 1, "launch", "", 1),
                     (50, 2, "launch", "", 60), (60, 1, "pop", "", 0), (70, 1, "pop", "", 0),
                     (80, 2, "launch", "", 5), (90, 1, "push", "after", 0), (95, 1, "pop", "", 0)])
    assert got == {"forward": 30, "backward": 61, "step": 91, "after": 0}  # (the 5 came before it opened)


def test_the_autograd_engine_s_own_ranges_count_for_the_thread_that_waits() -> None:
    """Under emit_nvtx the engine's thread opens ranges of its own (autograd::engine::evaluate_function: ...):
    each counts its own launches, and the calling thread's range around them counts them too."""
    node = "autograd::engine::evaluate_function: AddmmBackward0"
    got = _launches([(0, 1, "push", "emit_train", 0), (5, 1, "launch", "", 2), (10, 2, "push", node, 0),
                     (20, 2, "launch", "", 7), (30, 2, "pop", "", 0), (40, 2, "push", node + "x", 0),
                     (45, 2, "launch", "", 3), (50, 2, "pop", "", 0), (60, 1, "pop", "", 0)])
    assert got == {node: 7, node + "x": 3, "emit_train": 12}


def test_side_by_side_threads_count_their_own() -> None:
    """Each thread's range open across the other's edges: which launches were made for which cannot be told,
    so each keeps its own thread's (its _process figure counts both)."""
    ev = _events([(0, 1, "push", "a", 0), (10, 2, "push", "b", 0), (20, 1, "launch", "", 3),
                  (30, 2, "launch", "", 4), (40, 1, "pop", "", 0), (50, 2, "pop", "", 0)])
    r = attribution.ranges_from_events(ev).set_index("name")
    assert r.loc["a", "eager_launches"] == 3 and r.loc["b", "eager_launches"] == 4
    assert r.loc["a", "eager_launches_process"] == 7 and r.loc["b", "eager_launches_process"] == 7


def test_workers_own_ranges_inside_a_range_stay_theirs() -> None:
    """A thread that opens and closes its ranges inside another's (the C++ blind app's workers, joined by the
    main thread): its launches in them are its ranges', its launches between them the enclosing range's."""
    got = _launches([(0, 1, "push", "join", 0), (10, 2, "push", "work", 0), (20, 2, "launch", "", 25),
                     (30, 2, "pop", "", 0), (35, 2, "launch", "", 2), (40, 3, "push", "work2", 0),
                     (45, 3, "launch", "", 5), (50, 3, "pop", "", 0), (60, 1, "pop", "", 0)])
    assert got == {"work": 25, "work2": 5, "join": 2}


@pytest.mark.parametrize("rec", ["attach_h200x4_dense", "attach_h200x2_pipeline"])
def test_a_training_step_counts_its_backward_pass(data_dir, rec) -> None:
    """Real recordings of PyTorch training steps (tests/apps/dense_app.py under torchrun, pipeline_app.py on two
    GPUs): each rank's backward pass was launched by autograd's thread, which opens no range; `backward` and
    the step around it now count those launches, as the process's count does."""
    inst = analyze(Session.load(data_dir / rec))["range_instances"]
    for name in ("backward", "train_step" if rec == "attach_h200x4_dense" else "step"):
        calls = inst[inst["name"] == name]
        assert len(calls) and (calls["eager_launches"] == calls["eager_launches_process"]).all()
    back = inst[inst["name"] == "backward"]
    assert (back["eager_launches"] > 10).all()  # (the calling thread itself made 1-2 a call)


@st.composite
def _runs(draw) -> list[tuple[int, int, str, str, int]]:
    """CONSTRUCTED: 2-3 threads of one process, each a random walk of pushes (some named as the autograd
    engine's), pops and launches, interleaved in time; every range closed."""
    rows, depth = [(0, 1, "push", "r0", 0)], {1: 1}
    t = 0
    for _ in range(draw(st.integers(4, 40))):
        tid = draw(st.integers(1, 3))
        t += draw(st.integers(1, 5))
        kind = draw(st.sampled_from(["push", "pop", "launch", "launch"]))
        if kind == "pop" and not depth.get(tid):
            kind = "launch"
        if kind == "push":
            depth[tid] = depth.get(tid, 0) + 1
            engine = tid == 3 and draw(st.booleans())
            rows.append((t, tid, "push", f"{threads.ENGINE_PREFIX}: x{t}" if engine else f"r{t}", 0))
        elif kind == "pop":
            depth[tid] -= 1
            rows.append((t, tid, "pop", "", 0))
        else:
            rows.append((t, tid, "launch", "", draw(st.integers(1, 9))))
    for tid, d in depth.items():
        for _ in range(d):
            t += 1
            rows.append((t, tid, "pop", "", 0))
    return rows


def _by_hand(rows: list[tuple[int, int, str, str, int]]) -> dict[str, int]:
    """The rule read literally, range by range: its own thread's launches, plus every other thread's made while
    it was open outside their outermost ranges that lie inside it, unless another thread's outermost range
    (not the engine's) overlaps it without lying inside it."""
    launches = [(t, tid, n) for t, tid, kind, _, n in rows if kind == "launch"]
    spans, stack, depth = [], {}, {}
    for t, tid, kind, name, _ in rows:
        if kind == "push":
            stack.setdefault(tid, []).append((name, t, depth.get(tid, 0)))
            depth[tid] = depth.get(tid, 0) + 1
        elif kind == "pop":
            name, a, d = stack[tid].pop()
            depth[tid] -= 1
            spans.append((name, tid, a, t, d))
    top = {}
    for name, tid, a, b, d in spans:
        if d == 0:
            top.setdefault(tid, []).append((a, b, name))
    engine = {tid for tid, r in top.items() if all(n.startswith(threads.ENGINE_PREFIX) for _, _, n in r)}
    out = {}
    for name, tid, a, b, _ in spans:
        own = sum(n for t, who, n in launches if who == tid and a < t < b)
        others = [(t, who, n) for t, who, n in launches if who != tid and a < t < b]
        theirs = [(x, y, who) for who, r in top.items() if who != tid and who not in engine for x, y, _ in r]
        if any(x < b and y > a and not (a <= x and y <= b) for x, y, _ in theirs):
            out[name] = own
            continue
        out[name] = own + sum(n for t, who, n in others
                              if not any(w == who and x < t < y for x, y, w in theirs))
    return out


@settings(max_examples=150, deadline=None)
@given(_runs())
def test_the_counts_are_the_rule_read_range_by_range(rows) -> None:
    """The vectorised counts (each thread's outermost ranges searched once per thread) against the rule applied
    to each range by hand, on CONSTRUCTED interleavings of threads, nesting and the engine's ranges."""
    assert _launches(rows) == _by_hand(rows)
