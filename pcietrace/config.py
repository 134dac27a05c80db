"""What each measuring command is asked to do: one frozen, validated config per command (run, latency,
graphs, attach), built by the CLI from its flags and by :mod:`pcietrace.api` from keyword arguments, and
recorded by :mod:`pcietrace.workflow`. A value out of range raises :class:`~pcietrace.errors.ConfigError`
naming the field (the CLI names the flag instead). Importing this module loads no pandas."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pcietrace.device.gpus import GpuSpec, parse
from pcietrace.errors import ConfigError

if TYPE_CHECKING:
    from pcietrace.record.graphs import GraphsPlan
    from pcietrace.record.run import RunPlan

#: Kernel durations (us) a spin kernel can be asked for: 0 (an empty kernel) or MIN_US..MAX_US (a tinier one
#: overflows the launch plan's arithmetic; a longer one makes windows of hours).
MIN_US, MAX_US = 1e-3, 1e6
#: The largest simulated box, and the longest sampling interval (ms) any command takes.
MAX_SIM_GPUS = 64
MAX_INTERVAL_MS = 60_000.0
#: attach's idle interval cap (ms): collectors.sampler.MAX_IDLE_INTERVAL_NS (not imported: no numpy here).
MAX_IDLE_INTERVAL_MS = 20.0
LAUNCH_COUNTERS = ("interpose", "cupti", "none")
MAX_DEPTH = 4096  # attach --max-depth's largest value (pt_abi.h: PT_MAX_DEPTH)
NEEDS_SIMULATE = "simulates a box of N GPUs: it needs {simulate} (real GPUs are chosen with {gpu})"
GROUP_BY = ("op", "numbered", "name")  # pcietrace.analysis.names.GROUP_BY (not imported: no pandas here)


def _number(obj: Any, name: str, low: float, high: float, low_open: bool = False) -> None:
    v = getattr(obj, name)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(name, f"must be a number, not {v!r}")
    if not (math.isfinite(v) and (v > low if low_open else v >= low) and v <= high):
        raise ConfigError(name, f"must be {'>' if low_open else '>='} {low:g} and <= {high:g} (got {v!r})")


def _whole(obj: Any, name: str, low: int, high: int) -> None:
    v = getattr(obj, name)
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise ConfigError(name, f"must be a whole number {low}..{high} (got {v!r})")


def _tuple(obj: Any, name: str, kind: type) -> None:
    """A sequence field (list, tuple, or "1,2,3") stored as a tuple of ``kind``."""
    v = getattr(obj, name)
    if v is None:
        return

    def one(x: Any) -> Any:
        f = float(x)
        if kind is int and f != int(f):
            raise ValueError(x)
        return kind(f)

    try:
        vals = tuple(one(x) for x in ([x for x in v.split(",") if x.strip()] if isinstance(v, str) else v))
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(name, f"takes {'whole ' if kind is int else ''}numbers (got {v!r})") from None
    object.__setattr__(obj, name, vals)


def _durations(obj: Any, name: str) -> None:
    _tuple(obj, name, float)
    v = getattr(obj, name)
    if v is not None and (not v or any(not math.isfinite(d) or (d != 0 and not MIN_US <= d <= MAX_US) for d in v)):
        raise ConfigError(name, f"takes durations of 0 or {MIN_US:g}..{MAX_US:g} us (got {v!r})")


def _check_box(obj: Any) -> None:
    """The GPUs a run or latency suite measures: ``gpu``'s form (whether those GPUs exist is known when they are
    selected), a simulated box's size and seed."""
    parse(obj.gpu)
    _whole(obj, "gpus", 1, MAX_SIM_GPUS)
    if obj.gpus != 1 and not obj.simulate:
        raise ConfigError("gpus", NEEDS_SIMULATE)
    _whole(obj, "seed", 0, 2**63 - 1)


@dataclass(frozen=True)
class Saved:
    """Where a recording is saved. ``output``: a new or empty folder, or a saved run with ``force``; None: a
    new folder under ``runs/``; ``save``: False keeps nothing on disk."""

    output: Path | None = None
    force: bool = False
    save: bool = True

    def _check_saved(self) -> None:
        if self.output is not None:
            object.__setattr__(self, "output", Path(self.output))


@dataclass(frozen=True)
class RunConfig(Saved):
    """``pcietrace run``: spin kernels eager and as CUDA graphs while the PCIe counters are sampled.

    ``gpu``: which GPUs (:data:`GpuSpec`); ``simulate``: a SIMULATED box of ``gpus`` GPUs (seeded ``seed``);
    ``quick``: shorter defaults for ``window_s``, ``durations_us`` and ``graph_ks``; None fields take the
    plan's defaults; ``contexts``: CUDA contexts the GPU time per empty eager kernel is measured in;
    ``latency``: also the latency suite, ``repeats`` times each test; ``us_per_level``: the topology model's
    round trip per PCIe switch level."""

    gpu: GpuSpec = "all"
    simulate: bool = False
    gpus: int = 1
    seed: int = 0
    quick: bool = False
    window_s: float | None = None
    durations_us: tuple[float, ...] | None = None
    graph_ks: tuple[int, ...] | None = None
    contexts: int | None = None
    sample_interval_ms: float = 10.0
    throughput_api: bool = False
    latency: bool = True
    repeats: int = 11
    us_per_level: float = 0.3

    def __post_init__(self) -> None:
        self._check_saved()
        _check_box(self)
        if self.window_s is not None:
            _number(self, "window_s", 0.001, 3600)
        _durations(self, "durations_us")
        _tuple(self, "graph_ks", int)
        if self.graph_ks is not None and (not self.graph_ks or any(not 1 <= k <= 100_000 for k in self.graph_ks)):
            raise ConfigError("graph_ks", f"takes graph sizes of 1..100000 kernels (got {self.graph_ks!r})")
        if self.contexts is not None:
            _whole(self, "contexts", 1, 16)
        _number(self, "sample_interval_ms", 0, MAX_INTERVAL_MS)
        _whole(self, "repeats", 3, 100_000)
        _number(self, "us_per_level", 0, 1e6, low_open=True)

    def plan(self) -> RunPlan:
        """The windows, bursts and loops each GPU runs."""
        from pcietrace.record.run import RunPlan

        kw: dict[str, Any] = {}
        if self.quick:
            kw.update(durations_us=(0, 5, 50), graph_ks=(1, 100), window_s=0.1, e2e_repeats=1)
        for field, value in (("window_s", self.window_s), ("durations_us", self.durations_us),
                             ("graph_ks", self.graph_ks), ("gpu_time_contexts", self.contexts)):
            if value is not None:
                kw[field] = value
        return RunPlan(**kw)


@dataclass(frozen=True)
class LatencyConfig(Saved):
    """``pcietrace latency``: PCIe round trips and launch/completion latencies, ``repeats`` times each test, on
    ``gpu`` (or a SIMULATED box of ``gpus`` GPUs, seeded ``seed``)."""

    gpu: GpuSpec = "all"
    simulate: bool = False
    gpus: int = 1
    seed: int = 0
    repeats: int = 11

    def __post_init__(self) -> None:
        self._check_saved()
        _check_box(self)
        _whole(self, "repeats", 3, 100_000)


@dataclass(frozen=True)
class GraphsConfig(Saved):
    """``pcietrace graphs``: what each way of using CUDA graphs costs when parameters change, on CUDA device
    ``gpu`` (or the SIMULATED one). The workload fields are :class:`pcietrace.record.graphs.GraphsPlan`'s
    (``strategies`` None: every one; ``sync_each_iteration``: its ``sync``), checked when the config is made."""

    gpu: int = 0
    simulate: bool = False
    kernels: tuple[int, ...] = (500, 2500)
    param_sets: int = 5
    order: str = "cycle"
    strategies: tuple[str, ...] | None = None
    kernel_us: tuple[float, ...] = (2.0, 8.0)
    iterations: int = 40
    rounds: int = 3
    sync_each_iteration: bool = False
    sample_interval_ms: float = 10.0
    seed: int = 0

    def __post_init__(self) -> None:
        self._check_saved()
        if isinstance(self.gpu, bool) or not isinstance(self.gpu, int):
            raise ConfigError("gpu", f"takes one CUDA device number (got {self.gpu!r})")
        _tuple(self, "kernels", int)
        _tuple(self, "kernel_us", float)
        if isinstance(self.strategies, str):
            object.__setattr__(self, "strategies", tuple(s.strip() for s in self.strategies.split(",") if s.strip()))
        _number(self, "sample_interval_ms", 0, MAX_INTERVAL_MS)
        _whole(self, "seed", 0, 2**63 - 1)
        self.plan()  # the workload's own checks, by these fields' names

    def plan(self) -> GraphsPlan:
        from pcietrace.record.graphs import GraphsPlan

        kw: dict[str, Any] = {} if self.strategies is None else {"strategies": tuple(self.strategies)}
        return GraphsPlan(kernels=tuple(self.kernels), param_sets=self.param_sets, order=self.order,
                          kernel_us=tuple(self.kernel_us), iterations=self.iterations, rounds=self.rounds,
                          sync=self.sync_each_iteration, seed=self.seed, **kw)


@dataclass(frozen=True)
class AttachConfig(Saved):
    """``pcietrace attach``: run ``command`` while the counters of ``gpu`` are sampled.

    ``sample_interval_ms`` while an NVTX range is open and the link is busy (a copy), ``quiet_sample_interval_ms``
    while one is open and it is not (launches), ``idle_sample_interval_ms`` while none is (0: always the first);
    ``slow_domains``: comma-separated NVTX domains whose ranges do not hold the fast rate;
    ``sampler_duty``: the largest share of time a sampler spends in reads; ``idle_s``: idle time sampled
    before and after the program; ``calibrate``: measure per-launch costs (from ``baseline``, a saved run,
    where given); ``launch_counter``: interpose, cupti or none; ``exact_edges``: the injection library reads
    the counters at every range edge; ``max_depth``: push ranges opened this many or more deep in their thread are not
    recorded (their launches and bytes stay in the ranges around them; None: all are); ``gpu_time``: CUPTI
    kernel activity too; ``label``: this recording's
    name among a job's (``%l`` in ``output``, which also takes ``%h``, ``%q{VAR}``, ``%p``); ``group_by``:
    how range names are grouped."""

    command: tuple[str, ...] = ()
    gpu: GpuSpec = "all"
    sample_interval_ms: float = 0.5
    idle_sample_interval_ms: float = 5.0
    quiet_sample_interval_ms: float = 2.0
    slow_domains: str = "NCCL"
    sampler_duty: float = 1.0
    idle_s: float = 0.5
    calibrate: bool = True
    baseline: Path | None = None
    launch_counter: str = "interpose"
    exact_edges: bool = False
    max_depth: int | None = None
    gpu_time: bool = False
    label: str | None = None
    group_by: str = "op"

    def __post_init__(self) -> None:
        self._check_saved()
        if isinstance(self.command, str) or not all(isinstance(a, str) for a in self.command):
            raise ConfigError("command", f"takes the program and its arguments as a list of strings "
                                         f"(got {self.command!r})")
        object.__setattr__(self, "command", tuple(self.command))
        if not self.command:
            raise ConfigError("command", "is empty: attach needs a program to run")
        parse(self.gpu)
        _number(self, "sample_interval_ms", 0, MAX_INTERVAL_MS)
        _number(self, "idle_sample_interval_ms", 0, MAX_IDLE_INTERVAL_MS)
        _number(self, "quiet_sample_interval_ms", 0, MAX_IDLE_INTERVAL_MS)
        _number(self, "sampler_duty", 0, 1, low_open=True)
        _number(self, "idle_s", 0, 3600, low_open=True)
        if self.launch_counter not in LAUNCH_COUNTERS:
            raise ConfigError("launch_counter", f"must be one of {', '.join(LAUNCH_COUNTERS)} "
                                                f"(got {self.launch_counter!r})")
        if self.max_depth is not None and (isinstance(self.max_depth, bool) or not isinstance(self.max_depth, int)
                                           or not 1 <= self.max_depth <= MAX_DEPTH):
            raise ConfigError("max_depth", f"must be a whole number from 1 to {MAX_DEPTH}, or None for every range "
                                           f"(got {self.max_depth!r})")
        if self.group_by not in GROUP_BY:
            raise ConfigError("group_by", f"must be one of {', '.join(GROUP_BY)} (got {self.group_by!r})")
        if self.baseline is not None:
            object.__setattr__(self, "baseline", Path(self.baseline))
