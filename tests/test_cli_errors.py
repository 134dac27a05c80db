"""A new user's bad inputs found by trying every subcommand by hand (issue: no tracebacks): each case
here was a traceback, a wrong exit code or a silently ignored value before its fix."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import edit_report, one_line_exit_2, terminal_signals
from pcietrace.cli import main


@pytest.mark.parametrize("kernel_us", ["1", "1,2,3"])
def test_graphs_kernel_us_needs_exactly_min_and_max(kernel_us, capsys) -> None:
    # was: ValueError (unpacking) from GraphsPlan, a traceback
    assert "--kernel-us takes MIN,MAX" in one_line_exit_2(
        ["graphs", "--simulate", "--no-save", "--kernel-us", kernel_us], capsys)


@pytest.mark.parametrize("gpu", ["99", "-1"])
def test_graphs_simulate_refuses_a_gpu_it_does_not_have(gpu, capsys) -> None:
    # was: exit 0, the SIMULATED GPU 0 measured under the name the user asked for
    assert f"no CUDA device {gpu}" in one_line_exit_2(["graphs", "--simulate", "--no-save", "--gpu", gpu], capsys)


@pytest.mark.parametrize("name", ["attach_h100_python", "recordings/attach-h100-cpp-no-floor"])
def test_attach_run_without_its_events_is_refused(name, copy, capsys) -> None:
    # was: exit 0 and "No NVTX ranges were seen ... 0 eager and 0 graph launches" for a run that had both
    folder = copy(name)
    (folder / "events.parquet").unlink()
    assert "events.parquet is missing" in one_line_exit_2(["report", str(folder)], capsys)
    assert "events.parquet is missing" in one_line_exit_2(["compare", str(folder), str(folder)], capsys)


@pytest.mark.parametrize("keep", [0, 1])
def test_attach_events_cut_short_are_refused(keep, copy, capsys) -> None:
    folder = copy("attach_h200x8_torchrun")
    events = pd.read_parquet(folder / "events.parquet")
    events.head(keep).to_parquet(folder / "events.parquet")
    want = sum(p["ranges"] for p in json.loads((folder / "report.json").read_text())["meta"]["processes"])
    assert f"of the {want} range openings" in one_line_exit_2(["report", str(folder)], capsys)


@pytest.mark.parametrize("column", ["dev", "devmask"])
@pytest.mark.parametrize("damage", ["drop", "null"])
def test_attach_events_device_columns_come_whole_or_not_at_all(column, damage, copy, capsys) -> None:
    # was: KeyError 'dev' (a traceback) with devmask alone; a null became a garbage device number silently
    folder = copy("attach_h200x8_torchrun")
    events = pd.read_parquet(folder / "events.parquet")
    if damage == "drop":
        events = events.drop(columns=[column])
    else:
        events[column] = events[column].astype(float)
        events.loc[events.index[len(events) // 2], column] = float("nan")
    events.to_parquet(folder / "events.parquet")
    assert f"events.{column}" in one_line_exit_2(["report", str(folder)], capsys)


def test_graphs_analysis_with_no_samples_gives_bytes_as_unknown(data_dir) -> None:
    # was: KeyError 'h2d_bytes_per_iter' (a traceback) from the empty per-window rates
    from pcietrace.analysis import analyze
    from pcietrace.session import Session

    s = Session.load(data_dir / "graphs_h100")
    graphs = analyze(Session(meta=s.meta, samples=s.samples.iloc[:0], windows=s.windows, graphs=s.graphs))["graphs"]
    assert len(graphs) and graphs["h2d_bytes_per_iter"].isna().all() and graphs["wall_us_median"].notna().all()


@pytest.mark.parametrize("name", ["h100_run", "graphs_h100", "attach_h100_python", "recordings/attach-h100-cpp-no-floor"])
def test_emptied_samples_are_refused(name, copy, capsys) -> None:
    # was: exit 0 with every byte figure left out (run, graphs) or "No NVTX ranges were seen" (attach)
    folder = copy(name)
    pd.read_parquet(folder / "samples.parquet").iloc[:0].to_parquet(folder / "samples.parquet")
    assert "samples.parquet holds no samples" in one_line_exit_2(["report", str(folder)], capsys)
    assert "samples.parquet holds no samples" in one_line_exit_2(["compare", str(folder), str(folder)], capsys)


def test_latency_runs_sample_nothing_and_still_load(tmp_path, data_dir) -> None:
    from pcietrace.session import Session

    s = Session.load(data_dir / "h100_run_latency")
    s.samples, s.windows = s.samples.iloc[:0], s.windows.iloc[:0]
    s.meta = {**s.meta, "kind": "latency"}
    assert len(Session.load(s.save(tmp_path / "latency")).latency) == len(s.latency) > 0


@pytest.mark.parametrize("damage", ["reversed", "shuffled", "doubled"])
def test_attach_events_out_of_time_order_are_refused(damage, copy, capsys) -> None:
    # was: exit 0 with negative bytes, ranges swapped, 0 launches (reversed) or every range counted twice (doubled)
    folder = copy("attach_h100_python")
    events = pd.read_parquet(folder / "events.parquet")
    events = {"reversed": events.iloc[::-1], "shuffled": events.sample(frac=1, random_state=1),
              "doubled": pd.concat([events, events])}[damage].reset_index(drop=True)
    events.to_parquet(folder / "events.parquet")
    line = one_line_exit_2(["report", str(folder)], capsys)
    # (doubled: more range openings than report.json counts, found first)
    assert ("range openings, report.json counts" if damage == "doubled" else "events: not in time order") in line


@pytest.mark.parametrize("pair", [("h100_run", "attach_h100_python"), ("attach_h100_python", "h100_run")])
def test_compare_refuses_an_attach_run_beside_a_run(pair, data_dir, capsys) -> None:
    # was: exit 0 and "no significant difference" over a table where one side had no figure at all
    line = one_line_exit_2(["compare", *(str(data_dir / p) for p in pair)], capsys)
    assert "attach run compares only with another attach run" in line


@pytest.mark.parametrize("argv", [["--iterations", "1000000000"], ["--param-sets", "10000", "--kernels", "100000"],
                                  ["--order", "all-new", "--iterations", "100000", "--kernels", "1000"]])
def test_graphs_sizes_beyond_memory_are_usage_errors(argv, capsys) -> None:
    # was: numpy's MemoryError (a traceback) allocating the iteration order or the parameter sets
    assert "at most" in one_line_exit_2(["graphs", "--simulate", "--no-save", *argv], capsys)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full")
@pytest.mark.parametrize("argv", [["report", "h100_run"], ["report", "h100_run", "--format", "json"],
                                  ["compare", "h100_run", "h200x2_run", "--format", "csv"]])
def test_stdout_on_a_full_disk_is_one_line(argv, data_dir) -> None:
    # was: OSError ENOSPC from rich or the renderers' write, a traceback and exit 1
    argv = [str(data_dir / a) if (data_dir / a).exists() else a for a in argv]
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "pcietrace", *argv], stdout=full, stderr=subprocess.PIPE,
                           text=True, cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "No space left on device" in p.stderr, p.stderr


def edit_meta(folder: Path, **changes) -> None:
    edit_report(folder, lambda doc: doc["meta"].update(changes))


@pytest.mark.parametrize("name", ["h200x2_run", "h100_run_latency"])
def test_a_null_topology_renders(name, copy, capsys) -> None:
    # was: AttributeError 'NoneType' object has no attribute 'get' (the schema allows null topology)
    folder = copy(name)
    edit_meta(folder, topology=None)
    assert main(["report", str(folder), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["meta"]["topology"] is None
    assert main(["report", str(folder), "--format", "prometheus"]) == 0


@pytest.mark.parametrize("name, change, field", [
    ("attach_h100_python", {"sample_interval_ms": 1e300}, "meta.sample_interval_ms"),
    ("attach_h100_nocount", {"idle_sample_interval_ms": 1e300}, "meta.idle_sample_interval_ms"),
    ("graphs_h100", {"graphs_plan": {}}, "meta.graphs_plan.kernel_us"),
    ("graphs_h100", {"graphs_plan": {"kernel_us": ["?", 8.0]}}, "meta.graphs_plan.kernel_us"),
])
def test_meta_values_the_renderers_cannot_use_name_the_field(name, change, field, copy, capsys) -> None:
    # were: ValueError "Maximum allowed size exceeded" (timeline bins) and "Unknown format code 'g'" tracebacks
    folder = copy(name)
    edit_meta(folder, **change)
    assert field in one_line_exit_2(["report", str(folder)], capsys)


@pytest.mark.parametrize("argv, twice", [(["run", "--simulate", "--no-save", "--gpu", "0,0"], 0),
                                         (["run", "--simulate", "--gpus", "4", "--no-save", "--gpu", "2,1,2"], 2),
                                         (["latency", "--no-save", "--gpu", "0,0"], 0),
                                         (["attach", "--gpu", "1,0,1", "--", "true"], 1)])
def test_a_gpu_named_twice_is_refused(argv, twice, monkeypatch, capsys) -> None:
    # was: --gpu 0,0 measured GPU 0 once without a word. run: the SIMULATED box; latency and attach: a device
    # count stands in for the driver (nothing is opened: the list is checked first)
    from pcietrace.device import cuda

    monkeypatch.setattr(cuda, "device_count", lambda: 4)
    monkeypatch.setattr(cuda, "bus_ids", lambda: ["0000:00:06.0", "0000:00:07.0"])
    assert f"GPU {twice} given twice" in one_line_exit_2(argv, capsys)


def test_graphs_takes_one_gpu_so_a_list_is_refused_by_the_parser(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["graphs", "--simulate", "--no-save", "--gpu", "0,0"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "--gpu" in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["report", "h100_run"], ["compare", "h100_run", "h200x2_run"],
                                  ["run", "--simulate", "--no-save"], ["graphs", "--simulate", "--no-save"],
                                  ["latency", "--no-save"], ["attach", "--", "true"]])
@pytest.mark.parametrize("fmt", ["md", "table", "csv"])
@pytest.mark.parametrize("json_first", [True, False])
def test_json_beside_another_format_is_refused(argv, fmt, json_first, data_dir, capsys) -> None:
    # was: --json won and --format was dropped without a word; refused by the parser, before anything runs
    argv = argv[:1] + [str(data_dir / a) if (data_dir / a).exists() else a for a in argv[1:]]
    both = ["--json", "--format", fmt] if json_first else ["--format", fmt, "--json"]
    where = argv.index("--") if "--" in argv else len(argv)
    with pytest.raises(SystemExit) as exc:
        main(argv[:where] + both + argv[where:])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"--json and --format {fmt} ask for different output formats" in err


@pytest.mark.parametrize("argv", [["--json"], ["--format", "json"], ["--json", "--format", "json"], ["--format", "md"]])
def test_one_output_format_still_renders(argv, data_dir, capsys) -> None:
    assert main(["report", str(data_dir / "h100_run"), *argv]) == 0
    out = capsys.readouterr().out
    if "md" in argv:
        assert out.startswith("# ") and "|" in out
    else:
        assert json.loads(out)["meta"]["gpus"]


@pytest.mark.parametrize("name, cut", [("h200x2_run", "every GPU"), ("h200x2_run", "GPU 1"),
                                       ("graphs_h100", "every GPU"), ("attach_h200x8_torchrun", "GPU 1")])
def test_one_counter_sample_of_a_gpu_is_refused_as_none_is(name, cut, copy, capsys) -> None:
    # was: loaded, with that GPU's byte figures (differences of two readings) left blank without a word
    folder = copy(name)
    samples = pd.read_parquet(folder / "samples.parquet")
    first = samples.groupby("nvml_index").head(1)
    if cut == "GPU 1":
        first = pd.concat([samples[samples["nvml_index"] != 1], first[first["nvml_index"] == 1]])
    first.to_parquet(folder / "samples.parquet")
    gpu = int(first["nvml_index"].value_counts().idxmin())
    assert f"holds 1 sample of GPU {gpu}'s counters" in one_line_exit_2(["report", str(folder)], capsys)
    assert "holds 1 sample" in one_line_exit_2(["compare", str(folder), str(folder)], capsys)


def test_sigterm_before_anything_is_recorded_is_one_line(tmp_path) -> None:
    """SIMULATED device: SIGTERM as soon as pcietrace handles it (its handler shows in /proc), which is
    during the imports, well before the simulated recording starts; was: exit 143 and not a word."""
    if not Path("/proc/self/status").exists():
        pytest.skip("needs Linux's /proc to see when the handler is in place")
    bit = 1 << (signal.SIGTERM - 1)
    for _ in range(3):  # a signal that came after the set-up (a very slow start) is tried again
        p = subprocess.Popen([sys.executable, "-m", "pcietrace", "run", "--simulate", "-o", str(tmp_path / "run")],
                             preexec_fn=terminal_signals, cwd=Path(__file__).resolve().parents[1],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while p.poll() is None and time.monotonic() < deadline:
            caught = next(ln for ln in Path(f"/proc/{p.pid}/status").read_text().splitlines() if ln.startswith("SigCgt"))
            if int(caught.split()[1], 16) & bit:
                break
            time.sleep(0.001)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
        if "saved" not in err:
            break
        shutil.rmtree(tmp_path / "run", ignore_errors=True)
    assert p.returncode == 128 + signal.SIGTERM, (p.returncode, err)
    assert err == "pcietrace: interrupted before anything was recorded: nothing saved\n" and out == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("damage, says", [
    ("cycle", "parents form a cycle: 0000:01:00.0 -> 0000:01:00.0"),
    ("short link", "link ['32.0 GT/s PCIe', 16, '32.0 GT/s PCIe'] is not [speed, width, max speed, max width]"),
    ("path", "is not a PCI name like 0000:3b:00.0"),
])
def test_a_damaged_topology_fixture_is_refused_and_writes_nothing_outside(damage, says, data_dir, tmp_path,
                                                                         capsys) -> None:
    # was: RecursionError (a device its own parent), IndexError (a link of 3 items), and a bdf that is a path
    # made `topo --fixture` write its sysfs files there (outside its temporary tree)
    doc = json.loads((data_dir / "topo" / "wrx80_two_gpus_root_ports.json").read_text())
    gpu = doc["devices"][1]
    outside = tmp_path / "outside"
    if damage == "cycle":
        gpu["parent"] = gpu["bdf"]
    elif damage == "short link":
        gpu["link"] = gpu["link"][:3]
    else:
        gpu["bdf"] = str(outside)
    fixture = tmp_path / "fixture.json"
    fixture.write_text(json.dumps(doc))
    assert says in one_line_exit_2(["topo", "--fixture", str(fixture)], capsys)
    assert not outside.exists()


@pytest.mark.parametrize("target", ["report.json", "samples.parquet", "-"])
def test_report_perfetto_never_overwrites_the_recording_it_reads(target, copy, tmp_path, capsys) -> None:
    # was: `report DIR --perfetto DIR/report.json` replaced the recording with the trace (exit 0; the folder
    # was no report after), and `--perfetto -` wrote a file named "-"
    folder = copy("attach_h100_python")
    before = {f.name: f.read_bytes() for f in folder.iterdir()}
    path = target if target == "-" else str(folder / target)
    line = one_line_exit_2(["report", str(folder), "--perfetto", path], capsys)
    assert ("standard output holds the report" if target == "-" else f"the report's own {target}") in line
    assert {f.name: f.read_bytes() for f in folder.iterdir()} == before and not Path("-").exists()
    assert main(["report", str(folder), "--perfetto", str(tmp_path / "trace.json"), "--format", "json"]) == 0
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]


def edit_row(folder: Path, table: str, row: int, **changes) -> None:
    edit_report(folder, lambda doc: doc["tables"][table][row].update(changes))


@pytest.mark.parametrize("name, table, row, change, says", [
    ("h100_run", "windows", 1, {"graph_k": 0}, "windows.graph_k: expected whole numbers >= 1, got 0"),
    ("graphs_h100", "graphs", 0, {"kernels": float("inf")}, "graphs.kernels: expected whole numbers (64-bit)"),
    ("h200x2_run_contexts", "bursts", 0, {"path": []}, "bursts.path: expected strings, got []"),
    ("h100_run", "windows", 1, {"graph_k": 2**64 - 1}, "windows.graph_k: expected whole numbers (64-bit)"),
    ("h100_run", "windows", 1, {"launches": 10**20}, "windows.launches: expected 64-bit numbers, got 1000000"),
    # (was shown as it is, a 309-digit figure: no run holds it)
    ("h100_run", "windows", 1, {"launches": 1e308}, "windows.launches: row 1 is 1e+308, beyond any figure a run holds"),
])
def test_table_values_the_analysis_cannot_use_name_the_field(name, table, row, change, says, copy, capsys) -> None:
    # was: ZeroDivisionError (a graph of 0 kernels), OverflowError (infinite kernels: Python's JSON reads
    # Infinity) and TypeError (a list as a burst's launch path), each a traceback
    folder = copy(name)
    edit_row(folder, table, row, **change)
    assert says in one_line_exit_2(["report", str(folder)], capsys)


@pytest.mark.parametrize("name, table, change", [
    ("h100_run_latency", "bursts", {"gpu_ns": 0}),
])
def test_odd_but_valid_numbers_still_render(name, table, change, copy, capsys) -> None:
    # was: ZeroDivisionError (a burst of 0 GPU time: the share per switch level divided by it); such a number is
    # shown as it is (a count beyond any run's, 1e308, is now refused as impossible: tests/test_bad_input.py)
    folder = copy(name)
    edit_row(folder, table, 0 if table == "bursts" else 1, **change)
    assert main(["report", str(folder), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["results"]


def test_prometheus_refuses_graphs_instead_of_printing_nothing(data_dir, capsys) -> None:
    # was: exit 0 and only "# EOF" (no metric family is defined for the strategies' figures); `graphs` now
    # refuses before measuring: its parser does not offer the format (its --help listed it)
    with pytest.raises(SystemExit) as exc:
        main(["graphs", "--simulate", "--no-save", "--format", "prometheus"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "argument --format: invalid choice: 'prometheus'" in err
    said = one_line_exit_2(["report", str(data_dir / "graphs_h100"), "--format", "prometheus"], capsys)
    assert "--format prometheus has no metrics for `pcietrace graphs`" in said


def test_a_folder_name_that_is_not_utf8_still_loads(tmp_path, data_dir, capsys) -> None:
    # was: "samples.parquet is not a readable Parquet table ('utf-8' codec can't encode ...)": pyarrow could not
    # encode the path; the file was fine
    folder = tmp_path / os.fsdecode(b"run-\xff")
    shutil.copytree(data_dir / "h100_run", folder)
    assert main(["report", str(folder), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["results"]["per_launch"]


def test_sigterm_between_the_handler_and_the_commands_own_handling_is_one_line(monkeypatch, capsys) -> None:
    """The start-up race: SIGTERM right after ``signals.caught`` put its handler in place, before ``_main``'s own
    try block (1 full run in 2 ended in a ``Terminated`` traceback)."""
    from pcietrace import cli

    def signalled(argv, command):  # the signal lands before any of _main's own handling
        signal.raise_signal(signal.SIGTERM)
        raise AssertionError("the handler should have raised")

    monkeypatch.setattr(cli, "_main", signalled)
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        pytest.skip("SIGTERM is handled by the test runner")
    assert cli.main(["run", "--simulate"]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err == "pcietrace: interrupted before anything was recorded: nothing saved\n"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the previous handler is back


@pytest.mark.parametrize("argv", [
    ["run", "--durations", "nan"], ["run", "--durations", "1,inf"], ["run", "--graph-k", "inf"],
    ["run", "--graph-k", "1e400"], ["run", "--seed", "-1"], ["run", "--window-s", "nan"], ["run", "--window-s", "inf"],
    ["run", "--window-s", "-0.1"], ["run", "--window-s", "1e-9"], ["run", "--sample-interval-ms", "-1"], ["run", "--sample-interval-ms", "nan"],
    ["run", "--us-per-level", "inf"], ["run", "--repeats", "2"], ["attach", "--idle-s", "nan", "--", "true"],
    ["attach", "--idle-s", "-1", "--", "true"], ["attach", "--sample-interval-ms", "-5", "--", "true"],
    ["report", "x", "--us-per-level", "nan"],
])
@pytest.mark.parametrize("simulate", [False, True])
def test_bad_numbers_are_refused_by_the_parser(argv, simulate, capsys) -> None:
    if simulate and argv[0] != "run":
        pytest.skip("--simulate belongs to run")
    with pytest.raises(SystemExit) as exc:
        main(argv + (["--simulate"] if simulate else []))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("opts", [["--top", "3"], ["--filter", "x"], ["--all"], ["--sort", "d2h"], ["--group-by", "name"]])
def test_range_options_on_a_report_without_ranges_are_refused(opts, data_dir, capsys) -> None:
    # was: exit 0, the options dropped without a word (a run report has no NVTX ranges to choose among)
    said = one_line_exit_2(["report", str(data_dir / "h100_run"), *opts], capsys)
    assert opts[0] in said and "is a run report" in said
    assert main(["report", str(data_dir / "attach_h100_emit_nvtx"), *opts]) == 0  # (an attach report takes them)


def test_a_report_with_standard_output_closed_ends_without_a_traceback() -> None:
    """`pcietrace report RUN >&-`: Python has no sys.stdout then; the flush after the report raised
    AttributeError (a fuzzer's, on attach)."""
    import os
    import subprocess
    import sys

    from conftest import DATA, ROOT

    proc = subprocess.run([sys.executable, "-m", "pcietrace", "report", str(DATA / "attach_h200_serve")], cwd=ROOT,
                          preexec_fn=lambda: os.close(1), stderr=subprocess.PIPE, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                                                        os.environ.get("PYTHONPATH")]))))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]


def _read_only_stderr() -> None:
    import os

    os.dup2(os.open(os.devnull, os.O_RDONLY), 2)


@pytest.mark.parametrize("start", [lambda: __import__("os").close(0), lambda: __import__("os").close(2),
                                   _read_only_stderr], ids=["stdin closed", "stderr closed", "stderr read-only"])
def test_a_command_started_with_a_standard_stream_closed_still_works(start, tmp_path) -> None:
    """`pcietrace report RUN 2>&-` (or `<&-`; through pyenv's launcher script, stderr arrived as a file open only
    for reading): the stream is opened on the null device, so the report is shown and a bad path still exits 2
    (every command ended with exit 1 at its first message, attach before running the program)."""
    import os
    import subprocess
    import sys

    from conftest import DATA, ROOT

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for path, rc in ((DATA / "attach_h200_serve", 0), (tmp_path / "none", 2)):
        proc = subprocess.run([sys.executable, "-m", "pcietrace", "report", str(path)], cwd=ROOT, env=env,
                              preexec_fn=start, stdout=subprocess.PIPE, text=True, timeout=120)
        assert proc.returncode == rc and ("GPU" in proc.stdout) == (rc == 0), proc.stdout[-2000:]


def test_ctrl_c_while_the_command_line_is_imported_is_one_line(monkeypatch, capsys) -> None:
    """The ``pcietrace`` script's entry point imports the command line itself: Ctrl-C in its first tens of ms
    (the imports) says one line and exits 130 (the script generated for ``pcietrace.cli:main`` printed the import's
    traceback)."""
    import importlib.abc

    from pcietrace.__main__ import run

    class Interrupting(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201 -- the import system's signature
            if name == "pcietrace.cli":
                raise KeyboardInterrupt
            return None
    monkeypatch.delitem(sys.modules, "pcietrace.cli")
    monkeypatch.setattr(sys, "meta_path", [Interrupting(), *sys.meta_path])
    assert run() == 130
    assert capsys.readouterr().err == "pcietrace: interrupted\n"


@pytest.mark.parametrize("command", ["run", "latency", "graphs"])
def test_an_output_folder_with_no_save_is_refused_not_ignored(command, capsys) -> None:
    """-o names where to save and --no-save says not to: the two together are refused in one line (exit 2)."""
    from pcietrace.cli import main

    with pytest.raises(SystemExit) as ex:  # (argparse's own refusal: its usage line, then the error)
        main([command, "--simulate", "-o", "runs/x", "--no-save"])
    assert ex.value.code == 2
    err = capsys.readouterr().err
    assert "--no-save" in err and "-o" in err and "Traceback" not in err
