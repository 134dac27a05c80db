"""Recording ``pcietrace graphs``: N short kernels per iteration whose parameters change between iterations,
run by each strategy in counter windows (boundary reads at every window edge, idle windows for the floor).

Per workload size and round, each strategy runs ``iterations`` iterations in one window; its state (cached
or updated graphs) lives on across rounds, so recognize with P parameter sets instantiates P graphs in all.
Every strategy sees the same sequence of parameter sets.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import Any, Callable, NamedTuple

import numpy as np
import pandas as pd

from pcietrace import signals
from pcietrace.collectors import merge_samples
from pcietrace.device.gpus import GpuRecord
from pcietrace.device.graphs import COUNT_COLUMNS, STRATEGIES, GraphsDevice
from pcietrace.errors import ConfigError
from pcietrace.record.run import recording_status
from pcietrace.session import Session

ORDERS = ("cycle", "random", "all-new")
#: Columns of a session's ``graphs`` table after ``kernels, strategy, round, iteration`` (see ITERATION_DTYPE).
ITERATION_FIELDS = ("t_start_ns", "prep_ns", "submit_ns", "wall_ns", "cpu_ns", "param_set", *COUNT_COLUMNS)


#: Caps that keep a typo (--iterations 1000000000) a usage error, not a MemoryError: iterations in all, and
#: kernel durations held by the parameter sets (8 B each: 400 MB).
MAX_ITERATIONS = 1_000_000
MAX_DURATIONS = 50_000_000


@dataclass(frozen=True)
class GraphsPlan:
    """``kernels``: workload sizes (kernels per iteration); ``param_sets``: distinct parameter sets P;
    ``order``: how iterations pick them (cycle, random, all-new = a fresh set every iteration);
    ``kernel_us``: range of the uniformly drawn kernel durations; ``iterations`` per window; ``rounds``:
    windows per strategy and size; ``sync``: synchronize after every iteration (default: pipelined, the host
    preparing the next iteration while the GPU runs, as a training loop does);
    ``idle_s``: length of each idle (floor) window."""

    kernels: tuple[int, ...] = (500, 2500)
    param_sets: int = 5
    order: str = "cycle"
    strategies: tuple[str, ...] = STRATEGIES
    kernel_us: tuple[float, float] = (2.0, 8.0)
    iterations: int = 40
    rounds: int = 3
    sync: bool = False
    idle_s: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.kernels or any(not 1 <= k <= 100_000 for k in self.kernels):
            raise ConfigError("kernels", "takes sizes of 1..100000 kernels per iteration")
        if not 1 <= self.param_sets <= 10_000:
            raise ConfigError("param_sets", "must be 1..10000")
        if self.order not in ORDERS:
            raise ConfigError("order", f"must be one of {', '.join(ORDERS)}, not {self.order!r}")
        bad = [s for s in self.strategies if s not in STRATEGIES]
        if not self.strategies or bad:
            raise ConfigError("strategies", f"has unknown strategy {bad[0] if bad else ''!r}; choose from "
                                            f"{', '.join(STRATEGIES)}")
        if "eager" not in self.strategies:
            raise ConfigError("strategies", "must include eager (speedups are taken against it)")
        if len(self.kernel_us) != 2 or not 0 <= self.kernel_us[0] <= self.kernel_us[1] <= 1_000_000:
            raise ConfigError("kernel_us", "takes MIN,MAX with 0 <= MIN <= MAX <= 1e6")
        if self.iterations < 2:
            raise ConfigError("iterations", "must be at least 2 per window")
        if self.rounds < 1:
            raise ConfigError("rounds", "must be at least 1")
        if not self.idle_s > 0:
            raise ConfigError("idle_s", "must be > 0")
        if self.total_iterations > MAX_ITERATIONS:
            raise ConfigError("iterations", f"x {{rounds}} must be at most {MAX_ITERATIONS} iterations in all")
        sets = self.total_iterations if self.order == "all-new" else self.param_sets
        if sets * max(self.kernels) > MAX_DURATIONS:  # parameter_sets() holds them all at once
            raise ConfigError("param_sets", f"(or all-new iterations) x the largest {{kernels}} must be at most "
                                            f"{MAX_DURATIONS:.0e} kernel durations in the parameter sets")

    @property
    def total_iterations(self) -> int:
        return self.iterations * self.rounds

    def parameter_sets(self, kernels: int) -> np.ndarray:
        """Kernel durations (ns) per parameter set: (sets, kernels); all-new has one set per iteration."""
        rng = np.random.default_rng([self.seed, kernels])
        sets = self.total_iterations if self.order == "all-new" else self.param_sets
        lo, hi = self.kernel_us
        return np.round(rng.uniform(lo, hi, (sets, kernels)) * 1e3).astype(np.uint64)

    def order_of(self, kernels: int) -> np.ndarray:
        """Parameter set per iteration over all rounds (the same for every strategy)."""
        n = self.total_iterations
        if self.order == "cycle":
            return np.arange(n, dtype=np.int32) % self.param_sets
        if self.order == "random":
            return np.random.default_rng([self.seed, kernels, 1]).integers(0, self.param_sets, n).astype(np.int32)
        return np.arange(n, dtype=np.int32)


Progress = Callable[[str], None]


def record(session: Session, plan: GraphsPlan, device: GraphsDevice, nvml_index: int, sampler: Any,
           probe: Callable[[], int], progress: Progress = lambda _: None) -> Session:
    """Run ``plan`` on ``device`` while ``sampler`` samples and ``probe`` reads the counters at every window
    edge; fill ``session.graphs`` (one row per iteration) and ``session.windows`` (one per strategy, size
    and round, plus idle windows). ``session.meta["status"]`` says how it ended; what was recorded before
    an exception stays in the session."""
    rows: list[pd.DataFrame] = []
    windows: list[dict[str, Any]] = []
    runners: list[Any] = []

    def idle(kernels: int) -> None:
        t0 = probe()
        device.idle(int(plan.idle_s * 1e9))
        windows.append({"nvml_index": nvml_index, "mode": "idle", "kernels": kernels, "round": -1, "iterations": 0,
                        "t_start_ns": t0, "t_end_ns": probe()})

    sampler.start()
    for g in session.meta.get("gpus", []):
        g["counter"] = sampler.modes.get(g["nvml_index"], {"mode": "unknown", "bits": 0})
    if hasattr(probe, "agree") and nvml_index in sampler.modes:
        probe.agree(sampler.modes[nvml_index]["mode"])  # edge reads and samples in one counter mode
    try:
        with recording_status(session):
            for n in plan.kernels:
                sets, order = plan.parameter_sets(n), plan.order_of(n)
                warm = device.runner("eager", sets, True)  # module load and first-launch costs stay outside
                runners.append(warm)  # (closed below if the warm-up fails)
                warm.run(order[:1])
                runners.remove(warm)
                warm.close()
                idle(n)
                current = {}
                for s in plan.strategies:  # each one closed below if a later one fails to be made
                    current[s] = device.runner(s, sets, plan.sync)
                    runners.append(current[s])
                for r in range(plan.rounds):
                    sl = slice(r * plan.iterations, (r + 1) * plan.iterations)
                    for s in plan.strategies:
                        progress(f"{n} kernels: {s} round {r + 1}/{plan.rounds}")
                        t0 = probe()
                        recs = current[s].run(order[sl])
                        t1 = probe()
                        windows.append({"nvml_index": nvml_index, "mode": s, "kernels": n, "round": r,
                                        "iterations": len(recs), "t_start_ns": t0, "t_end_ns": t1})
                        df = pd.DataFrame(recs)
                        df.insert(0, "iteration", np.arange(sl.start, sl.start + len(recs)))
                        df.insert(0, "round", r)
                        df.insert(0, "strategy", s)
                        df.insert(0, "kernels", n)
                        rows.append(df)
                for run in current.values():
                    run.close()
                runners.clear()
                idle(n)
    finally:
        for run in runners:
            try:
                run.close()
            except Exception:  # the original error matters more than a failed clean-up
                pass
        with signals.deferred():  # a signal here lost every row and sample
            session.samples = merge_samples([sampler.stop(), getattr(probe, "frame", pd.DataFrame)()])
            session.graphs = (pd.concat(rows, ignore_index=True) if rows else
                              pd.DataFrame(columns=["kernels", "strategy", "round", "iteration", *ITERATION_FIELDS]))
            session.windows = pd.DataFrame(windows)
    return session


def meta_for(plan: GraphsPlan, device: GraphsDevice) -> dict[str, Any]:
    """What the saved run says about how it was measured."""
    return {"kind": "graphs", "graphs_plan": asdict(plan), "timing": device.timing}


class OpenedDevice(NamedTuple):
    """What ``pcietrace graphs`` measures with: the GPU, its graphs device (the caller closes it), the counter
    sampler and boundary probe, and what the session's meta says of them (driver, sampling or the model)."""

    gpu: GpuRecord
    device: GraphsDevice
    sampler: Any
    probe: Any
    meta: dict[str, Any]


def open_device(simulate: bool, ordinal: int, seed: int = 0, sample_interval_ms: float = 10.0) -> OpenedDevice:
    """The device, sampler and boundary probe for CUDA device ``ordinal`` (or the SIMULATED one). The caller
    closes the device (``with device:``)."""
    if simulate:
        if ordinal != 0:  # the simulated box has one GPU, as `run --simulate` without --gpus
            raise ConfigError("gpu", f"{ordinal}: no CUDA device {ordinal} (1 visible)")
        from pcietrace.device.graphs_sim import GraphSimCosts, SimGraphsDevice
        from pcietrace.device.sim import SimDevice, SimParams, SimSampler

        params, costs = SimParams.default(), GraphSimCosts.default()
        sim = SimDevice(params, seed=seed)
        sampler = SimSampler({0: sim})
        gpu = GpuRecord(nvml_index=0, cuda_ordinal=0, name=f"SIMULATED {costs.gpu_name}", bus_id="sim", simulated=True)
        extra = {"driver": "simulated", "sim_source": costs.source, "sim_costs": asdict(costs),
                 "sim_params": asdict(params)}
        return OpenedDevice(gpu, SimGraphsDevice(sim, costs), sampler, sampler.probe(0), extra)
    from pcietrace.collectors import BoundaryProbe, CounterSampler
    from pcietrace.device import backend, gpus
    from pcietrace.device.graphs import CudaGraphsDevice

    if sample_interval_ms < 0:
        raise ConfigError("sample_interval_ms", "must be >= 0")
    (gpu, be), = backend.open_gpus(gpus.select(ordinal))
    try:
        device = CudaGraphsDevice(be)  # owns be from here: the caller closes it
        sampler = CounterSampler([gpu.nvml_index], interval_ns=int(sample_interval_ms * 1e6))
        return OpenedDevice(gpu, device, sampler, BoundaryProbe(gpu.nvml_index),
                            {"driver": backend.driver_version(), "sample_interval_ms": sample_interval_ms})
    except BaseException:  # (Ctrl-C included) the caller never gets the device to close
        with contextlib.suppress(Exception):
            be.close()
        raise
