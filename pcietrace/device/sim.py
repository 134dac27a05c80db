"""SIMULATED device for ``pcietrace run --simulate`` and CPU tests: no GPU, no driver, virtual clock.

Its parameters (bytes per launch, floor, host and GPU cost per launch) come from a real recorded report
(``pcietrace/data/sim_params.json`` was derived from the committed H100 report; regenerate with
``python3 bench/sim_params.py REPORT_DIR``). Time is virtual: launches advance it by the measured host cost,
the GPU is a queue that runs kernels back to back with the measured gap, and the counter samples are
synthesised afterwards at the real sampler's period, wrapped to 32 bits like NVML's. Everything it
produces is labelled simulated.
"""

from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np
import pandas as pd

from pcietrace.errors import CudaError
from pcietrace.device.base import Launch, Loops, PythonLoops
from pcietrace.device.gpus import GpuRecord

_OK = (0,)
QUEUE_DEPTH = 1000  # launches the driver queues before cuLaunchKernel blocks (measured ~1020 on H100)
#: Relative standard deviation of the eager launch gap between CUDA contexts (H200: 1.29-1.45 us per empty
#: eager kernel over 18 contexts' first streams, SD ~3 %; docs/lab/reports/eager-gpu-time-20261122)
CONTEXT_SD = 0.03


@dataclass(frozen=True)
class SimParams:
    """Model parameters; bytes are per launch call unless named per node, times in ns."""

    source: str
    gpu_name: str
    floor_rx_Bps: float
    floor_tx_Bps: float
    eager_rx_bytes: float
    eager_tx_bytes: float
    graph_fixed_rx_bytes: float
    graph_fixed_tx_bytes: float
    graph_node_rx_bytes: float
    graph_node_tx_bytes: float
    host_ns_eager: float
    host_ns_graph: float
    gap_ns_eager: float
    gap_ns_graph: float
    sample_period_ns: float
    read_ns: float
    pcie_gen: int = 5
    pcie_width: int = 16
    link_speed: str = "32.0 GT/s PCIe"
    pci_device: str = "0x2330"
    #: per latency test: median and interquartile spread (% of the median) of the real run
    latency_median_us: dict[str, float] = field(default_factory=dict)
    latency_spread_pct: dict[str, float] = field(default_factory=dict)
    #: host cost of an eager launch issued from Python over the same launch from C (a measured ratio; 1: none)
    host_ratio_python: float = 1.0
    host_ratio_python_source: str = ""

    @classmethod
    def default(cls) -> "SimParams":
        return cls(**json.loads(resources.files("pcietrace").joinpath("data/sim_params.json").read_text()))


def params_from_results(results: dict[str, pd.DataFrame], meta: dict[str, Any], source: str) -> SimParams:
    """Derive simulation parameters from a real run's analysis tables."""
    pl, pn, fl = results["per_launch"], results["per_node"], results["floor"]
    eager = pl[pl["mode"] == "eager"].set_index("direction")["bytes_per_call"]
    node = pn.set_index("direction")
    cc = results["cpu_cost"].set_index("mode")
    gt = results["gpu_time"]
    g0 = gt.loc[gt["kernel_us"].idxmin()]
    sm = results["sampling"].iloc[0]
    g = meta["gpus"][0]
    hop = next((h for t in meta.get("topology", {}).get("gpus", [])[:1] for h in t.get("hops", []) if h.get("role") == "endpoint"), {})
    lat = results.get("latency", pd.DataFrame())
    lat = lat[(lat["nvml_index"] == g["nvml_index"]) & (lat["peer"] < 0)] if len(lat) else lat
    return SimParams(
        source=source, gpu_name=meta["gpus"][0]["name"],
        floor_rx_Bps=float(fl["rx_Bps"].iloc[0]), floor_tx_Bps=float(fl["tx_Bps"].iloc[0]),
        eager_rx_bytes=float(eager["h2d"]), eager_tx_bytes=float(eager["d2h"]),
        graph_fixed_rx_bytes=max(0.0, float(node.loc["h2d", "fixed_bytes"])),
        graph_fixed_tx_bytes=max(0.0, float(node.loc["d2h", "fixed_bytes"])),
        graph_node_rx_bytes=max(0.0, float(node.loc["h2d", "per_node_bytes"])),
        graph_node_tx_bytes=max(0.0, float(node.loc["d2h", "per_node_bytes"])),
        host_ns_eager=float(cc.loc["eager", "host_us_per_call"]) * 1e3,
        host_ns_graph=float(cc.loc["graph", "host_us_per_call"]) * 1e3,
        gap_ns_eager=max(0.0, float(g0["eager_gap_us"])) * 1e3, gap_ns_graph=max(0.0, float(g0["graph_gap_us"])) * 1e3,
        sample_period_ns=float(sm["median_gap_us"]) * 1e3, read_ns=float(sm["median_read_us"]) * 1e3,
        pcie_gen=int(g.get("pcie_gen_max") or 5), pcie_width=int(g.get("pcie_width_max") or 16),
        link_speed=str(hop.get("link_speed", "32.0 GT/s PCIe")), pci_device=str(hop.get("device", "0x2330")),
        latency_median_us={r.test: float(r.median_us) for r in lat.itertuples()},
        latency_spread_pct={r.test: float(r.spread_pct) for r in lat.itertuples()})


class _Event:
    t_ns = 0


class SimClock:
    """The simulated host's clock (ns), shared by every simulated GPU of one box."""

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self.now = start_ns


class SimDevice:
    """The simulated GPU and host: a virtual clock, a launch queue, and a log of launch traffic."""

    CLOCK_READ_NS = 40  # simulated cost of reading the clock, so busy-wait loops advance time

    def __init__(self, params: SimParams, seed: int = 0, host: SimClock | None = None) -> None:
        self.p = params
        self.rng = np.random.default_rng(seed)
        self.host = host or SimClock()
        self.gpu_free = self.now
        self.traffic: list[tuple[int, float, float]] = []  # (t_ns, rx_bytes, tx_bytes) per launch call
        self.pending: deque[int] = deque()  # completion times of queued launch calls
        self._jitter = (1 + 0.02 * self.rng.standard_normal(4096)).tolist()  # host-cost jitter, cycled (cheap)
        self._n = 0

    @property
    def now(self) -> int:
        return self.host.now

    @now.setter
    def now(self, t_ns: int) -> None:
        self.host.now = t_ns

    def clock(self) -> int:
        self.host.now += self.CLOCK_READ_NS
        return self.host.now

    def submit(self, nodes: int, kernel_ns: int, graph: bool, gap_scale: float = 1.0,
               host_scale: float = 1.0) -> tuple[int]:
        """One launch call of ``nodes`` kernels of ``kernel_ns``; ``gap_scale``: the calling context's
        factor on the launch gap; ``host_scale``: the launching language's factor on the host cost."""
        p = self.p
        host = (p.host_ns_graph if graph else p.host_ns_eager) * host_scale
        self._n += 1
        now = self.host.now + int(host * self._jitter[self._n & 4095])
        q = self.pending
        while q and q[0] <= now:
            q.popleft()
        if len(q) >= QUEUE_DEPTH:  # the driver blocks until the queue has room
            now = q[len(q) - QUEUE_DEPTH]
            while q and q[0] <= now:
                q.popleft()
        self.host.now = now
        per_kernel = kernel_ns + (p.gap_ns_graph if graph else p.gap_ns_eager) * gap_scale
        self.gpu_free = max(self.gpu_free, now) + int(nodes * per_kernel)
        q.append(self.gpu_free)
        if graph:
            rx = p.graph_fixed_rx_bytes + nodes * p.graph_node_rx_bytes
            tx = p.graph_fixed_tx_bytes + nodes * p.graph_node_tx_bytes
        else:
            rx, tx = p.eager_rx_bytes, p.eager_tx_bytes
        self.traffic.append((now, rx, tx))
        return _OK

    def counter_samples(self, t0: int, t1: int, nvml_index: int = 0, extra_t: list[int] | None = None) -> pd.DataFrame:
        """Samples at the real sampler's period over [t0, t1] plus at ``extra_t`` (boundary reads), as
        raw 32-bit counters (wrapping)."""
        p = self.p
        t = np.unique(np.concatenate([np.arange(t0, t1, p.sample_period_ns), extra_t or []]).astype(np.int64))
        step_ns = np.diff(t, prepend=t[0])
        tr = np.array(self.traffic, dtype=float).reshape(-1, 3)
        cols = {}
        for name, floor_bps, col in (("rx_raw", p.floor_rx_Bps, 1), ("tx_raw", p.floor_tx_Bps, 2)):
            floor_cum = np.cumsum(floor_bps * step_ns / 1e9 * (1 + 0.05 * self.rng.standard_normal(t.size)))
            launch_cum = np.concatenate([[0.0], np.cumsum(tr[:, col])])[np.searchsorted(tr[:, 0], t, "right")]
            offset = int(self.rng.integers(0, 2**32))  # start anywhere, so wraps happen as on hardware
            cols[name] = ((np.round(floor_cum + launch_cum).astype(np.int64) + offset) % 2**32).astype(np.uint64)
        return pd.DataFrame({"nvml_index": nvml_index, "t_ns": t, "read_ns": np.int64(p.read_ns),
                             "tx_raw": cols["tx_raw"], "rx_raw": cols["rx_raw"]})


class SimBackend:
    """:class:`pcietrace.record.generate.Backend` over a :class:`SimDevice`."""

    simulated = True

    def __init__(self, device: SimDevice, eager_gap_scale: float = 1.0) -> None:
        """``eager_gap_scale``: this context's factor on the eager launch gap (:meth:`in_new_context`)."""
        self.d = device
        self.eager_gap_scale = eager_gap_scale

    def activate(self) -> None:
        pass

    def in_new_context(self) -> "SimBackend":
        """The same simulated GPU in a new context, which draws its own eager launch gap: H200 contexts
        spread over 1.29-1.45 us per empty eager kernel, about ±CONTEXT_SD of the gap
        (docs/lab/reports/eager-gpu-time-20261122)."""
        return SimBackend(self.d, float(1 + CONTEXT_SD * self.d.rng.standard_normal()))

    def close(self) -> None:
        pass

    def clock(self) -> int:
        return self.d.clock()

    def wait_until(self, t_ns: int) -> None:
        """Idle or paced loops: jump the virtual clock instead of spinning on it."""
        self.d.now = max(self.d.now, int(t_ns))

    def thread_time_ns(self) -> int:
        return self.d.now  # the simulated host does nothing but launch: CPU time = wall time

    def launcher(self, kernel_ns: int) -> Launch:
        """A launch called from Python (the generator's Python path): it costs the host the measured Python/C
        ratio more than the native loops' (:attr:`SimParams.host_ratio_python`)."""
        return lambda: self.d.submit(1, kernel_ns, graph=False, gap_scale=self.eager_gap_scale,
                                     host_scale=self.d.p.host_ratio_python)

    def _native_launcher(self, kernel_ns: int) -> Launch:
        return lambda: self.d.submit(1, kernel_ns, graph=False, gap_scale=self.eager_gap_scale)

    def blocker(self, kernel_ns: int) -> Launch:
        return lambda: self.d.submit(1, kernel_ns, graph=False)

    def graph_launcher(self, nodes: int, kernel_ns: int) -> Launch:
        return lambda: self.d.submit(nodes, kernel_ns, graph=True)

    def native_loops(self, mode: str, nodes: int, kernel_ns: int) -> Loops:
        # The simulated host pays the modelled cost per call whichever loop runs it.
        launch = self.graph_launcher(nodes, kernel_ns) if mode == "graph" else self._native_launcher(kernel_ns)
        return PythonLoops(self, launch, path="native")

    def synchronize(self) -> None:
        self.d.now = max(self.d.now, self.d.gpu_free)

    def event(self) -> Any:
        return _Event()

    def record(self, ev: Any) -> None:
        ev.t_ns = max(self.d.gpu_free, self.d.now)

    def done(self, ev: Any) -> bool:
        return ev.t_ns <= self.d.now

    def elapsed_ms(self, a: Any, b: Any) -> float:
        self.d.now = max(self.d.now, b.t_ns)
        return (b.t_ns - a.t_ns) / 1e6

    def measure_kernel_ns(self, kernel_ns: int, repeats: int) -> list[int]:
        return [int(math.ceil(kernel_ns / 32) * 32)] * repeats  # the H100 global timer ticks every 32 ns

    def raise_launch_error(self, result: tuple[Any, ...]) -> None:
        if result[0]:
            raise CudaError("launch", int(result[0]), "SIMULATED_ERROR")


class SimSampler:
    """Stands in for :class:`pcietrace.collectors.CounterSampler` over the simulated GPUs (``devices``: NVML
    index -> device) and for their boundary probes (:meth:`probe`); samples are synthesised at :meth:`stop`."""

    def __init__(self, devices: dict[int, SimDevice]) -> None:
        self.devices = devices
        self.modes = {i: {"mode": "fields", "bits": 32} for i in devices}
        self.failed_reads = {i: 0 for i in devices}
        self._marks: dict[int, list[int]] = {i: [] for i in devices}

    def probe(self, nvml_index: int) -> "_SimProbe":
        return _SimProbe(self.devices[nvml_index], self._marks[nvml_index])

    def start(self) -> None:
        self._t0 = min(d.now for d in self.devices.values())

    def stop(self) -> pd.DataFrame:
        t1 = max(d.now for d in self.devices.values()) + 1_000_000
        return pd.concat([d.counter_samples(self._t0, t1, i, self._marks[i]) for i, d in self.devices.items()],
                         ignore_index=True)


class _SimProbe:
    """A boundary read of one simulated GPU's counters: marks the time; the value is synthesised later."""

    def __init__(self, device: SimDevice, marks: list[int]) -> None:
        self.d, self._marks = device, marks

    def __call__(self) -> int:
        self._marks.append(self.d.clock())
        return self._marks[-1]

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame()  # boundary reads are synthesised together with the samples in stop()


def gpu_records(params: SimParams, n: int) -> list[GpuRecord]:
    """The GPUs of an ``n``-GPU simulated box (names say SIMULATED; link fields from the modelled GPU)."""
    return [GpuRecord(nvml_index=i, cuda_ordinal=i, name=f"SIMULATED {params.gpu_name}", uuid=f"GPU-SIMULATED-{i}",
                      bus_id=f"sim:{i:02x}:00.0", pcie_gen_current=params.pcie_gen, pcie_gen_max=params.pcie_gen,
                      pcie_width_current=params.pcie_width, pcie_width_max=params.pcie_width, simulated=True)
            for i in range(n)]


def topology(params: SimParams, gpus: list[GpuRecord]) -> dict[str, Any]:
    """A topology record (as :func:`pcietrace.collectors.topology.collect` returns) for the simulated box: every
    GPU on the root complex (0 switch levels, like the modelled VM), PCIe host bridge between GPUs, no NVLink."""
    n = len(gpus)
    hop = {"role": "endpoint", "vendor": "0x10de", "device": params.pci_device, "pci_class": "0x030200",
           "link_speed": params.link_speed, "link_width": params.pcie_width,
           "max_link_speed": params.link_speed, "max_link_width": params.pcie_width}
    return {"source": "SIMULATED", "sysfs_root": None,
            "gpus": [{"bdf": g.bus_id, "host_bridge": "sim0000:00", "numa_node": 0, "local_cpulist": "0-15",
                      "hops": [{"bdf": g.bus_id, **hop}], "switch_levels": 0, "nvml_index": g.nvml_index,
                      "name": g.name} for g in gpus],
            "labels": [f"GPU{g.nvml_index}" for g in gpus],
            "matrix": [["X" if i == j else "PHB" for j in range(n)] for i in range(n)],
            "nvlinks": [[0] * n for _ in range(n)], "notes": ["SIMULATED box: GPUs on one host bridge, no NVLink"]}


def latency(params: SimParams, gpus: list[GpuRecord], repeats: int, seed: int = 0) -> pd.DataFrame:
    """Latency rows (:data:`pcietrace.record.latency.LATENCY_COLUMNS`) drawn around the modelled run's medians
    with its interquartile spread (normal: IQR = 1.35 sigma)."""
    rng = np.random.default_rng(seed)
    rows = []
    for g in gpus:
        for test, med in params.latency_median_us.items():
            sigma = med * params.latency_spread_pct.get(test, 1.0) / 100 / 1.35
            for rep, v in enumerate(med + sigma * rng.standard_normal(repeats)):
                rows.append({"nvml_index": g.nvml_index, "test": test, "peer": -1, "repeat": rep, "value_us": float(v)})
    return pd.DataFrame(rows, columns=["nvml_index", "test", "peer", "repeat", "value_us"])

