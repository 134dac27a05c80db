"""SIMULATED device for ``pcietrace run --simulate`` and CPU tests: no GPU, no driver, virtual clock.

Its parameters (bytes per launch, floor, host and GPU cost per launch) come from a real recorded report
(``pcietrace/data/sim_params.json`` was derived from the committed H100 report; regenerate with
``python -m pcietrace.device.sim REPORT_DIR``). Time is virtual: launches advance it by the measured host cost,
the GPU is a queue that runs kernels back to back with the measured gap, and the counter samples are
synthesised afterwards at the real sampler's period, wrapped to 32 bits like NVML's. Everything it
produces is labelled simulated.
"""

from __future__ import annotations

import json
import math
import sys
from collections import deque
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pcietrace.errors import CudaError
from pcietrace.device.base import Launch, Loops, PythonLoops

_OK = (0,)
QUEUE_DEPTH = 1000  # launches the driver queues before cuLaunchKernel blocks (measured ~1020 on H100)


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
        sample_period_ns=float(sm["median_gap_us"]) * 1e3, read_ns=float(sm["median_read_us"]) * 1e3)


class _Event:
    t_ns = 0


class SimDevice:
    """The simulated GPU and host: a virtual clock, a launch queue, and a log of launch traffic."""

    CLOCK_READ_NS = 40  # simulated cost of reading the clock, so busy-wait loops advance time

    def __init__(self, params: SimParams, seed: int = 0) -> None:
        self.p = params
        self.rng = np.random.default_rng(seed)
        self.now = 1_000_000_000
        self.gpu_free = self.now
        self.traffic: list[tuple[int, float, float]] = []  # (t_ns, rx_bytes, tx_bytes) per launch call
        self.pending: deque[int] = deque()  # completion times of queued launch calls
        self._jitter = 1 + 0.02 * self.rng.standard_normal(4096)  # host-cost jitter, cycled (cheap)
        self._n = 0

    def clock(self) -> int:
        self.now += self.CLOCK_READ_NS
        return self.now

    def submit(self, nodes: int, kernel_ns: int, graph: bool) -> tuple[int]:
        p = self.p
        host = p.host_ns_graph if graph else p.host_ns_eager
        self._n += 1
        self.now += int(host * self._jitter[self._n & 4095])
        q = self.pending
        while q and q[0] <= self.now:
            q.popleft()
        if len(q) >= QUEUE_DEPTH:  # the driver blocks until the queue has room
            self.now = q[len(q) - QUEUE_DEPTH]
            while q and q[0] <= self.now:
                q.popleft()
        per_kernel = kernel_ns + (p.gap_ns_graph if graph else p.gap_ns_eager)
        self.gpu_free = max(self.gpu_free, self.now) + int(nodes * per_kernel)
        q.append(self.gpu_free)
        if graph:
            rx = p.graph_fixed_rx_bytes + nodes * p.graph_node_rx_bytes
            tx = p.graph_fixed_tx_bytes + nodes * p.graph_node_tx_bytes
        else:
            rx, tx = p.eager_rx_bytes, p.eager_tx_bytes
        self.traffic.append((self.now, rx, tx))
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

    def __init__(self, device: SimDevice) -> None:
        self.d = device

    def activate(self) -> None:
        pass

    def clock(self) -> int:
        return self.d.clock()

    def thread_time_ns(self) -> int:
        return self.d.now  # the simulated host does nothing but launch: CPU time = wall time

    def launcher(self, kernel_ns: int) -> Launch:
        return lambda: self.d.submit(1, kernel_ns, graph=False)

    blocker = launcher

    def graph_launcher(self, nodes: int, kernel_ns: int) -> Launch:
        return lambda: self.d.submit(nodes, kernel_ns, graph=True)

    def native_loops(self, mode: str, nodes: int, kernel_ns: int) -> Loops:
        # The simulated host pays the modelled cost per call whichever loop runs it.
        launch = self.graph_launcher(nodes, kernel_ns) if mode == "graph" else self.launcher(kernel_ns)
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
    """Stands in for both :class:`pcietrace.collectors.CounterSampler` and its boundary probe: calling
    it marks a boundary read; samples are synthesised from the device model at :meth:`stop`."""

    def __init__(self, device: SimDevice, nvml_index: int = 0) -> None:
        self.d, self.index = device, nvml_index
        self.modes = {nvml_index: {"mode": "fields", "bits": 32}}
        self.failed_reads = {nvml_index: 0}
        self._marks: list[int] = []

    def __call__(self) -> int:
        self._marks.append(self.d.clock())
        return self._marks[-1]

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame()  # boundary reads are synthesised together with the samples in stop()

    def start(self) -> None:
        self._t0 = self.d.now

    def stop(self) -> pd.DataFrame:
        return self.d.counter_samples(self._t0, self.d.now + 1_000_000, self.index, self._marks)


def main(argv: list[str]) -> int:
    """``python -m pcietrace.device.sim REPORT_DIR``: print SimParams derived from a real report as JSON."""
    from pcietrace.analysis import analyze
    from pcietrace.session import Session

    s = Session.load(Path(argv[0]))
    if s.meta.get("simulated"):
        print("refusing to derive simulation parameters from a simulated report", file=sys.stderr)
        return 2
    print(json.dumps(asdict(params_from_results(analyze(s), s.meta, argv[0])), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
