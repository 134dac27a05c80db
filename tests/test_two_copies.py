"""Two copies of the injection library in one process (loaded from two paths: attach from one install wrapping a
program that runs attach from another, or the library added to LD_PRELOAD by hand beside attach's): the first
to load records, any later one only forwards, so each launch is counted once and one copy writes the trace.

The copy is the built library copied under another path (another file, so another object to the loader); the
scripts, the fake driver and the stand-in libcupti are test_capture.py's (no GPU).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from injected import build_fake, run_injected
from test_capture import (CAPTURE_SCRIPT, CUPTI_SCRIPT, DIRECT_LIB, DIRECT_SCRIPT, FAKE_CUPTI_CALLBACKS,
                          NO_DRIVER_SCRIPT, _build_direct_lib, _per_range)


def _copy(tmp_path: Path) -> tuple[str, str]:
    """The built injection library and a byte-for-byte copy of it in ``tmp_path/other/``."""
    from pcietrace.errors import UsageError
    from pcietrace.record.attach import injection_library

    try:
        lib = injection_library()
    except UsageError:
        pytest.skip("the injection library is not built (python3 setup.py build_ext --inplace)")
    (tmp_path / "other").mkdir()
    copy = tmp_path / "other" / Path(lib).name
    shutil.copy(lib, copy)
    return lib, str(copy)


def _check_whole(ev: pd.DataFrame, want: list[tuple]) -> None:
    """One process's trace written by one copy: every range's push and pop once, the library's one-off lines
    once, and the exit totals equal to the launches the script made."""
    kinds = ev["event"].value_counts()
    assert ev["pid"].nunique() == 1
    assert kinds.get("push", 0) == kinds.get("pop", 0) == len(want)
    assert kinds.get("nvtx", 0) == kinds.get("exit", 0) == 1
    assert ev.iloc[-1]["event"] == "exit"
    assert set(ev["event"]) <= {"push", "pop", "nvtx", "exit", "interpose", "cupti", "cudevice", "mark"}
    last = ev.iloc[-1]
    assert [last["eager_process"], last["graph_process"], last["captured_process"]] == \
        [sum(w[i] for w in want) for i in (1, 2, 3)]


@pytest.mark.parametrize("script", ["trampolines", "direct calls"])
@pytest.mark.parametrize("first", ["attach's", "the copy"])
def test_two_preloaded_copies_count_each_launch_once(tmp_path, first: str, script: str) -> None:
    """Both copies in LD_PRELOAD (either order) over the fake driver: launches through cuGetProcAddress's
    trampolines, and direct calls of code linked against libcuda (which pass through both copies' definitions),
    are each counted once, and the trace is one copy's, whole."""
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
    _check_whole(ev, want)
    assert (ev["event"] == "interpose").sum() == 1


@pytest.mark.parametrize("first", ["CUDA's", "NVTX's"])
def test_two_copies_loaded_locally_record_once(tmp_path, first: str) -> None:
    """No preload: the CUDA injection (CUDA_INJECTION64_PATH, CUPTI callbacks) is the copy and NVTX's is
    attach's library, both loaded RTLD_LOCAL, so neither sees the other in the global scope. Whichever loads
    first records; the other hands NVTX's tables or CUDA's InitializeInjection to it: ranges and launches once."""
    cc = build_fake(tmp_path, "fake_libcuda.c", "libcuda.so.1")
    _, copy = _copy(tmp_path)
    (tmp_path / "cupti.c").write_text(FAKE_CUPTI_CALLBACKS)
    subprocess_env = {"PCIETRACE_CUPTI": str(tmp_path / "libcupti_standin.so"), "CUDA_INJECTION64_PATH": copy}
    import subprocess

    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", subprocess_env["PCIETRACE_CUPTI"], str(tmp_path / "cupti.c")],
                   check=True)
    pytest.importorskip("nvtx")
    script = CUPTI_SCRIPT if first == "CUDA's" else "import nvtx; nvtx.mark('NVTX loads first')\n" + CUPTI_SCRIPT
    ev, got = run_injected(tmp_path, script, "cupti", env=subprocess_env)
    want = [tuple(w) for w in got["want"]]
    assert _per_range(ev) == want
    _check_whole(ev, want)
    assert (ev["event"] == "cupti").sum() == 1


def test_without_a_driver_neither_copy_s_entry_points_are_found(tmp_path) -> None:
    """A program probing for the driver by a launch entry point before libcuda is loaded finds neither copy's
    definition (the first copy's lookup must not hand out the second's); once the driver is loaded, it does."""
    build_fake(tmp_path, "fake_libcuda.c", "libcuda.so.1")
    lib, copy = _copy(tmp_path)
    _, got = run_injected(tmp_path, NO_DRIVER_SCRIPT, "interpose", env={"LD_PRELOAD": f"{lib} {copy}"})
    assert not any(got["before"].values())
    assert all(got["after"].values())
