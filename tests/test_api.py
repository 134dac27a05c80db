"""pcietrace's Python API (pcietrace/api.py): measure, latency, graphs and attach record through the same
workflow as the CLI, from configs whose errors name fields; the API never loads the CLI; ``load`` gives named
tables, summary and meta; ``import pcietrace`` stays light."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

import pcietrace
from pcietrace.errors import ConfigError

from conftest import REPORTS, ROOT
from test_attach import attach_stand_ins  # noqa: F401 - the stand-in GPU's fixture


def test_the_api_records_without_loading_the_cli() -> None:
    code = ("import sys, pcietrace; pcietrace.latency(simulate=True, repeats=3); "
            "pcietrace.graphs(simulate=True, kernels=(20,), iterations=2, rounds=1); "
            "print([m for m in ('pcietrace.cli', 'pcietrace.commands') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         timeout=300)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


@pytest.mark.parametrize("call, field", [
    (lambda: pcietrace.measure(simulate=True, window_s=0), "window_s"),
    (lambda: pcietrace.measure(simulate=True, gpu="0,0"), "gpu"),
    (lambda: pcietrace.measure(simulate=True, gpus=0), "gpus"),
    (lambda: pcietrace.latency(simulate=True, repeats=1), "repeats"),
    (lambda: pcietrace.graphs(simulate=True, order="never"), "order"),
    (lambda: pcietrace.graphs(simulate=True, gpu=1), "gpu"),
    (lambda: pcietrace.attach([]), "command"),
])
def test_a_bad_option_is_a_config_error_naming_the_field(call, field) -> None:
    with pytest.raises(ConfigError) as exc:
        call()
    assert exc.value.field == field and str(exc.value).startswith(field)


def test_an_unknown_option_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="windw_s"):
        pcietrace.measure(simulate=True, windw_s=0.1)


def test_latency_saves_where_asked_and_prints_nothing(tmp_path, capsys) -> None:
    run = pcietrace.latency(simulate=True, gpus=2, repeats=3, output=tmp_path / "lat")
    assert capsys.readouterr() == ("", "")
    assert run.path == tmp_path / "lat" and (tmp_path / "lat" / "report.json").is_file()
    assert run.meta["kind"] == "latency" and set(run.latency["nvml_index"]) == {0, 1}
    again = pcietrace.load(run.path)
    assert again.meta["gpus"] == run.meta["gpus"] and len(again.latency) == len(run.latency)


def test_without_output_nothing_is_saved(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    run = pcietrace.graphs(simulate=True, kernels=(20,), iterations=2, rounds=1)
    assert run.path is None and list(tmp_path.iterdir()) == []
    assert set(run.graphs["strategy"]) >= {"eager", "recognize"} and str(run)


def test_the_api_and_the_cli_record_the_same_run(tmp_path, capsys) -> None:
    """The same workflow behind both: the same SIMULATED run gives the same GPUs, tables and latency suite."""
    from pcietrace.report.saved import to_jsonable
    from pcietrace.cli import main

    options = dict(simulate=True, quick=True, window_s=0.02, durations_us=(0, 5), gpus=2, seed=3, repeats=3)
    api = pcietrace.measure(**options)
    assert main(["run", "--simulate", "--quick", "--window-s", "0.02", "--durations", "0,5", "--gpus", "2",
                 "--seed", "3", "--repeats", "3", "--no-save", "--format", "json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert cli["meta"]["gpus"] == api.meta["gpus"]
    assert {k for k, v in cli["results"].items() if v} == {k for k, v in api.tables.items() if len(v)}
    assert cli["results"]["latency"] == json.loads(json.dumps(to_jsonable({"latency": api.latency})["latency"]))


def test_attach_runs_the_program_and_gives_its_exit_code(attach_stand_ins, tmp_path, capfd) -> None:
    """SIMULATED: stand-in GPU and samplers (tests/test_attach.py's). The program's own output is its own; the
    API adds none; a failing program is a result (its exit code in meta), not an exception."""
    run = pcietrace.attach([sys.executable, "-c", "print('hello'); raise SystemExit(3)"], gpu=0, calibrate=False,
                           idle_s=0.01, output=tmp_path / "rec")
    assert run.meta["kind"] == "attach" and run.meta["exit_code"] == 3 and run.meta["command"][-1].endswith("(3)")
    assert run.path == tmp_path / "rec" and (tmp_path / "rec" / "report.json").is_file()
    assert capfd.readouterr() == ("hello\n", "")
    assert "ranges" in run.tables


def test_load_gives_named_tables_summary_and_meta(loaded) -> None:
    run = pcietrace.load(REPORTS[0])
    _, res = loaded["h100_run_defaults"]
    pd.testing.assert_frame_equal(run.per_launch, res["per_launch"])
    assert run["speedup"] is run.tables["speedup"]
    assert run.meta["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert str(run).startswith("One eager launch on GPU0")
    with pytest.raises(AttributeError, match="no result table"):
        run.nope  # noqa: B018


def test_measure_runs_the_simulated_pipeline(tmp_path) -> None:
    run = pcietrace.measure(simulate=True, quick=True, window_s=0.02, gpus=2, latency=False, output=tmp_path / "m")
    assert run.meta["simulated"] and len(run.meta["gpus"]) == 2
    assert set(run.per_launch["nvml_index"]) == {0, 1}
    assert (tmp_path / "m" / "report.json").is_file()


def test_import_stays_light() -> None:
    import subprocess
    import sys

    code = "import sys, pcietrace; print([m for m in ('pandas', 'rich', 'numpy') if m in sys.modules])"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
