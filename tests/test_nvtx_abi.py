"""The injection library answers every NVTX entry point a program can name a range with.

NVTX hands an injection its callback tables through ``InitializeInjectionNvtx2``. Here a script plays NVTX's
side over ctypes (tests/native/nvtx_loader.py, a STAND-IN for NVTX's loader, no GPU, no NVTX headers): it hands
the real library tables of the sizes nvtxTypes.h gives, then calls what the library installed, as NVTX would
for nvtxRangePushA/W/Ex, nvtxRangeStartA/W/Ex, nvtxMarkA/W, nvtxDomainCreateA/W, nvtxDomainRegisterStringA/W
and the domain ranges with ASCII, wide and registered messages. Each range must come out with its name and domain; an entry point the
library left empty would leave NVTX's no-op, and a range made through it would be lost (its pop would close
the range around it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pcietrace.analysis import attribution

from injected import NATIVE, run_injected

#: One range per entry point, called as NVTX would (argv[2]: the folder of nvtx_loader.py). Callback ids:
#: nvtxTypes.h (NVTX_CBID_CORE_* and NVTX_CBID_CORE2_*).
NVTX_SIDE = r"""
import ctypes as C, json, sys
sys.path.insert(0, sys.argv[2])
from nvtx_loader import ASCII, REGISTERED, UNICODE, Attrs as A, attrs, fn
Attrs = C.POINTER(A)
push_a, push_w, push_ex = fn(1, 9, C.c_int, C.c_char_p), fn(1, 10, C.c_int, C.c_wchar_p), fn(1, 8, C.c_int, Attrs)
pop = fn(1, 11, C.c_int)
start_a, start_w, start_ex = fn(1, 5, C.c_uint64, C.c_char_p), fn(1, 6, C.c_uint64, C.c_wchar_p), fn(1, 4, C.c_uint64, Attrs)
end = fn(1, 7, None, C.c_uint64)
mark_a, mark_w = fn(1, 2, None, C.c_char_p), fn(1, 3, None, C.c_wchar_p)
create_a, create_w = fn(5, 12, C.c_void_p, C.c_char_p), fn(5, 13, C.c_void_p, C.c_wchar_p)
register_a, register_w = fn(5, 10, C.c_void_p, C.c_void_p, C.c_char_p), fn(5, 11, C.c_void_p, C.c_void_p, C.c_wchar_p)
d_push, d_pop = fn(5, 4, C.c_int, C.c_void_p, Attrs), fn(5, 5, C.c_int, C.c_void_p)
d_start, d_end = fn(5, 2, C.c_uint64, C.c_void_p, Attrs), fn(5, 3, None, C.c_void_p, C.c_uint64)
want = []  # (domain, name, kind)
push_a(b"outer"); want.append(("default", "outer", "push"))
push_w("wide_push"); pop(); want.append(("default", "wide_push", "push"))
wide = C.create_unicode_buffer("ex_wide")
push_ex(attrs(UNICODE, wide)); pop(); want.append(("default", "ex_wide", "push"))
mark_a(b"a mark"); mark_w("a wide mark")
pop()                                   # closes "outer": the pushes inside it were all seen and popped
for make, name in ((start_a, b"start_ascii"), (start_w, "start_wide")):
    end(make(name)); want.append(("default", name if isinstance(name, str) else name.decode(), "start"))
ascii_msg = C.create_string_buffer(b"start_ex_ascii")
end(start_ex(attrs(ASCII, ascii_msg))); want.append(("default", "start_ex_ascii", "start"))
da, dw = create_a(b"dom_a"), create_w("dom_w")
for dom, dname, register in ((da, "dom_a", register_a), (dw, "dom_w", register_w)):
    handle = register(dom, b"registered" if register is register_a else "registered")
    d_push(dom, attrs(REGISTERED, handle)); d_pop(dom); want.append((dname, "registered", "push"))
    msg = C.create_unicode_buffer("domain_wide")
    d_end(dom, d_start(dom, attrs(UNICODE, msg))); want.append((dname, "domain_wide", "start"))
json.dump(want, open(sys.argv[1], "w"))
"""


def test_every_nvtx_entry_point_makes_its_range(tmp_path) -> None:
    """A/W/Ex ranges, start/end, marks, domains created and strings registered in both spellings: every range
    the script made is in the trace with its domain, name and kind, and nothing else is."""
    events, made = run_injected(tmp_path, NVTX_SIDE, args=[str(NATIVE)])
    want = sorted(tuple(w) for w in made)
    ranges = attribution.ranges_from_events(events)
    got = sorted(zip(ranges["domain"], ranges["name"], ranges["kind"]))
    assert got == want
    assert ranges["closed"].all()
    assert sorted(events.loc[events["event"] == "mark", "message"]) == ["a mark", "a wide mark"]


#: Wide names beyond ASCII, in a process that never chose a locale (a C++ program's "C" locale; here LC_ALL=C).
WIDE_SIDE = r"""
import ctypes as C, json, sys
sys.path.insert(0, sys.argv[2])
from nvtx_loader import fn
push_w, pop, mark_w = fn(1, 10, C.c_int, C.c_wchar_p), fn(1, 11, C.c_int), fn(1, 3, None, C.c_wchar_p)
names = ["naïve", "λ-step", "データ", "🚀 launch"]
for n in names:
    push_w(n); pop()
mark_w(names[0])
json.dump(names, open(sys.argv[1], "w"))
"""


def test_wide_names_keep_their_characters_whatever_the_program_s_locale(tmp_path) -> None:
    """nvtxRangePushW/MarkW names are written as UTF-8 whatever locale the program runs in: in the "C" locale
    of a program that never calls setlocale, a name beyond ASCII is not lost (nor merged with the others)."""
    events, names = run_injected(tmp_path, WIDE_SIDE, env={"LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0"},
                                 args=[str(NATIVE)])
    assert sorted(events.loc[events["event"] == "push", "message"]) == sorted(names)
    assert events.loc[events["event"] == "mark", "message"].tolist() == names[:1]


#: Nested pushes and pops from two threads, and start/end ranges (argv[2]: the folder of nvtx_loader.py, argv[3]:
#: ranges per thread).
TIMED_SIDE = r"""
import ctypes as C, json, sys, threading
sys.path.insert(0, sys.argv[2])
from nvtx_loader import fn
push_a, pop = fn(1, 9, C.c_int, C.c_char_p), fn(1, 11, C.c_int)
start_a, end = fn(1, 5, C.c_uint64, C.c_char_p), fn(1, 7, None, C.c_uint64)
n = int(sys.argv[3])
def work():
    push_a(b"outer")
    for i in range(n):
        push_a(b"aten::linear, seq = %d" % i); pop()
    pop()
    for i in range(n // 10):
        end(start_a(b"async"))
threads = [threading.Thread(target=work) for _ in range(2)]
[t.start() for t in threads]; [t.join() for t in threads]
json.dump([], open(sys.argv[1], "w"))
"""


def test_the_library_times_one_range_edge_in_61_of_each_thread_and_attach_says_what_they_cost(tmp_path) -> None:
    """The trace's header holds the edges the library timed (one in EDGE_TIMED_EVERY of each thread's, whatever
    the kind) and the ns they took; attach's process record turns that into ns per edge and ms in all."""
    from pcietrace.record.attach import processes
    from pcietrace.record.trace import EDGE_TIMED_EVERY

    per_thread = 3000
    events, _ = run_injected(tmp_path, TIMED_SIDE, args=[str(NATIVE), str(per_thread)])
    edges_per_thread = 2 + 2 * per_thread + 2 * (per_thread // 10)
    (pid, (timed, ns)), = events.attrs["edge_timing"].items()
    assert timed == 2 * (edges_per_thread // EDGE_TIMED_EVERY)
    assert 0 < ns / timed < 1e6  # (each edge well under a millisecond, and not nothing)
    proc, = processes(events, "none")
    assert proc["pid"] == pid and proc["edges"] == 2 * edges_per_thread
    assert proc["edge_ns"] == ns / timed
    assert proc["edges_ms"] == proc["edges"] * ns / timed / 1e6


def test_a_trace_whose_library_timed_no_edge_says_nothing_of_their_cost(tmp_path) -> None:
    """Threads of fewer than 61 edges each: none timed, and no cost made up for their process (as for an older
    library's trace, whose header's timing words are 0)."""
    from pcietrace.record.attach import processes

    events, _ = run_injected(tmp_path, TIMED_SIDE, args=[str(NATIVE), "10"])  # (fewer than 61 edges a thread)
    assert events.attrs["edge_timing"] == {}
    proc, = processes(events, "none")
    assert not {"edges", "edge_ns", "edges_ms"} & set(proc)


#: Pops with no range of the thread open, before any push and after the last (argv[2]: nvtx_loader.py's folder).
UNMATCHED_SIDE = r"""
import ctypes as C, json, sys
sys.path.insert(0, sys.argv[2])
from nvtx_loader import fn
push_a, pop = fn(1, 9, C.c_int, C.c_char_p), fn(1, 11, C.c_int)
got = [pop(), push_a(b"outer"), push_a(b"inner"), pop(), pop(), pop()]
json.dump(got, open(sys.argv[1], "w"))
"""


def test_a_pop_with_no_range_open_returns_nvtx_s_error_value_and_closes_nothing(tmp_path) -> None:
    """A pop on a thread with no range open returns a negative value (NVTX's error), a matched one the level of
    the range it ends; the analysis pairs only the matched ones."""
    events, got = run_injected(tmp_path, UNMATCHED_SIDE, args=[str(NATIVE)])
    assert got == [-1, 0, 1, 1, 0, -1]
    ranges = attribution.ranges_from_events(events)
    assert sorted(zip(ranges["name"], ranges["depth"])) == [("inner", 1), ("outer", 0)]
    assert ranges["closed"].all()


#: Megatron-style nesting, step > layer > op > kernel-level op, from two threads, a start/end range inside an op
#: (argv[2]: the folder of nvtx_loader.py, argv[3]: steps); writes what each push returned, by name.
DEEP_SIDE = r"""
import ctypes as C, json, sys, threading
sys.path.insert(0, sys.argv[2])
from nvtx_loader import fn
push_a, pop = fn(1, 9, C.c_int, C.c_char_p), fn(1, 11, C.c_int)
start_a, end = fn(1, 5, C.c_uint64, C.c_char_p), fn(1, 7, None, C.c_uint64)
levels = {}
def work():
    for s in range(int(sys.argv[3])):
        levels["step"] = push_a(b"step")
        for layer in range(3):
            levels["layer"] = push_a(b"layer")
            for op in range(4):
                levels["op"] = push_a(b"aten::linear")
                levels["addmm"] = push_a(b"aten::addmm"); pop()
                end(start_a(b"async"))
                pop()
            pop()
        pop()
threads = [threading.Thread(target=work) for _ in range(2)]
[t.start() for t in threads]; [t.join() for t in threads]
json.dump(levels, open(sys.argv[1], "w"))
"""


def test_ranges_deeper_than_max_depth_are_counted_not_recorded_and_nesting_is_kept(tmp_path) -> None:
    """With attach's --max-depth 2 (PCIETRACE_MAX_DEPTH), a thread's push ranges at depth 0 and 1 (step, layer)
    are recorded, the ops below them are not (neither edge), every push still returns its level as NVTX's, the
    header counts the ranges left out, and attach's process record says how many; start/end ranges, which have
    no depth, are all recorded."""
    from pcietrace.record.attach import processes

    steps = 5
    events, levels = run_injected(tmp_path, DEEP_SIDE, max_depth=2, args=[str(NATIVE), str(steps)])
    assert levels == {"step": 0, "layer": 1, "op": 2, "addmm": 3}
    pushes = events[events["event"] == "push"]
    assert sorted(set(pushes["message"])) == ["layer", "step"]
    assert (pushes["message"] == "layer").sum() == 2 * steps * 3
    assert (events["event"] == "pop").sum() == len(pushes)
    assert (events["event"] == "start").sum() == (events["event"] == "end").sum() == 2 * steps * 3 * 4
    ranges = attribution.ranges_from_events(events)
    assert sorted(ranges.loc[ranges["kind"] == "push", "depth"].unique()) == [0, 1]
    unrecorded = 2 * steps * 3 * 4 * 2
    assert events.attrs["unrecorded_ranges"] == {int(events["pid"].iloc[0]): unrecorded}
    proc, = processes(events, "none")
    assert proc["ranges_unrecorded"] == unrecorded and proc["ranges"] == len(pushes) + 2 * steps * 3 * 4


def test_without_max_depth_every_range_is_recorded_and_none_is_said_unrecorded(tmp_path) -> None:
    """The same program with no depth limit: every push recorded at its depth, and no count of ranges left out."""
    from pcietrace.record.attach import processes

    events, levels = run_injected(tmp_path, DEEP_SIDE, args=[str(NATIVE), "2"])
    assert levels == {"step": 0, "layer": 1, "op": 2, "addmm": 3}
    assert (events["event"] == "push").sum() == 2 * 2 * (1 + 3 + 3 * 4 * 2)
    assert events.attrs["unrecorded_ranges"] == {}
    assert "ranges_unrecorded" not in processes(events, "none")[0]


#: Ranges left out where no recorded edge follows them (argv[2]: the folder of nvtx_loader.py): the main thread's
#: 100 inside an "outer" it never pops, a thread's 70 inside one it never pops, and a child forked inside "outer"
#: whose own 50 lie inside its own top range.
UNPOPPED_SIDE = r"""
import ctypes as C, json, os, sys, threading
sys.path.insert(0, sys.argv[2])
from nvtx_loader import fn
push_a, pop = fn(1, 9, C.c_int, C.c_char_p), fn(1, 11, C.c_int)
def deep(n):
    for i in range(n):
        push_a(b"op"); pop()
def worker():
    push_a(b"outer_thread"); deep(70)
push_a(b"outer")
t = threading.Thread(target=worker); t.start(); t.join()
pid = os.fork()
if pid == 0:
    child = push_a(b"child_top"); deep(50); pop()
    os._exit(0 if child == 0 else 3)
_, status = os.waitpid(pid, 0)
deep(100)
json.dump({"child": pid, "status": status, "parent": os.getpid()}, open(sys.argv[1], "w"))
"""


def test_ranges_left_out_are_counted_when_no_recorded_edge_follows_them(tmp_path) -> None:
    """The count reaches the header at exit (the main thread's 100, inside a range never popped), every 64 (a
    thread that ends inside its outermost range: 64 of its 70, the rest said lost in the note's "at least"), and a
    child forked inside a range starts at depth 0 with a count of its own (its top range recorded, its 50 counted
    in its own trace, none of the parent's)."""
    events, out = run_injected(tmp_path, UNPOPPED_SIDE, max_depth=1, args=[str(NATIVE)])
    assert out["status"] == 0  # (the child's first push returned level 0)
    assert events.attrs["unrecorded_ranges"] == {out["parent"]: 100 + 64, out["child"]: 50}
    pushes = events[events["event"] == "push"]
    assert sorted(pushes["message"]) == ["child_top", "outer", "outer_thread"]
    assert pushes.loc[pushes["message"] == "child_top", "pid"].tolist() == [out["child"]]


@pytest.mark.parametrize("value", ["0", "-1", "2x", "", "4097"])
def test_a_max_depth_that_is_not_one_leaves_every_range_recorded(tmp_path, value) -> None:
    """PCIETRACE_MAX_DEPTH other than a whole number from 1 to PT_MAX_DEPTH: the library records every range."""
    events, levels = run_injected(tmp_path, DEEP_SIDE, env={"PCIETRACE_MAX_DEPTH": value}, args=[str(NATIVE), "1"])
    assert (events["event"] == "push").sum() == 2 * (1 + 3 + 3 * 4 * 2)
    assert events.attrs["unrecorded_ranges"] == {}


def test_attach_sets_its_run_flags_only_where_asked(monkeypatch) -> None:
    """A PCIETRACE_MAX_DEPTH (or another of attach's run flags) inherited from attach's environment is not passed
    on to a program attach runs without that option: the recording would leave ranges out, or read at every edge,
    without saying so."""
    from pcietrace.record.attach import RUN_FLAGS, injection_env

    for flag in RUN_FLAGS:
        monkeypatch.setenv(flag, "1")
    assert not set(RUN_FLAGS) & set(injection_env(Path("t"), "none", None, [0], False))
    assert injection_env(Path("t"), "none", None, [0], False, max_depth=3)["PCIETRACE_MAX_DEPTH"] == "3"
