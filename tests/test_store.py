"""pcietrace/store.py: the run folder. A streamed recording's scratch folder and journal are dropped when the run
is published; one whose process died is found (by its staging folder or the name it was to have), made a run
marked interrupted that reads as the recording did up to its last sample, and recovered rather than swept by
the next run in that folder. An existing, foreign or unwritable output is refused before measuring (unless
--force); default names carry the GPU selection and never collide, even for runs started together; a published run
takes the umask's mode."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pcietrace import store
from pcietrace.cli import main
from pcietrace.errors import ReportError
from pcietrace.record import guard
from pcietrace.session import Session

from conftest import DATA, QUICK_SIM, checkout_env, one_line_exit_2

SOURCE = DATA / "attach_h100_blind_graphs"


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


def _write_traces(events, trace_dir: Path) -> None:
    """A saved run's events as the injection library's trace files, one per process."""
    from pcietrace.record.trace import EVENT_COLUMNS, TRACE_COLUMNS, TRACE_MAGIC

    trace_dir.mkdir(parents=True)
    for pid, g in events.groupby("pid"):
        with open(trace_dir / f"trace-{pid}.tsv", "wb") as f:
            f.write(TRACE_MAGIC + b" %d\n" % max(TRACE_COLUMNS))
            g[EVENT_COLUMNS].to_csv(f, sep="\t", header=False, index=False, lineterminator="\n")


def _killed_recording(parent: Path, cut_ns: int | None = None, started: bool = True) -> tuple[Path, Session]:
    """A staging folder as attach leaves it when killed: the journal, the traces and the streamed samples of the
    committed recording (samples up to ``cut_ns``; the program's start only if ``started``)."""
    from pcietrace.collectors.sampler import FLUSH_S, SampleStream, empty_samples

    src = Session.load(SOURCE)
    folder = store.RunFolder(parent / "rec")
    meta = {k: v for k, v in src.meta.items() if k not in ("t_app_end_ns", "exit_code", "processes", "status")}
    if not started:
        del meta["t_app_start_ns"]
    folder.journal(meta, windows=src.windows.to_dict("records"), flush_s=FLUSH_S)
    pid = _dead_pid()
    store.write_journal(folder.staging, {**store.read_journal(folder.staging), "pid": pid})
    _write_traces(src.events, folder.scratch / "traces")
    samples = src.samples if cut_ns is None else src.samples[src.samples["t_ns"] <= cut_ns]
    samples = samples.astype(empty_samples().dtypes.to_dict())  # (the sampler's own types: loaded ones may be narrower)
    stream = SampleStream(folder.scratch / "samples")
    for start in range(0, len(samples), 500):
        stream.write(samples.iloc[start:start + 500])
    folder.lock.release()  # (the process that held it is gone)
    dead = folder.staging.with_name(folder.staging.name.replace(f"-{os.getpid()}-", f"-{pid}-"))
    folder.staging.rename(dead)  # (named by the dead process, as its own staging folder would be)
    return dead, src


def test_publishing_drops_the_scratch_folder_and_journal(tmp_path) -> None:
    folder = store.RunFolder(tmp_path / "run")
    (folder.scratch / "traces").mkdir(parents=True)
    (folder.scratch / "traces" / "trace-1.tsv").write_text("x")
    folder.journal({"kind": "attach"}, windows=[])
    Session.load(SOURCE).save(folder.staging)
    where = folder.publish()
    assert where == tmp_path / "run" and sorted(p.name for p in where.iterdir()) == sorted(
        p.name for p in SOURCE.iterdir() if p.name in ("report.json", "samples.parquet", "events.parquet"))


def test_a_killed_recording_is_found_by_its_staging_folder_or_its_name(tmp_path) -> None:
    staging, _ = _killed_recording(tmp_path)
    assert store.interrupted_recording(staging) == staging
    assert store.interrupted_recording(tmp_path / "rec") == staging
    assert store.interrupted_recording(tmp_path / "other") is None
    assert store.interrupted_recording(SOURCE) is None


def test_a_killed_recording_reads_as_recorded_up_to_its_last_sample(tmp_path) -> None:
    """Loading the name it was to have recovers it: published there, marked interrupted, its events those up to
    the last sample streamed, its samples those streamed; the analysis runs on it."""
    from pcietrace.analysis import analyze

    src = Session.load(SOURCE)
    cut = int(src.events.loc[src.events["event"] == "push", "t_ns"].quantile(0.5))  # (half the ranges)
    staging, src = _killed_recording(tmp_path, cut)
    s = Session.load(tmp_path / "rec")
    assert not staging.exists() and (tmp_path / "rec" / "report.json").is_file()
    assert not (tmp_path / "rec" / store.SCRATCH).exists() and not (tmp_path / "rec" / store.JOURNAL_FILE).exists()
    assert s.meta["status"] == "interrupted" and s.meta["interrupted"]["saved_as"] == str(tmp_path / "rec")
    last = int(s.samples["t_ns"].max())
    assert last == int(src.samples.loc[src.samples["t_ns"] <= cut, "t_ns"].max()) and s.meta["t_app_end_ns"] == last
    assert len(s.samples) == int((src.samples["t_ns"] <= cut).sum())
    assert len(s.events) == int((src.events["t_ns"] <= last).sum()) and len(s.events) < len(src.events)
    assert sum(p["ranges"] for p in s.meta["processes"]) == int(s.events["event"].isin(["push", "start"]).sum())
    assert len(s.windows) == len(src.windows)
    res = analyze(s)
    assert len(res["range_instances"]) > 0
    # (the program's exit code died with the recording: "unknown", not "None")
    from pcietrace.analysis.summary import summarize

    assert "exit code unknown" in " ".join(summarize(s.meta, res)["lines"]) and "None" not in \
        " ".join(summarize(s.meta, res)["lines"])
    again = Session.load(tmp_path / "rec")  # a saved run from now on, read as any other
    assert again.meta["interrupted"]["recovered_from"] == staging.name


def test_a_recording_killed_before_its_program_ran_is_an_attach_failed_run(tmp_path) -> None:
    staging, _ = _killed_recording(tmp_path, started=False)
    s = Session.load(staging)
    assert s.meta["kind"] == "attach-failed" and s.meta["status"] == "interrupted before the program ran"


def test_a_recording_killed_before_its_first_samples_were_saved_says_so(tmp_path) -> None:
    """Killed after the program started (it may have ended) but before the samples' first flush: no sample of the
    program survives, and the run is said to be that, not "interrupted before the program ran"."""
    start = int(Session.load(SOURCE).meta["t_app_start_ns"])
    staging, _ = _killed_recording(tmp_path, cut_ns=start - 1)
    s = Session.load(staging)
    assert s.meta["kind"] == "attach-failed"
    assert s.meta["status"] == "interrupted before any counter sample of the program was saved"


def test_a_recording_still_running_is_not_taken(tmp_path) -> None:
    staging, _ = _killed_recording(tmp_path)
    store.write_journal(staging, {**store.read_journal(staging), "pid": os.getppid()})
    with pytest.raises(ReportError, match="still being recorded"):
        Session.load(staging)
    assert staging.is_dir() and not (tmp_path / "rec").exists()
    assert store.sweep_leftovers(tmp_path) == [] and staging.is_dir()


def test_the_next_run_in_that_folder_recovers_it_rather_than_sweeping_it(tmp_path) -> None:
    staging, _ = _killed_recording(tmp_path)
    dead_plain = tmp_path / f".other.partial-{_dead_pid()}-0123abcd"  # no journal: a run's leftovers, swept
    dead_plain.mkdir()
    nxt = store.RunFolder(tmp_path / "next")
    assert not staging.exists() and not dead_plain.exists()
    assert Session.load(tmp_path / "rec").meta["status"] == "interrupted"
    nxt.discard()


@pytest.mark.parametrize("field, value, says", [
    ("target", "../../escape", "target"), ("target", "/tmp/elsewhere", "target"), ("target", "a\0b", "target"),
    ("target", "..", "target"), ("flush_s", "x", "flush_s"), ("flush_s", float("nan"), "flush_s"),
    ("windows", "abc", "windows"), ("windows", [[1, 2]], "windows"),
    ("meta.t_app_start_ns", "x", "t_app_start_ns"), ("meta.t_app_start_ns", None, "t_app_start_ns"),
    ("meta.t_app_start_ns", 1.5e30, "t_app_start_ns"), ("meta.t_app_end_ns", "x", "t_app_end_ns")])
def test_a_journal_the_recovery_cannot_use_is_refused_in_one_line(tmp_path, capsys, field, value, says) -> None:
    """A killed recording's journal with a field that recovery cannot use (a target that is no plain folder name:
    the run would be published elsewhere; times or seconds that are not numbers) is refused, naming the field, and
    nothing is published."""
    staging, _ = _killed_recording(tmp_path / "runs")
    doc = store.read_journal(staging)
    if field.startswith("meta."):
        doc["meta"][field[5:]] = value
    else:
        doc[field] = value
    store.write_journal(staging, doc)
    line = one_line_exit_2(["report", str(staging)], capsys)
    assert "recording journal" in line and says in line
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [staging.name] and \
        sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


def test_a_recovered_run_never_replaces_a_run_that_took_its_name(tmp_path) -> None:
    staging, _ = _killed_recording(tmp_path)
    Session.load(SOURCE).save(tmp_path / "rec")
    assert store.recover(staging) == tmp_path / "rec-2"
    assert Session.load(tmp_path / "rec").meta["status"] == "complete"


def test_an_unwritable_folder_is_read_as_it_is(tmp_path, monkeypatch) -> None:
    staging, _ = _killed_recording(tmp_path)

    def no_room(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Session, "save", no_room)
    s = Session.load(staging)
    assert s.meta["status"] == "interrupted" and len(s.events) and staging.is_dir()


def test_a_recording_that_had_ended_is_recovered_whole(tmp_path) -> None:
    """Killed while analysing or saving (the journal says the recording was over): every event and sample, the
    program's own end, status as recorded."""
    staging, src = _killed_recording(tmp_path)
    doc = store.read_journal(staging)
    meta = {**doc["meta"], "t_app_end_ns": src.meta["t_app_end_ns"], "exit_code": 0, "status": "complete"}
    store.write_journal(staging, {**doc, "meta": meta, "whole": True})
    s = Session.load(tmp_path / "rec")
    assert s.meta["status"] == "complete" and "interrupted" not in s.meta
    assert len(s.events) == len(src.events) and len(s.samples) == len(src.samples)
    assert s.meta["t_app_end_ns"] == src.meta["t_app_end_ns"] and s.meta["processes"] == src.meta["processes"]


def test_a_save_given_up_on_leaves_a_streamed_recording_to_recover(tmp_path, monkeypatch) -> None:
    """The signal that no longer waits for the save (the third) lands while a streamed recording is being saved:
    the staging folder stays, the interrupted line says how to get the run, and `report` of its name gets it.
    A run that streamed nothing is discarded as before."""
    from pcietrace.record import guard

    src = Session.load(SOURCE)
    real_save = Session.save

    def cut(self, directory, results=None):
        raise KeyboardInterrupt

    for streamed in (True, False):
        folder = store.RunFolder(tmp_path / f"rec{streamed}")
        if streamed:
            from pcietrace.collectors.sampler import SampleStream, empty_samples

            folder.journal({**src.meta}, windows=src.windows.to_dict("records"), whole=True)
            _write_traces(src.events, folder.scratch / "traces")
            SampleStream(folder.scratch / "samples").write(src.samples.astype(empty_samples().dtypes.to_dict()))
        monkeypatch.setattr(Session, "save", cut)
        with pytest.raises(KeyboardInterrupt):
            guard.finish(src, folder, lambda: None, lambda r: r, lambda line: None)
        monkeypatch.setattr(Session, "save", real_save)
        line = guard.interrupted_line(folder, None, "the run")
        if streamed:
            assert folder.left == folder.staging and folder.staging.is_dir() and "report" in line, line
        else:
            assert folder.left is None and not folder.staging.exists() and "nothing saved" in line
    got = Session.load(tmp_path / "recTrue")
    assert got.meta["status"] == "complete" and len(got.events) == len(src.events) and len(got.samples) == len(src.samples)


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


@pytest.mark.gpu
def test_two_real_runs_started_together_keep_both(tmp_path) -> None:
    procs = [subprocess.Popen([sys.executable, "-m", "pcietrace", "run", "--quick", "--no-latency", "--json"],
                              cwd=tmp_path, env=checkout_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read() if p.stderr else ""
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 2 and all(Session.load(r).meta["status"] == "complete" for r in runs), \
        [(r.name, Session.load(r).meta["status"]) for r in runs]


def test_simulated_runs_started_together_keep_every_run(tmp_path) -> None:
    procs = [subprocess.Popen([sys.executable, "-m", "pcietrace", *QUICK_SIM, "--json"], cwd=tmp_path,
                              env=checkout_env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read() if p.stderr else ""
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 3 and all(Session.load(r).meta["status"] == "complete" for r in runs)
    assert all(re.search(r"simulated-nvidia-h100.*-gpu0(-[23])?$", r.name) for r in runs), runs
