"""The injection library times the calls that tell whether a range's host waited for the GPU (interpose mode):
eager launch calls (``launch_call_ns``: a full launch queue makes them wait) and synchronize calls
(``sync_wait_ns``). CPU tests over the fake driver (tests/native/fake_libcuda.c), whose calls spend a set time."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pcietrace.analysis import attribution
from pcietrace.schema import TIMING_COLUMNS
from injected import build_fake, run_injected
from test_capture import _build_direct_lib

#: What the CUDA runtime's own layer may add to a call above the driver call pcietrace times. H100, 2026-11-23,
#: two calls: 0.2-0.4 us per cudaLaunchKernel in a loop; single calls 1.4-5.4 us (a kernel's first launch;
#: each synchronize: 1.4-3.6 us).
RUNTIME_LAYER_NS = 10_000
#: Instances of each of the oracle app's ranges: the median instance is judged (the H100's suite in the twentieth
#: session caught one single call 19 us above its driver call; a one-instance test failed on it).
REPEATS = 5

#: How far attach's call clock may run from the app's CLOCK_MONOTONIC, relative: calls are timed by the TSC
#: where the kernel's clocksource is it, turned into ns by one ratio per process (read jitter over >= 10 ms:
#: ~1e-6), and NTP may change its slewing of CLOCK_MONOTONIC after that. The H200's suite had a 20 ms wait only
#: 0.29 us (1.5e-5) inside the app's figure.
CALL_CLOCK_RATE = 1e-4

#: Busy time per fake launch call and per fake synchronize call (ns): long enough to stand out of Python's own time.
LAUNCH_NS, SYNC_NS = 200_000, 300_000

TIMING_SCRIPT = r"""
import ctypes, json, sys
import nvtx
cuda = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
def fetch(name, version=12000):
    fn = ctypes.c_void_p()
    assert cuda.cuGetProcAddress_v2(name, ctypes.byref(fn), version, ctypes.c_ulonglong(0), None) == 0
    return fn.value
L = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3)
launch = L(fetch(b"cuLaunchKernel"))
graph = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(fetch(b"cuGraphLaunch"))
S1 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
stream_sync, event_sync = S1(fetch(b"cuStreamSynchronize")), S1(fetch(b"cuEventSynchronize"))
ctx_sync = ctypes.CFUNCTYPE(ctypes.c_int)(fetch(b"cuCtxSynchronize"))
ctx_sync_v2 = S1(fetch(b"cuCtxSynchronize", 13000))  # CUDA 13's ABI of the same name: it takes the context
knob = lambda name: ctypes.c_longlong.in_dll(cuda, name)
knob("fake_launch_ns").value, knob("fake_sync_ns").value = int(sys.argv[2]), int(sys.argv[3])
handle = lambda: ctypes.c_ulonglong.in_dll(cuda, "fake_sync_handle").value
k = lambda stream=0x100: launch(None, 1, 1, 1, 1, 1, 1, 0, stream, None, None)
busy, at = {}, {}  # the fake's own busy ns (CLOCK_MONOTONIC) per range
def push(name): at[name] = knob("fake_busy_ns").value; nvtx.push_range(name)
def pop(name): nvtx.pop_range(); busy[name] = knob("fake_busy_ns").value - at[name]
push("launches"); [k() for _ in range(10)]; pop("launches")
ctypes.c_ulonglong.in_dll(cuda, "fake_capturing_stream").value = 0x200
assert ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int)(fetch(b"cuStreamBeginCapture"))(0x200, 0) == 0
push("graphs and captures"); [graph(None, 0x100) for _ in range(5)]; [k(0x200) for _ in range(5)]; pop("graphs and captures")
handles = []
push("waits")
for call, arg in ((stream_sync, 0x51), (event_sync, 0xE1), (ctx_sync, None), (ctx_sync_v2, 0xC2)):
    assert (call(arg) if arg else call()) == 0
    handles.append(handle())
pop("waits")
push("outer"); push("inner"); k(); k(); pop("inner"); stream_sync(0x100); pop("outer")
json.dump({"handles": handles, "syncs": knob("fake_syncs").value, "busy": busy}, open(sys.argv[1], "w"))
"""

#: Code linked against libcuda calls the synchronize entry points through its PLT (as it does the launches).
DIRECT_LIB = r"""
int cuStreamSynchronize(void *); int cuEventSynchronize(void *); int cuCtxSynchronize(void);
int sync_all(void) { return cuStreamSynchronize((void *)0x51) | cuEventSynchronize((void *)0xE1) | cuCtxSynchronize(); }
"""

DIRECT_SCRIPT = r"""
import ctypes, json, sys
import nvtx
cuda = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
direct = ctypes.CDLL(sys.argv[2])
ctypes.c_longlong.in_dll(cuda, "fake_sync_ns").value = int(sys.argv[3])
nvtx.push_range("direct waits"); assert direct.sync_all() == 0; nvtx.pop_range()
json.dump({"syncs": ctypes.c_longlong.in_dll(cuda, "fake_syncs").value}, open(sys.argv[1], "w"))
"""


def _timing_run(tmp_path: Path, counter: str, env: dict[str, str] | None = None) -> tuple[pd.DataFrame, dict]:
    """TIMING_SCRIPT over the fake driver under the library (``counter``): its trace's events and its JSON."""
    pytest.importorskip("nvtx")
    build_fake(tmp_path, "fake_libcuda.c", "libcuda.so.1")
    return run_injected(tmp_path, TIMING_SCRIPT, counter, env=env, args=[str(LAUNCH_NS), str(SYNC_NS)])


def _ranges(tmp_path: Path, counter: str, env: dict[str, str] | None = None) -> tuple[dict, dict]:
    ev, got = _timing_run(tmp_path, counter, env)
    assert set(TIMING_COLUMNS) <= set(ev.columns)
    r = attribution.ranges_from_events(ev).set_index("name")
    return r.to_dict("index"), got


@pytest.mark.parametrize("clock", ["default", "monotonic"])
def test_interposer_times_eager_launch_calls_and_synchronize_calls(tmp_path, clock) -> None:
    """Per range: ``launch_call_ns`` covers each eager launch call's time in the driver and nothing else (graph
    launches and launches into a capturing stream are not eager: exactly 0); ``sync_wait_ns`` each synchronize
    call's, whichever way it was fetched (cuCtxSynchronize's CUDA 13 ABI takes the context: it reaches the
    driver); a parent's figures include its children's. Both call clocks: the TSC's ticks (where the kernel's
    clocksource is the TSC, as on the lent VMs and this one, most likely) and CLOCK_MONOTONIC."""
    r, got = _ranges(tmp_path, "interpose", {"PCIETRACE_CALL_CLOCK": clock})
    assert got["handles"] == [0x51, 0xE1, 0xC0, 0xC2] and got["syncs"] == 5  # every call forwarded, arguments intact
    excess: dict[str, float] = {}
    for name, launches, syncs in (("launches", 10, 0), ("graphs and captures", 0, 0), ("waits", 0, 4),
                                  ("inner", 2, 0), ("outer", 2, 1)):
        row = r[name]
        dur = row["t_end_ns"] - row["t_start_ns"]
        assert launches * LAUNCH_NS <= row["launch_call_ns"] <= max(dur, 1) * (launches > 0), (name, row)
        assert syncs * SYNC_NS <= row["sync_wait_ns"] <= max(dur, 1) * (syncs > 0), (name, row)
        assert row["launch_call_ns"] + row["sync_wait_ns"] <= dur, (name, row)
        if launches + syncs:  # against the fake's own busy time (CLOCK_MONOTONIC), which the timing encloses
            over = row["launch_call_ns"] + row["sync_wait_ns"] - got["busy"][name]
            assert over >= -1e-4 * got["busy"][name], (name, over, row)
            excess[name] = (over - (launches + syncs) * 500) / got["busy"][name]  # ~0.1 us per call's own cost
    # A ratio of ticks to ns set too high shows in every range; a thread preempted inside a call only in its own
    # (here: one range 21 us over, 2 CPUs): the least excess is ~0. Ratios 0.3 and 0.5 % high failed this.
    assert min(excess.values()) <= 1e-3, excess


@pytest.mark.parametrize("clock", ["default", "monotonic"])
def test_the_first_timed_call_says_which_clock_times_calls(tmp_path, clock) -> None:
    """A "callclock" line per process: the TSC (with its ns per tick and calibration window, >= 10 ms) where the
    kernel's clocksource is the TSC on x86-64, else, or when asked, CLOCK_MONOTONIC."""
    import platform

    ev, _ = _timing_run(tmp_path, "interpose", {"PCIETRACE_CALL_CLOCK": clock})
    said = ev.loc[ev["event"] == "callclock", "message"].tolist()
    assert len(said) == 1, said
    source = Path("/sys/devices/system/clocksource/clocksource0/current_clocksource")
    tsc = clock == "default" and platform.machine() == "x86_64" and source.exists() and source.read_text() == "tsc\n"
    if not tsc:
        assert said == ["monotonic"]
        return
    kind, ns_per_tick, window_ns = said[0].split()
    assert kind == "tsc" and 0.01 < float(ns_per_tick) < 10 and int(window_ns) >= 10_000_000, said


#: A program whose first timed call (a synchronize, from code linked against libcuda: no entry point fetched, so
#: no event of the library's either) comes before its first NVTX event and over 10 ms after the library loaded:
#: that call sets the call clock up (argv[2]: DIRECT_LIB built).
FIRST_CALL_SCRIPT = r"""
import ctypes, json, sys, time
import nvtx
direct = ctypes.CDLL(sys.argv[2])
time.sleep(0.02)
assert direct.sync_all() == 0
nvtx.push_range("after"); nvtx.pop_range()
json.dump({}, open(sys.argv[1], "w"))
"""


@pytest.mark.parametrize("clock", ["default", "monotonic"])
def test_a_first_timed_call_before_any_event_sets_the_clock_up_once(tmp_path, clock) -> None:
    """The call clock's set-up writes its own "callclock" event; on CLOCK_MONOTONIC (AArch64, a clocksource
    other than the TSC, or asked) that event's time once asked for the set-up again, from inside it: the program
    hung at its first synchronize where no event had come before it."""
    pytest.importorskip("nvtx")
    cc = build_fake(tmp_path, "fake_libcuda.c", "libcuda.so.1")
    lib = _build_direct_lib(tmp_path, cc, DIRECT_LIB)
    ev, _ = run_injected(tmp_path, FIRST_CALL_SCRIPT, "interpose", env={"PCIETRACE_CALL_CLOCK": clock},
                         args=[str(lib)], timeout=20)
    assert (ev["event"] == "callclock").sum() == 1
    assert ev.loc[ev["event"] == "push", "message"].tolist() == ["after"]


def test_outside_interpose_mode_calls_are_not_timed(tmp_path) -> None:
    """Without the trampolines nothing is timed: the ranges say NaN (unknown), never 0 ns."""
    r, _ = _ranges(tmp_path, "none")
    assert all(math.isnan(row["launch_call_ns"]) and math.isnan(row["sync_wait_ns"]) for row in r.values())


def test_interposer_times_direct_synchronize_calls(tmp_path) -> None:
    """Code linked against libcuda reaches the preloaded library's own cuStreamSynchronize, cuEventSynchronize
    and cuCtxSynchronize, which time the call and forward it to the driver."""
    pytest.importorskip("nvtx")
    cc = build_fake(tmp_path, "fake_libcuda.c", "libcuda.so.1")
    lib = _build_direct_lib(tmp_path, cc, DIRECT_LIB)
    ev, got = run_injected(tmp_path, DIRECT_SCRIPT, "interpose", args=[str(lib), str(SYNC_NS)])
    assert got["syncs"] == 3
    row = attribution.ranges_from_events(ev).set_index("name").loc["direct waits"]
    assert 3 * SYNC_NS <= row["sync_wait_ns"] <= row["t_end_ns"] - row["t_start_ns"]
    assert row["launch_call_ns"] == 0


@pytest.mark.gpu
def test_call_timing_matches_the_apps_own_clock(tmp_path) -> None:
    """On a GPU: tests/apps/wait_truth.cu times its own launch and synchronize calls (CUDA runtime) per range, each
    range :data:`REPEATS` times; attach's figures (the driver calls inside them) are never more than the app's, and
    in the median instance short of it by at most the runtime's own layer (:data:`RUNTIME_LAYER_NS` per call; one
    instance may catch a host hiccup between the runtime's entry and the driver's). Each synchronize call --
    stream, event and device (cudaDeviceSynchronize reaches cuCtxSynchronize's CUDA 13 ABI, which takes the context)
    -- is seen, and launch calls that waited for a full queue hold most of their range."""
    import json
    import shutil
    import subprocess
    import sys

    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc: the oracle app is not built")
    exe, truth = tmp_path / "wait_truth", tmp_path / "truth.json"
    subprocess.run(["nvcc", "-O2", "-o", str(exe), str(Path(__file__).parent / "apps" / "wait_truth.cu"), "-ldl"], check=True)
    out = tmp_path / "attach"
    p = subprocess.run([sys.executable, "-m", "pcietrace", "attach", "--json", "--no-calibrate", "-o", str(out), "--",
                        str(exe), "20", str(truth), str(REPEATS)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    want = json.loads(truth.read_text())
    from pcietrace.analysis import analyze
    from pcietrace.session import Session

    got = analyze(Session.load(out))["range_instances"].sort_values("t_start_ns").groupby("name")
    calls = {"launches": (2000, 1), "stream": (1, 1), "event": (1, 1), "device": (1, 1), "queue_full": (6000, 1)}
    for name, (launches, syncs) in calls.items():
        mine = got.get_group(name)
        assert len(mine) == REPEATS, mine
        for col, n in (("launch_call_ns", launches), ("sync_wait_ns", syncs)):
            ours, app = mine[col].to_numpy(float), np.asarray(want[name][col], float)
            short_ns = app - ours
            print(f"{name:11s} {col:15s} app {np.median(app) / 1e6:9.3f} ms  attach {np.median(ours) / 1e6:9.3f} ms  "
                  f"short by {', '.join(f'{x / n / 1e3:.3f}' for x in short_ns)} us per call")
            assert (ours > 0).all() and (ours <= app * (1 + CALL_CLOCK_RATE)).all(), (name, col, ours, app)  # inside
            assert np.median(short_ns) <= n * RUNTIME_LAYER_NS, (name, col, ours, app)
        if name in ("stream", "event", "device"):  # the 20 ms spin, waited for
            assert (mine["sync_wait_ns"] >= 19e6).all(), mine
        if name == "queue_full":  # 6,000 x 20 us kernels: the calls waited for the GPU
            assert (mine["launch_call_ns"] > 0.5 * mine["duration_ns"]).all(), mine
