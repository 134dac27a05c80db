"""The classes of bad input of issue 39, each at its root: hostile text reaching a terminal or a text format
(pcietrace/report/text.py), trace lines attach cannot parse (record/trace.py: read_traces), JSON nested too
deep (schema.load_json), reports breaking an invariant (analysis/validate.py), concurrent writers, signals and
full disks (record/guard.py), a sampler child killed while its parent waits (collectors/sampler.py: stop), and
leftovers of killed runs. Property tests (hypothesis) for the sanitiser, the trace parser and the validator."""

from __future__ import annotations

import csv
import io
import json
import math
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import checkout_env, edit_report, notes_text, one_line_exit_2
from test_attach import attach_stand_ins  # noqa: F401  (a fixture: attach on stand-in GPU and samplers)
from pcietrace.analysis import analyze, validate
from pcietrace.cli import main
from pcietrace.errors import DataError, PcietraceError, UsageError
from pcietrace.record import guard, trace
from pcietrace.session import Session

PROPS = settings(max_examples=int(os.environ.get("PCIETRACE_FUZZ_EXAMPLES", "0")) or 60, deadline=None,
                 derandomize=not os.environ.get("PCIETRACE_FUZZ_EXAMPLES"), database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
#: A string a hostile program, GPU or user could put in any field: terminal escapes (CSI, OSC title and
#: hyperlink), C0/C1 controls, CR/LF with a fake CSV block and a Markdown cell break, bidi override, a lone surrogate.
HOSTILE = "\x1b[2J\x1b]0;owned\x07\x1b]8;;http://x\x1b\\link\x9b31m\r\n# table: fake\nA|B\u202eevil\udc80\x00"


# --- 1. one sanitiser for every string that reaches a terminal or a text format ----------------------------

@PROPS
@given(st.text())
def test_clean_leaves_nothing_unsafe_and_is_stable(s) -> None:
    from pcietrace.report.text import UNSAFE, clean

    out = clean(s)
    assert not UNSAFE.search(out)
    out.encode("utf-8")  # (a lone surrogate made every renderer fail)
    assert clean(out) == out
    if not UNSAFE.search(s):
        assert out == s  # safe text passes untouched


@PROPS
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30))
def test_clean_is_one_to_one_on_what_it_escapes(s) -> None:
    from pcietrace.report.text import UNSAFE, clean

    # what it escapes stays readable: every unsafe character becomes its own visible escape
    assert len(clean(s)) >= len(s) and clean(s).count("\\") >= len(UNSAFE.findall(s))


def _hostile_report(copy, name: str = "attach_h100_python") -> Path:
    run = copy(name)

    def change(d):
        d["meta"]["gpus"][0]["name"] = HOSTILE
        d["meta"]["host"] = HOSTILE
        d["meta"]["command"] = [HOSTILE, "x"]
    edit_report(run, change)
    ev = pd.read_parquet(run / "events.parquet")
    text = HOSTILE.replace("\udc80", "")  # (Parquet holds UTF-8 only: the surrogate goes in report.json above)
    ranges = ev["event"].isin(["push", "pop"])
    ev.loc[ranges, "message"] = ev.loc[ranges, "message"] + text
    ev.loc[ranges, "domain"] = text
    ev.to_parquet(run / "events.parquet", index=False)
    return run


@pytest.mark.parametrize("fmt", ["table", "csv", "md", "json", "prometheus"])
def test_hostile_strings_reach_no_format_raw(copy, capsysbinary, monkeypatch, fmt) -> None:
    """Escapes, controls, CR/LF, bidi overrides and a lone surrogate in the GPU name, host, command and every
    range name and domain: every format renders, none carries a control character; CSV has only its own
    ``# table:`` lines and Markdown tables keep their row count (was: the terminal took the escapes, CSV got a
    fake block, a CR broke the pipe table, the surrogate raised UnicodeEncodeError)."""
    pytest.importorskip("prometheus_client") if fmt == "prometheus" else None
    monkeypatch.setenv("COLUMNS", "250")
    run = _hostile_report(copy)
    assert main(["report", str(run), "--format", fmt, "--detail"]) == 0
    out = capsysbinary.readouterr().out.decode("utf-8")
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]", out), "a control character reached the output"
    if fmt == "csv":
        assert all(line.startswith("# table: ") and line[9:].isidentifier()
                   for line in out.splitlines() if line.startswith("# table"))
        block = out.split("# table: ranges\n")[1].split("\n\n")[0]
        back = pd.read_csv(io.StringIO(block))
        assert back["domain"].str.contains("# table: fake").all()  # the fake block is a cell, not a block
    if fmt == "md":
        section = out.split("## ranges\n\n")[1].split("\n\n")[0].splitlines()
        width = section[0].count(" | ")
        cells = [re.sub(r"\\.", "", line) for line in section[2:]]  # (escaped characters are cell text)
        assert len(section) > 2 and all(line.count(" | ") == width for line in cells)


def test_csv_text_starting_with_a_hash_is_quoted_not_a_comment() -> None:
    from pcietrace.report import csv as csv_out

    df = pd.DataFrame({"name": ["# table: fake", "ok"], "x": [1, 2]})
    text = csv_out.render({}, {"t": df}, {"lines": []})
    block = text.split("# table: t\n")[1]
    assert pd.read_csv(io.StringIO(block), comment="#").equals(df) or \
        list(csv.reader(io.StringIO(block)))[1][0] == "# table: fake"
    assert [ln for ln in text.splitlines() if ln.startswith("#")] == ["# table: t"]


def test_csv_text_holding_a_hash_is_quoted_so_its_row_reads_whole() -> None:
    # was: `--group-by numbered` wrote its `layer#` groups unquoted, and read_csv(comment="#") as the docs read a
    # block cut each such row there (a fuzzer, on the committed 4x H200 recording); Arrow's rows and pandas' alike
    from pcietrace.report import csv as csv_out

    rows = pd.DataFrame({"domain": ["d", "d"], "name": pd.Categorical(["layer#", "op#1, x"]), "calls": [3, 4]})
    plain = pd.DataFrame({"name": ["a#b", "c"], "x": [1.0, 2.0]}).astype({"x": np.float32})  # (through pandas)
    assert csv_out._by_rows(rows, csv_out._quoting(rows)) and not csv_out._by_rows(plain, csv_out._quoting(plain))
    text = csv_out.render({}, {"rows": rows, "plain": plain}, {"lines": []})
    for name, df in (("rows", rows), ("plain", plain)):
        block = text.split(f"# table: {name}\n")[1].split("\n# table:")[0]
        back = pd.read_csv(io.StringIO(block), comment="#")
        assert list(back["name"]) == list(df["name"].astype(str)) and back.notna().all().all()


def test_error_lines_are_cleaned(tmp_path, capsys) -> None:
    bad = tmp_path / "x\x1b[2Jy"
    bad.mkdir()
    err = one_line_exit_2(["report", str(bad)], capsys)
    assert "\x1b" not in err and "\\x1b" in err


def test_clean_all_reaches_frames_keys_and_lists() -> None:
    from pcietrace.report.text import UNSAFE, clean_all

    meta = {"a\x1b": [HOSTILE, {"k": HOSTILE}], "n": 1.5}
    df = pd.DataFrame({"c\r": [HOSTILE, None, 3]})
    m, d = clean_all((meta, df))
    assert not UNSAFE.search(json.dumps(m, ensure_ascii=False)) and m["n"] == 1.5
    assert not UNSAFE.search(str(list(d.columns)) + str(d.iloc[0, 0])) and d.iloc[2, 0] == 3


# --- 2. a trace-line parser that never loses a recording ---------------------------------------------------

def _line(t: int, event: str = "push", message: str = "r", domain: str = "default", tid: int = 7) -> bytes:
    """One trace line in the current layout (CONSTRUCTED, in the injection library's field order)."""
    values = {"t_ns": t, "tid": tid, "event": event, "domain": domain, "id": 0, "depth": 1, "eager_thread": 0,
              "graph_thread": 0, "eager_process": 0, "graph_process": 0, "dev": -1, "devmask": 0,
              "captured_thread": 0, "captured_process": 0, "call_ns_thread": -1, "call_ns_process": -1,
              "wait_ns_thread": -1, "wait_ns_process": -1, "message": message}
    return "\t".join(str(values[c]) for c in trace.EVENT_COLUMNS).encode("utf-8", "surrogateescape") + b"\n"


# (no NUL: the library's lines never hold one, and a NUL marks where the unwritten part of a trace file begins)
GARBAGE = st.one_of(
    st.binary(max_size=60).map(lambda b: b.replace(b"\n", b"").replace(b"\0", b"")),  # anything on one line
    st.just(b"1\t2\t3"), st.just(b"x" * 2000),
    st.integers(0, 30).map(lambda n: b"\t".join([b"z"] * n)),  # wrong field counts (or words for numbers)
)


@PROPS
@given(st.lists(st.tuples(st.booleans(), GARBAGE, st.text(max_size=20)), max_size=40))
def test_the_trace_parser_keeps_every_good_line_and_counts_the_rest(tmp_path_factory, rows) -> None:
    folder = tmp_path_factory.mktemp("tr")
    raw, good, names = b"", 0, []
    for i, (is_good, junk, name) in enumerate(rows):
        if is_good:
            name = name.replace("\t", " ").replace("\n", " ").replace("\0", "")
            raw += _line(1000 + i, message=name)
            good += 1
            names.append(name.encode("utf-8", "surrogateescape").decode("utf-8", "replace"))
        else:
            raw += junk + b"\n"
    # the version line every trace begins with (without it the layout is guessed by a majority of lines, and
    # junk of an older layout's field count could outvote the good lines)
    (folder / "trace-42.tsv").write_bytes(b"%s %d\n" % (trace.TRACE_MAGIC, max(trace.TRACE_COLUMNS)) + raw)
    ev = trace.read_traces(folder)
    # a junk line can happen to be a valid line: then it is kept, never lost
    assert len(ev) + ev.attrs["bad_lines"] == len(rows)
    assert len(ev) >= good
    kept = ev["message"].tolist() if len(ev) else []
    it = iter(kept)
    assert all(any(n == k for k in it) for n in names)  # every good line, in order
    if len(ev):
        assert ev["t_ns"].dtype.kind == "i" and (ev["pid"] == 42).all()  # (32 bits where every value fits)


def test_trace_lines_with_cr_cut_utf8_and_foreign_files_are_kept_or_counted(tmp_path) -> None:
    """The real injection library (driven by the nvtx package): a range name with CR, a 1,023-byte name cut
    inside a UTF-8 character, a long non-ASCII domain (cut at 255 bytes), and a foreign ``trace-*.tsv`` in the
    folder (was: ValueError/UnicodeDecodeError, the recording lost)."""
    pytest.importorskip("nvtx")
    env = dict(os.environ, NVTX_INJECTION64_PATH=trace.injection_library(), PCIETRACE_TRACE_DIR=str(tmp_path))
    prog = ("import nvtx\nnvtx.push_range('a\\rb')\nnvtx.pop_range()\n"
            "nvtx.push_range('x' * 1022 + '\\u00e9')\nnvtx.pop_range()\n"
            "nvtx.push_range('in', domain='\\u00e9' * 300)\nnvtx.pop_range(domain='\\u00e9' * 300)\n")
    subprocess.run([sys.executable, "-c", prog], env=env, check=True, timeout=60)
    (tmp_path / "trace-notes.tsv").write_text("not\ta trace\n")
    (tmp_path / "trace-99.tsv").write_bytes(_line(5) + b"garbage line\n" + _line(6, "pop"))
    ev = trace.read_traces(tmp_path)
    pushes = ev[(ev["event"] == "push") & (ev["pid"] != 99)]
    assert pushes["message"].tolist() == ["a\rb", "x" * 1022 + "\ufffd", "in"]
    assert pushes["domain"].iloc[2] == "\u00e9" * 127 + "\ufffd"
    assert ev.attrs == {"bad_lines": 1, "bad_files": ["trace-notes.tsv"], "edge_timing": {}, "unrecorded_ranges": {}}
    assert (ev["pid"] == 99).sum() == 2


def test_bad_trace_lines_are_said_in_a_note(data_dir) -> None:
    s = Session.load(data_dir / "attach_h100_python")
    s.meta["trace_bad"] = {"lines": 3, "files": ["trace-x.tsv"]}
    notes = notes_text(analyze(s))
    assert any("3 line(s) that were not trace lines" in n and "trace-x.tsv" in n for n in notes)


def test_attach_keeps_the_recording_and_the_exit_code_with_bad_trace_lines(attach_stand_ins, tmp_path,
                                                                            capsys) -> None:
    """A program whose traced name holds CR and whose trace folder gets a foreign file: the run is saved, the
    program's exit code (3) passes through, and meta says what was left out."""
    pytest.importorskip("nvtx")
    S, made = attach_stand_ins
    prog = ("import nvtx, os, sys\nnvtx.push_range('a\\rb')\nnvtx.pop_range()\n"
            "open(os.path.join(os.environ['PCIETRACE_TRACE_DIR'], 'trace-x.tsv'), 'w').write('x\\n')\nsys.exit(3)\n")
    out = tmp_path / "rec"
    assert main(["attach", "--gpu", "0", "--no-calibrate", "--idle-s", "0.01", "-o", str(out), "--",
                 sys.executable, "-c", prog]) == 3
    meta = json.loads((out / "report.json").read_text())["meta"]
    assert meta["exit_code"] == 3 and meta["trace_bad"] == {"lines": 0, "files": ["trace-x.tsv"]}
    ev = pd.read_parquet(out / "events.parquet")
    assert "a\rb" in ev["message"].tolist()


# --- 3. a depth limit on JSON input --------------------------------------------------------------------------

@pytest.mark.parametrize("depth", [65, 950, 5000, 100_000])
def test_deep_json_is_one_line_for_reports_meta_and_fixtures(tmp_path, capsys, depth) -> None:
    deep = "[" * depth + "]" * depth
    (tmp_path / "report.json").write_text('{"schema": "pcietrace.report/1", "meta": {"gpus": [], "x": %s}, '
                                          '"tables": {}}' % deep)
    assert "nested too deeply" in one_line_exit_2(["report", str(tmp_path)], capsys)
    (tmp_path / "fixture.json").write_text('{"devices": %s}' % deep)
    assert "nested too deeply" in one_line_exit_2(["topo", "--fixture", str(tmp_path / "fixture.json")], capsys)


@PROPS
@given(st.recursive(st.none() | st.integers() | st.text(max_size=4),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3)))
def test_json_depth_counts_brackets_outside_strings(doc) -> None:
    from pcietrace.schema import json_depth

    def depth(o) -> int:
        if isinstance(o, list):
            return 1 + max(map(depth, o), default=0)
        if isinstance(o, dict):
            return 1 + max(map(depth, o.values()), default=0)
        return 0
    assert json_depth(json.dumps(doc).encode()) == depth(doc)


# --- 4. a report's invariants: refused or said, never printed wrong -----------------------------------------

def _samples(run: Path, change) -> None:
    s = pd.read_parquet(run / "samples.parquet")
    change(s).to_parquet(run / "samples.parquet", index=False)


def _events(run: Path, change) -> None:
    e = pd.read_parquet(run / "events.parquet")
    change(e).to_parquet(run / "events.parquet", index=False)


def _dup_times(s: pd.DataFrame) -> pd.DataFrame:
    extra = s.sample(frac=0.1, random_state=1)
    return pd.concat([s, extra]).sort_values(["nvml_index", "t_ns"], kind="stable").reset_index(drop=True)


def _back_launches(e: pd.DataFrame) -> pd.DataFrame:
    i = e.index[(e["eager_thread"] > 0)][5]
    e.loc[i, "eager_thread"] = 0
    return e


@pytest.mark.parametrize("name, damage, says", [
    ("h100_run_latency", lambda r: edit_report(r, lambda d: [x.update(value_us=-abs(x["value_us"]))
                                                            for x in d["tables"]["latency"]]), "negative"),
    ("h100_run", lambda r: edit_report(r, lambda d: d["tables"]["bursts"][0].update(host_ns=1e300)), "beyond any figure"),
    ("h100_run", lambda r: _samples(r, _dup_times), "duplicated rows"),
    ("h100_run", lambda r: edit_report(r, lambda d: d["meta"]["gpus"][0].update(counter={"mode": "throughput",
                                                                                          "bits": 32})),
     "throughput values exceed"),
    ("h100_run", lambda r: edit_report(r, lambda d: d["tables"]["windows"][1].update(
        t_start_ns=d["tables"]["windows"][0]["t_start_ns"] + 1)), "overlap"),
    ("h100_run", lambda r: edit_report(r, lambda d: d["meta"]["gpus"][0].update(nvml_index=5)), "GPU 0"),
    ("attach_h100_python", lambda r: _events(r, lambda e: e.assign(depth=e["depth"] - 5)), "events.depth"),
    # (a depth past 64 bits' reach overflowed the nesting's keys: a traceback; a fuzzer's)
    ("attach_h100_python", lambda r: _events(r, lambda e: e.assign(depth=e["depth"].astype("int64") + 2**62)),
     "deeper than the 2,147,483,647 levels"),
    ("attach_h100_python", lambda r: _events(r, _back_launches), "backwards"),
    ("graphs_h100", lambda r: edit_report(r, lambda d: d["tables"]["graphs"][3].update(iteration=-1)), "negative"),
    ("graphs_h100", lambda r: edit_report(r, lambda d: d["tables"]["graphs"].append(dict(d["tables"]["graphs"][0]))),
     "listed twice"),
    ("attach_h100_python", lambda r: edit_report(r, lambda d: d["meta"].update(exit_code=2**40)), "0..255"),
    ("attach_h100_python", lambda r: edit_report(r, lambda d: d["meta"]["launch_costs"].update(
        host_us_per_eager_launch=1e300)), "launch_costs"),
    # (an attach run's samples are read a GPU at a time: their columns went unchecked, KeyError and casting
    # tracebacks; its events repeated doubled every range's figures; a fuzzer's)
    ("attach_h100_python", lambda r: _samples(r, lambda s: s.drop(columns="read_ns")), "samples.read_ns: missing"),
    ("attach_h100_python", lambda r: _samples(r, lambda s: s.assign(read_ns=s["read_ns"].astype(str))),
     "samples.read_ns"),
    ("attach_h100_python", lambda r: _events(r, lambda e: pd.concat([e, e]).sort_values("t_ns", kind="stable")),
     "range openings"),
    ("attach_h100_python", lambda r: edit_report(r, lambda d: d["meta"].update(kind="ATTACH")), "unknown kind"),
    # (a program or events outside the samples: "ran 79.88 s" of a 12.8 s program, every range "no data")
    ("attach_h100_python", lambda r: edit_report(r, lambda d: d["meta"].update(t_app_start_ns=-1)),
     "meta.t_app_start_ns -1 lies before the counter samples"),
    ("attach_h100_python", lambda r: _events(r, lambda e: e.assign(t_ns=e["t_ns"] - 10**11)),
     "events' first t_ns"),
    # (its ranges listed, then "no NVTX ranges were seen")
    ("attach_h100_python", lambda r: edit_report(r, lambda d: d["meta"].update(kind="attach-failed")), "never ran"),
])
def test_impossible_values_are_refused_in_one_line(copy, capsys, name, damage, says) -> None:
    """Each damage changed or dropped figures without a word (negative latencies in the headline, a 300-digit
    figure, 243 instead of 253 B/launch, 21,922,575 B/launch, "0 B"...): now one line naming it, exit 2."""
    run = copy(name)
    damage(run)
    assert says in one_line_exit_2(["report", str(run), "--json"], capsys)


def test_ranges_with_no_name_are_no_group_not_another_s(copy, capsys) -> None:
    """Pushed ranges whose names are all null (a damaged file: the library writes "" for none) ended in an
    IndexError; a null name among others took the last group's name. A fuzzer's case."""
    from pcietrace.analysis import names
    from pcietrace.cli import main

    one = copy("attach_h100_python")
    _events(one, lambda e: e.assign(message=e["message"].astype(object).where(
        e.index != e.index[e["event"] == "push"][0], None)))
    assert main(["report", str(one), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["results"]["ranges"]) == 5  # (the 5 named groups; none more)
    _events(one, lambda e: e.assign(message=e["message"].where(e["event"] != "push", None)))
    assert main(["report", str(one)]) == 0 and "Traceback" not in capsys.readouterr().err
    assert list(names.group_names(pd.Series(["a", None, "b"], dtype="category"), "op").isna()) == [False, True, False]


def test_never_popped_ranges_are_said(data_dir) -> None:
    s = Session.load(data_dir / "attach_h100_python")
    first_pop = s.events.index[s.events["event"] == "pop"][0]
    s.events = s.events.drop(first_pop).reset_index(drop=True)
    s.meta["processes"][0]["ranges"] = int(s.events["event"].isin(["push", "start"]).sum())
    notes = notes_text(analyze(s))
    assert any("never popped" in n for n in notes)


@PROPS
@given(st.data())
def test_the_validator_refuses_or_passes_never_raises_otherwise(h100, data) -> None:
    """Random damage to a real run's samples and windows (duplicates, swaps, negative or huge values, another
    GPU's index): validation raises DataError or passes, and what passes analyses without error."""
    s = Session(meta=h100.meta, samples=h100.samples.copy(), windows=h100.windows.copy(), bursts=h100.bursts,
                calibration=h100.calibration, e2e=h100.e2e, contexts=h100.contexts, latency=h100.latency)
    for _ in range(data.draw(st.integers(1, 3))):
        table = data.draw(st.sampled_from(["samples", "windows"]))
        df = getattr(s, table)
        col = data.draw(st.sampled_from([c for c in df.columns if df[c].dtype.kind in "iuf"]))
        row = data.draw(st.integers(0, len(df) - 1))
        value = data.draw(st.sampled_from([-1, 0, 2**31, 1e300, -1e-9, df[col].iloc[max(row - 1, 0)], 5]))
        # (as a recording's writer holds them: loaded integers are 32 bits where their values fit)
        df = df.astype({col: "float64" if isinstance(value, float) else {"i": "int64", "u": "uint64"}.get(
            df[col].dtype.kind, df[col].dtype)})
        with np.errstate(all="ignore"):
            try:
                df.loc[df.index[row], col] = value
            except (TypeError, ValueError, OverflowError):
                continue
        setattr(s, table, df)
    try:
        validate.check(s)
    except DataError as exc:
        assert "\n" not in str(exc)
        return
    analyze(s)


def test_measure_refuses_zero_gpus() -> None:
    import pcietrace

    with pytest.raises(UsageError, match="gpus must be"):
        pcietrace.measure(simulate=True, quick=True, gpus=0)


# --- 5. no data loss: concurrent writers, signals, full disks, odd folders ---------------------------------

def test_a_second_writer_into_one_folder_is_refused(tmp_path) -> None:
    first = guard.RunFolder(tmp_path / "run", force=True)
    with pytest.raises(UsageError, match="another pcietrace run is saving there"):
        guard.RunFolder(tmp_path / "run", force=True)
    first.discard()
    guard.RunFolder(tmp_path / "run", force=True).discard()  # released: the next one may
    assert not [p for p in tmp_path.iterdir()]


def test_two_force_runs_into_one_folder_cannot_both_succeed(tmp_path) -> None:
    cmd = [sys.executable, "-m", "pcietrace", "run", "--simulate", "--quick", "--window-s", "0.02", "--no-latency",
           "--format", "json", "-o", str(tmp_path / "r"), "--force"]
    env = checkout_env()
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(120), p.stderr.read()) for p in procs]
    ok = [r for r in results if r[0] == 0]
    assert ok, results
    for rc, err in results:
        if rc:  # refused up front, one line; never "saved" with its run gone
            assert rc == 2 and err.strip().count("\n") == 0 and "another pcietrace run" in err, err
    Session.load(tmp_path / "r")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_an_interrupted_force_run_never_replaces_a_complete_one(tmp_path, h100) -> None:
    target = tmp_path / "run"
    h100.save(target)
    folder = guard.RunFolder(target, force=True)
    partial = Session(meta={**h100.meta, "status": "interrupted"}, samples=h100.samples, windows=h100.windows)
    _, where = guard.finish(partial, folder, lambda: None, lambda r: r, print)
    assert where == tmp_path / "run-2" and folder.kept == target
    assert Session.load(target).meta.get("status", "complete") == h100.meta.get("status", "complete")
    line = guard.interrupted_line(folder, where, "what was recorded")
    assert "run-2" in line and f"{target} was kept" in line


def test_a_signal_right_after_publishing_says_where_the_run_is(tmp_path, h100, as_in_a_terminal) -> None:
    """The give-up signal lands after the run was published (was: "interrupted: nothing saved" while the new
    run had replaced the old one)."""
    folder = guard.RunFolder(tmp_path / "run")
    class GiveUpAfter(guard.SaveSteps):
        def after(self, saving):
            raise KeyboardInterrupt

    saving = guard.Saving(h100, folder, lambda: None, to_jsonable=lambda r: r, tell=lambda s: None,
                          partial_if_interrupted=False, steps=GiveUpAfter())
    with saving:
        pass
    assert saving.out_dir == tmp_path / "run" and saving.interrupted is not None
    assert "saved" in guard.interrupted_line(folder, saving.out_dir, "the run")


def test_signals_during_the_publishing_renames_wait_for_them(tmp_path, h100, as_in_a_terminal) -> None:
    target = tmp_path / "run"
    h100.save(target)
    folder = guard.RunFolder(target, force=True)
    h100.save(folder.staging)
    intr = guard.Interrupts()
    real = os.replace

    def replace(a, b):  # three signals between the two renames that swap the runs
        if Path(b) == target:
            for _ in range(3):
                intr._handler(signal.SIGINT, None)
        return real(a, b)
    with intr, intr.held():
        try:
            os.replace = replace
            with pytest.raises(KeyboardInterrupt):
                with intr.held():
                    folder.publish()
        finally:
            os.replace = real
        intr.pending.clear()
    assert Session.load(target) and folder.published == target
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_leftovers_of_dead_runs_are_swept_at_the_next_start(tmp_path, monkeypatch) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    from pcietrace import store

    monkeypatch.setattr(store, "TEMP_LEFTOVERS", ((tmp, store.TEMP_LEFTOVERS[0][1]),))
    stale = [tmp_path / f".run.partial-{dead}-0123abcd", tmp / f"pcietrace-{dead}-abcdefgh",
             tmp / f"pcietrace-edges-{dead}-abcdefgh"]
    live = [tmp_path / f".run.partial-{os.getpid()}-0123abcd", tmp / "pcietrace-abcdefgh"]
    for p in stale[:2] + live:
        p.mkdir()
    stale[2].write_bytes(b"\0" * 16)
    guard.RunFolder(tmp_path / "new").discard()
    assert not any(p.exists() for p in stale) and all(p.exists() for p in live)


def test_odd_output_folders(tmp_path, capsys, monkeypatch) -> None:
    quick = ["run", "--simulate", "--quick", "--window-s", "0.02", "--no-latency", "--format", "json"]
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert main(quick + ["-o", str(tmp_path / "link")]) == 0  # (was: saved to link-2)
    assert Session.load(tmp_path / "real") and not (tmp_path / "link-2").exists()
    capsys.readouterr()
    long = tmp_path / ("x" * 250)  # a legal name; its staging name once was not
    assert main(quick + ["-o", str(long)]) == 0 and Session.load(long)
    capsys.readouterr()
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty")
    assert "current folder" in one_line_exit_2(quick + ["-o", "."], capsys)  # (was: refused after measuring)
    assert not list((tmp_path / "empty").iterdir())
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_perfetto_never_writes_into_another_run(copy, capsys, tmp_path) -> None:
    run, other = copy("attach_h100_python"), copy("h100_run")
    before = {p.name: p.read_bytes() for p in other.iterdir()}
    for name in ("report.json", "trace.json"):
        assert "another saved run" in one_line_exit_2(["report", str(run), "--perfetto", str(other / name)], capsys)
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before
    assert main(["report", str(run), "--json", "--perfetto", str(run / "trace.json")]) == 0  # its own: fine


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("args", [["--json"], ["--format", "csv"], []])
def test_a_full_disk_on_stdout_is_not_exit_0(data_dir, args) -> None:
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "pcietrace", "report", str(data_dir / "h100_run"), *args],
                           stdout=full, stderr=subprocess.PIPE, text=True, env=checkout_env(),
                           timeout=120)
    assert r.returncode == 2 and "No space left" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.skipif(not Path("/dev/full").is_char_device(), reason="needs /dev/full")
def test_perfetto_into_a_device_writes_into_it_never_replaces_it(data_dir, capsys) -> None:
    # (a trace written whole beside the target and renamed over it replaced /dev/full with a regular file as root)
    assert "No space" in one_line_exit_2(["report", str(data_dir / "attach_h100_python"), "--perfetto", "/dev/full"],
                                         capsys)
    assert Path("/dev/full").is_char_device()


def test_a_perfetto_trace_on_a_full_disk_leaves_no_truncated_file(copy, monkeypatch, tmp_path, capsys) -> None:
    from pcietrace.report import perfetto

    run = copy("attach_h100_python")
    target = tmp_path / "t.json"
    target.write_text("an older trace")
    real_open = open

    class Full(io.StringIO):
        def write(self, s):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(perfetto, "open", lambda p, m="r", *a, **k: Full() if "w" in m else real_open(p, m, *a, **k),
                        raising=False)
    one_line_exit_2(["report", str(run), "--perfetto", str(target)], capsys)
    assert target.read_text() == "an older trace"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["t.json", run.name])


# --- 6. the sampler's stop never waits for good ---------------------------------------------------------------

def _die_holding(event) -> None:
    event._cond.acquire()  # killed with the event's lock taken: no one can set it again
    os.kill(os.getpid(), signal.SIGKILL)


def _sleep() -> None:
    time.sleep(600)


def test_the_sampler_stop_returns_when_a_child_died_holding_its_lock() -> None:
    """A sampler child killed while it held the stop event's lock, another still running: stop() returns
    within its timeout with the samples it has (was: blocked for good in run and graphs)."""
    from pcietrace.collectors.sampler import CounterSampler

    ctx = mp.get_context("spawn")
    s = CounterSampler([0, 1])
    s._q, s._stop, s._pause = ctx.Queue(), ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_die_holding, args=(s._stop,))
    holder.start()
    holder.join(30)
    sleeper = ctx.Process(target=_sleep, daemon=True)
    sleeper.start()
    s._procs = [holder, sleeper]
    s._drainer = threading.Thread(target=s._drain, daemon=True)
    s._drainer.start()
    t0 = time.monotonic()
    out = s.stop(timeout_s=2.0)
    assert time.monotonic() - t0 < 10 and not sleeper.is_alive() and list(out.columns)


def test_a_counter_that_steps_back_and_stays_is_a_reset_not_its_later_samples_left_out(data_dir) -> None:
    """The hooks recording's D2H counter set back 60 MB from halfway (SIMULATED damage; a step the link could
    have made backwards in one interval): every later sample was left out as reads swapped (2,211 of 4,053 kept,
    "at least 0.0 MB H2D", no note). Now it is a counter reset: every sample kept, one jump, said in a note;
    reads merged from several readers still leave out their short runs (the C++ exact-edges recording)."""
    from pcietrace.analysis import analyze
    from pcietrace.analysis.counters import cumulative_bytes
    from pcietrace.session import Session

    s = Session.load(data_dir / "attach_h200_hooks")
    half = len(s.samples) // 2
    tx = s.samples["tx_raw"].to_numpy().astype(np.int64)
    tx[half:] = (tx[half:] - 60_000_000) % 2**32
    s.samples = s.samples.assign(tx_raw=tx.astype(np.uint64))
    cum = cumulative_bytes(s.samples, s.counters)
    assert len(cum) == len(s.samples) and int(cum["jump"].sum()) == 1
    assert any(n.code == "counter_reset" for n in analyze(s)["notes"]["note"])
    exact = Session.load(data_dir / "attach_h100_blind_cpp_exact")
    kept = cumulative_bytes(exact.samples, exact.counters)
    assert len(kept) < len(exact.samples) and not kept["jump"].any()
    # (constructed, a reviewer's: a read held up 80 ms carrying a value from late in its span, the 80 reads after
    # it below that value: reads swapped, no reset; and a swapped read just before a reset: the reset's step jumps)
    t = np.arange(200, dtype=np.int64) * 500_000
    true = np.arange(200, dtype=np.int64) * 1_000_000
    late, read = true.copy(), np.full(200, 300_000)
    late[50], read[50] = true[130], 80_000_000
    frame = pd.DataFrame({"nvml_index": 0, "t_ns": t, "tx_raw": late, "rx_raw": late, "read_ns": read})
    cum = cumulative_bytes(frame, {0: {"mode": "fields", "bits": 32}})
    assert not cum["jump"].any() and cum["tx_bytes"].iloc[-1] == true[-1]
    reset = np.r_[np.arange(100) * 1000 + 10_000_000, np.arange(100) * 1000]
    reset[99] = reset[98] - 500
    frame = pd.DataFrame({"nvml_index": 0, "t_ns": t, "tx_raw": reset, "rx_raw": reset, "read_ns": 300_000})
    cum = cumulative_bytes(frame, {0: {"mode": "fields", "bits": 32}})
    assert int(cum["jump"].sum()) == 1 and len(cum) >= 198 and cum["jump"].iloc[-101:].any()
