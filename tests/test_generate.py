"""Launch generator loops, run against the SIMULATED device (virtual clock, no GPU)."""

from __future__ import annotations

import pytest

from pcietrace.errors import UsageError
from pcietrace.record.generate import LaunchConfig, LaunchGenerator
from pcietrace.record.run import RunPlan
from pcietrace.device.sim import SimBackend, SimDevice, SimParams


@pytest.fixture()
def gen() -> LaunchGenerator:
    return LaunchGenerator(SimBackend(SimDevice(SimParams.default(), seed=3)))


@pytest.mark.parametrize("kwargs,match", [
    ({"mode": "bogus"}, "mode must be"), ({"mode": "eager", "kernel_us": -1}, "kernel duration"),
    ({"mode": "eager", "graph_k": 10}, "only applies to graph"), ({"mode": "graph", "graph_k": 0}, "graph size"),
    ({"mode": "eager", "rate_hz": 0}, "rate must be"), ({"mode": "idle", "duration_s": 0}, "window duration"),
])
def test_launch_config_rejects_bad_values(kwargs, match) -> None:
    with pytest.raises(UsageError, match=match):
        LaunchConfig(**kwargs)


def test_paced_window_hits_its_target_rate(gen) -> None:
    rec = gen.window(LaunchConfig("eager", 0.0, 1, 50_000, 0.2))
    assert rec["achieved_rate_hz"] == pytest.approx(50_000, rel=0.01)
    assert rec["launches"] == rec["calls"] and rec["t_end_ns"] > rec["t_start_ns"]


def test_graph_window_counts_kernels_as_calls_times_k(gen) -> None:
    rec = gen.window(LaunchConfig("graph", 0.0, 10, 2_000, 0.1))
    assert rec["launches"] == 10 * rec["calls"] and rec["calls"] == pytest.approx(200, abs=2)


def test_max_rate_is_the_host_cost(gen) -> None:
    p = SimParams.default()
    rec = gen.window(LaunchConfig("eager", 0.0, 1, None, 0.1))
    assert rec["achieved_rate_hz"] == pytest.approx(1e9 / p.host_ns_eager, rel=0.05)


def test_burst_keeps_the_queue_full_and_times_gpu_and_host_apart(gen) -> None:
    p = SimParams.default()
    b = gen.burst("eager", 5.0, 1, 900)
    assert b["saturated"]
    assert b["gpu_ns"] / 900 == pytest.approx(5000 + p.gap_ns_eager, rel=0.01)
    assert b["host_ns"] / 900 == pytest.approx(p.host_ns_eager, rel=0.05)


def test_a_burst_s_cpu_time_is_the_loop_s_own_over_the_calls_its_wall_time_is_of(gen) -> None:
    """A burst's CPU time is what its launch loop read around the calls themselves, as its wall time is: read
    around the loop from Python, a burst of 9 calls showed 30.3 us of CPU against 15.2 us of wall time."""
    from pcietrace.device.base import PythonLoops

    class Loops(PythonLoops):  # (the SIMULATED loop, with the Python around it made to cost CPU time)
        def calls(self, n: int, sync: bool = False) -> tuple[int, int, int, int]:
            out = super().calls(n, sync)
            self.b.d.now += 15_000
            return out
    loops = Loops(gen.b, gen.b.launcher(5000))
    b = gen.burst("eager", 5.0, 1, 9, loops=loops)
    assert 0 < b["cpu_ns"] <= b["host_ns"] + 2 * gen.b.d.CLOCK_READ_NS


def test_plan_step_count_matches_the_steps() -> None:
    plan = RunPlan(durations_us=(0, 5), graph_ks=(1, 10), idle_windows=1, e2e_repeats=1, language_repeats=1)
    # 2 calibrations + 1 idle + 4 eager fits + 1 duration + 8 graph windows + loading PyTorch + making the
    # fresh CUDA contexts + 4 fresh contexts' bursts + 4 bursts + 3 language bursts (native, Python, PyTorch) + 4 e2e
    assert plan.steps() == 33


def test_end_to_end_loops_of_long_kernels_are_capped_at_whole_graphs() -> None:
    plan = RunPlan()
    n = {d: plan.e2e_kernels_at(d) for d in (0, 2, 20, 50, 10_000)}
    assert n[0] == n[2] == plan.e2e_kernels  # short kernels: the full loop (host-bound, the graph speedup)
    assert n[50] * 50 <= plan.e2e_loop_ms * 1e3 < (n[50] + plan.e2e_graph_k) * 50  # ~e2e_loop_ms of GPU time
    assert n[10_000] == plan.e2e_graph_k and all(k % plan.e2e_graph_k == 0 for k in n.values())
    with pytest.raises(UsageError):
        RunPlan(e2e_loop_ms=0)
