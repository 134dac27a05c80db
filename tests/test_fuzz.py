"""Fuzz and property tests (hypothesis): whatever the input, pcietrace answers with figures or with one of
its typed errors (a PcietraceError: one line and exit 2 at the CLI), never another exception.

Inputs: mutated copies of the real recorded reports (tests/data, and ../shared/recordings when present),
mutated sysfs fixture trees, random argument lists, random counter sample streams. CI runs a fixed,
derandomized set (a few seconds); ``PCIETRACE_FUZZ_EXAMPLES=2000 python3 -m pytest tests/test_fuzz.py``
explores fresh random cases.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from pcietrace.analysis import RESULT_TABLES, analyze
from pcietrace.analysis.counters import unwrap, window_bytes
from pcietrace.cli import build_parser
from pcietrace.errors import PcietraceError, UsageError
from pcietrace.report.console import render, topology_tables
from pcietrace.report.saved import to_jsonable
from pcietrace.session import Session

from conftest import DATA
from sysfs_fixture import build

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "recordings"
REPORTS = [DATA / n for n in ("h100_run", "h100_run_latency", "h200x2_run", "attach_h100_python")]
REPORTS += sorted(p for p in SHARED.iterdir() if (p / "report.json").is_file()) if SHARED.is_dir() else []
FIXTURES = sorted((DATA / "topo").glob("*.json"))
DOCS = {p: json.loads((p / "report.json").read_text()) for p in REPORTS}

_N = int(os.environ.get("PCIETRACE_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=_N or 25, deadline=None, derandomize=not _N, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])


def exercise(path: Path) -> None:
    """Everything `pcietrace report` does with a saved run: load, analyse, JSON, console tables."""
    try:
        s = Session.load(path)
        results = analyze(s)
        assert set(results) == set(RESULT_TABLES)
        json.loads(json.dumps(to_jsonable(results)))
        render(s.meta, results, Console(file=io.StringIO(), width=200, markup=False))
    except PcietraceError:
        pass


def _copy(src: Path, dst: Path) -> Path:
    """The report folder ``src`` at ``dst``: report.json copied (to be mutated), Parquet files linked."""
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix == ".parquet":
            os.symlink(f.resolve(), dst / f.name)
        else:
            shutil.copy(f, dst / f.name)
    return dst


JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=6),
                        st.just([]), st.just({}), st.lists(st.integers(-3, 3), max_size=3),
                        st.dictionaries(st.sampled_from(["mode", "bits", "nvml_index", "x"]), st.integers(-1, 70),
                                        max_size=2))


def _pick(data: st.DataObject, doc: Any) -> tuple[Any, Any]:
    """A random (container, key) inside ``doc``, walking down from the top."""
    node, key = doc, None
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node))) if isinstance(node, list) else []
        if not keys:
            return node, key
        k = keys[data.draw(st.integers(0, len(keys) - 1))]
        child = node[k]
        if not isinstance(child, (dict, list)) or not child or data.draw(st.integers(0, 3)) == 0:
            return node, k
        node = child


@FUZZ
@given(data=st.data(), report=st.sampled_from(REPORTS), op=st.sampled_from(["delete", "retype", "nest"]))
def test_load_survives_mutated_keys(tmp_path_factory, data, report, op) -> None:
    doc = json.loads(json.dumps(DOCS[report]))
    parent, key = _pick(data, doc)
    if key is not None:
        if op == "delete" and isinstance(parent, dict):
            del parent[key]
        elif op == "delete":
            parent.pop(key)
        elif op == "retype":
            parent[key] = data.draw(JSON_VALUES)
        else:
            parent[key] = json.loads("[" * 50 + "]" * 50)
    run = _copy(report, tmp_path_factory.mktemp("run") / "run")
    (run / "report.json").write_text(json.dumps(doc))
    exercise(run)


@FUZZ
@given(data=st.data(), report=st.sampled_from(REPORTS),
       file=st.sampled_from(["report.json", "samples.parquet", "events.parquet"]),
       op=st.sampled_from(["truncate", "flip", "splice", "delete"]))
def test_load_survives_damaged_bytes(tmp_path_factory, data, report, file, op) -> None:
    run = tmp_path_factory.mktemp("run") / "run"
    shutil.copytree(report, run)
    f = run / file
    if not f.exists():
        return
    raw = bytearray(f.read_bytes())
    if op == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    elif op == "flip":
        for i in data.draw(st.lists(st.integers(0, len(raw) - 1), min_size=1, max_size=8)):
            raw[i] ^= data.draw(st.integers(1, 255))
    elif op == "splice":
        i = data.draw(st.integers(0, len(raw)))
        raw[i:i + data.draw(st.integers(0, 64))] = data.draw(st.binary(max_size=64))
    if op == "delete":
        f.unlink()
    else:
        f.write_bytes(bytes(raw))
    exercise(run)


@FUZZ
@given(data=st.data(), fixture=st.sampled_from(FIXTURES))
def test_sysfs_walker_survives_garbage_files(tmp_path_factory, data, fixture) -> None:
    from pcietrace.collectors import sysfs, topology

    root = build(fixture, tmp_path_factory.mktemp("sysfs") / "t")
    clean = sysfs.nvidia_gpus(root)
    files = sorted(p for p in (root / "devices").rglob("*") if p.is_file())
    touched = data.draw(st.lists(st.sampled_from(files), min_size=1, max_size=6, unique=True))
    for f in touched:
        if data.draw(st.booleans()):
            f.write_bytes(data.draw(st.binary(max_size=80)))
        else:
            f.write_text(data.draw(st.sampled_from(["-1", "0", "x16", "1_6", "٣", "", "None", "0x10de", "[/x]",
                                                    "99999999999999999999", "32.0 GT/s PCIe"])))
    topo = topology.collect(None, root)
    buf = io.StringIO()
    for t in topology_tables(topo):
        Console(file=buf, width=200, markup=False).print(t)
    found = {g["bdf"] for g in topo["gpus"]}
    untouched = [b for b in clean if not any(f.parent.name == b and f.name in ("vendor", "class") for f in touched)]
    assert set(untouched) <= found  # a GPU is dropped only if its own vendor/class file says it is no GPU
    text = buf.getvalue()
    assert "xNone" not in text and "x-1" not in text


ARG_VALUES = st.sampled_from(["0", "1", "-1", "3", "nan", "inf", "-inf", "1e309", "0.5", "-0.0", "1,2", "0,nan",
                              "a", "", "all", "0,1", "5", "2,,3", "1e6", "100001", " 7 "])
ARG_WORDS = st.sampled_from(["run", "report", "topo", "latency", "attach", "compare", "--simulate", "--quick",
                             "--window-s", "--durations", "--graph-k", "--seed", "--sample-interval-ms", "--idle-s",
                             "--us-per-level", "--repeats", "--gpu", "-o", "--force", "--no-save", "--json", "--",
                             "--perfetto", "--baseline", "--launch-counter", "--no-latency", "--sysfs-root"])


@FUZZ
@given(argv=st.lists(st.one_of(ARG_WORDS, ARG_VALUES), max_size=8), lead=st.sampled_from(["run", "attach", "report"]))
def test_parser_exits_0_or_2_and_validates_numbers(argv, lead) -> None:
    from pcietrace import commands
    from pcietrace.device import gpus

    argv = [lead] + argv
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = build_parser().parse_args(argv)
    except SystemExit as exc:
        assert exc.code in (0, 2) and "Traceback" not in err.getvalue()
        return
    for name in ("window_s", "sample_interval_ms", "idle_s", "us_per_level", "seed", "repeats"):
        v = getattr(args, name, None)
        assert v is None or (math.isfinite(v) and v >= 0)
    for name in ("durations", "graph_k"):
        assert all(math.isfinite(v) and v >= 0 for v in getattr(args, name, None) or ())
    with contextlib.suppress(UsageError):  # what the parser lets through, the config takes or refuses typed
        if args.command == "run":
            commands.run_config(args).plan()
        if hasattr(args, "gpu"):
            gpus.ordinals(args.gpu, 2)


@FUZZ
@given(raw=st.lists(st.integers(0, 2**32 - 1), max_size=200))
def test_unwrap_undoes_every_single_wrap(raw) -> None:
    cum = unwrap(np.array(raw, np.uint64), 32)
    assert cum.size == len(raw)
    if raw:
        assert cum[0] == 0 and (np.diff(cum) >= 0).all()
        assert ((cum + raw[0]) % 2**32 == np.array(raw)).all()


@st.composite
def sessions(draw: Any) -> Session:
    """A small session with random counter samples, windows, bursts and (attach) events."""
    gpus = draw(st.lists(st.integers(0, 3), min_size=1, max_size=2, unique=True))
    attach = draw(st.booleans())
    n = draw(st.integers(0, 40))
    times = st.integers(0, 10**9)
    t = draw(st.lists(st.one_of(times, st.integers(-10, -1)) if draw(st.integers(0, 5)) == 0 else times,
                      min_size=n, max_size=n))
    if draw(st.integers(0, 3)):  # mostly in order, as recorded
        t = sorted(t)
    big = st.integers(0, 2**32 - 1) if draw(st.integers(0, 5)) else st.integers(0, 2**64 - 1)
    samples = pd.DataFrame({"nvml_index": [draw(st.sampled_from(gpus)) for _ in range(n)], "t_ns": t,
                            "read_ns": draw(st.lists(st.integers(0, 10**6), min_size=n, max_size=n)),
                            "tx_raw": np.array(draw(st.lists(big, min_size=n, max_size=n)), np.uint64),
                            "rx_raw": np.array(draw(st.lists(big, min_size=n, max_size=n)), np.uint64)})
    samples = samples.sort_values(["nvml_index"], kind="stable").reset_index(drop=True)
    counter = st.fixed_dictionaries({"mode": st.sampled_from(["fields"] * 4 + ["throughput", "unknown"]),
                                     "bits": st.sampled_from([32] * 4 + [64, 0, 65])})
    meta: dict[str, Any] = {"gpus": [{"nvml_index": g, "name": "fuzz", "counter": draw(counter)} for g in gpus],
                            "status": "complete", "simulated": False}
    w = draw(st.integers(0, 12))
    start = draw(st.lists(times, min_size=w, max_size=w))
    length = st.integers(1, 10**8) if draw(st.integers(0, 5)) else st.integers(-10**3, 10**8)
    windows = pd.DataFrame({"nvml_index": [draw(st.sampled_from(gpus)) for _ in range(w)],
                            "mode": [draw(st.sampled_from(["idle", "eager", "graph"])) for _ in range(w)],
                            "t_start_ns": start,
                            "t_end_ns": [a + draw(length) for a in start]})
    events = pd.DataFrame()
    if attach:
        t0, t1 = sorted(draw(st.lists(times, min_size=2, max_size=2)))
        meta.update(kind="attach", t_app_start_ns=t0, t_app_end_ns=t1, sample_interval_ms=0.5)
        e = draw(st.integers(0, 10))
        counts = st.lists(st.integers(0, 10**6), min_size=e, max_size=e)
        events = pd.DataFrame({"t_ns": sorted(draw(st.lists(times, min_size=e, max_size=e))), "tid": 1,
                               "event": [draw(st.sampled_from(["push", "pop", "start", "end", "mark"])) for _ in range(e)],
                               "domain": "d", "id": draw(st.lists(st.integers(0, 3), min_size=e, max_size=e)),
                               "depth": draw(st.lists(st.integers(0, 3), min_size=e, max_size=e)),
                               "eager_thread": draw(counts), "graph_thread": draw(counts),
                               "eager_process": draw(counts), "graph_process": draw(counts),
                               "message": [draw(st.sampled_from(["a", "b", "[/x]"])) for _ in range(e)], "pid": 7})
    else:
        windows = windows.assign(purpose=[draw(st.sampled_from(["fit", "graph", "floor", "duration"])) for _ in range(w)],
                                 graph_k=draw(st.lists(st.integers(1, 1000), min_size=w, max_size=w)),
                                 calls=draw(st.lists(st.integers(0, 10**6), min_size=w, max_size=w)),
                                 kernel_us=draw(st.lists(st.sampled_from([0.0, 2.0, 50.0]), min_size=w, max_size=w)),
                                 target_rate_hz=draw(st.lists(st.one_of(st.none(), st.floats(1, 1e6)), min_size=w,
                                                              max_size=w)),
                                 achieved_rate_hz=draw(st.lists(st.floats(0, 1e6), min_size=w, max_size=w)))
        windows["launches"] = windows["calls"] * windows["graph_k"]
        windows["target_rate_hz"] = windows["target_rate_hz"].astype(float)
    return Session(meta=meta, samples=samples, windows=windows, events=events)


@FUZZ
@given(session=sessions())
def test_analysis_of_random_sample_streams_gives_figures_or_a_typed_error(session) -> None:
    try:
        results = analyze(session)
    except PcietraceError:
        return
    assert set(results) == set(RESULT_TABLES) and all(isinstance(v, pd.DataFrame) for v in results.values())
    json.loads(json.dumps(to_jsonable(results)))
    render(session.meta, results, Console(file=io.StringIO(), width=200, markup=False))


@FUZZ
@given(session=sessions())
def test_window_bytes_are_covered_or_nan(session) -> None:
    """Bytes between two times: NaN where samples do not cover the window, else finite."""
    from pcietrace.analysis import validate
    from pcietrace.analysis.counters import cumulative_bytes

    try:
        validate.check(session)
    except PcietraceError:
        return
    if not len(session.windows):
        return
    wb = window_bytes(cumulative_bytes(session.samples, session.counters), session.windows)
    covered = wb["rx_bytes"].notna()
    assert np.isfinite(wb.loc[covered, ["rx_bytes", "tx_bytes"]].to_numpy(float)).all()
    for _, w in wb[covered].iterrows():
        t = session.samples.loc[session.samples["nvml_index"] == w["nvml_index"], "t_ns"]
        assert t.min() <= w["t_start_ns"] and w["t_end_ns"] <= t.max()


CLI_WORDS = st.sampled_from(["--json", "--perfetto", "--us-per-level", "--sysfs-root", "0.3", "nan", "-1", "x",
                             "out.json", "/dev/full", "/nonexistent", str(DATA / "h100_run"),
                             str(DATA / "attach_h100_python"), str(DATA / "h100_run" / "samples.parquet"),
                             str(DATA / "topo"), str(DATA / "h200x2_run" / "report.json")])


@FUZZ
@given(cmd=st.sampled_from(["report", "compare", "topo"]), argv=st.lists(CLI_WORDS, max_size=5))
def test_reading_commands_exit_0_or_2_with_one_line(tmp_path_factory, cmd, argv) -> None:
    from pcietrace.cli import main

    cwd = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))  # a relative --perfetto FILE lands in a scratch folder
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                code = main([cmd, *argv])
            except SystemExit as exc:
                code = exc.code
    finally:
        os.chdir(cwd)
    assert code in (0, 2), (code, err.getvalue()[-500:])
    if code == 2:
        assert err.getvalue().count("\n") == 1 and "Traceback" not in err.getvalue()
