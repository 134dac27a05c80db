"""A new user's bad inputs found by trying every subcommand by hand (issue: no tracebacks): each case
here was a traceback, a wrong exit code or a silently ignored value before its fix."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pcietrace.cli import main


def one_line_exit_2(argv: list[str], capsys) -> str:
    """Run the CLI in-process; assert exit 2 with exactly one line and no traceback; return the line."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pcietrace: error:") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("kernel_us", ["1", "1,2,3"])
def test_graphs_kernel_us_needs_exactly_min_and_max(kernel_us, capsys) -> None:
    # was: ValueError (unpacking) from GraphsPlan, a traceback
    assert "--kernel-us takes MIN,MAX" in one_line_exit_2(
        ["graphs", "--simulate", "--no-save", "--kernel-us", kernel_us], capsys)


@pytest.mark.parametrize("gpu", ["99", "-1"])
def test_graphs_simulate_refuses_a_gpu_it_does_not_have(gpu, capsys) -> None:
    # was: exit 0, the SIMULATED GPU 0 measured under the name the user asked for
    assert f"no CUDA device {gpu}" in one_line_exit_2(["graphs", "--simulate", "--no-save", "--gpu", gpu], capsys)


@pytest.fixture()
def copy(tmp_path, data_dir):
    """A writable copy of a recorded report folder (tests/data stays untouched)."""
    def make(name: str) -> Path:
        dst = tmp_path / name.replace("/", "-")
        shutil.copytree(data_dir / name, dst)
        return dst
    return make


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
    assert "events: not in time order" in one_line_exit_2(["report", str(folder)], capsys)


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
    doc = json.loads((folder / "report.json").read_text())
    doc["meta"].update(changes)
    (folder / "report.json").write_text(json.dumps(doc))


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
