"""Launches made while their stream is being captured into a graph are counted as captured, not eager.

The C classification runs in the real injection library over the fake driver of tests/native/fake_libcuda.c
(no GPU: its cuStreamIsCapturing says which stream handles capture) and over a stand-in libcupti (the CUPTI
path); old traces and the real recordings in tests/data (made before captured launches were told apart) still
load, read as 0 captured and keep their eager figures; a GPU test attaches to an app that captures K kernels
and launches M eagerly, and another attaches to a driver-API program linked against libcuda.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from pcietrace.analysis import analyze, attribution
from pcietrace.record.trace import EVENT_COLUMNS_V1, EVENT_COLUMNS_V2, read_traces
from pcietrace.schema import CAPTURED_COLUMNS
from pcietrace.session import Session

from conftest import DATA
from injected import build_fake, run_injected

NATIVE = Path(__file__).parent / "native"
APPS = Path(__file__).parent / "apps"

#: Over the fake driver, from one thread, inside NVTX ranges: every way a launch can meet a capture. Each entry
#: of ``want`` is (range, eager, graph, captured) as the script's own comments count them.
CAPTURE_SCRIPT = r"""
import ctypes, json, sys
import nvtx
cuda = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
def fetch(name, flags=0):
    fn = ctypes.c_void_p()
    assert cuda.cuGetProcAddress_v2(name, ctypes.byref(fn), 12000, ctypes.c_ulonglong(flags), None) == 0
    return fn.value
L = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3)
launch, launch_ptsz = L(fetch(b"cuLaunchKernel")), L(fetch(b"cuLaunchKernel", 2))  # 2: per-thread default stream
launch_ex = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(fetch(b"cuLaunchKernelEx"))
graph = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(fetch(b"cuGraphLaunch"))
class Config(ctypes.Structure):  # CUlaunchConfig (CUDA 12): hStream at byte 32
    _fields_ = [("dims", ctypes.c_uint * 7), ("hStream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint)]
assert Config.hStream.offset == 32
def ex(stream):
    launch_ex(ctypes.byref(Config(hStream=stream)), None, None, None)
coop = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 2)(fetch(b"cuLaunchCooperativeKernel"))
multi = fetch(b"cuLaunchCooperativeKernelMultiDevice")
knob = lambda name: ctypes.c_ulonglong.in_dll(cuda, name)
knob("fake_capturing_stream").value, knob("fake_invalidated_stream").value, knob("fake_failing_stream").value = 0x200, 0x400, 0x300
per_thread = ctypes.c_int.in_dll(cuda, "fake_per_thread_capturing")
k = lambda fn, stream: fn(None, 1, 1, 1, 1, 1, 1, 0, stream, None, None)
want = []
nvtx.push_range("plain")        # nothing captures: 3 + 1 eager, 1 graph
for _ in range(3): k(launch, 0x100)
ex(0x100); graph(None, 0x100)
nvtx.pop_range(); want.append(("plain", 4, 1, 0))
calls = lambda: ctypes.c_longlong.in_dll(cuda, "fake_launches").value + ctypes.c_longlong.in_dll(cuda, "fake_graph_launches").value
queries = lambda: ctypes.c_longlong.in_dll(cuda, "fake_capture_queries").value
before = {"calls_before_begin": calls(), "queries_before_begin": queries()}  # no capture has begun: no query
begin = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int)(fetch(b"cuStreamBeginCapture"))
assert begin(0x200, 1) == 0     # (the fake's capturing streams are set above; a begin changes nothing there)
before["begin_args"] = list((ctypes.c_ulonglong * 6).in_dll(cuda, "fake_begin_args"))[:2]
nvtx.push_range("capture")      # into the capturing stream: 5 kernels (4 + 1 by cuLaunchKernelEx) and 1 graph
for _ in range(4): k(launch, 0x200)
ex(0x200); graph(None, 0x200)
k(launch, 0x400)                # a capture already invalidated: the launch fails, nothing runs
nvtx.pop_range(); want.append(("capture", 0, 0, 7))
nvtx.push_range("mixed")        # eager between captured ones, and a query that fails: counted eager, never dropped
k(launch, 0x100); k(launch, 0x200); k(launch, 0x300); k(launch, 0x300); ex(0x200)
nvtx.pop_range(); want.append(("mixed", 3, 0, 2))
per_thread.value = 1            # the thread's per-thread default stream captures
nvtx.push_range("default streams")
k(launch, None)                 # legacy entry point: NULL is the legacy stream, not capturing
k(launch_ptsz, None)            # per-thread entry point: NULL is the per-thread stream -> captured
k(launch, 0x2)                  # CU_STREAM_PER_THREAD named explicitly -> captured
k(launch, 0x1)                  # CU_STREAM_LEGACY -> eager
nvtx.pop_range(); want.append(("default streams", 2, 0, 2))
per_thread.value = 0
nvtx.push_range("after")
k(launch_ptsz, None)
nvtx.pop_range(); want.append(("after", 1, 0, 0))
nvtx.push_range("cooperative")  # cudaLaunchCooperativeKernel's driver call: 2 eager, 1 into the capturing stream
coop(None, 1, 1, 1, 1, 1, 1, 0, 0x100, None); coop(None, 1, 1, 1, 1, 1, 1, 0, None, None)
coop(None, 1, 1, 1, 1, 1, 1, 0, 0x200, None)
nvtx.pop_range(); want.append(("cooperative", 2, 0, 1))
assert multi == ctypes.cast(cuda.fake_multi_device_launch, ctypes.c_void_p).value  # another signature: not wrapped
to_graph = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_void_p] * 4, ctypes.c_size_t, ctypes.c_int)(fetch(b"cuStreamBeginCaptureToGraph"))
assert to_graph(0x200, 0x11, 0x22, 0x33, 4, 2) == 0
json.dump({"want": want, "driver_calls": calls(), "queries": queries(), **before,
           "begins": ctypes.c_longlong.in_dll(cuda, "fake_capture_begins").value,
           "to_graph_args": list((ctypes.c_ulonglong * 6).in_dll(cuda, "fake_begin_args"))}, open(sys.argv[1], "w"))
"""


def _build_fake_driver(tmp_path: Path) -> str:
    return build_fake(tmp_path, "fake_libcuda.c", "libcuda.so.1")


def _run(tmp_path: Path, script: str, counter: str, extra_env: dict[str, str] | None = None,
         args: list[str] | None = None) -> tuple[pd.DataFrame, dict]:
    """``script`` (its argv[1]: a JSON file it writes) with the real injection library in attach's environment
    (``counter``: "interpose" or "cupti") over the fake driver; returns the trace's events and the JSON."""
    pytest.importorskip("nvtx")
    _build_fake_driver(tmp_path)
    return run_injected(tmp_path, script, counter, env=extra_env, args=args)


def _per_range(events: pd.DataFrame) -> list[tuple[str, int, int, int]]:
    r = attribution.ranges_from_events(events).sort_values("t_start_ns")
    return [(n, int(e), int(g), int(c)) for n, e, g, c in
            zip(r["name"], r["eager_launches"], r["graph_launches"], r["captured_launches"])]


def test_interposer_counts_launches_into_a_capturing_stream_as_captured(tmp_path) -> None:
    """The interposer's trampolines (cuLaunchKernel, its per-thread-stream variant, cuLaunchKernelEx's config,
    cuLaunchCooperativeKernel, cuGraphLaunch) ask the driver whether the launch's stream captures: per range, eager/graph/captured are
    exactly what the script made; every driver call is counted once; a failed query counts eager. They ask only
    once the process has begun a capture (no launch before can be captured): none before the first
    cuStreamBeginCapture, one per launch after; the begin trampolines pass every argument on (six for
    cuStreamBeginCaptureToGraph)."""
    ev, got = _run(tmp_path, CAPTURE_SCRIPT, "interpose")
    assert set(CAPTURED_COLUMNS) <= set(ev.columns)
    want = [tuple(w) for w in got["want"]]
    assert _per_range(ev) == want
    last = ev.iloc[-1]  # the "exit" event: the process's totals
    assert last["event"] == "exit"
    totals = [sum(w[i] for w in want) for i in (1, 2, 3)]
    assert [last["eager_process"], last["graph_process"], last["captured_process"]] == totals
    assert sum(totals) == got["driver_calls"]  # never dropped, never counted twice
    assert got["calls_before_begin"] == 5 and got["queries_before_begin"] == 0
    assert got["queries"] == got["driver_calls"] - got["calls_before_begin"]  # then one query per launch
    assert got["begins"] == 2 and got["begin_args"] == [0x200, 1]
    assert got["to_graph_args"] == [0x200, 0x11, 0x22, 0x33, 4, 2]


#: A library linked against libcuda (-lcuda, as CuPy is) that calls the launch entry points directly (through its
#: PLT, never dlsym): each call of ``direct_all`` makes 4 kernel launches (cuLaunchKernel, its _ptsz variant on the
#: per-thread stream, cuLaunchKernelEx, cuLaunchCooperativeKernel) and 1 graph launch into ``stream``; ``begin``
#: begins a capture (cuStreamBeginCapture_v2), after which the library asks whether each launch's stream captures.
DIRECT_LIB = r"""
typedef struct { unsigned dims[7]; void *hStream; void *attrs; unsigned numAttrs; } Config;
int cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **);
int cuLaunchKernel_ptsz(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **);
int cuLaunchKernelEx(const Config *, void *, void **, void **);
int cuLaunchCooperativeKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **);
int cuGraphLaunch(void *, void *);
int cuStreamBeginCapture_v2(void *, int);
int cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
int begin(void *stream) { return cuStreamBeginCapture_v2(stream, 5); }
/* entry points fetched through cuGetProcAddress_v2 called directly: a begin, and a launch into ``stream`` */
int fetched_begin(void *stream)
{
    int (*fn)(void *, int) = 0;
    return cuGetProcAddress_v2("cuStreamBeginCapture", (void **)&fn, 12000, 0, 0) || fn(stream, 6);
}
int fetched_launch(void *stream)
{
    int (*fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **) = 0;
    return cuGetProcAddress_v2("cuLaunchKernel", (void **)&fn, 12000, 0, 0) || fn(0, 1, 1, 1, 1, 1, 1, 0, stream, 0, 0);
}
int direct_all(void *stream)
{
    Config c = {{1, 1, 1, 1, 1, 1, 0}, stream, 0, 0};
    return cuLaunchKernel(0, 1, 1, 1, 1, 1, 1, 0, stream, 0, 0) | cuLaunchKernel_ptsz(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0)
         | cuLaunchKernelEx(&c, 0, 0, 0) | cuLaunchCooperativeKernel(0, 1, 1, 1, 1, 1, 1, 0, stream, 0) | cuGraphLaunch(0, stream);
}
"""

DIRECT_SCRIPT = r"""
import ctypes, json, sys
import nvtx
cuda = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
direct = ctypes.CDLL(sys.argv[2])
ctypes.c_ulonglong.in_dll(cuda, "fake_capturing_stream").value = 0x200
want = []
nvtx.push_range("direct"); assert direct.direct_all(ctypes.c_void_p(0x100)) == 0; nvtx.pop_range(); want.append(("direct", 4, 1, 0))
queries = ctypes.c_longlong.in_dll(cuda, "fake_capture_queries")
assert queries.value == 0  # no capture has begun: no query
assert direct.begin(ctypes.c_void_p(0x200)) == 0 and ctypes.c_longlong.in_dll(cuda, "fake_capture_begins").value == 1
assert list((ctypes.c_ulonglong * 2).in_dll(cuda, "fake_begin_args")) == [0x200, 5]  # stream and mode passed on
nvtx.push_range("direct capturing")  # the _ptsz launch goes to the thread's stream, which does not capture
assert direct.direct_all(ctypes.c_void_p(0x200)) == 0; nvtx.pop_range(); want.append(("direct capturing", 1, 0, 4))
L = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3)
by_name = L(ctypes.cast(ctypes.CDLL(None).cuLaunchKernel, ctypes.c_void_p).value)  # RTLD_DEFAULT: the library's own
by_handle = L(ctypes.cast(cuda.cuLaunchKernel, ctypes.c_void_p).value)            # libcuda's, wrapped once
nvtx.push_range("looked up"); by_name(None, 1, 1, 1, 1, 1, 1, 0, 0x100, None, None)
by_handle(None, 1, 1, 1, 1, 1, 1, 0, 0x100, None, None); nvtx.pop_range(); want.append(("looked up", 2, 0, 0))
calls = ctypes.c_longlong.in_dll(cuda, "fake_launches").value + ctypes.c_longlong.in_dll(cuda, "fake_graph_launches").value
json.dump({"want": want, "driver_calls": calls}, open(sys.argv[1], "w"))
"""


NO_DRIVER_SCRIPT = r"""
import ctypes, json, sys
everywhere = ctypes.CDLL(None)
found = {name: hasattr(everywhere, name) for name in ("cuLaunchKernel", "cuLaunchKernelEx", "cuGraphLaunch")}
cuda = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)  # the driver now loaded: the names are there
found_after = {name: hasattr(everywhere, name) for name in found}
json.dump({"before": found, "after": found_after}, open(sys.argv[1], "w"))
"""


def _build_direct_lib(tmp_path: Path, cc: str, source: str) -> Path:
    """``source`` (C) built into a library linked against the libcuda.so.1 in ``tmp_path`` (the fake's soname)."""
    (tmp_path / "direct.c").write_text(source)
    lib = tmp_path / "libdirect.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "direct.c"), "-L", str(tmp_path),
                    "-l:libcuda.so.1"], check=True)
    return lib


def test_without_a_driver_the_launch_entry_points_are_not_found(tmp_path) -> None:
    """The preloaded library defines cuLaunchKernel & co. for code linked against libcuda; a program probing for
    the driver by such a name (``dlsym(RTLD_DEFAULT, ...)``) before any libcuda is loaded must not find the
    library's own, whose calls would fail: not found until the driver is loaded, then found."""
    _build_fake_driver(tmp_path)
    _, got = run_injected(tmp_path, NO_DRIVER_SCRIPT, "interpose")
    assert not any(got["before"].values())
    assert all(got["after"].values())


def test_interposer_counts_direct_calls_of_code_linked_against_libcuda(tmp_path) -> None:
    """Code linked against libcuda calls the launch entry points through its PLT, not dlsym: the preloaded
    library defines them, so each launch is counted once (eager, graph or captured, as the trampolines count),
    and a name looked up in the global scope (the library's own entry point) is not wrapped a second time."""
    cc = _build_fake_driver(tmp_path)
    lib = _build_direct_lib(tmp_path, cc, DIRECT_LIB)
    ev, got = _run(tmp_path, DIRECT_SCRIPT, "interpose", args=[str(lib)])
    want = [tuple(w) for w in got["want"]]
    assert _per_range(ev) == want
    assert sum(sum(w[1:]) for w in want) == got["driver_calls"]  # every call counted once


#: Begins fetched as the CUDA 13 runtime fetches them at start-up (six: cuStreamBeginCapture at 10000 and 10010 and
#: ToGraph at 12030, each with and without the per-thread flag) plus cuda.bindings' ToCig (both flags), none
#: called; then ``sys.argv[2]`` more fake begins ("_stubK", none called), launches, one begin, launches.
START_UP_SCRIPT = r"""
import ctypes, json, sys
import nvtx
cuda = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
def fetch(name, version=12000, flags=0):
    fn = ctypes.c_void_p()
    assert cuda.cuGetProcAddress_v2(name, ctypes.byref(fn), version, ctypes.c_ulonglong(flags), None) == 0
    return fn.value
begins = {(n, v, f): fetch(n, v, f) for n, v in ((b"cuStreamBeginCapture", 10000), (b"cuStreamBeginCapture", 10010),
          (b"cuStreamBeginCaptureToGraph", 12030), (b"cuStreamBeginCaptureToCig", 13000)) for f in (0, 2)}
stubs = [fetch(b"cuStreamBeginCapture_stub%d" % k) for k in range(int(sys.argv[2]))]
launch = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3)(fetch(b"cuLaunchKernel"))
k = lambda stream: launch(None, 1, 1, 1, 1, 1, 1, 0, stream, None, None)
queries = lambda: ctypes.c_longlong.in_dll(cuda, "fake_capture_queries").value
ctypes.c_ulonglong.in_dll(cuda, "fake_capturing_stream").value = 0x200
nvtx.push_range("before"); k(0x100); k(0x100); nvtx.pop_range()
q_before = queries()
v1_ptsz = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(begins[b"cuStreamBeginCapture", 10000, 2])
assert v1_ptsz(0x200) == 0
args = list((ctypes.c_ulonglong * 2).in_dll(cuda, "fake_begin_args"))
nvtx.push_range("after"); k(0x100); k(0x200); nvtx.pop_range()
json.dump({"distinct": len(set(begins.values()) | set(stubs)), "queries_before": q_before, "queries_after": queries() - q_before,
           "args": args}, open(sys.argv[1], "w"))
"""


@pytest.mark.parametrize("stubs", [0, 16], ids=["runtime's begins", "more begins than slots"])
def test_the_capture_query_waits_for_the_first_begin_after_the_runtime_fetches_its_begins(tmp_path, stubs: int) -> None:
    """The runtime fetches six begin entry points at start-up, each a function of its own, and cuda.bindings two
    more: each gets a trampoline, so launches before the program's first begin are not queried, and one per launch
    after it (the one-argument begin reaches the driver with its stream). With more begins than the library has
    trampolines for (16 more), one handed out unwrapped could begin a capture unseen: then every launch is queried
    from the start, and the trace says so."""
    _build_fake_driver(tmp_path)
    ev, got = run_injected(tmp_path, START_UP_SCRIPT, "interpose", args=[str(stubs)])
    assert got["distinct"] == 8 + stubs
    assert got["args"] == [0x200, 2**64 - 2]  # the stream passed on; -2: the fake's own mark for this variant
    assert got["queries_after"] == 2
    assert _per_range(ev) == [("before", 2, 0, 0), ("after", 1, 0, 1)]
    overflow = ev["message"].astype(str).str.contains("more capture-begin entry points than slots")
    assert got["queries_before"] == (2 if stubs else 0)
    assert overflow.any() == bool(stubs)


#: Code linked against libcuda that fetches entry points with cuGetProcAddress_v2 itself (through its PLT).
FETCHED_SCRIPT = r"""
import ctypes, json, sys
import nvtx
cuda = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
direct = ctypes.CDLL(sys.argv[2])
ctypes.c_ulonglong.in_dll(cuda, "fake_capturing_stream").value = 0x200
nvtx.push_range("fetched"); assert direct.fetched_launch(ctypes.c_void_p(0x100)) == 0; nvtx.pop_range()
assert direct.fetched_begin(ctypes.c_void_p(0x200)) == 0
args = list((ctypes.c_ulonglong * 2).in_dll(cuda, "fake_begin_args"))
nvtx.push_range("fetched capturing"); assert direct.fetched_launch(ctypes.c_void_p(0x200)) == 0
assert direct.direct_all(ctypes.c_void_p(0x200)) == 0; nvtx.pop_range()
json.dump({"want": [("fetched", 1, 0, 0), ("fetched capturing", 1, 0, 5)], "args": args}, open(sys.argv[1], "w"))
"""


def test_entry_points_fetched_by_a_direct_cuGetProcAddress_call_are_wrapped(tmp_path) -> None:
    """Code linked against libcuda may call cuGetProcAddress_v2 itself, through its PLT: the preloaded library
    defines it, so a launch fetched that way is counted and a begin fetched that way is seen (the launches into
    the capturing stream after it are captured, not eager)."""
    cc = _build_fake_driver(tmp_path)
    lib = _build_direct_lib(tmp_path, cc, DIRECT_LIB)
    ev, got = _run(tmp_path, FETCHED_SCRIPT, "interpose", args=[str(lib)])
    assert got["args"] == [0x200, 6]
    assert _per_range(ev) == [tuple(w) for w in got["want"]]


#: A driver whose cuGetProcAddress hands out the address of its exported cuGraphLaunch, which the preloaded
#: library's own definition interposes: the entry point handed out already counts, and must not be wrapped again.
EXPORTED_SCRIPT = r"""
import ctypes, json, sys
import nvtx
cuda = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
ctypes.c_int.in_dll(cuda, "fake_getproc_exported").value = 1
fn = ctypes.c_void_p()
assert cuda.cuGetProcAddress_v2(b"cuGraphLaunch", ctypes.byref(fn), 12000, ctypes.c_ulonglong(0), None) == 0
graph = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(fn.value)
nvtx.push_range("exported"); graph(None, 0x100); graph(None, 0x100); nvtx.pop_range()
json.dump({"want": [("exported", 0, 2, 0)], "driver_calls": ctypes.c_longlong.in_dll(cuda, "fake_graph_launches").value},
          open(sys.argv[1], "w"))
"""


def test_an_entry_point_the_driver_hands_out_that_is_the_library_s_own_is_counted_once(tmp_path) -> None:
    """cuGetProcAddress of a driver that takes its exported launch entry points' addresses through the GOT returns
    the preloaded library's definitions; wrapped in a trampoline as well, each launch was counted twice."""
    ev, got = _run(tmp_path, EXPORTED_SCRIPT, "interpose")
    want = [tuple(w) for w in got["want"]]
    assert _per_range(ev) == want
    assert sum(sum(w[1:]) for w in want) == got["driver_calls"]


#: The direct caller dlopened RTLD_LOCAL (ctypes' default, as Python imports extension modules) before anything
#: loads libcuda globally: libcuda is then in that library's local scope only, where RTLD_NEXT does not look.
LOCAL_DIRECT_SCRIPT = r"""
import ctypes, json, sys
import nvtx
direct = ctypes.CDLL(sys.argv[2])
nvtx.push_range("direct"); rc = direct.direct_all(ctypes.c_void_p(0x100)); nvtx.pop_range()
cuda = ctypes.CDLL("libcuda.so.1")
calls = ctypes.c_longlong.in_dll(cuda, "fake_launches").value + ctypes.c_longlong.in_dll(cuda, "fake_graph_launches").value
json.dump({"rc": rc, "want": [("direct", 4, 1, 0)], "driver_calls": calls}, open(sys.argv[1], "w"))
"""


def test_direct_calls_reach_a_libcuda_loaded_in_a_local_scope_only(tmp_path) -> None:
    """A library linked against libcuda and loaded RTLD_LOCAL binds its launch calls to the preloaded library's
    definitions; those must still reach libcuda (not fail with CUDA_ERROR_NOT_FOUND) and count once each."""
    cc = _build_fake_driver(tmp_path)
    lib = _build_direct_lib(tmp_path, cc, DIRECT_LIB)
    ev, got = _run(tmp_path, LOCAL_DIRECT_SCRIPT, "interpose", args=[str(lib)])
    assert got["rc"] == 0
    want = [tuple(w) for w in got["want"]]
    assert _per_range(ev) == want
    assert sum(sum(w[1:]) for w in want) == got["driver_calls"]


#: On the real driver: each direct call's return code (before cuInit: the driver's own error, never the
#: library's CUDA_ERROR_NOT_FOUND, 500, for a libcuda it could not find).
LOCAL_REAL_SCRIPT = r"""
import ctypes, json, sys
import nvtx
direct = ctypes.CDLL(sys.argv[2])  # RTLD_LOCAL; its libcuda.so.1 is the real one (no LD_LIBRARY_PATH)
rc = {}
nvtx.push_range("direct")
for name in ("cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch"):
    rc[name] = getattr(direct, "one_" + name)()
nvtx.pop_range()
json.dump(rc, open(sys.argv[1], "w"))
"""

#: DIRECT_LIB's calls one by one, each with null handles.
DIRECT_ONE_BY_ONE = DIRECT_LIB + r"""
int one_cuLaunchKernel(void) { return cuLaunchKernel(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0); }
int one_cuLaunchKernel_ptsz(void) { return cuLaunchKernel_ptsz(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0); }
int one_cuLaunchKernelEx(void) { Config c = {{1, 1, 1, 1, 1, 1, 0}, 0, 0, 0}; return cuLaunchKernelEx(&c, 0, 0, 0); }
int one_cuLaunchCooperativeKernel(void) { return cuLaunchCooperativeKernel(0, 1, 1, 1, 1, 1, 1, 0, 0, 0); }
int one_cuGraphLaunch(void) { return cuGraphLaunch(0, 0); }
"""


@pytest.mark.gpu
def test_direct_calls_from_a_locally_loaded_library_reach_the_real_driver(tmp_path) -> None:
    """With the real driver: a library linked against libcuda and loaded RTLD_LOCAL (a Python extension) calls
    the launch entry points through the preloaded library, which must hand each call to libcuda (its return
    code is the driver's, not 500) and count it once."""
    from pcietrace.record.attach import injection_env

    pytest.importorskip("nvtx")
    cc = _build_fake_driver(tmp_path)  # linked against the fake only for its soname: the real one loads at run time
    lib = _build_direct_lib(tmp_path, cc, DIRECT_ONE_BY_ONE)
    traces = tmp_path / "traces"
    traces.mkdir()
    env = injection_env(traces, "interpose", None, [0], False)  # (the fake's folder is not on the loader's path)
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "-c", LOCAL_REAL_SCRIPT, str(out), str(lib)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rc = json.loads(out.read_text())
    assert all(v not in (0, 500) for v in rc.values()), rc  # the driver's error for null handles before cuInit
    assert _per_range(read_traces(traces)) == [("direct", 4, 1, 0)]


#: A STAND-IN libcupti with the callback API (no GPU): cuptiSubscribe keeps the injection library's callback;
#: fake_fire(name, params) calls it at API entry as CUPTI does (CUpti_CallbackData: site, name, params).
FAKE_CUPTI_CALLBACKS = r"""
#include <stdint.h>
#include <string.h>
typedef void (*cb_fn)(void *, int, uint32_t, const void *);
typedef struct { int site; const char *name; const void *params; void *ret; const char *symbol; } Data;
static cb_fn callback;
static const struct { uint32_t id; const char *name; } cbids[] = {  /* cupti_driver_cbid.h */
    {307, "cuLaunchKernel"}, {442, "cuLaunchKernel_ptsz"}, {652, "cuLaunchKernelEx"}, {514, "cuGraphLaunch"},
    {477, "cuLaunchCooperativeKernel"}};
static int enabled[4096];
int cuptiSubscribe(void **sub, cb_fn cb, void *user) { (void)user; *sub = (void *)1; callback = cb; return 0; }
int cuptiEnableCallback(uint32_t on, void *sub, int domain, uint32_t id) { (void)sub, (void)domain; if (id < 4096) enabled[id] = on; return 0; }
#ifndef NO_NAMES  /* an older CUPTI that cannot name its callbacks: the library enables the known ids */
int cuptiGetCallbackName(int domain, uint32_t id, const char **name)
{
    (void)domain;
    for (unsigned i = 0; i < sizeof cbids / sizeof cbids[0]; ++i) if (cbids[i].id == id) { *name = cbids[i].name; return 0; }
    return 1;
}
#endif
/* as CUPTI: a callback fires only where it was enabled */
void fake_fire(const char *name, const void *params)
{
    Data d = {0, name, params, 0, 0};
    for (unsigned i = 0; i < sizeof cbids / sizeof cbids[0]; ++i)
        if (!strcmp(cbids[i].name, name) && enabled[cbids[i].id]) callback(0, 1, cbids[i].id, &d);
}
"""

#: The same launches as CAPTURE_SCRIPT's first ranges, through CUPTI callbacks with the parameter structs of
#: generated_cuda_meta.h (cuLaunchKernel_params and cuLaunchCooperativeKernel_params: hStream at byte 40;
#: cuLaunchKernelEx_params: config first;
#: cuGraphLaunch_params: hStream second).
CUPTI_SCRIPT = r"""
import ctypes, json, os, sys
import nvtx
cuda = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
lib = ctypes.CDLL(os.environ["CUDA_INJECTION64_PATH"])
assert lib.InitializeInjection() == 1
cupti = ctypes.CDLL(os.environ["PCIETRACE_CUPTI"])
ctypes.c_ulonglong.in_dll(cuda, "fake_capturing_stream").value = 0x200
class KernelParams(ctypes.Structure):
    _fields_ = [("f", ctypes.c_void_p), ("dims", ctypes.c_uint * 7), ("hStream", ctypes.c_void_p),
                ("kernelParams", ctypes.c_void_p), ("extra", ctypes.c_void_p)]
assert KernelParams.hStream.offset == 40
class Config(ctypes.Structure):
    _fields_ = [("dims", ctypes.c_uint * 7), ("hStream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint)]
def kernel(stream, name=b"cuLaunchKernel"):
    p = KernelParams(hStream=stream); cupti.fake_fire(name, ctypes.byref(p))
def ex(stream):
    c = Config(hStream=stream); p = (ctypes.c_void_p * 4)(ctypes.addressof(c)); cupti.fake_fire(b"cuLaunchKernelEx", p)
def graph(stream):
    p = (ctypes.c_void_p * 2)(None, stream); cupti.fake_fire(b"cuGraphLaunch", p)
want = []
coop = lambda stream: kernel(stream, b"cuLaunchCooperativeKernel")
nvtx.push_range("plain"); kernel(0x100); kernel(0x100); ex(0x100); graph(0x100); coop(0x100); nvtx.pop_range()
want.append(("plain", 4, 1, 0))
nvtx.push_range("capture"); kernel(0x200); ex(0x200); graph(0x200); coop(0x200); nvtx.pop_range(); want.append(("capture", 0, 0, 4))
ctypes.c_int.in_dll(cuda, "fake_per_thread_capturing").value = 1
nvtx.push_range("default streams"); kernel(None); kernel(None, b"cuLaunchKernel_ptsz"); nvtx.pop_range()
want.append(("default streams", 1, 0, 1))
json.dump({"want": want}, open(sys.argv[1], "w"))
"""


@pytest.mark.parametrize("named", [True, False], ids=["callbacks named", "known ids"])
def test_cupti_callbacks_count_launches_into_a_capturing_stream_as_captured(tmp_path, named: bool) -> None:
    """The CUPTI path (``--launch-counter cupti``) enables the launch callbacks (by name, or by the known ids
    where CUPTI cannot name them), reads each launch's stream from the callback's parameter struct and
    classifies it as the interposer does, over a stand-in libcupti that fires only enabled callbacks."""
    cc = _build_fake_driver(tmp_path)
    (tmp_path / "cupti.c").write_text(FAKE_CUPTI_CALLBACKS)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", *([] if named else ["-DNO_NAMES"]), "-o",
                    str(tmp_path / "libcupti_standin.so"), str(tmp_path / "cupti.c")], check=True)
    ev, got = _run(tmp_path, CUPTI_SCRIPT, "cupti", {"PCIETRACE_CUPTI": str(tmp_path / "libcupti_standin.so")})
    assert (ev["event"] == "cupti").any()
    assert _per_range(ev) == [tuple(w) for w in got["want"]]


def _recordings() -> list[Path]:
    found = sorted({p.parent for p in DATA.rglob("events.parquet")})
    shared = Path(__file__).resolve().parents[2] / "shared" / "recordings"  # (tests/data/recordings holds copies)
    names = {p.name for p in found}
    found += sorted({p.parent for p in shared.rglob("events.parquet") if p.parent.name not in names}) \
        if shared.is_dir() else []
    # made before: no captured-launch columns (recordings since then are checked by the capture tests above)
    return [p for p in found if not set(CAPTURED_COLUMNS) & set(pq.read_schema(p / "events.parquet").names)]


@pytest.mark.parametrize("recording", _recordings(), ids=lambda p: p.name)
def test_recordings_from_before_read_as_zero_captured_and_keep_their_eager_counts(recording: Path) -> None:
    """Every real attach recording made before captured launches were told apart loads; its ranges have 0
    captured launches (unknown where launches were not counted at all) and the eager/graph counts its saved
    report.json holds (computed when it was made), or more where its process's other threads launched for it
    outside ranges of their own (pcietrace/analysis/threads.py: PyTorch's backward pass), never more than its
    process made while it was open."""
    s = Session.load(recording)
    assert not set(CAPTURED_COLUMNS) & set(s.events.columns)  # (made before: the test's premise)
    saved = json.loads((recording / "report.json").read_text()).get("results", {}).get("ranges", [])
    r = analyze(s)
    rg, whole = r["ranges"], r["whole_run"]
    assert len(rg) > 0
    assert (rg["captured_launches"].isna() == rg["eager_launches"].isna()).all()
    assert (rg["captured_launches"].dropna() == 0).all()
    assert (whole["program_captured_launches"].isna() == whole["program_eager_launches"].isna()).all()
    assert (whole["program_captured_launches"].dropna() == 0).all()
    if saved and rg["eager_launches"].notna().any():  # (--no-count-launches runs were saved with 0s before NaN)
        old = pd.DataFrame(saved).set_index(["domain", "name"])
        new = rg.set_index(["domain", "name"]).loc[old.index]
        inst = r["range_instances"]
        most = inst.groupby([inst["domain"].astype(str), inst["group"].astype(str)])[
            ["eager_launches_process", "graph_launches_process"]].sum().loc[old.index]
        for c in ("eager_launches", "graph_launches"):
            got, was = new[c].astype(float), old[c].astype(float)
            same = got.isna() & was.isna()
            assert (same | ((got >= was) & (got <= most[f"{c}_process"]))).all()


@pytest.mark.parametrize("recording, names", [("attach_h200x8_torchrun", EVENT_COLUMNS_V2),
                                              ("attach_h100_python", EVENT_COLUMNS_V1)])
def test_trace_files_without_captured_fields_read_as_before(tmp_path, recording: str, names: list[str]) -> None:
    """Trace files in the previous formats (13 fields: no captured counts; 11: no devices either), written back
    from a real recording's events, read into the same frame, and its ranges count 0 captured and the same
    eager launches."""
    ev = Session.load(DATA / recording).events
    assert list(ev.columns) == names + ["pid"]
    for pid, g in ev.groupby("pid"):
        buf = io.StringIO()
        g[names].to_csv(buf, sep="\t", header=False, index=False)
        (tmp_path / f"trace-{pid}.tsv").write_text(buf.getvalue())
    back = read_traces(tmp_path)
    order = lambda df: df.sort_values(["pid", "t_ns"], kind="stable").reset_index(drop=True)
    as_read = ev.astype(dict.fromkeys(ev.select_dtypes("category").columns, str))  # (loaded strings are categories)
    pd.testing.assert_frame_equal(order(back[ev.columns.tolist()]), order(as_read), check_dtype=False)
    ranges, before = attribution.ranges_from_events(back), attribution.ranges_from_events(ev)
    assert len(ranges) and (ranges["captured_launches"] == 0).all()
    assert ranges["eager_launches"].tolist() == before["eager_launches"].tolist()


@pytest.mark.gpu
@pytest.mark.parametrize("counter", ["interpose", "cupti"])
def test_attach_counts_captured_kernels_apart_from_eager_ones(tmp_path, counter: str) -> None:
    """On a GPU, with either launch counter: an app that launches M kernels eagerly and captures K into a graph
    inside one range (then replays it once) is reported with eager == M, captured == K and one graph launch,
    exactly; the process totals agree."""
    pytest.importorskip("nvtx")
    m, k = 700, 300
    out = tmp_path / "attach"
    proc = subprocess.run([sys.executable, "-m", "pcietrace", "attach", "--json", "--no-calibrate", "--launch-counter",
                           counter, "-o", str(out), "--", sys.executable, str(APPS / "capture_app.py"), str(m), str(k)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    ranges = pd.DataFrame(doc["results"]["ranges"]).set_index("name")
    assert ranges.loc["eager", ["eager_launches", "graph_launches", "captured_launches"]].tolist() == [m, 0, 0]
    assert ranges.loc["capture", ["eager_launches", "graph_launches", "captured_launches"]].tolist() == [0, 0, k]
    assert ranges.loc["replay", ["eager_launches", "graph_launches", "captured_launches"]].tolist() == [0, 1, 0]
    whole = doc["results"]["whole_run"][0]
    assert whole["program_captured_launches"] == k
    assert whole["program_eager_launches"] >= m  # (plus the app's own set-up launches, if any)


def _build_driver_api_app(tmp_path: Path) -> Path:
    """tests/apps/driver_api_app.cu linked against libcuda (the toolkit's stub, else the driver's libcuda.so.1)."""
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc: the driver-API app is not built")
    exe = tmp_path / "driver_api_app"
    for link in (["-lcuda"], ["-L/usr/local/cuda/lib64/stubs", "-lcuda"], ["-l:libcuda.so.1"]):
        if subprocess.run(["nvcc", "-O2", "-o", str(exe), str(APPS / "driver_api_app.cu"), *link],
                          capture_output=True).returncode == 0:
            return exe
    pytest.fail("nvcc could not link tests/apps/driver_api_app.cu against libcuda")


@pytest.mark.gpu
@pytest.mark.parametrize("counter", ["interpose", "cupti"])
def test_attach_counts_a_driver_api_programs_direct_launches(tmp_path, counter: str) -> None:
    """On a GPU, a program linked against libcuda calls cuLaunchKernel, cuLaunchKernelEx,
    cuLaunchCooperativeKernel and cuGraphLaunch directly (its PLT, no dlsym): with either launch counter each
    range holds exactly the launches it made."""
    n = 250
    exe = _build_driver_api_app(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "pcietrace", "attach", "--json", "--no-calibrate", "--launch-counter",
                           counter, "-o", str(tmp_path / "attach"), "--", str(exe), str(n)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    ranges = pd.DataFrame(json.loads(proc.stdout)["results"]["ranges"]).set_index("name")
    cols = ["eager_launches", "graph_launches", "captured_launches"]
    for name in ("direct_launch", "direct_ex", "direct_cooperative"):
        assert ranges.loc[name, cols].tolist() == [n, 0, 0], name
    assert ranges.loc["direct_graph", cols].tolist() == [0, n, 0]


def test_the_truth_bench_checks_each_calls_launches_against_the_apps(tmp_path) -> None:
    """bench/attach_truth.py's launch check on the real 2x H200 threads recording (made before captured launches
    were told apart: 0 captured): the app's 3,000 eager launches per eager_3000 call match; one more or less, a
    captured count the recording does not have, or no truth at all do not pass."""
    import attach_truth

    inst = analyze(Session.load(DATA / "attach_h200x2_threads"))["range_instances"]
    eager = inst[inst["name"] == "eager_3000"]
    truth = lambda launches: pd.DataFrame({"launches": [launches] * 2})
    row = attach_truth.launch_check(truth({"eager": 3000, "graph": 0, "captured": 0}), eager)
    assert row["launches_ok"] is True and row["eager_ours"] == 3000 and row["captured_ours"] == 0
    for wrong in ({"eager": 2999}, {"eager": 3001}, {"eager": 3000, "captured": 100}):
        assert attach_truth.launch_check(truth(wrong), eager)["launches_ok"] is False
    # "at least" where the app's own count is not exact (PyTorch's capture may add kernels)
    assert attach_truth.launch_check(truth({"eager": 3000, "captured": 0, "captured_exact": False}), eager)["launches_ok"]
    assert attach_truth.launch_check(pd.DataFrame({"h2d": [1.0]}), eager)["launches_ok"] is None


def test_console_and_json_show_captured_launches(tmp_path) -> None:
    """`pcietrace report --json` on a real recording has ``captured_launches`` in every range and
    ``program_captured_launches`` in the whole run; the console shows a ``captured`` column only where a range
    captured (old recordings print as before), in 80 columns, with each range's count. The non-zero counts are
    the recording's own eager counts put in the captured column (a rendering test: the renderer computes nothing)."""
    from rich.console import Console

    from pcietrace.report import console

    rec = DATA / "attach_h200x2_threads"
    proc = subprocess.run([sys.executable, "-m", "pcietrace", "report", str(rec), "--json"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert all(r["captured_launches"] == 0 for r in doc["results"]["ranges"])
    assert all(w["program_captured_launches"] == 0 for w in doc["results"]["whole_run"])

    s = Session.load(rec)
    results = analyze(s)

    def launches_table(res: dict) -> str:
        out = Console(width=80, record=True, file=io.StringIO())
        for part in console.attach_tables(s.meta, res):
            out.print(part)
        text = out.export_text()
        return text[text.index("Launches per NVTX range"):text.index("Whole run")]

    assert "captured" not in launches_table(results)
    rg = results["ranges"].assign(captured_launches=results["ranges"]["eager_launches"])
    table = launches_table({**results, "ranges": rg})
    assert "captured" in table and max(len(line) for line in table.splitlines()) <= 80
    top = rg.sort_values("captured_launches").iloc[-1]
    row = next(line for line in table.splitlines() if line.strip().startswith(top["name"][:8]))
    assert row.count(f"{int(top['captured_launches']):,}") == 2  # eager and captured columns


def test_graph_savings_prediction_ignores_captured_launches() -> None:
    """attach's "graphs save" prediction rests on eager launches only: on a real recording's ranges, adding
    captured launches (as many as each range's eager ones) changes no prediction."""
    from pcietrace.analysis import savings

    s = Session.load(DATA / "attach_h200x2_threads")
    inst = analyze(s)["range_instances"]
    before = savings.predict_ms(inst, s.meta["launch_costs"])
    after = savings.predict_ms(inst.assign(captured_launches=inst["eager_launches"]), s.meta["launch_costs"])
    assert before["predicted_ms"].gt(0).any()
    pd.testing.assert_series_equal(before["predicted_ms"], after["predicted_ms"])


def test_sessions_with_captured_counts_save_and_load(tmp_path) -> None:
    """A session whose events carry the captured counts (as attach now records them) saves and loads with them;
    events with one of the two columns only are refused with the file and column named."""
    from pcietrace.errors import ReportError

    s = Session.load(DATA / "attach_h200x2_threads")
    n = len(s.events)
    s.events = s.events.assign(captured_thread=np.arange(n) % 3, captured_process=np.arange(n) % 5)
    s.save(tmp_path / "new")
    back = Session.load(tmp_path / "new")
    assert back.events["captured_thread"].tolist() == s.events["captured_thread"].tolist()
    assert back.events["captured_process"].tolist() == s.events["captured_process"].tolist()
    s.events = s.events.drop(columns="captured_process")
    s.save(tmp_path / "half")
    with pytest.raises(ReportError, match="captured_process"):
        Session.load(tmp_path / "half")


#: Four threads open and close a range at the same moment (NVTX's side played by tests/native/nvtx_loader.py), the
#: injection library reading the counters itself at each edge (--exact-edges) through the fake NVML of
#: tests/native/fake_libnvml.c, whose reads take turns.
EXACT_SCRIPT = r"""
import ctypes as C, json, sys, threading
sys.path.insert(0, sys.argv[2])
from nvtx_loader import fn
push, pop = fn(1, 9, C.c_int, C.c_char_p), fn(1, 11, C.c_int)  # nvtxRangePushA, nvtxRangePop (GIL released)
start = threading.Barrier(4)
def work():
    start.wait()
    push(b"edge")
    pop()
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
json.dump({}, open(sys.argv[1], "w"))
"""


def test_exact_edge_reads_time_only_the_read_not_the_wait_for_their_turn(tmp_path) -> None:
    """``--exact-edges``: threads at an edge at once take turns reading (NVML serializes a process's reads).
    Each read's recorded time is the read's own (the fake's 2 ms), not its wait for the others, so its
    midpoint is where its values were taken: the reads' spans do not overlap and their values grow in the
    order of their midpoints. (Timed from before the wait, reads took up to 4x as long on the lent H100.)"""
    from pcietrace.record.trace import edge_samples

    build_fake(tmp_path, "fake_libnvml.c", "libnvidia-ml.so.1", "-lpthread")
    events, _ = run_injected(tmp_path, EXACT_SCRIPT, exact_edges=True, args=[str(NATIVE)])
    reads = edge_samples(events).sort_values("t_ns")
    assert len(reads) == 8  # a read before each push and after each pop
    # each at least the fake's 2 ms; that none includes another's (an upper bound failed where a busy machine woke
    # the fake's sleep late) is the spans' order below: a read timed from before its wait would overlap the one
    # it waited for
    assert (reads["read_ns"] >= 2e6 - 10_000).all()
    begin, end = reads["t_ns"] - reads["read_ns"] // 2, reads["t_ns"] + reads["read_ns"] // 2
    assert (begin.to_numpy()[1:] >= end.to_numpy()[:-1] - 100_000).all()  # one after another
    assert reads["tx_raw"].is_monotonic_increasing and reads["rx_raw"].is_monotonic_increasing


FORKS_SCRIPT = r"""
import ctypes as C, json, os, sys
sys.path.insert(0, sys.argv[2])
from nvtx_loader import fn
push, pop = fn(1, 9, C.c_int, C.c_char_p), fn(1, 11, C.c_int)  # nvtxRangePushA, nvtxRangePop
push(b"spawner")
kids = []
for _ in range(8):
    pid = os.fork()
    if pid == 0:
        push(b"kid")
        pop()
        os._exit(0)
    os.waitpid(pid, 0)
    kids.append(pid)
pop()
json.dump(kids, open(sys.argv[1], "w"))
"""


def test_a_process_that_writes_a_few_events_takes_a_few_pages_of_trace(tmp_path) -> None:
    """Forked children, a range each: each child's trace file is allocated a few hundred kB, not the 16 MB (and the
    kernel's zeroing of them, ~40 ms a child on the lent VMs) that made 200 such children 20x slower under attach;
    every child's range is in its own trace, its push before its pop."""
    import os

    events, kids = run_injected(tmp_path, FORKS_SCRIPT, args=[str(NATIVE)])
    for pid in kids:
        mine = events[(events["pid"] == pid) & events["event"].isin(["push", "pop"])]  # (a callclock line may come)
        assert mine["event"].tolist() == ["push", "pop"] and mine["message"].iloc[0] == "kid", mine
        f = tmp_path / "traces" / f"trace-{pid}.bin"
        assert os.stat(f).st_blocks * 512 <= 2 << 20, os.stat(f).st_blocks * 512
