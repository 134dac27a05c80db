"""Idle-aware sampling (attach): the injection library counts the ranges open right now in the edge page, and
the sampler reads fast only while one is open (or pcietrace holds the fast rate), slowly otherwise."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pandas as pd
import pytest

from fake_nvml import FakeCounterReader
from pcietrace.collectors import edges
from pcietrace.collectors.sampler import CounterSampler, _child_main
from pcietrace.errors import UsageError

#: Run under the real nvtx package with the injection library: each NVTX call, then the page's words
#: (sequence number, open ranges) as the library left them.
NVTX_SCRIPT = """
import ctypes, json, mmap, sys, threading
import nvtx
f = open(sys.argv[1], "r+b")
w = (ctypes.c_uint32 * 4).from_buffer(mmap.mmap(f.fileno(), 4096))
seen = []
def note(what):
    seen.append([what, w[0], w[1]])
note("start")
nvtx.push_range("a"); note("push a")
nvtx.push_range("b", domain="d"); note("push b")
nvtx.pop_range(domain="d"); note("pop b")
nvtx.pop_range(); note("pop a")
nvtx.pop_range(); note("pop at depth 0")
r = nvtx.start_range("s"); note("start s")
nvtx.end_range((r[0] + 1000, r[1])); note("end of an unknown id")
nvtx.end_range(r); note("end s")
nvtx.end_range(r); note("end s again")
nvtx.push_range("held"); note("push held")
t = threading.Thread(target=nvtx.pop_range); t.start(); t.join(); note("pop on a thread with depth 0")
nvtx.pop_range(); note("pop held")
nvtx.push_range("left open"); nvtx.start_range("never ended"); note("left open at exit")
print(json.dumps({"seen": seen, "counting": w[3]}))
"""


def _under_the_library(tmp_path, script: str, **env: str) -> tuple[subprocess.CompletedProcess, np.ndarray]:
    """``script`` (argument: the edge page) run with the real injection library under NVTX's hook; its result
    and the page's first two words (sequence number, open ranges) after it exited."""
    pytest.importorskip("nvtx")
    from pcietrace.record.trace import injection_library

    try:
        lib = injection_library()
    except UsageError:
        pytest.skip("the injection library is not built (python3 setup.py build_ext --inplace)")
    page = edges.create()
    try:
        proc = subprocess.run([sys.executable, "-c", script, page], capture_output=True, text=True, timeout=30,
                              env=dict(os.environ, NVTX_INJECTION64_PATH=lib, PCIETRACE_TRACE_DIR=str(tmp_path),
                                       PCIETRACE_EDGE_FILE=page, **env))
        with open(page, "rb") as f:
            return proc, np.frombuffer(f.read(8), np.uint32)
    finally:
        os.unlink(page)


def test_injection_library_counts_open_ranges_through_real_nvtx(tmp_path) -> None:
    proc, after_exit = _under_the_library(tmp_path, NVTX_SCRIPT)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    seen = doc["seen"]
    assert doc["counting"] == 1  # the library says it keeps the count
    opened = {what: n for what, _, n in seen}
    # push, push, pop, pop: a thread counts once while its outermost range is open; a pop at depth 0 keeps 0
    assert [n for _, _, n in seen[:6]] == [0, 1, 1, 1, 0, 0]
    assert opened["start s"] == 1 and opened["end of an unknown id"] == 1  # an unknown id closes nothing
    assert opened["end s"] == 0 and opened["end s again"] == 0
    assert opened["push held"] == 1 and opened["pop on a thread with depth 0"] == 1 and opened["pop held"] == 0
    # ranges left open by a process that exits normally are closed with it (and the samplers woken)
    assert opened["left open at exit"] == 2 and after_exit[1] == 0 and after_exit[0] > seen[-1][1]
    # never negative (the word is unsigned: a negative count would read as ~4e9)
    assert max(n for _, _, n in seen) == 2
    # every range edge (matched or not) bumps the sequence word the samplers wait on, except those nested in the
    # thread's own open range (the samplers are at the fast rate then: at emit_nvtx density no shared word is touched)
    seq = [s for _, s, _ in seen]
    assert [b - a for a, b in zip(seq, seq[1:])] == [1, 0, 0] + [1] * (len(seq) - 5) + [2]  # the last note: 2 edges


SLOW_DOMAIN_SCRIPT = """
import ctypes, json, mmap, sys
import nvtx
f = open(sys.argv[1], "r+b")
w = (ctypes.c_uint32 * 4).from_buffer(mmap.mmap(f.fileno(), 4096))
seen = []
nvtx.push_range("init", domain="NCCL"); seen.append(w[1])
nvtx.push_range("step"); seen.append(w[1])
nvtx.pop_range(); seen.append(w[1])
nvtx.pop_range(domain="NCCL"); seen.append(w[1])
r = nvtx.start_range("a", domain="NCCL"); seen.append(w[1]); nvtx.end_range(r); seen.append(w[1])
print(json.dumps(seen))
"""


def test_ranges_of_slow_domains_do_not_hold_the_fast_rate(tmp_path) -> None:
    # NCCL's own range around its communicator set-up must not keep the samplers fast (attach --slow-domains)
    proc, _ = _under_the_library(tmp_path, SLOW_DOMAIN_SCRIPT, PCIETRACE_SLOW_DOMAINS="other,NCCL")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [0, 1, 0, 0, 0, 0]  # only the default-domain range counted
    proc, _ = _under_the_library(tmp_path, SLOW_DOMAIN_SCRIPT, PCIETRACE_SLOW_DOMAINS="default")
    assert json.loads(proc.stdout) == [1, 1, 1, 0, 1, 0]  # the core API's ranges are domain "default", as in the trace


WAKE_SCRIPT = """
import json, sys, threading, time
import nvtx
from pcietrace.collectors.edges import EdgeWaiter
w = EdgeWaiter(sys.argv[1])
seen = w.seq
def edges():
    time.sleep(0.2); nvtx.push_range("r"); nvtx.pop_range()
threading.Thread(target=edges).start()
t = time.monotonic()
w.wait_until(time.monotonic_ns() + 2_000_000_000, seen)
print(json.dumps({"waited_s": time.monotonic() - t, "edges": (w.seq - seen) % 2**32}))
"""


def test_edges_wake_the_samplers_unless_told_not_to(tmp_path) -> None:
    # PCIETRACE_EDGE_WAKE=0 (bench/attach_overhead_matrix.py's attach-nowake): edges are counted, no waiter is woken
    proc, _ = _under_the_library(tmp_path, WAKE_SCRIPT)
    assert proc.returncode == 0, proc.stderr
    woken = json.loads(proc.stdout)
    proc, _ = _under_the_library(tmp_path, WAKE_SCRIPT, PCIETRACE_EDGE_WAKE="0")
    assert proc.returncode == 0, proc.stderr
    left = json.loads(proc.stdout)
    assert woken["waited_s"] < 1.5 and woken["edges"] >= 1, woken
    assert left["waited_s"] >= 1.9 and left["edges"] == 2, left


NESTED_WAKE_SCRIPT = """
import json, subprocess, sys, threading, time
import nvtx
from pcietrace.collectors.edges import EdgeWaiter
w = EdgeWaiter(sys.argv[1])
nvtx.push_range("outer")
seen, woken = w.seq, w.wakes
def edges():
    time.sleep(0.1)
    nvtx.push_range("thread outer")
    for _ in range(1000):
        nvtx.push_range("inner"); nvtx.pop_range()
    nvtx.pop_range()
    for _ in range(1000):
        nvtx.push_range("inner"); nvtx.pop_range()
th = threading.Thread(target=edges)
th.start()
t = time.monotonic()
w.wait_until(time.monotonic_ns() + 600_000_000, woken=woken)
out = {"thread_waited_s": time.monotonic() - t, "outer_woke": woken}
th.join()
out.update(edges=(w.seq - seen) % 2**32, thread_wakes=(w.wakes - woken) % 2**32)
woken = w.wakes
t = time.monotonic()
other = subprocess.Popen([sys.executable, "-c", "import nvtx, time; time.sleep(0.3); nvtx.push_range('r'); nvtx.pop_range()"])
w.wait_until(time.monotonic_ns() + 20_000_000_000, woken=woken)
out.update(process_waited_s=time.monotonic() - t, process_wakes=(w.wakes - woken) % 2**32)
other.wait()
print(json.dumps(out))
nvtx.pop_range()
"""


def test_only_a_range_opening_in_a_process_with_none_open_wakes_the_samplers(tmp_path) -> None:
    # nested edges (emit_nvtx density: thousands per step) and ranges of a second thread (PyTorch's autograd
    # thread) while the process has one open wake nobody: a sampler inside a range reads at its own pace. A
    # range opening in another process (another rank) wakes them although this one has a range open
    proc, _ = _under_the_library(tmp_path, NESTED_WAKE_SCRIPT)
    assert proc.returncode == 0, proc.stderr
    nested = json.loads(proc.stdout)
    # (nested pairs touch no shared word: the thread's outer push and pop and its 1,000 outermost pairs do)
    assert nested["outer_woke"] == 1 and nested["edges"] == 2002 and nested["thread_wakes"] == 0, nested
    assert nested["thread_waited_s"] >= 0.55, nested
    assert nested["process_wakes"] == 1 and nested["process_waited_s"] < 15, nested


@pytest.mark.skipif(edges._SYS_FUTEX is None, reason="futex syscall number unknown on this machine")
def test_dense_edges_never_read_faster_than_the_interval(monkeypatch) -> None:
    # an edge every ~20 us inside an open range (a range per op) must not bring the reads closer than the
    # sampling interval: the sampler's own traffic stays bounded by time, not by the number of edges
    page = edges.create()

    def app(words, edge) -> None:
        words[edges.COUNTING] = 1
        words[edges.OPEN_RANGES] += 1
        edge()
        end = time.monotonic_ns() + 150_000_000
        while time.monotonic_ns() < end:
            edge()
            time.sleep(20e-6)
        words[edges.OPEN_RANGES] -= 1

    try:
        t = _sample_in_this_process(monkeypatch, page, interval_ms=2.0, idle_ms=5.0, app=app)
    finally:
        os.unlink(page)
    gap = np.diff(t)
    assert gap.size > 20  # the range was read throughout
    assert np.percentile(gap, 5) >= 1.9e6, np.percentile(gap, [0, 5, 50])


#: Timing claims (gaps, wake-ups) hold on the best of a few attempts: the suite may share a small machine with
#: other jobs, and a sampler starved of CPU reads late through no fault of its own. Everything else must hold
#: on every attempt.
ATTEMPTS = 5


def _best_of(measure) -> None:
    """Run ``measure`` (returns a dict of timing check -> passed) until every check passes, at most ATTEMPTS times,
    a pause between tries (a burst of other work on a loaded machine, which delays a thread's wake-up by tens of
    ms, outlasted three tries back to back)."""
    failed: list[str] = []
    for attempt in range(ATTEMPTS):
        time.sleep(0.3 * attempt)
        failed = [name for name, ok in measure().items() if not ok]
        if not failed:
            return
    pytest.fail(f"timing checks failed {ATTEMPTS} times: {failed}")


def _sample_in_this_process(monkeypatch, page: str, interval_ms: float, idle_ms: float, app,
                            reader: type = FakeCounterReader, quiet_ms: float = 0.0) -> np.ndarray:
    """Run one GPU's sampling loop (the body of a sampler child) here with a fake NVML, while ``app`` (run on a
    thread with the page's words, a mark function and the stop event) plays the traced program; returns the
    read times (ns)."""
    from pcietrace.collectors import nvml

    monkeypatch.setattr(nvml, "CounterReader", reader)
    out: queue.Queue = queue.Queue()
    stop, pause = threading.Event(), threading.Event()
    with open(page, "r+b") as f:
        mm = mmap.mmap(f.fileno(), edges.PAGE)
    words = (ctypes.c_uint32 * 5).from_buffer(mm)
    libc = ctypes.CDLL(None)

    def edge(wake: bool = True) -> None:  # what the injection library does at an edge: bump the sequence and,
        words[edges.SEQ] += 1              # where it can change a sampler's pace, wake the waiters
        if wake:
            words[edges.WAKES] += 1
            libc.syscall(edges._SYS_FUTEX, ctypes.byref(words, 4 * edges.WAKES), edges._FUTEX_WAKE, 2**31 - 1,
                         None, None, 0)

    def run_app() -> None:
        try:
            app(words, edge)
        finally:
            stop.set()
            edge()  # as CounterSampler.stop does

    before = signal.getsignal(signal.SIGINT)  # the loop ignores SIGINT (as a child must): restore it for pytest
    th = threading.Thread(target=run_app)
    th.start()
    try:
        _child_main(0, None, int(interval_ms * 1e6), page, 1.0, out, stop, pause, int(idle_ms * 1e6),
                    int(quiet_ms * 1e6))
    finally:
        signal.signal(signal.SIGINT, before)
        th.join()
        words = None  # release the buffer export before closing the map
        mm.close()
    msgs = [out.get_nowait() for _ in range(out.qsize())]
    assert msgs[-1][0] == "done"
    return np.concatenate([m[2] for m in msgs if m[0] == "chunk"])


BACK_TO_BACK_SCRIPT = """
import json, sys
import nvtx
from pcietrace.collectors.edges import EdgeWaiter
w = EdgeWaiter(sys.argv[1])
nvtx.push_range("first"); nvtx.pop_range()
woken = w.wakes
for _ in range(1000):
    nvtx.push_range("op"); nvtx.pop_range()
print(json.dumps({"wakes": (w.wakes - woken) % 2**32}))
"""


def test_every_waking_edge_bumps_the_word_though_system_calls_are_spaced(tmp_path) -> None:
    # ranges back to back with none enclosing them (a range per op, no step range): each push wakes, the library
    # makes at most one system call per 0.1 ms, and a sampler that was not woken by the call sees the word moved
    # before it waits again
    proc, _ = _under_the_library(tmp_path, BACK_TO_BACK_SCRIPT)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["wakes"] == 1000


@pytest.mark.skipif(edges._SYS_FUTEX is None, reason="futex syscall number unknown on this machine")
def test_sampler_reads_fast_only_while_a_range_is_open_and_wakes_at_an_edge(monkeypatch) -> None:
    _best_of(lambda: _fast_only_in_ranges(monkeypatch))


def _fast_only_in_ranges(monkeypatch) -> dict[str, bool]:
    page = edges.create()
    marks: dict[str, int] = {}

    def app(words, edge) -> None:
        time.sleep(0.06)                                   # no library counts ranges yet: fast rate
        words[edges.COUNTING] = 1                          # the injection library maps the page
        marks["counting"] = time.monotonic_ns()
        edge()
        time.sleep(0.12)                                   # no range open: idle rate
        words[edges.OPEN_RANGES] += 1
        marks["push"] = time.monotonic_ns()
        edge()
        time.sleep(0.06)                                   # a range open: fast rate
        words[edges.OPEN_RANGES] -= 1
        marks["pop"] = time.monotonic_ns()
        edge()
        time.sleep(0.12)                                   # idle again
        words[edges.FORCE_FAST] = 1                        # pcietrace holds the fast rate (idle windows)
        marks["hold"] = time.monotonic_ns()
        edge()
        time.sleep(0.06)
        marks["stop"] = time.monotonic_ns()

    try:
        t = _sample_in_this_process(monkeypatch, page, interval_ms=1.0, idle_ms=20.0, app=app)
    finally:
        os.unlink(page)
    gap = np.diff(t)
    start = t[:-1]
    uncounted = start < marks["counting"]
    idle = ((start > marks["counting"]) & (start < marks["push"])) | ((start > marks["pop"]) & (start < marks["hold"]))
    open_ = (start > marks["push"]) & (start < marks["pop"])
    held = start > marks["hold"]
    checks = {
        # idle: ~20 ms apart; with the range open (and while held fast): ~1 ms apart
        "idle ~20 ms": 15e6 < np.median(gap[idle]) < 30e6,
        "open ~1 ms": np.median(gap[open_]) < 3e6 and open_.sum() > 15,
        "held ~1 ms": np.median(gap[held]) < 3e6,
        "fast before a counting library maps the page": np.median(gap[uncounted]) < 3e6,
        # the stop: the last read (after the loop) follows it at once
        "stop wakes": t[-1] - marks["stop"] < 5e6,
    }
    # the push, the pop and the hold each woke the sampler at once, not at the end of its 20 ms wait
    for what in ("push", "pop", "hold"):
        checks[f"{what} wakes"] = t[np.searchsorted(t, marks[what])] - marks[what] < 5e6
    return checks


class CopyingReader(FakeCounterReader):
    """A stand-in reader whose counters move at 10 GB/s while ``copying`` (a bulk copy outside any range, far
    above BUSY_BPS whatever the read rate; the slowest in the real 2x H200 copy ranges was 8 GB/s), else 1 B per
    read, wrapping at 32 bits."""

    copying = False

    def read(self) -> tuple[int, int]:
        t, last = time.monotonic_ns(), getattr(self, "t", None)
        moved = int(10 * (t - last)) if CopyingReader.copying and last is not None else 1  # 10 B/ns = 10 GB/s
        self.t, self.v = t, (getattr(self, "v", 0) + moved) % 2**32
        return self.v, self.v


def test_a_copy_outside_ranges_holds_the_fast_rate_until_it_ends(monkeypatch) -> None:
    """No range open: the counters moving faster than BUSY_BPS keep the sampler at its fast rate, so a range
    that opens right after a copy has a recent sample before its edge; when they stop moving it reads slowly."""
    monkeypatch.setattr(CopyingReader, "copying", False)
    _best_of(lambda: _fast_while_copying(monkeypatch))


def _fast_while_copying(monkeypatch) -> dict[str, bool]:
    page = edges.create()
    marks: dict[str, int] = {}

    def app(words, edge) -> None:
        words[edges.COUNTING] = 1
        edge()
        time.sleep(0.12)                                    # idle: slow
        CopyingReader.copying = True
        marks["copy"] = time.monotonic_ns()
        time.sleep(0.1)                                     # a copy, no range open: fast from its first read
        CopyingReader.copying = False
        marks["done"] = time.monotonic_ns()
        time.sleep(0.12)                                    # idle again: slow

    try:
        t = _sample_in_this_process(monkeypatch, page, interval_ms=1.0, idle_ms=20.0, app=app, reader=CopyingReader)
    finally:
        os.unlink(page)
        CopyingReader.copying = False
    gap, start = np.diff(t), t[:-1]
    before = start < marks["copy"]
    # from the first read that saw the copy (one idle interval at most) to its end
    seen = t[np.searchsorted(t, marks["copy"])]
    copying = (start > seen) & (start < marks["done"])
    after = start > marks["done"] + 25e6  # the read that sees the end is one fast interval late
    return {"idle ~20 ms before": 15e6 < np.median(gap[before]) < 30e6,
            "fast while copying": copying.sum() > 30 and np.median(gap[copying]) < 3e6,
            "idle ~20 ms after": 15e6 < np.median(gap[after]) < 30e6}


def test_an_open_range_is_read_at_the_quiet_pace_unless_the_link_is_busy(monkeypatch) -> None:
    """A range open with only launches (the link < BUSY_BPS): read every quiet interval however dense its nested
    edges; a copy inside it brings back the fast interval from the read that sees it, until it ends."""
    monkeypatch.setattr(CopyingReader, "copying", False)
    _best_of(lambda: _quiet_in_ranges(monkeypatch))


def _quiet_in_ranges(monkeypatch) -> dict[str, bool]:
    page = edges.create()
    marks: dict[str, int] = {}

    def app(words, edge) -> None:
        words[edges.COUNTING] = 1
        words[edges.OPEN_RANGES] += 1
        edge()
        marks["open"] = time.monotonic_ns()
        end = marks["open"] + 150_000_000
        while time.monotonic_ns() < end:                   # launches only, a nested edge every ~50 us: quiet
            edge(wake=False)
            time.sleep(50e-6)
        CopyingReader.copying = True
        marks["copy"] = time.monotonic_ns()
        time.sleep(0.1)                                     # a copy inside the range: fast
        CopyingReader.copying = False
        marks["done"] = time.monotonic_ns()
        time.sleep(0.1)                                     # launches only again: quiet
        words[edges.OPEN_RANGES] -= 1
        edge(wake=False)
        words[edges.OPEN_RANGES] += 1
        edge()                                              # the next range opening as the last one closed
        marks["reopen"] = time.monotonic_ns()
        time.sleep(0.03)
        words[edges.OPEN_RANGES] -= 1

    try:
        t = _sample_in_this_process(monkeypatch, page, interval_ms=1.0, idle_ms=20.0, app=app, reader=CopyingReader,
                                    quiet_ms=5.0)
    finally:
        os.unlink(page)
        CopyingReader.copying = False
    gap, start = np.diff(t), t[:-1]
    quiet = (start > marks["open"]) & (start < marks["copy"] - 5e6)
    seen = t[np.searchsorted(t, marks["copy"])]
    copying = (start > seen) & (start < marks["done"])
    after = (start > marks["done"] + 10e6) & (start < marks["reopen"] - 5e6)
    return {"a range opening as the last one closed wakes": t[np.searchsorted(t, marks["reopen"])] - marks["reopen"] < 2e6,
            "quiet ~5 ms in the range": quiet.sum() > 15 and 4.5e6 < np.median(gap[quiet]) < 8e6,
            "no quiet gap under the interval": np.percentile(gap[quiet], 5) >= 4.5e6,
            "fast while copying": copying.sum() > 30 and np.median(gap[copying]) < 3e6,
            "quiet again after": after.sum() > 8 and 4.5e6 < np.median(gap[after]) < 8e6}


class FailingAfterCopyReader(CopyingReader):
    """A copying stand-in whose reads fail (NVML's own error: None) while ``failing``; every call's time kept."""

    failing = False
    calls: list[int] = []

    def read(self) -> tuple[int, int] | None:
        FailingAfterCopyReader.calls.append(time.monotonic_ns())
        return None if FailingAfterCopyReader.failing else super().read()


def test_reads_that_fail_after_a_copy_do_not_hold_the_fast_rate(monkeypatch) -> None:
    """A copy outside any range holds the fast rate; reads that then keep failing say nothing about the link, so
    the sampler goes back to its idle rate (was: the last good read's 'busy' held the fast rate for as long as
    the reads failed, 20x the NVML calls on a GPU whose reads fail)."""
    monkeypatch.setattr(CopyingReader, "copying", False)
    monkeypatch.setattr(FailingAfterCopyReader, "failing", False)
    _best_of(lambda: _idle_while_failing(monkeypatch))


def _idle_while_failing(monkeypatch) -> dict[str, bool]:
    page = edges.create()
    marks: dict[str, int] = {}
    FailingAfterCopyReader.calls = []

    def app(words, edge) -> None:
        words[edges.COUNTING] = 1
        edge()
        CopyingReader.copying = True
        time.sleep(0.06)                                    # a copy, no range open: fast
        FailingAfterCopyReader.failing = True
        marks["fail"] = time.monotonic_ns()
        time.sleep(0.2)                                     # every read fails: idle rate
        FailingAfterCopyReader.failing = CopyingReader.copying = False

    try:
        _sample_in_this_process(monkeypatch, page, interval_ms=1.0, idle_ms=20.0, app=app,
                                reader=FailingAfterCopyReader)
    finally:
        os.unlink(page)
        CopyingReader.copying = FailingAfterCopyReader.failing = False
    calls = np.array(FailingAfterCopyReader.calls)
    gap, start = np.diff(calls), calls[:-1]
    copying, failing = start < marks["fail"], (start > marks["fail"] + 5e6) & (start < marks["fail"] + 190e6)
    return {"fast while copying": np.median(gap[copying]) < 3e6,
            "idle ~20 ms while the reads fail": failing.sum() > 3 and 15e6 < np.median(gap[failing]) < 30e6}


def test_without_an_edge_file_a_stop_cuts_a_long_wait_short(monkeypatch) -> None:
    """`pcietrace run` (no edge file): a 1 s sampling interval, stopped 50 ms in, must not wait out the second."""
    from pcietrace.collectors import nvml

    monkeypatch.setattr(nvml, "CounterReader", FakeCounterReader)
    out: queue.Queue = queue.Queue()
    stop, pause = threading.Event(), threading.Event()
    timer = threading.Timer(0.05, stop.set)
    before = signal.getsignal(signal.SIGINT)
    t0 = time.monotonic_ns()
    timer.start()
    try:
        _child_main(0, None, 1_000_000_000, None, 1.0, out, stop, pause, 5_000_000)
    finally:
        signal.signal(signal.SIGINT, before)
        timer.cancel()
    assert time.monotonic_ns() - t0 < 0.5e9
    assert [m for m in (out.get_nowait() for _ in range(out.qsize())) if m[0] == "done"]


def test_idle_interval_is_validated() -> None:
    for bad in (-1, 20_000_001):
        with pytest.raises(UsageError, match="idle"):
            CounterSampler([0], idle_interval_ns=bad)
        with pytest.raises(UsageError, match="quiet"):
            CounterSampler([0], quiet_interval_ns=bad)
    assert CounterSampler([0], idle_interval_ns=0).idle_interval_ns == 0  # 0 = off


def test_attach_option_bad_values_are_one_line_exit_2(capsys) -> None:
    from pcietrace.cli import main

    for option in ("--idle-sample-interval-ms", "--quiet-sample-interval-ms"):
        for bad in ("25", "-1", "nan"):
            with pytest.raises(SystemExit) as exc:
                main(["attach", option, bad, "--", "true"])
            assert exc.value.code == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and option in err and "Traceback" not in err


def _idle_aware_trace() -> tuple[pd.DataFrame, pd.DataFrame]:
    """CONSTRUCTED (not measured): one GPU read every 5 ms while no range is open and every 0.5 ms while
    one is, with a read right after each push and pop, as the idle-aware sampler does; 1 GB/s of steady
    traffic, so every interval's bytes are known."""
    ranges = pd.DataFrame({"t_start_ns": [20_000_000, 60_100_000], "t_end_ns": [30_000_000, 62_100_000]})
    in_ranges = {int(x) for a, b in zip(ranges["t_start_ns"], ranges["t_end_ns"]) for x in range(a + 50_000, b, 500_000)}
    t = sorted(set(range(0, 100_000_000, 5_000_000)) | in_ranges | {int(b) + 50_000 for b in ranges["t_end_ns"]})
    t = np.array(t, np.int64)
    cum = pd.DataFrame({"nvml_index": 0, "t_ns": t, "rx_bytes": t.astype(float), "tx_bytes": t / 2.0})
    return cum, ranges


def test_idle_gaps_are_not_stalls_but_a_stall_inside_a_range_still_is() -> None:
    from pcietrace.analysis import attribution

    cum, ranges = _idle_aware_trace()
    one_rate = attribution.sampling_gaps(cum)[0]
    assert one_rate["stall"].any()  # read as one rate, the 5 ms idle gaps look like stalls
    gp = attribution.sampling_gaps(cum, idle_ns=5_000_000, ranges=ranges)[0]
    assert not gp["stall"].any() and gp["median_ns"] == 500_000
    # a 3 ms hole inside the first range is a stall all the same
    holed = cum[~cum["t_ns"].between(24_000_000, 26_900_000)].reset_index(drop=True)
    gp = attribution.sampling_gaps(holed, idle_ns=5_000_000, ranges=ranges)[0]
    assert gp["stall"].sum() == 1
    t = gp["t"][:-1][gp["stall"]]
    assert 20_000_000 < t[0] < 30_000_000


def test_a_gap_is_a_stall_by_the_pace_the_sampler_kept_there() -> None:
    """CONSTRUCTED (not measured): reads every 0.5 ms with one 3 ms hole, inside a range. Launches only (the
    link far below BUSY_BPS): the sampler's quiet pace (2 ms) allows up to twice that, no stall. During a copy
    (10 GB/s) it was meant to read every 0.5 ms: the hole is a stall."""
    from pcietrace.analysis import attribution

    t = np.r_[np.arange(0, 10_000_000, 500_000), np.arange(13_000_000, 20_000_000, 500_000)].astype(np.int64)
    ranges = pd.DataFrame({"t_start_ns": [0], "t_end_ns": [20_000_000]})
    for bps, stalls in ((10e9, 1), (1e7, 0)):
        y = t * bps / 1e9
        cum = pd.DataFrame({"nvml_index": 0, "t_ns": t, "tx_bytes": y, "rx_bytes": y, "read_ns": 300_000,
                            "jump": False})
        gp = attribution.sampling_gaps(cum, idle_ns=5_000_000, ranges=ranges, quiet_ns=2_000_000)[0]
        assert gp["stall"].sum() == stalls, bps
        assert attribution.sampling_gaps(cum, idle_ns=5_000_000, ranges=ranges)[0]["stall"].sum() == 1  # one pace


def test_floor_counts_reads_where_the_read_rate_varies() -> None:
    """Per-read floor under idle-aware sampling: each range is charged the reads it holds, so a range read
    every 0.5 ms carries ten times the per-read bytes of the same time read every 5 ms."""
    from pcietrace.analysis import attribution

    cum, ranges = _idle_aware_trace()
    per_read = 10_000.0
    floor = pd.DataFrame([{"nvml_index": 0, "status": "per read", "windows": 4, "reads_per_s": 2000.0,
                           "h2d_bytes_per_read": per_read, "d2h_bytes_per_read": 0.0, "h2d_background_Bps": 0.0,
                           "d2h_background_Bps": 0.0, "h2d_Bps": 0.0, "d2h_Bps": 0.0}])
    rg = ranges.assign(kind="start", pid=1, tid=1, depth=0, gpus=[[0], [0]])
    gaps = attribution.sampling_gaps(cum, idle_ns=5_000_000, ranges=ranges)
    at = attribution.attribute(rg, cum, floor, gaps=gaps)
    t = cum["t_ns"].to_numpy()
    reads = [int(((t > a) & (t <= b)).sum()) for a, b in zip(ranges["t_start_ns"], ranges["t_end_ns"])]
    truth = (ranges["t_end_ns"] - ranges["t_start_ns"]).to_numpy(float)  # 1 byte per ns
    np.testing.assert_allclose(at["h2d_bytes"], truth - per_read * np.array(reads), rtol=1e-9)
    assert (at["stalls"] == 0).all() and (at["status"] == "ok").all()


def test_sampler_processes_follow_the_page_and_the_held_fast_rate() -> None:
    """The real CounterSampler (spawned child processes, a stand-in counter reader: no driver here): ~10 ms
    between reads with no range open, ~1 ms while held fast (attach's idle windows) or while a range is
    open, none while paused; stop() returns promptly."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]

    def measure() -> dict[str, bool]:
        proc = subprocess.run([sys.executable, str(root / "tests" / "apps" / "sampler_fake_nvml.py")], cwd=root,
                              env=dict(os.environ, PYTHONPATH=str(root)), capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        res = json.loads(proc.stdout)
        checks = {"stop": res["stop_s"] < 1.0}
        for i, p in enumerate(res["phases"]):
            if p["phase"] == "paused":
                assert p["reads"] == 0, p  # not a matter of timing: no read at all while paused
            else:
                gap = p["median_gap_ms"] or float("inf")
                checks[f"{i} {p['phase']}"] = 8 < gap < 15 if p["phase"] == "idle" else gap < 3 and p["reads"] > 30
        return checks

    _best_of(measure)


@pytest.mark.gpu
def test_real_sampler_processes_follow_open_ranges_and_the_held_fast_rate() -> None:
    """On a GPU (NVML): the sampler child processes read GPU 0 every ~10 ms with no range open, every ~3 ms (the
    quiet pace: only the reads' own traffic) while the page says a range is open, fast while pcietrace holds
    the fast rate (as in attach's idle windows)."""
    page = edges.create()
    s = CounterSampler([0], interval_ns=500_000, edge_file=page, idle_interval_ns=10_000_000,
                       quiet_interval_ns=3_000_000)
    with open(page, "r+b") as f:
        mm = mmap.mmap(f.fileno(), edges.PAGE)
    words = (ctypes.c_uint32 * 4).from_buffer(mm)
    words[edges.COUNTING] = 1  # as the injection library does when it maps the page
    marks = []
    try:
        s.start()
        for phase in ("idle", "held", "idle", "open", "idle"):
            if phase == "held":
                s.hold_fast(True)
            elif phase == "open":
                words[edges.OPEN_RANGES] = 1
                words[edges.SEQ] += 1  # the futex wake is not needed here: the wait ends within 10 ms anyway
            marks.append((phase, time.monotonic_ns()))
            time.sleep(0.2)
            s.hold_fast(False)
            words[edges.OPEN_RANGES] = 0
    finally:
        t = s.stop()["t_ns"].to_numpy()
        del words
        mm.close()
        os.unlink(page)
    ends = marks[1:] + [("end", time.monotonic_ns())]
    # median gap per phase, in ms, skipping each phase's first 20 ms
    medians = [(phase, float(np.median(np.diff(t[(t > a + 20_000_000) & (t < b)]))) / 1e6)
               for (phase, a), (_, b) in zip(marks, ends)]
    print("median gap between reads, ms:", medians)
    for phase, ms in medians:
        assert {"idle": 8 < ms < 15, "open": 2.5 < ms < 4.5, "held": ms < 1.5}[phase], medians


def _thin_like_idle_aware(s, idle_ns: int) -> int:
    """Thin a REAL recording made at one rate (0.5 ms) to what idle-aware sampling would have kept: every
    sample while a range was open or in an idle window (held fast), the first sample after every range edge
    (the wake-up), and otherwise one every ``idle_ns``. Marks the session as recorded that way; returns the
    samples dropped."""
    from pcietrace.analysis import attribution

    ranges = attribution.ranges_from_events(s.events)
    edges_ns = np.sort(np.concatenate([ranges["t_start_ns"], ranges["t_end_ns"]]))
    parts = []
    for _, g in s.samples.groupby("nvml_index"):
        t = g["t_ns"].to_numpy(np.int64)
        must = attribution.open_ranges_at(ranges, t) > 0
        for w in s.windows.itertuples():
            must |= (t >= w.t_start_ns) & (t <= w.t_end_ns)
        must[np.unique(np.clip(np.searchsorted(t, edges_ns), 0, t.size - 1))] = True
        must[[0, -1]] = True
        keep, last = np.zeros(t.size, bool), -(2**62)
        for i in range(t.size):
            if must[i] or t[i] - last >= idle_ns:
                keep[i], last = True, t[i]
        parts.append(g[keep])
    dropped = len(s.samples) - sum(len(p) for p in parts)
    s.samples = pd.concat(parts).reset_index(drop=True)
    s.meta["idle_sample_interval_ms"] = idle_ns / 1e6
    return dropped


@pytest.mark.parametrize("recording", ["attach_h100_python", "recordings/attach-h200x4-torchrun-ddp"])
def test_real_recordings_thinned_to_idle_aware_sampling_keep_their_figures(data_dir, recording) -> None:
    """Real attach recordings (0.5 ms throughout), thinned to what idle-aware sampling keeps (5 ms with no
    range open): every range's counter bytes stay within the stated edge error of the full recording, the
    per-read floor holds, and the idle gaps are not reported as stalls."""
    from pcietrace.analysis import analyze, attribution, counters
    from pcietrace.session import Session

    full = Session.load(data_dir / recording)
    thin = Session.load(data_dir / recording)
    assert _thin_like_idle_aware(thin, 5_000_000) > 0.1 * len(full.samples)  # not a vacuous thinning
    ra, rb = analyze(full), analyze(thin)
    a, b = ra["range_instances"], rb["range_instances"]
    assert len(a) == len(b)
    for d in ("h2d", "d2h"):
        diff = (b[f"{d}_raw_bytes"] - a[f"{d}_raw_bytes"]).abs()
        assert (diff <= a[f"{d}_edge_bytes"] + b[f"{d}_edge_bytes"] + 1e3).all(), d
        ok = (a["status"] == "ok") & (b["status"] == "ok")
        edge = a[f"{d}_edge_bytes"] + b[f"{d}_edge_bytes"]
        assert ((b[f"{d}_bytes"] - a[f"{d}_bytes"]).abs()[ok] <= edge[ok] + 1e4).all()
    # no range is newly marked (the counts of ranges already marked move with the in-range median gap)
    assert not ((b["stalls"] > 0) & (a["stalls"] == 0)).any()
    # ranges shorter than two in-range gaps are the same ones: the idle gaps do not stretch the median
    assert ra["ranges"]["short_calls"].tolist() == rb["ranges"]["short_calls"].tolist()
    # read as one rate, the thinned samples would mark other ranges: idle gaps taken for stalls (mostly in
    # ranges) or, where idle time dominates, the 5 ms median hiding the real stalls inside ranges
    cum = counters.cumulative_bytes(thin.samples, thin.counters)
    one_rate = attribution.attribute(b.drop(columns=["stalls"]), cum, rb["floor"])
    assert ((one_rate["stalls"] > 0) != (b["stalls"] > 0)).any()


#: The traced program: three 20 ms ranges, 40 ms apart, after 50 ms without one.
RANGES_APP = """
import time, nvtx
time.sleep(0.05)
for _ in range(3):
    with nvtx.annotate("work", domain="app"):
        time.sleep(0.02)
    time.sleep(0.04)
"""


def test_attach_end_to_end_reads_fast_in_ranges_slowly_between_and_keeps_the_floor(tmp_path) -> None:
    """`pcietrace attach` with stand-ins for the GPU (tests/apps/attach_fake_gpu.py: every counter read is
    1,000 B of traffic and there is no other): reads ~2 ms apart inside the ranges (the link is quiet), ~0.5 ms
    in the idle windows (held fast), ~5 ms apart between ranges; the per-read floor is
    fitted as 1,000 B and takes every range's bytes to ~0 although its read rate differs from the windows'."""
    pytest.importorskip("nvtx")
    from pathlib import Path

    from pcietrace.analysis import analyze, attribution
    from pcietrace.session import Session

    from injected import injection_library_or_skip

    injection_library_or_skip()
    root = Path(__file__).resolve().parents[1]
    app = tmp_path / "app.py"
    app.write_text(RANGES_APP)
    attempt = iter(range(ATTEMPTS))

    def measure() -> dict[str, bool]:
        out = tmp_path / f"rec{next(attempt)}"
        proc = subprocess.run([sys.executable, str(root / "tests" / "apps" / "attach_fake_gpu.py"), "attach",
                               "--gpu", "0", "--no-calibrate", "--no-count-launches", "--idle-s", "0.1", "-o", str(out),
                               "--json", "--", sys.executable, str(app)],
                              cwd=root, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                  filter(None, [str(root), os.environ.get("PYTHONPATH")]))), capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr[-2000:]
        s = Session.load(out)
        assert s.meta["idle_sample_interval_ms"] == 5.0 and s.meta["quiet_sample_interval_ms"] == 2.0
        ranges = attribution.ranges_from_events(s.events)
        assert len(ranges) == 3
        # the floor: every read is 1,000 B, whatever the read rate, so the fit and the ranges are exact
        res = analyze(s)
        fl = res["floor"].iloc[0]
        assert fl["status"] == "per read" and abs(fl["h2d_bytes_per_read"] - 1000) < 20
        inst = res["range_instances"]
        # (a range over a sampling stall of a loaded machine says "wrap risk": a timing check, below)
        assert inst["status"].isin(["ok", "wrap risk"]).all()
        assert (inst["h2d_bytes"].abs() <= inst["h2d_edge_bytes"] + 2000).all()
        assert abs(res["whole_run"]["h2d_bytes"].item()) < 0.01 * s.samples["t_ns"].size * 1000
        # the rates
        t = s.samples["t_ns"].to_numpy()
        gap, start = np.diff(t), t[:-1]
        # from the first push on: before it the library (loaded by NVTX at its first call) has not mapped the page
        in_app = (start > ranges["t_start_ns"].min()) & (t[1:] < s.meta["t_app_end_ns"])
        open_ = attribution.open_ranges_at(ranges, start) > 0
        held = np.zeros(start.size, bool)
        for w in s.windows[s.windows["sampling"] == "on"].itertuples():
            held |= (start > w.t_start_ns) & (t[1:] < w.t_end_ns)
        # (the wake-up at a push is checked with a 20 ms idle interval above, where it shows)
        return {"no range over a sampling stall": (inst["status"] == "ok").all(),
                "in ranges ~2 ms": 1.8e6 < np.median(gap[in_app & open_]) < 3.5e6,
                "held ~0.5 ms": np.median(gap[held]) < 1.5e6,
                "between ranges ~5 ms": 4e6 < np.median(gap[in_app & ~open_]) < 8e6}

    _best_of(measure)


def test_the_parser_limit_of_the_idle_interval_is_the_sampler_s() -> None:
    from pcietrace.cli import build_parser
    from pcietrace.collectors.sampler import MAX_IDLE_INTERVAL_NS

    limit_ms = MAX_IDLE_INTERVAL_NS / 1e6
    for option in ("idle", "quiet"):
        args = build_parser().parse_args(["attach", f"--{option}-sample-interval-ms", str(limit_ms), "--", "x"])
        assert getattr(args, f"{option}_sample_interval_ms") == limit_ms
        with pytest.raises(SystemExit):
            build_parser().parse_args(["attach", f"--{option}-sample-interval-ms", str(limit_ms * 1.01), "--", "x"])


def _stand_in_processes(monkeypatch, queue_type: type, interrupt_start_of: int | None = None) -> list:
    """Make CounterSampler.start spawn SIMULATED processes that behave as multiprocessing's before and after
    start() (no pid until started; joining one never started fails) and record what was done to them (``state``);
    the one made ``interrupt_start_of``-th (from 0) gets Ctrl-C as it starts. Returns them, as they are made."""
    from pcietrace.collectors import sampler as sampler_mod

    procs: list = []

    class Proc:
        def __init__(self, **kw) -> None:
            self.pid, self.state = None, "new"
            procs.append(self)

        def start(self) -> None:
            if interrupt_start_of is not None and self is procs[interrupt_start_of]:
                raise KeyboardInterrupt
            self.pid, self.state = 4242, "started"

        def join(self, timeout=None) -> None:
            assert self.pid is not None, "can only join a started process"
            self.state = "joined"

        def is_alive(self) -> bool:
            return False

        def kill(self) -> None:
            self.state = "killed"

    class Ctx:
        Process = Proc
        Queue = queue_type
        Event = threading.Event

    monkeypatch.setattr(sampler_mod.mp, "get_context", lambda _: Ctx)
    return procs


def test_a_signal_while_the_samplers_start_leaves_no_sampler_process(monkeypatch) -> None:
    """Ctrl-C (or SIGTERM turned into it) while CounterSampler.start waits for its children's first reads: the
    started children are stopped and reaped before the interrupt propagates, and stop() afterwards is safe
    (SIMULATED processes: stand-ins that record what was done to them)."""
    class Interrupting:
        def get(self, timeout=None):
            raise KeyboardInterrupt

    procs = _stand_in_processes(monkeypatch, Interrupting)
    s = CounterSampler([0, 1], interval_ns=500_000)
    with pytest.raises(KeyboardInterrupt):
        s.start()
    assert [p.state for p in procs] == ["joined", "joined"] and s._stop.is_set()
    assert s.stop().empty  # nothing recorded, and no AttributeError for a drainer never started


@pytest.mark.parametrize("name", ["attach_h100_nocount", "attach_h200x2_threads", "attach_h200x8_torchrun"])
def test_the_reads_own_traffic_never_holds_the_fast_rate(name, data_dir) -> None:
    """Real recordings (H100, 2x and 8x H200): in attach's idle reading windows (no range open, the sampler held
    at its fast rate, so the counters move by the reads' own traffic alone) no pair of consecutive reads counts
    as busy, and neither would back-to-back reads (``--sample-interval-ms 0``: the bytes of a read over its
    shortest duration), so the fast rate a copy holds ends with the copy."""
    from pcietrace.collectors.sampler import BUSY_BPS, _busy
    from pcietrace.session import Session

    s = Session.load(data_dir / name)
    on = s.windows[s.windows["sampling"] == "on"]
    checked = 0
    for g in s.meta["gpus"]:
        c = g["counter"]
        assert c["mode"] == "fields"
        sm = s.samples[s.samples["nvml_index"] == g["nvml_index"]]
        t = sm["t_ns"].to_numpy(np.int64)
        inside = np.zeros(len(t), bool)
        for w in on[on["nvml_index"] == g["nvml_index"]].itertuples():
            inside |= (t >= w.t_start_ns) & (t <= w.t_end_ns)
        rows = [(int(a), int(b), int(x)) for a, b, x in zip(t, sm["tx_raw"], sm["rx_raw"])]
        pairs = [(rows[i], rows[i + 1]) for i in np.flatnonzero(inside[:-1] & inside[1:])]
        assert len(pairs) > 100
        assert not any(_busy("fields", c["bits"], a, b) for a, b in pairs)
        moved = [((b[1] - a[1]) % 2 ** c["bits"]) + ((b[2] - a[2]) % 2 ** c["bits"]) for a, b in pairs]
        assert np.median(moved) / (np.percentile(sm["read_ns"], 1) / 1e9) < BUSY_BPS
        checked += 1
    assert checked == len(s.meta["gpus"])


def test_a_launch_only_stream_is_not_busy_and_a_bulk_copy_is(data_dir) -> None:
    """Real 2x H200 threads recording, read at the fast rate inside its ranges: no interval inside eager_3000 (a
    launch-only stream, 113,000 launches/s from cuda.bindings, plus the reads' own traffic) counts as busy, with
    room for a launcher twice as fast; the intervals inside the bulk copies are far above BUSY_BPS. (was 500 MB/s:
    launch-only intervals reached 630 MB/s, so an app launching outside its ranges at that rate held the fast
    rate there, partly on the reads' own ~70 MB/s.)"""
    from pcietrace.analysis import analyze
    from pcietrace.collectors.sampler import BUSY_BPS, _busy
    from pcietrace.session import Session

    s = Session.load(data_dir / "attach_h200x2_threads")
    inst = analyze(s)["range_instances"]
    inst = inst[inst["domain"] == "truth"]
    for g in s.meta["gpus"]:
        i, bits = g["nvml_index"], g["counter"]["bits"]
        sm = s.samples[s.samples["nvml_index"] == i]
        t = sm["t_ns"].to_numpy(np.int64)
        rows = [(int(a), int(b), int(x)) for a, b, x in zip(t, sm["tx_raw"], sm["rx_raw"])]
        rate = np.array([(((b[1] - a[1]) % 2 ** bits) + ((b[2] - a[2]) % 2 ** bits)) / ((b[0] - a[0]) / 1e9)
                         for a, b in zip(rows[:-1], rows[1:])])

        def inside(name: str) -> np.ndarray:
            m = np.zeros(len(t) - 1, bool)
            for r in inst[(inst["name"] == name) & inst["gpus"].map(lambda x: i in list(x))].itertuples():
                m |= (t[:-1] >= r.t_start_ns) & (t[1:] <= r.t_end_ns)
            assert m.sum() > 5
            return np.flatnonzero(m)

        launches = inside("eager_3000")
        assert not any(_busy("fields", bits, rows[k], rows[k + 1]) for k in launches)
        assert 2 * rate[launches].max() < BUSY_BPS
        for copy in ("h2d_64MiB", "h2d_256MiB", "d2h_64MiB"):
            assert np.median(rate[inside(copy)]) > 4 * BUSY_BPS, copy


def test_a_signal_between_starting_two_samplers_reaps_the_started_one(monkeypatch) -> None:
    """Ctrl-C after the first sampler process started and before the second did: the started one is stopped and
    reaped, the interrupt comes out as itself (was: joining the never-started one raised multiprocessing's
    AssertionError 'can only join a started process' in the clean-up, which left the rest unreaped and hid the
    interrupt). SIMULATED processes that behave as multiprocessing's do before and after start()."""
    procs = _stand_in_processes(monkeypatch, queue.Queue, interrupt_start_of=1)
    s = CounterSampler([0, 1, 2], interval_ns=500_000)
    with pytest.raises(KeyboardInterrupt):
        s.start()
    assert [p.state for p in procs] == ["joined", "new", "new"] and s._stop.is_set()
    assert s.stop().empty


def test_a_sampler_process_that_must_be_killed_is_reaped_too() -> None:
    """A sampler child still alive after its stop (hung in an NVML call) is killed and then joined, so no zombie
    is left (SIMULATED: a stand-in process that records what was done to it)."""
    calls: list[str] = []

    class Hung:
        pid = 4242
        alive = True

        def join(self, timeout=None) -> None:
            calls.append("join")

        def is_alive(self) -> bool:
            return self.alive

        def kill(self) -> None:
            calls.append("kill")
            self.alive = False

    s = CounterSampler([0], interval_ns=500_000)
    s._stop, s._procs = threading.Event(), [Hung()]
    s._kill()
    assert calls == ["join", "kill", "join"] and s._procs == [] and s._stop.is_set()
