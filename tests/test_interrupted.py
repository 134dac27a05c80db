"""A recording whose pcietrace process dies mid-run (SIGKILL here; a crash or a power cut alike) is read back up
to its last flush, marked interrupted; SIGTERM and Ctrl-C still end with a normal save. `pcietrace attach` runs
for real on stand-in GPUs (tests/apps/attach_fake_gpu.py: real samplers and injection library, a stand-in
counter reader)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, checkout_env, terminal_signals

#: A program that opens and closes a range every ~20 ms and writes how many it has closed, until ``stop`` exists.
#: Ctrl-C ends it quietly.
STEPS_APP = """import os, sys, time, nvtx
count, stop = sys.argv[1], sys.argv[2]
n = 0
t_end = time.monotonic() + 60
try:
    while not os.path.exists(stop) and time.monotonic() < t_end:
        with nvtx.annotate("step", domain="app"):
            time.sleep(0.01)
        n += 1
        with open(count + ".tmp", "w") as f:
            f.write(str(n))
        os.replace(count + ".tmp", count)
        time.sleep(0.01)
except KeyboardInterrupt:
    pass
"""


@pytest.fixture
def steps(tmp_path):
    pytest.importorskip("nvtx")
    from pcietrace.errors import UsageError
    from pcietrace.record.trace import injection_library

    try:
        injection_library()
    except UsageError:
        pytest.skip("the injection library is not built (python3 setup.py build_ext --inplace)")
    app = tmp_path / "steps.py"
    app.write_text(STEPS_APP)
    return app


def _attach(out: Path, app: Path, tmp_path: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.Popen([sys.executable, str(ROOT / "tests" / "apps" / "attach_fake_gpu.py"), "attach", "--gpu", "0",
                             "--no-calibrate", "--no-count-launches", "--idle-s", "0.2", "-o", str(out), "--format", "csv",
                             "--", sys.executable, str(app), str(tmp_path / "count"), str(tmp_path / "stop")],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=terminal_signals)


def _count(tmp_path: Path) -> int:
    try:
        return int((tmp_path / "count").read_text() or 0)
    except FileNotFoundError:
        return 0


def _wait_for_ranges(tmp_path: Path, proc: subprocess.Popen, n: int) -> None:
    deadline = time.monotonic() + 90
    while _count(tmp_path) < n:
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the program under attach closed no range within 90 s"
        time.sleep(0.1)


def _report_json(path: Path) -> dict:
    env = checkout_env()
    p = subprocess.run([sys.executable, "-m", "pcietrace", "report", str(path), "--format", "json"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_a_killed_recording_reads_back_to_its_last_flush_marked_interrupted(steps, tmp_path) -> None:
    from pcietrace.collectors.sampler import FLUSH_S
    from pcietrace.session import Session

    out = tmp_path / "runs" / "rec"
    proc = _attach(out, steps, tmp_path)
    try:
        _wait_for_ranges(tmp_path, proc, 10)
        time.sleep(2 * FLUSH_S + 0.5)  # (samples of the ranges before this point are on disk by the kill)
        closed_early = _count(tmp_path)
        time.sleep(FLUSH_S + 0.5)
        t_kill = time.monotonic_ns()
        proc.kill()
        proc.wait(30)
        closed_at_kill = _count(tmp_path)
    finally:
        (tmp_path / "stop").touch()  # the program outlives pcietrace, as it would
        proc.kill()
    time.sleep(0.5)
    assert not out.exists() and len(list(out.parent.glob(".rec.partial-*"))) == 1  # nothing published: a staging folder

    doc = _report_json(out)
    assert out.is_dir() and not list(out.parent.glob(".rec.partial-*"))  # recovered: published where it was to go
    meta = doc["meta"]
    assert meta["status"] == "interrupted" and meta["interrupted"]["lost_at_most_s"] == FLUSH_S
    calls = sum(r["calls"] for r in doc["results"]["ranges"]) if "ranges" in doc["results"] else None
    s = Session.load(out)
    pushes = int((s.events["event"] == "push").sum())
    assert closed_early <= pushes <= closed_at_kill + 1, (closed_early, pushes, closed_at_kill)
    assert calls is None or calls == pushes
    last = int(s.samples["t_ns"].max())
    assert t_kill - last < (FLUSH_S + 0.5) * 1e9  # samples up to the last flush before the kill
    assert s.meta["t_app_end_ns"] == last and int(s.events["t_ns"].max()) <= last

    # the console says so too, with the most that was lost
    p = subprocess.run([sys.executable, "-m", "pcietrace", "report", str(out)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env=checkout_env(COLUMNS="200"))
    assert p.returncode == 0 and "run status: interrupted" in p.stdout and f"last {FLUSH_S:g} s" in p.stdout, p.stdout


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_ctrl_c_still_save_the_whole_run(steps, tmp_path, sig) -> None:
    """The signal goes to the program, which ends; attach saves as after any program's end: nothing left to
    recover, every range there."""
    from pcietrace.session import Session

    out = tmp_path / "rec"
    proc = _attach(out, steps, tmp_path)
    try:
        _wait_for_ranges(tmp_path, proc, 5)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert "saved" in err and "Traceback" not in err, err
    s = Session.load(out)
    assert "interrupted" not in s.meta and s.meta["kind"] == "attach"
    assert int((s.events["event"] == "push").sum()) >= _count(tmp_path)
    assert not list(tmp_path.glob(".rec.partial-*")) and not (out / "recording").exists()
