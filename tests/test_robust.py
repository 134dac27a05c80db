"""The explicit cases of issue 9 ("nothing lost, no tracebacks"), on the real recordings in tests/data and
on the SIMULATED device: damaged reports, broken invariants, run folders, signals, CLI numbers, sysfs."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from conftest import edit_report, one_line_exit_2, terminal_signals
from pcietrace.analysis import analyze
from pcietrace.cli import main
from pcietrace.errors import DataError, ReportError, UsageError
from pcietrace.record import guard
from pcietrace.report.console import render, topology_tables
from pcietrace.session import Session
from sysfs_fixture import build

ROOT = Path(__file__).resolve().parents[1]
QUICK_SIM = ["run", "--simulate", "--quick", "--window-s", "0.02", "--no-latency"]


# --- one validated load path --------------------------------------------------------------------

@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_damaged_parquet_is_one_line(copy, capsys, damage) -> None:
    run = copy()
    f = run / "samples.parquet"
    raw = f.read_bytes()
    f.write_bytes({"truncate": raw[: len(raw) // 2], "garbage": os.urandom(len(raw)), "empty": b""}[damage])
    err = one_line_exit_2(["report", str(run)], capsys)
    assert "samples.parquet" in err


def test_damaged_events_parquet_is_one_line(copy, capsys) -> None:
    run = copy("attach_h100_python")
    (run / "events.parquet").write_bytes(b"PAR1" + b"\x00" * 50)
    assert "events.parquet" in one_line_exit_2(["report", str(run)], capsys)


@pytest.mark.parametrize("change, field", [
    (lambda d: d["meta"].pop("gpus"), "meta.gpus"),
    (lambda d: d["meta"]["gpus"][0].update(nvml_index="0"), "meta.gpus[0].nvml_index"),
    (lambda d: d["meta"]["gpus"][0].update(nvml_index=None), "meta.gpus[0].nvml_index"),
    (lambda d: d["meta"].update(gpus={}), "meta.gpus"),
    (lambda d: d["meta"]["gpus"][0].update(counter={"mode": 3, "bits": 32}), "meta.gpus[0].counter.mode"),
    (lambda d: d["meta"].update(simulated="no"), "meta.simulated"),
    (lambda d: d.update(tables=[]), "report.tables"),
    (lambda d: d["tables"]["windows"][0].update(t_start_ns="soon"), "windows.t_start_ns"),
    (lambda d: [w.pop("purpose") for w in d["tables"]["windows"]], "windows.purpose"),
    (lambda d: d["tables"]["bursts"][3].update(saturated=None), "bursts.saturated"),
    (lambda d: d["meta"].update(topology={"gpus": [{"bdf": 1}]}), "meta.topology.gpus[0].bdf"),
])
def test_missing_or_mistyped_keys_name_the_field(copy, capsys, change, field) -> None:
    run = copy()
    edit_report(run, change)
    with pytest.raises(ReportError, match=field.replace("[", r"\[").replace("]", r"\]")) as exc:
        Session.load(run)
    assert "report.json" in str(exc.value) or ".parquet" in str(exc.value)
    one_line_exit_2(["report", str(run)], capsys)


def test_deep_json_nesting_is_one_line(tmp_path, capsys) -> None:
    (tmp_path / "report.json").write_text("[" * 100_000 + "]" * 100_000)
    assert "nested too deeply" in one_line_exit_2(["report", str(tmp_path)], capsys)


def test_binary_report_json_is_one_line(tmp_path, capsys) -> None:
    (tmp_path / "report.json").write_bytes(b"\xff\xfe\x00garbage")
    one_line_exit_2(["report", str(tmp_path)], capsys)


def test_newer_schema_says_so(copy, capsys) -> None:
    run = copy()
    edit_report(run, lambda d: d.update(schema="pcietrace.report/2"))
    assert "newer pcietrace" in one_line_exit_2(["report", str(run)], capsys)


def test_report_without_samples_file_is_one_line(copy, capsys) -> None:
    run = copy()
    (run / "samples.parquet").unlink()
    assert "samples.parquet is missing" in one_line_exit_2(["report", str(run)], capsys)


def test_compare_and_baseline_go_through_the_same_load(copy, capsys, data_dir) -> None:
    run = copy()
    edit_report(run, lambda d: d["meta"].update(gpus=[{"nvml_index": "x"}]))
    one_line_exit_2(["compare", str(data_dir / "h100_run"), str(run)], capsys)


# --- analysis refuses bad inputs -----------------------------------------------------------------

def _samples(run: Path, change) -> None:
    s = pd.read_parquet(run / "samples.parquet")
    change(s).to_parquet(run / "samples.parquet", index=False)


@pytest.mark.parametrize("change, says", [
    (lambda s: s.sample(frac=1.0, random_state=0), "not in time order"),
    (lambda s: s.assign(tx_raw=s["tx_raw"].astype(float).where(s.index != 7)), "samples.tx_raw: row 7"),
    (lambda s: s.assign(rx_raw=s["rx_raw"].astype(np.int64) - 2**40), "negative"),
    (lambda s: s.assign(rx_raw=s["rx_raw"].astype(np.uint64) + np.uint64(2**33)), "beyond its 32-bit counter"),
])
def test_broken_samples_are_refused_not_figured(copy, capsys, change, says) -> None:
    run = copy()
    _samples(run, change)
    assert says in one_line_exit_2(["report", str(run), "--json"], capsys)


def test_unknown_counter_mode_and_reversed_windows_are_refused(copy, capsys) -> None:
    run = copy()
    edit_report(run, lambda d: d["meta"]["gpus"][0]["counter"].update(mode="bogus"))
    assert "unknown counter mode 'bogus'" in one_line_exit_2(["report", str(run)], capsys)
    run2 = copy("h200x2_run")

    def reverse(d):
        w = d["tables"]["windows"][5]
        w["t_start_ns"], w["t_end_ns"] = w["t_end_ns"], w["t_start_ns"]
    edit_report(run2, reverse)
    assert "ends before it starts" in one_line_exit_2(["report", str(run2)], capsys)


def test_zero_launch_bursts_are_refused(h100) -> None:
    s = Session(meta=h100.meta, samples=h100.samples, windows=h100.windows, bursts=h100.bursts.assign(calls=0),
                e2e=h100.e2e, calibration=h100.calibration)
    with pytest.raises(DataError, match="bursts.calls"):
        analyze(s)


def test_windows_no_sample_covers_render_with_declared_columns(copy, capsys, monkeypatch) -> None:
    """Only three samples, before every window: no window has bytes; tables say '–', nothing crashes."""
    run = copy()
    _samples(run, lambda s: s.iloc[:3])
    res = analyze(Session.load(run))
    assert {"h2d_bytes_per_launch", "d2h_bytes_per_launch"} <= set(res["by_duration"].columns)
    assert res["by_duration"]["h2d_bytes_per_launch"].isna().all()
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["report", str(run)]) == 0
    assert "vs kernel duration" in capsys.readouterr().out


def test_attach_report_with_an_uncovered_floor_renders(copy, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    run = copy("attach_h100_python")
    doc = json.loads((run / "report.json").read_text())
    t0, t1 = doc["meta"]["t_app_start_ns"], doc["meta"]["t_app_end_ns"]
    _samples(run, lambda s: s[(s["t_ns"] > t0) & (s["t_ns"] < t1)])  # idle windows lie outside: no floor
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert "Launches per NVTX range" in out and "B/launch" in out


def test_recorded_reports_pass_validation(data_dir) -> None:
    shared = ROOT.parent / "shared" / "recordings"
    folders = [data_dir / n for n in ("h100_run", "h100_run_latency", "h200x2_run", "attach_h100_python")]
    folders += sorted(p.parent for p in shared.glob("*/report.json"))  # (the folder holds a README too)
    folders += [data_dir / n for n in ("h100_run_defaults", "h200x2_run_defaults", "h200x4_run", "h200x8_run")]
    for f in folders:
        res = analyze(Session.load(f))
        assert len(res["sampling"]) == Session.load(f).samples["nvml_index"].nunique()


# --- never lose a run ----------------------------------------------------------------------------

def test_existing_run_is_refused_before_measuring_unless_force(copy, capsys) -> None:
    run = copy()
    before = (run / "samples.parquet").read_bytes()
    assert "--force" in one_line_exit_2(QUICK_SIM + ["-o", str(run)], capsys)
    assert (run / "samples.parquet").read_bytes() == before and not list(run.parent.glob(".*partial*"))
    assert main(QUICK_SIM + ["-o", str(run), "--force", "--json"]) == 0
    capsys.readouterr()
    replaced = Session.load(run)
    assert replaced.meta["simulated"] is True and not list(run.parent.glob(".*"))


def test_runs_being_a_file_fails_up_front(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("runs").write_text("not a folder")
    t = time.monotonic()
    one_line_exit_2(QUICK_SIM, capsys)
    assert time.monotonic() - t < 2.0  # refused before the measurement, not after it


def test_unwritable_output_fails_up_front(tmp_path, capsys) -> None:
    one_line_exit_2(QUICK_SIM + ["-o", "/proc/pcietrace-cannot-exist/run"], capsys)
    if os.geteuid() != 0:  # root writes anywhere: chmod proves nothing there
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        one_line_exit_2(QUICK_SIM + ["-o", str(ro / "run")], capsys)


def test_non_empty_foreign_folder_is_not_written_into(tmp_path, capsys) -> None:
    (tmp_path / "mine.txt").write_text("keep")
    one_line_exit_2(QUICK_SIM + ["-o", str(tmp_path)], capsys)
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


def test_default_names_carry_the_gpu_selection_and_never_collide(tmp_path, h100) -> None:
    meta = {**h100.meta, "simulated": False}
    a = guard.default_folder(meta, [0, 1])
    assert a.name.endswith("-nvidia-h100-80gb-hbm3-gpu0-1") and a.parent.name == "runs"
    target = tmp_path / "run"
    folders = [guard.RunFolder(target, explicit=False) for _ in range(3)]
    for f in folders:
        h100.save(f.staging)
    published = [f.publish() for f in folders]
    assert [p.name for p in published] == ["run", "run-2", "run-3"]
    assert all(Session.load(p).meta["gpus"] == h100.meta["gpus"] for p in published)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "run-2", "run-3"]  # no staging left


def test_a_published_run_is_made_as_mkdir_makes_a_folder(tmp_path, h100) -> None:
    # was: always 0700 (the staging folder tempfile.mkdtemp made): other users could not read a saved run. A
    # run saved into an empty read-only -o folder takes the umask's mode too, so --force can replace it later
    old = os.umask(0o027)
    try:
        (tmp_path / "given").mkdir(mode=0o555)
        folders = [guard.RunFolder(tmp_path / "new"), guard.RunFolder(tmp_path / "given")]
        for f in folders:
            h100.save(f.staging)
        published = [f.publish() for f in folders]
        again = guard.RunFolder(tmp_path / "given", force=True)
        h100.save(again.staging)
        assert again.publish() == tmp_path / "given"
    finally:
        os.umask(old)
    assert [stat.S_IMODE(p.stat().st_mode) for p in published] == [0o750, 0o750]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["given", "new"]  # nothing hidden left behind


def test_a_second_interrupt_waits_for_the_save(tmp_path, h100, as_in_a_terminal) -> None:
    """Ctrl-C during the save: the save completes into a loadable report, then the interrupt is raised."""
    folder = guard.RunFolder(tmp_path / "run")
    s = Session(meta=dict(h100.meta), samples=h100.samples, windows=h100.windows)
    real_save = Session.save

    def save_with_ctrl_c(self, directory, results=None):
        os.kill(os.getpid(), signal.SIGINT)  # arrives while writing
        return real_save(self, directory, results)

    s.save = save_with_ctrl_c.__get__(s)
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN where pytest runs in the background
    intr = guard.Interrupts.install()
    with pytest.raises(KeyboardInterrupt):
        with intr.finishing():
            _, where = guard.finish(s, folder, lambda: None, lambda r: r, print)
    assert where == tmp_path / "run" and len(Session.load(where).samples) == len(h100.samples)
    assert signal.getsignal(signal.SIGINT) is before


def test_interrupted_save_leaves_nothing_not_an_empty_folder(tmp_path, h100) -> None:
    folder = guard.RunFolder(tmp_path / "run")

    def boom(*a, **k):
        raise KeyboardInterrupt

    s = Session(meta=dict(h100.meta))
    s.save = boom
    with pytest.raises(KeyboardInterrupt):
        guard.finish(s, folder, lambda: (_ for _ in ()).throw(KeyboardInterrupt()), lambda r: r, print)
    assert list(tmp_path.iterdir()) == []


def test_failed_save_still_prints_the_results(tmp_path, capsys, monkeypatch) -> None:
    def disk_full(self, directory, results=None):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Session, "save", disk_full)
    assert main(QUICK_SIM + ["-o", str(tmp_path / "run"), "--json"]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out)["results"]["per_launch"]  # the figures were printed
    assert "could not save" in err and "No space left" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_save_like_ctrl_c(tmp_path, sig) -> None:
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "pcietrace", "run", "--simulate", "--gpus", "8", "-o", str(out)],
                         preexec_fn=terminal_signals, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not list(tmp_path.glob(".run.partial-*")) and time.monotonic() < deadline:
        time.sleep(0.05)  # the staging folder exists: the measurement is about to start
    time.sleep(0.5)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + sig and "Traceback" not in err, err
    s = Session.load(out)
    assert s.meta["status"] == "interrupted" and len(s.samples)
    assert [x.name for x in tmp_path.iterdir()] == ["run"]


def test_perfetto_to_a_missing_folder_or_a_full_disk_is_one_line(data_dir, tmp_path, capsys) -> None:
    attach = str(data_dir / "attach_h100_python")
    one_line_exit_2(["report", attach, "--perfetto", str(tmp_path / "no" / "such" / "trace.json")], capsys)
    if Path("/dev/full").exists():
        assert "No space" in one_line_exit_2(["report", attach, "--perfetto", "/dev/full"], capsys)


# --- CLI numbers ----------------------------------------------------------------------------------

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


def test_simulate_refuses_a_gpu_it_does_not_have(capsys) -> None:
    assert "no CUDA device 5" in one_line_exit_2(["run", "--simulate", "--gpu", "5", "--no-save"], capsys)


def test_ctrl_c_during_imports_is_one_line() -> None:
    code = ("import importlib.abc, runpy, sys\n"
            "class Stop(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'pcietrace.cli': raise KeyboardInterrupt\n"
            "sys.meta_path.insert(0, Stop())\n"
            "runpy.run_module('pcietrace', run_name='__main__')\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 130 and r.stderr == "pcietrace: interrupted\n"


def test_ctrl_c_while_commands_import_is_one_line(monkeypatch, capsys) -> None:
    import pcietrace.cli as cli

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert main(["report", "x"]) == 130
    assert capsys.readouterr().err == "pcietrace: interrupted\n"


# --- sysfs garbage --------------------------------------------------------------------------------

def test_garbage_sysfs_files_keep_the_gpus_and_print_no_none(tmp_path, data_dir) -> None:
    from pcietrace.collectors import topology

    root = build(data_dir / "topo" / "wrx80_two_gpus_root_ports.json", tmp_path / "t")
    gpus = sorted((root / "bus" / "pci" / "devices").iterdir())
    clean = topology.collect(None, root)
    for dev in gpus:
        for name, junk in (("numa_node", b"\xff\xfe\x80"), ("current_link_width", b"-1\n"),
                           ("max_link_width", b"\x00\x01x16"), ("local_cpulist", b"\xc3\x28"),
                           ("current_link_speed", b"32.0 GT/s PCIe\x07"), ("device", b"0xZZ")):
            if (dev / name).exists():
                (dev.resolve() / name).write_bytes(junk)
    topo = topology.collect(None, root)
    assert [g["bdf"] for g in topo["gpus"]] == [g["bdf"] for g in clean["gpus"]] and len(topo["gpus"]) == 2
    hop = topo["gpus"][0]["hops"][-1]
    assert hop["link_width"] is None and hop["max_link_width"] is None and topo["gpus"][0]["numa_node"] is None
    buf = io.StringIO()
    for t in topology_tables(topo):
        Console(file=buf, width=200).print(t)
    text = buf.getvalue()
    assert "None" not in text and "x-1" not in text and "x?" in text


def test_topo_command_on_a_garbage_tree_is_not_a_traceback(tmp_path, data_dir, capsys) -> None:
    root = build(data_dir / "topo" / "lent_h100_vm.json", tmp_path / "t")
    gpu = (root / "bus" / "pci" / "devices" / "0000:00:06.0").resolve()
    (gpu / "class").write_bytes(os.urandom(64) + b"\xff")
    assert main(["topo", "--sysfs-root", str(root)]) == 0  # an NVIDIA function of unknown class is still listed
    assert "0000:00:06.0" in capsys.readouterr().out


def test_render_survives_an_empty_result_set(h100) -> None:
    buf = io.StringIO()
    render(h100.meta, {}, Console(file=buf, width=200))
    assert "System" in buf.getvalue() and "H100" in buf.getvalue()


def test_report_errors_are_usage_errors() -> None:
    """ReportError is a UsageError: every existing `except UsageError` and the CLI's exit 2 still apply."""
    with pytest.raises(UsageError, match="no pcietrace report"):
        Session.load(Path("/nonexistent/run"))


def test_an_analysis_error_still_publishes_the_raw_data(tmp_path, h100) -> None:
    folder = guard.RunFolder(tmp_path / "run")

    def refuse():
        raise DataError("samples: not in time order")

    with pytest.raises(DataError):
        guard.finish(h100, folder, refuse, lambda r: r, print)
    assert len(Session.load(tmp_path / "run").samples) == len(h100.samples)
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


# --- on a GPU (the lead runs these: python3 -m pytest -q -m gpu tests/test_robust.py) ---------------

def _start_and_signal(argv: list[str], staging_glob: Path, sig: int, after_s: float) -> subprocess.CompletedProcess:
    p = subprocess.Popen([sys.executable, "-m", "pcietrace", *argv], cwd=ROOT, preexec_fn=terminal_signals,
                         stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(staging_glob.parent.glob(staging_glob.name)) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
    time.sleep(after_s)
    p.send_signal(sig)
    out, err = p.communicate(timeout=180)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@pytest.mark.gpu
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_real_run_stopped_by_a_signal_keeps_a_loadable_partial_report(tmp_path, sig) -> None:
    r = _start_and_signal(["run", "--no-latency", "-o", str(tmp_path / "run")], tmp_path / ".run.partial-*", sig, 6.0)
    assert r.returncode == 128 + sig and "Traceback" not in r.stderr, r.stderr  # a default run takes ~20 s
    s = Session.load(tmp_path / "run")
    assert s.meta["status"] == "interrupted" and len(s.samples), (s.meta["status"], len(s.samples), r.stderr)
    assert [p.name for p in tmp_path.iterdir()] == ["run"]
    assert main(["report", str(tmp_path / "run"), "--json"]) == 0


@pytest.mark.gpu
def test_real_latency_stopped_by_sigterm_leaves_no_folder(tmp_path) -> None:
    # enough repeats that the suite is still running when the signal comes (11 take well under a second on an H100)
    r = _start_and_signal(["latency", "--repeats", "301", "-o", str(tmp_path / "lat")], tmp_path / ".lat.partial-*",
                          signal.SIGTERM, 0.5)
    assert r.returncode == 128 + signal.SIGTERM and r.stderr.strip().endswith("pcietrace: interrupted"), \
        (r.returncode, r.stderr)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.gpu
def test_two_real_runs_started_together_keep_both(tmp_path) -> None:
    procs = [subprocess.Popen([sys.executable, "-m", "pcietrace", "run", "--quick", "--no-latency", "--json"],
                              cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read() if p.stderr else ""
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 2 and all(Session.load(r).meta["status"] == "complete" for r in runs), \
        [(r.name, Session.load(r).meta["status"]) for r in runs]


def test_simulated_runs_started_together_keep_every_run(tmp_path) -> None:
    procs = [subprocess.Popen([sys.executable, "-m", "pcietrace", *QUICK_SIM, "--json"], cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read() if p.stderr else ""
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 3 and all(Session.load(r).meta["status"] == "complete" for r in runs)
    assert all(re.search(r"simulated-nvidia-h100.*-gpu0(-[23])?$", r.name) for r in runs), runs


@pytest.mark.parametrize("table", ["bursts", "e2e"])
def test_a_run_stopped_between_a_durations_eager_and_graph_steps_reports(table, tmp_path, data_dir, capsys) -> None:
    """The real H100 run cut where Ctrl-C between a duration's eager and graph step leaves it (the first eager
    burst or end-to-end loop recorded, its graph partner not): `report` renders the eager figures and leaves the
    graph ones out (it raised KeyError: 'graph')."""
    s = Session.load(data_dir / "h100_run")
    t = getattr(s, table)
    setattr(s, table, t.loc[:t.index[t["mode"] == "graph"][0] - 1])
    if table == "bursts":
        s.e2e = s.e2e.iloc[:0]  # (the loops come after the bursts)
    s.meta["status"] = "interrupted"
    s.save(tmp_path / "run")
    assert main(["report", str(tmp_path / "run"), "--format", "json"]) == 0
    res = json.loads(capsys.readouterr().out)["results"]
    key, eager, graph = {"bursts": ("gpu_time", "eager_gpu_us", "graph_gpu_us"),
                         "e2e": ("speedup", "eager_wall_us", "graph_wall_us")}[table]
    rows = res[key]
    assert len(rows) == 1 and rows[0][eager] > 0 and rows[0][graph] is None
    if table == "bursts":  # the eager bursts kept the queue full: not an upper bound for want of a graph burst
        full = analyze(Session.load(data_dir / "h100_run"))["gpu_time"]
        assert rows[0]["saturated"] == bool(full.loc[full["kernel_us"] == rows[0]["kernel_us"], "saturated"].iloc[0])
    assert main(["report", str(tmp_path / "run")]) == 0
