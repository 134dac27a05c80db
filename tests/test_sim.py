"""The SIMULATED device's host cost by launching language: from the measured Python/C ratio, not Python == C."""

from __future__ import annotations

import pytest

import pcietrace
from pcietrace.device import sim


def test_simulated_python_launches_cost_the_measured_ratio_more_than_c() -> None:
    # was: the simulated run showed Python costing the same as C ('+0.000 1.00x')
    p = sim.SimParams.default()
    assert 1.1 < p.host_ratio_python < 2 and "reports/h100-20261124" in p.host_ratio_python_source
    run = pcietrace.measure(simulate=True, quick=True)
    lang = run.host_cost_by_language.set_index("path")
    assert lang.loc["python", "ratio_vs_native"] == pytest.approx(p.host_ratio_python, rel=0.05)
    assert lang.loc["native", "us_per_launch"] == pytest.approx(p.host_ns_eager / 1e3, rel=0.05)
