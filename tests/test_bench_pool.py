"""bench/pool_pairs.py on the committed H100 runtime logs (no GPU): it finds every completed pair of each log, and
each pair's change is the one the log's own loop times give."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import pool_pairs

LOGS = sorted((Path(__file__).resolve().parent / "data" / "bench" / "overhead").glob(
    "h100-run*-overhead-*.log"))


def test_the_committed_logs_are_there() -> None:
    assert len(LOGS) >= 14  # (an empty glob would leave the test below with nothing to run)


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name)
def test_pairs_are_the_logs_own_loop_times(log: Path) -> None:
    text = log.read_text()
    loops = {(int(k), cfg): float(ms) for k, cfg, ms in re.findall(r"^pair (\d+) (\S+): loop ([\d.]+) ms", text, re.M)}
    complete = sorted(k for k, cfg in loops if cfg == "attach" and (k, "alone") in loops)
    found = pool_pairs.pairs_in(text, "attach")
    assert len(found) == len(complete) > 0
    for k, pct in zip(complete, found):  # the log prints one decimal of loop times rounded to 0.1 ms
        assert pct == pytest.approx(100 * (loops[k, "attach"] / loops[k, "alone"] - 1), abs=0.15), k


def test_a_log_without_the_configuration_is_refused(tmp_path: Path, monkeypatch, capsys) -> None:
    log = tmp_path / "nowake.log"  # another configuration's line only: "attach" must not match "attach-nowake"
    log.write_text("attach-nowake: app runtime per pair +1.0, -2.0 % -> median -0.50 % [95 % CI -2.00, +1.00]\n")
    monkeypatch.setattr("sys.argv", ["pool_pairs.py", str(log)])
    assert pool_pairs.main() == 2
    assert "no 'attach: app runtime per pair' line" in capsys.readouterr().err
    monkeypatch.setattr("sys.argv", ["pool_pairs.py", str(log), "--config", "attach-nowake"])
    assert pool_pairs.main() == 0
    assert "2 pairs, median -0.50 %" in capsys.readouterr().out
