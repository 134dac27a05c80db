"""Two copies of the injection library in one process (loaded from two paths: attach from one install wrapping a
program that runs attach from another, or the library added to LD_PRELOAD by hand beside attach's): the first
to load records, any later one only forwards, so each launch is counted once and one copy writes the trace.

The copy is the built library copied under another path (another file, so another object to the loader). CPU
tests run test_capture.py's scripts over its fake driver and stand-in libcupti (no GPU); the GPU tests attach to
test_capture.py's apps with the copy preloaded beside attach's library.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import notes_text
from injected import build_fake, run_injected
from test_capture import (APPS, CAPTURE_SCRIPT, CUPTI_SCRIPT, DIRECT_LIB, DIRECT_SCRIPT, FAKE_CUPTI_CALLBACKS,
                          NO_DRIVER_SCRIPT, _build_direct_lib, _build_driver_api_app, _per_range)

#: The events one process's trace may hold in these runs (anything else: lines of two writers run together).
EVENTS = {"push", "pop", "mark", "nvtx", "exit", "interpose", "cupti", "cudevice", "copy", "callclock"}
#: A range's launch counts in attach's JSON report.
COLS = ["eager_launches", "graph_launches", "captured_launches"]


def _copy(tmp_path: Path) -> tuple[str, str]:
    """The built injection library and a byte-for-byte copy of it in ``tmp_path/other/``."""
    from pcietrace.errors import UsageError
    from pcietrace.record.trace import injection_library

    try:
        lib = injection_library()
    except UsageError:
        pytest.skip("the injection library is not built (python3 setup.py build_ext --inplace)")
    (tmp_path / "other").mkdir()
    copy = tmp_path / "other" / Path(lib).name
    shutil.copy(lib, copy)
    return lib, str(copy)


def _check_whole(ev: pd.DataFrame, want: list[tuple], counter_event: str, passive: str | None) -> None:
    """One process's trace, written by one copy: every range's push and pop once, the library's one-off lines
    (NVTX initialised, how launches are counted, exit) once, the passive copy's one "copy" line naming it
    (``passive``: its path; None: none written), and the exit totals equal to the launches the script made
    (``want``: (range, eager, graph, captured) per range)."""
    kinds = ev["event"].value_counts()
    assert ev["pid"].nunique() == 1
    assert set(kinds.index) <= EVENTS
    assert kinds.get("push", 0) == kinds.get("pop", 0) == len(want)
    assert kinds.get("nvtx", 0) == kinds.get(counter_event, 0) == kinds.get("exit", 0) == 1
    assert ev.loc[ev["event"] == "copy", "message"].tolist() == ([passive] if passive else [])
    last = ev.iloc[-1]
    assert last["event"] == "exit"
    assert [last["eager_process"], last["graph_process"], last["captured_process"]] == \
        [sum(w[i] for w in want) for i in (1, 2, 3)]


@pytest.mark.parametrize("script", ["trampolines", "direct calls"])
@pytest.mark.parametrize("first", ["attach's", "the copy"])
def test_two_preloaded_copies_count_each_launch_once(tmp_path, first: str, script: str) -> None:
    """Both copies in LD_PRELOAD (either first; NVTX names attach's) over the fake driver: launches through
    cuGetProcAddress's trampolines, and direct calls of code linked against libcuda (which pass through both
    copies' definitions), are each counted once, and the trace is one copy's, whole. Before, direct calls were
    counted twice and both copies truncated and wrote the same file."""
    pytest.importorskip("nvtx")
    cc = build_fake(tmp_path, "fake_libcuda.c", "libcuda.so.1")
    lib, copy = _copy(tmp_path)
    args = [str(_build_direct_lib(tmp_path, cc, DIRECT_LIB))] if script == "direct calls" else None
    preload = f"{lib} {copy}" if first == "attach's" else f"{copy} {lib}"
    ev, got = run_injected(tmp_path, DIRECT_SCRIPT if args else CAPTURE_SCRIPT, "interpose",
                           env={"LD_PRELOAD": preload}, args=args)
    want = [tuple(w) for w in got["want"]]
    assert _per_range(ev) == want
    assert sum(sum(w[1:]) for w in want) == got["driver_calls"]
    _check_whole(ev, want, "interpose", copy if first == "attach's" else lib)


@pytest.mark.parametrize("first", ["CUDA's", "NVTX's"])
def test_two_copies_loaded_locally_record_once(tmp_path, first: str) -> None:
    """No preload: CUDA's injection (CUDA_INJECTION64_PATH, CUPTI callbacks) is the copy and NVTX's is attach's
    library, both opened RTLD_LOCAL, so neither is in the global scope. Whichever loads first records; the other
    hands it NVTX's tables or CUDA's InitializeInjection: every range and launch once, in one trace."""
    pytest.importorskip("nvtx")
    cc = build_fake(tmp_path, "fake_libcuda.c", "libcuda.so.1")
    lib, copy = _copy(tmp_path)
    cupti = tmp_path / "libcupti_standin.so"
    (tmp_path / "cupti.c").write_text(FAKE_CUPTI_CALLBACKS)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(cupti), str(tmp_path / "cupti.c")], check=True)
    # a mark makes NVTX load its library before the script opens the CUDA injection's
    script = CUPTI_SCRIPT if first == "CUDA's" else "import nvtx; nvtx.mark('NVTX loads first')\n" + CUPTI_SCRIPT
    ev, got = run_injected(tmp_path, script, "cupti", env={"PCIETRACE_CUPTI": str(cupti), "CUDA_INJECTION64_PATH": copy})
    want = [tuple(w) for w in got["want"]]
    assert _per_range(ev) == want
    _check_whole(ev, want, "cupti", lib if first == "CUDA's" else copy)


def _unmarked_copy(tmp_path: Path, cc: str) -> str:
    """The injection library as built before copies knew of each other (4aa36b5): the same source, built
    under setup.py's file name with the marker and the note entry point kept out of its exported symbols."""
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "old").mkdir()
    (tmp_path / "hide.map").write_text("{ local: pcietrace_inject_copy; pcietrace_inject_copy_loaded; };\n")
    out = tmp_path / "old" / "_pt_inject.old.so"
    subprocess.run([cc, "-O2", "-fvisibility=hidden", "-std=gnu11", "-shared", "-fPIC", "-o", str(out),
                    f"-Wl,--version-script={tmp_path / 'hide.map'}",
                    *map(str, sorted((root / "pcietrace" / "native").glob("pt_inject*.c"))), "-ldl", "-lpthread"],
                   check=True)
    return str(out)


@pytest.mark.parametrize("script", ["trampolines", "direct calls"])
def test_a_copy_built_before_the_marker_loaded_first_records_alone(tmp_path, script: str) -> None:
    """A copy without the marker (built before it) preloaded before this build: it records, knowing nothing of
    copies; this one sees it by its file name and forwards, so each launch is counted once and the trace is
    whole. It cannot leave a note there (the old copy has no entry point for one). Before, both recorded:
    direct calls counted twice, one trace truncated by the other."""
    pytest.importorskip("nvtx")
    cc = build_fake(tmp_path, "fake_libcuda.c", "libcuda.so.1")
    lib, _ = _copy(tmp_path)
    old = _unmarked_copy(tmp_path, cc)
    args = [str(_build_direct_lib(tmp_path, cc, DIRECT_LIB))] if script == "direct calls" else None
    ev, got = run_injected(tmp_path, DIRECT_SCRIPT if args else CAPTURE_SCRIPT, "interpose",
                           env={"LD_PRELOAD": f"{old} {lib}"}, args=args)
    want = [tuple(w) for w in got["want"]]
    assert _per_range(ev) == want
    assert sum(sum(w[1:]) for w in want) == got["driver_calls"]
    _check_whole(ev, want, "interpose", None)


def test_a_second_copy_is_named_in_the_report_s_notes(tmp_path) -> None:
    """The passive copy's "copy" line becomes a note of the attach report: which process loaded a second
    copy, from where, and that each launch was counted once."""
    from pcietrace.analysis import analyze
    from pcietrace.session import Session

    pytest.importorskip("nvtx")
    build_fake(tmp_path, "fake_libcuda.c", "libcuda.so.1")
    lib, copy = _copy(tmp_path)
    ev, _ = run_injected(tmp_path, CAPTURE_SCRIPT, "interpose", env={"LD_PRELOAD": f"{lib} {copy}"})
    pid = int(ev["pid"].iloc[0])
    s = Session.load(Path(__file__).parent / "data" / "attach_h100_python")
    t0 = int(s.meta["t_app_start_ns"])  # the real H100 recording's program, its events replaced by this trace's
    s.events = ev.assign(t_ns=t0 + ev["t_ns"] - ev["t_ns"].min())
    notes = notes_text(analyze(s))
    assert [n for n in notes if "second copy" in n] == \
        [f"process {pid}: a second copy of the injection library was loaded ({copy}); it only forwarded to the "
         "first copy, which counted each launch once and wrote this trace"]


def test_without_a_driver_neither_copy_s_entry_points_are_found(tmp_path) -> None:
    """A program probing for the driver by a launch entry point before libcuda is loaded finds neither copy's
    definition; once the driver is loaded, it does."""
    build_fake(tmp_path, "fake_libcuda.c", "libcuda.so.1")
    lib, copy = _copy(tmp_path)
    _, got = run_injected(tmp_path, NO_DRIVER_SCRIPT, "interpose", env={"LD_PRELOAD": f"{lib} {copy}"})
    assert not any(got["before"].values())
    assert all(got["after"].values())


def _attach_with_copy(tmp_path: Path, first: str, program: list[str], attach: list[str] | None = None,
                      env: dict[str, str] | None = None) -> pd.DataFrame:
    """``pcietrace attach --json --launch-counter interpose`` (or ``attach``: another entry point and its options)
    of ``program``, with the copy preloaded too: after attach's library (``first`` "attach's": in the user's
    LD_PRELOAD, which attach appends) or before it (prepended by a shell around the program); ``env``: more
    environment. The ranges of the JSON report, by name."""
    _, copy = _copy(tmp_path)
    full = dict(os.environ, **(env or {}))
    if first == "attach's":
        full["LD_PRELOAD"] = copy
    else:
        program = ["sh", "-c", f'LD_PRELOAD="{copy} $LD_PRELOAD" exec {shlex.join(program)}']
    proc = subprocess.run([*(attach or [sys.executable, "-m", "pcietrace", "attach", "--no-calibrate"]), "--json",
                           "--launch-counter", "interpose", "-o", str(tmp_path / "attach"), "--", *program], env=full,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return pd.DataFrame(json.loads(proc.stdout)["results"]["ranges"]).set_index("name")


@pytest.mark.parametrize("first", ["attach's", "the copy"])
def test_attach_with_a_second_copy_preloaded_reports_each_launch_once(tmp_path, first: str) -> None:
    """`pcietrace attach` end to end on stand-in GPUs (tests/apps/attach_fake_gpu.py) over the fake driver, with
    a second copy preloaded by hand: the report's ranges hold the launches the program made through direct
    calls of code linked against libcuda, once each."""
    pytest.importorskip("nvtx")
    root = Path(__file__).resolve().parents[1]
    cc = build_fake(tmp_path, "fake_libcuda.c", "libcuda.so.1")
    lib = _build_direct_lib(tmp_path, cc, DIRECT_LIB)
    out = tmp_path / "out.json"
    ranges = _attach_with_copy(
        tmp_path, first, [sys.executable, "-c", DIRECT_SCRIPT, str(out), str(lib)],
        attach=[sys.executable, str(root / "tests" / "apps" / "attach_fake_gpu.py"), "attach", "--gpu", "0",
                "--no-calibrate", "--idle-s", "0.1"],
        env={"LD_LIBRARY_PATH": str(tmp_path), "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))})
    for name, *counts in json.loads(out.read_text())["want"]:
        assert ranges.loc[name, COLS].tolist() == counts, name



@pytest.mark.gpu
@pytest.mark.parametrize("first", ["attach's", "the copy"])
def test_attach_with_a_second_copy_counts_a_cuda_python_app_once(tmp_path, first: str) -> None:
    """On a GPU, a second copy preloaded beside attach's: capture_app.py's M eager kernels, K captured ones and
    one graph launch (through cuda.bindings: dlsym + cuGetProcAddress) are each counted once."""
    pytest.importorskip("nvtx")
    m, k = 700, 300
    ranges = _attach_with_copy(tmp_path, first, [sys.executable, str(APPS / "capture_app.py"), str(m), str(k)])
    assert ranges.loc["eager", COLS].tolist() == [m, 0, 0]
    assert ranges.loc["capture", COLS].tolist() == [0, 0, k]
    assert ranges.loc["replay", COLS].tolist() == [0, 1, 0]


@pytest.mark.gpu
@pytest.mark.parametrize("first", ["attach's", "the copy"])
def test_attach_with_a_second_copy_counts_direct_launches_once(tmp_path, first: str) -> None:
    """On a GPU, a second copy preloaded beside attach's: a program linked against libcuda, whose direct calls
    pass through both copies' definitions of cuLaunchKernel & co., has each launch counted once."""
    n = 250
    ranges = _attach_with_copy(tmp_path, first, [str(_build_driver_api_app(tmp_path)), str(n)])
    for name in ("direct_launch", "direct_ex", "direct_cooperative"):
        assert ranges.loc[name, COLS].tolist() == [n, 0, 0], name
    assert ranges.loc["direct_graph", COLS].tolist() == [0, n, 0]


#: A C program that probes for the driver from its own code (not through ctypes, whose dlsym caller is libffi).
PROBE_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
int main(void)
{
    void *p = dlsym(RTLD_DEFAULT, "cuLaunchKernel");
    const char *err = p ? "" : dlerror();
    printf("%d %d\n", p != NULL, err != NULL);
    return 0;
}
"""


@pytest.mark.parametrize("copies", [1, 2])
def test_a_c_program_probing_for_the_driver_finds_no_copy_s_entry_points(tmp_path, copies: int) -> None:
    """A C program's own dlsym(RTLD_DEFAULT, "cuLaunchKernel") with no driver loaded, under one copy or two:
    not found, with dlerror() set. (Before: the library's own definition was handed back, the next object after
    the program being the preloaded library itself.)"""
    lib, copy = _copy(tmp_path)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    (tmp_path / "probe.c").write_text(PROBE_C)
    subprocess.run([cc, "-O2", "-o", str(tmp_path / "probe"), str(tmp_path / "probe.c"), "-ldl"], check=True)
    env = dict(os.environ, PCIETRACE_COUNT="interpose", LD_PRELOAD=" ".join([lib, copy][:copies]))
    proc = subprocess.run([str(tmp_path / "probe")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "1"]  # not found, and dlerror() says why
