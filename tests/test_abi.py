"""The injection library's contract with the Python side (pcietrace/native/pt_abi.h): the edge page's words, the
trace format's version line and the interface version are the same numbers on both sides; a library built with
``cc`` from the sources exports that version, and attach refuses a library that lacks it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from collectors import edges
from pcietrace.config import MAX_DEPTH
from pcietrace.errors import UsageError
from pcietrace.record import trace

NATIVE = Path(__file__).resolve().parent.parent / "pcietrace" / "native"


def _defines() -> dict[str, str]:
    text = (NATIVE / "pt_abi.h").read_text()
    return dict(re.findall(r"^#define (PT_\w+) (\S+)", text, re.M))


def test_the_header_and_the_python_side_agree() -> None:
    d = _defines()
    assert int(d["PT_ABI_VERSION"]) == trace.INJECT_ABI
    assert trace.INJECT_ABI_TAG == b"pcietrace-inject-abi %s\0" % d["PT_ABI_VERSION"].encode()
    words = {"PT_EDGE_SEQ": edges.SEQ, "PT_EDGE_OPEN_RANGES": edges.OPEN_RANGES,
             "PT_EDGE_FORCE_FAST": edges.FORCE_FAST, "PT_EDGE_COUNTING": edges.COUNTING,
             "PT_EDGE_PAGE_BYTES": edges.PAGE}
    assert {k: int(d[k]) for k in words} == words
    assert d["PT_TRACE_MAGIC"].strip('"').encode() == trace.TRACE_MAGIC
    assert int(d["PT_TRACE_VERSION"]) == trace.TRACE_VERSION == max(trace.TRACE_COLUMNS)
    assert int(d["PT_TRACE_RESERVE"]) == trace.TRACE_RESERVE_BYTES
    assert int(d["PT_EDGE_TIMED_EVERY"]) == trace.EDGE_TIMED_EVERY
    assert int(d["PT_MAX_DEPTH"]) == MAX_DEPTH


def test_the_trace_records_are_laid_out_as_python_reads_them(tmp_path) -> None:
    # every field's offset and size in the C structs (as the compiler lays them out) against the numpy dtypes
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    probe = ['#include <stddef.h>', '#include <stdio.h>', '#include "pt_abi.h"', 'int main(void) {']
    for struct, dtype in (("pt_event", trace.EVENT_DTYPE), ("pt_trace_header", trace.HEADER_DTYPE)):
        probe.append(f'printf("{struct} %zu\\n", sizeof(struct {struct}));')
        for name in dtype.names:
            probe.append(f'printf("{name} %zu %zu\\n", offsetof(struct {struct}, {name}), '
                         f'sizeof(((struct {struct} *)0)->{name}));')
    (tmp_path / "probe.c").write_text("\n".join(probe + ["return 0; }"]))
    subprocess.run([cc, "-std=gnu11", "-I", str(NATIVE), "-o", str(tmp_path / "probe"), str(tmp_path / "probe.c")],
                   check=True)
    out = subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True, check=True).stdout.split("\n")
    got = iter(out)
    for struct, dtype in (("pt_event", trace.EVENT_DTYPE), ("pt_trace_header", trace.HEADER_DTYPE)):
        assert next(got) == f"{struct} {dtype.itemsize}"
        for name in dtype.names:
            offset, size = dtype.fields[name][1], dtype.fields[name][0].itemsize
            assert next(got) == f"{name} {offset} {size}"


def _build(tmp_path: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    out = tmp_path / "_pt_inject.so"
    subprocess.run([cc, "-O2", "-fvisibility=hidden", "-std=gnu11", "-Wall", "-Werror", "-shared", "-fPIC", "-o",
                    str(out), *map(str, sorted(NATIVE.glob("pt_inject*.c"))), "-ldl", "-lpthread"], check=True)
    return out


def test_a_library_built_from_the_sources_exports_the_version_python_expects(tmp_path) -> None:
    lib = _build(tmp_path)
    probe = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
             "print(ctypes.c_uint.in_dll(lib, 'pcietrace_inject_abi').value)")
    got = subprocess.run([sys.executable, "-c", probe, str(lib)], capture_output=True, text=True, check=True)
    assert int(got.stdout) == trace.INJECT_ABI
    assert trace.INJECT_ABI_TAG in lib.read_bytes()  # what injection_library() looks for, without loading it


def test_a_library_of_another_interface_is_refused(tmp_path, monkeypatch) -> None:
    old = tmp_path / "_pt_inject.so"
    old.write_bytes(_build(tmp_path).read_bytes().replace(trace.INJECT_ABI_TAG, b"pcietrace-inject-abi 0\0"))
    monkeypatch.setattr("pcietrace.device.native.built", lambda module: str(old))
    with pytest.raises(UsageError, match="interface version"):
        trace.injection_library()


def test_each_trace_begins_with_its_version_line(tmp_path) -> None:
    pytest.importorskip("nvtx")
    try:
        lib = trace.injection_library()
    except UsageError:
        pytest.skip("the injection library is not built (python3 setup.py build_ext --inplace)")
    env = dict(os.environ, NVTX_INJECTION64_PATH=lib, PCIETRACE_TRACE_DIR=str(tmp_path))
    subprocess.run([sys.executable, "-c", "import nvtx; nvtx.push_range('a'); nvtx.pop_range()"], env=env,
                   check=True, timeout=60)
    (path,) = tmp_path.glob("trace-*.bin")
    with open(path, "rb") as f:
        assert f.readline() == b"%s %d\n" % (trace.TRACE_MAGIC, trace.TRACE_VERSION)
    ev = trace.read_traces(tmp_path)
    assert list(ev["event"][ev["event"].isin(["push", "pop"])]) == ["push", "pop"]
    assert list(ev.columns) == trace.EVENT_COLUMNS + ["pid"]


def test_a_trace_is_read_by_the_version_it_names_and_a_newer_one_is_left_out(tmp_path) -> None:
    line = "\t".join(["5", "1", "push", "default", "0"] + ["0"] * 13 + ["r"])  # version 4's 19 fields
    v3 = "\t".join(["6", "1", "pop", "default", "0"] + ["0"] * 9 + [""])  # a line of version 3's 15 fields
    (tmp_path / "trace-1.tsv").write_text(f"#pcietrace-trace 4\n{line}\n{v3}\n{v3}\n")
    ev = trace.read_traces(tmp_path)  # version 4 named: its lines kept, the others' left out (not the majority's)
    assert ev["message"].tolist() == ["r"] and ev["t_ns"].tolist() == [5] and ev.attrs["bad_lines"] == 2
    (tmp_path / "trace-1.tsv").write_text(f"#pcietrace-trace 99\n{line}\n")
    ev = trace.read_traces(tmp_path)  # a newer format: nothing read as if it were an old one
    assert ev.empty and ev.attrs["bad_lines"] == 2


def test_a_trace_without_the_line_is_read_by_its_field_count(data_dir, tmp_path) -> None:
    shutil.copy(data_dir / "attach" / "nvtx_python_threads.tsv", tmp_path / "trace-7551.tsv")
    ev = trace.read_traces(tmp_path)
    assert len(ev) and list(ev.columns) == trace.EVENT_COLUMNS_V1 + ["pid"]
