"""Analysis refuses a session that breaks an invariant (pcietrace/analysis/validate.py): samples out of time
order, NaN, negative or beyond their counter, an unknown counter mode, reversed windows, zero-launch bursts; every
recorded report passes. On copies of the real recordings in tests/data."""

from __future__ import annotations

import numpy as np
import pytest

from pcietrace.analysis import analyze
from pcietrace.errors import DataError
from pcietrace.session import Session

from conftest import ROOT, edit_report, edit_samples, one_line_exit_2


@pytest.mark.parametrize("change, says", [
    (lambda s: s.sample(frac=1.0, random_state=0), "not in time order"),
    (lambda s: s.assign(tx_raw=s["tx_raw"].astype(float).where(s.index != 7)), "samples.tx_raw: row 7"),
    (lambda s: s.assign(rx_raw=s["rx_raw"].astype(np.int64) - 2**40), "negative"),
    (lambda s: s.assign(rx_raw=s["rx_raw"].astype(np.uint64) + np.uint64(2**33)), "beyond its 32-bit counter"),
])
def test_broken_samples_are_refused_not_figured(copy, capsys, change, says) -> None:
    run = copy()
    edit_samples(run, change)
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


def test_recorded_reports_pass_validation(data_dir) -> None:
    shared = ROOT.parent / "shared" / "recordings"
    folders = [data_dir / n for n in ("h100_run", "h100_run_latency", "h200x2_run", "attach_h100_python")]
    folders += sorted(p.parent for p in shared.glob("*/report.json"))  # (the folder holds a README too)
    folders += [data_dir / n for n in ("h100_run_defaults", "h200x2_run_defaults", "h200x4_run", "h200x8_run")]
    for f in folders:
        res = analyze(Session.load(f))
        assert len(res["sampling"]) == Session.load(f).samples["nvml_index"].nunique()
