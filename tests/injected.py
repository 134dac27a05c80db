"""CPU tests of the injection library (pcietrace/native/pt_inject*.c) over fakes: build a stand-in shared library
(tests/native/), and run a script with the real library in attach's environment (no GPU)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

NATIVE = Path(__file__).parent / "native"


def build_fake(tmp_path: Path, source: str, soname: str, *libs: str) -> str:
    """Compile ``tests/native/<source>`` into ``tmp_path/<soname>`` (skips without a C compiler); the compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    subprocess.run([cc, "-O2", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(tmp_path / soname),
                    str(NATIVE / source), *libs], check=True)
    return cc


def injection_library_or_skip() -> str:
    """The built injection library; the test skipped where it is not built."""
    from pcietrace.errors import UsageError
    from pcietrace.record.trace import injection_library

    try:
        return injection_library()
    except UsageError:
        pytest.skip("the injection library is not built (python3 setup.py build_ext --inplace)")


def run_native_program(tmp_path: Path, source: str, *args: str, cflags: tuple[str, ...] = (), timeout: int = 120
                       ) -> tuple[str, Path]:
    """Build ``tests/native/<source>`` into a program and run it with the real injection library (its first
    argument) and ``args``, writing its trace to a folder of its own (skips without a C compiler or the built
    library): its standard output and that folder."""
    lib = injection_library_or_skip()
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    prog = tmp_path / Path(source).stem
    subprocess.run([cc, "-O2", *cflags, "-o", str(prog), str(NATIVE / source), "-ldl"], check=True)
    traces = tmp_path / "traces"
    traces.mkdir()
    out = subprocess.run([str(prog), lib, *args], env={"PCIETRACE_TRACE_DIR": str(traces)}, capture_output=True,
                         text=True, timeout=timeout, check=True)
    return out.stdout, traces


def run_injected(tmp_path: Path, script: str, counter: str = "none", *, exact_edges: bool = False,
                 max_depth: int | None = None, env: dict[str, str] | None = None,
                 args: list[str] | None = None, timeout: float = 60) -> tuple[pd.DataFrame, dict]:
    """``script`` (its argv[1]: a JSON file it writes; then ``args``) with the injection library as attach sets
    it up (``counter``: "interpose", "cupti" or "none"; ``exact_edges``; ``max_depth``), fakes found in
    ``tmp_path`` first, given ``timeout`` s; returns the trace's events and the JSON. Skips where the library is
    not built."""
    from pcietrace.record.trace import read_traces
    from pcietrace.record.attach import injection_env

    traces = tmp_path / "traces"
    traces.mkdir()
    injection_library_or_skip()
    full = injection_env(traces, counter, None, [0], exact_edges, max_depth=max_depth)
    full.update({"LD_LIBRARY_PATH": str(tmp_path), **(env or {})})
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "-c", script, str(out), *(args or [])], env=full, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return read_traces(traces), json.loads(out.read_text())


def run_nvtx_program(tmp_path: Path, prog: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    """Python program ``prog`` run with the real injection library driven through NVTX's injection hook (the nvtx
    package; no GPU needed), its trace written into ``tmp_path``, ``env`` added to the environment; its output
    (text). Skips without the nvtx package."""
    import os

    from pcietrace.record.trace import injection_library

    pytest.importorskip("nvtx")
    full = dict(os.environ, NVTX_INJECTION64_PATH=injection_library(), PCIETRACE_TRACE_DIR=str(tmp_path), **env)
    proc = subprocess.run([sys.executable, "-c", prog], env=full, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc
