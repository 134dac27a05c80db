"""SIMULATED device for ``pcietrace graphs --simulate`` and CPU tests: the five strategies as a cost model.

Per-operation costs come from ``pcietrace/data/graphs_sim.json`` (its ``source`` says which figures are
published and which are assumed; a real ``pcietrace graphs`` run replaces them). It runs on the virtual clock
and traffic log of :class:`pcietrace.device.sim.SimDevice`, so the counter windows, floor and bytes per
iteration go through the same analysis as on hardware. The strategies' bookkeeping (what is captured,
instantiated, updated, cached) follows ``pt_graphs.c`` step by step; only the times are modelled.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from importlib import resources

import numpy as np

from pcietrace.device.graphs import CACHE_CAP, ITERATION_DTYPE
from pcietrace.device.sim import QUEUE_DEPTH, SimDevice


@dataclass(frozen=True)
class GraphSimCosts:
    """Model costs (ns, bytes); see the JSON's ``source`` for where each comes from."""

    source: str
    gpu_name: str
    host_ns_eager_launch: float
    gpu_gap_ns_eager: float
    gpu_gap_ns_graph: float
    host_ns_graph_launch: float
    host_ns_graph_launch_per_node: float
    host_ns_capture_per_kernel: float
    host_ns_instantiate_fixed: float
    host_ns_instantiate_per_node: float
    host_ns_update_per_node: float
    host_ns_node_set_params: float
    host_ns_sync: float
    instantiate_rx_bytes_per_node: float
    update_rx_bytes_per_node: float
    node_set_rx_bytes: float

    @classmethod
    def default(cls) -> "GraphSimCosts":
        return cls(**json.loads(resources.files("pcietrace").joinpath("data/graphs_sim.json").read_text()))


class SimRunner:
    """One strategy on the simulated device; same bookkeeping as pt_graphs.c."""

    def __init__(self, dev: "SimGraphsDevice", strategy: str, durations_ns: np.ndarray, sync: bool) -> None:
        self.dev, self.strategy, self.sync = dev, strategy, sync
        self.d = np.asarray(durations_ns, dtype=np.int64)
        self.cache: dict[int, bool] = {}
        self.fifo: deque[int] = deque()
        self.exec = False
        self.applied = 0
        self.inflight: deque[int] = deque()  # GPU end times of submitted iterations (pipelined mode)

    def _spend(self, ns: float, rx: float = 0.0) -> None:
        sd = self.dev.sd
        sd._n += 1
        sd.now += int(ns * sd._jitter[sd._n & 4095])
        if rx:
            sd.traffic.append((sd.now, rx, 0.0))

    def _prep(self, p: int, it: np.void) -> None:
        c, n, s = self.dev.c, self.d.shape[1], self.strategy
        capture = c.host_ns_capture_per_kernel * n
        instantiate = c.host_ns_instantiate_fixed + c.host_ns_instantiate_per_node * n
        if s == "recapture":
            self._spend(capture)
            self._spend(instantiate, c.instantiate_rx_bytes_per_node * n)
            it["captures"] = it["instantiations"] = 1
        elif s == "exec_update":
            self._spend(capture)
            it["captures"] = 1
            if self.exec:  # same topology every time: the update always succeeds
                self._spend(c.host_ns_update_per_node * n, c.update_rx_bytes_per_node * n)
                it["updates"] = 1
            else:
                self._spend(instantiate, c.instantiate_rx_bytes_per_node * n)
                self.exec = True
                it["instantiations"] = 1
        elif s == "node_update":
            if not self.exec:
                self._spend(instantiate, c.instantiate_rx_bytes_per_node * n)
                self.exec = True
                it["instantiations"] = 1
            changed = int((self.d[self.applied] != self.d[p]).sum())
            self._spend(c.host_ns_node_set_params * changed, c.node_set_rx_bytes * changed)
            it["node_updates"] = changed
            self.applied = p
        elif s == "recognize":
            if p in self.cache:
                it["cache_hits"] = 1
            else:
                self._spend(capture)
                self._spend(instantiate, c.instantiate_rx_bytes_per_node * n)
                it["captures"] = it["instantiations"] = 1
                self.cache[p] = True
                self.fifo.append(p)
                if len(self.fifo) > min(CACHE_CAP, self.d.shape[0]):
                    del self.cache[self.fifo.popleft()]
                    it["evictions"] = 1

    def _submit(self, p: int, it: np.void) -> int:
        """Launch the iteration's work; returns when the GPU finishes it (ns)."""
        c, sd, k = self.dev.c, self.dev.sd, self.d[p]
        gpu_free = self.inflight[-1] if self.inflight else 0
        if self.strategy == "eager":
            h = c.host_ns_eager_launch
            t0 = sd.now
            # Kernel j starts once launched and once kernel j-1 is done: the GPU finishes at the latest of
            # (launch time of j + the kernels from j on) over j, and of (GPU free + all of them).
            suffix = np.cumsum((k + c.gpu_gap_ns_eager)[::-1])[::-1]
            launch_t = t0 + h * np.arange(1, k.size + 1)
            end = int(max(gpu_free + suffix[0], float(np.max(launch_t + suffix))))
            step = max(1, k.size // 64)  # traffic logged in chunks of launches (cheap), at their launch times
            for j in range(0, k.size, step):
                m = min(step, k.size - j)
                sd.traffic.append((int(launch_t[j + m - 1]), self.dev.eager_rx * m, self.dev.eager_tx * m))
            self._spend(h * k.size)
            it["eager_launches"] = k.size
        else:
            self._spend(c.host_ns_graph_launch + c.host_ns_graph_launch_per_node * k.size)
            p_ = sd.p
            sd.traffic.append((sd.now, p_.graph_fixed_rx_bytes + k.size * p_.graph_node_rx_bytes,
                               p_.graph_fixed_tx_bytes + k.size * p_.graph_node_tx_bytes))
            end = int(max(gpu_free, sd.now) + (k + c.gpu_gap_ns_graph).sum())
            it["graph_launches"] = 1
        return end

    def run(self, order: np.ndarray) -> np.ndarray:
        sd = self.dev.sd
        out = np.zeros(len(order), ITERATION_DTYPE)
        depth = max(1, QUEUE_DEPTH // (self.d.shape[1] if self.strategy == "eager" else 1))
        for i, p in enumerate(np.asarray(order, dtype=np.int64)):
            it = out[i]
            it["param_set"] = p
            it["t_start_ns"] = t0 = sd.now
            self._prep(int(p), it)
            it["prep_ns"] = 0 if it["cache_hits"] or self.strategy == "eager" else sd.now - t0
            end = self._submit(int(p), it)
            it["submit_ns"] = it["cpu_ns"] = sd.now - t0
            self.inflight.append(end)
            if self.sync:
                sd.now = max(sd.now, end) + int(self.dev.c.host_ns_sync)
                it["wall_ns"] = sd.now - t0
            elif len(self.inflight) > depth:  # the driver's queue is full: the host waits
                sd.now = max(sd.now, self.inflight[-depth - 1])
            while len(self.inflight) > depth + 1:
                self.inflight.popleft()
            if not self.sync and i:
                out[i - 1]["wall_ns"] = t0 - out[i - 1]["t_start_ns"]
        if not self.sync and len(out):
            sd.now = max(sd.now, self.inflight[-1]) + int(self.dev.c.host_ns_sync)
            out[-1]["wall_ns"] = sd.now - out[-1]["t_start_ns"]
        sd.gpu_free = max(sd.gpu_free, sd.now)
        return out

    def close(self) -> None:
        self.cache.clear()


class SimGraphsDevice:
    """:class:`pcietrace.device.graphs.GraphsDevice` on a :class:`SimDevice` (virtual clock, traffic log)."""

    simulated = True
    timing = "SIMULATED (cost model, virtual clock)"

    def __init__(self, sim_device: SimDevice, costs: GraphSimCosts | None = None) -> None:
        self.sd = sim_device
        self.c = costs or GraphSimCosts.default()
        self.eager_rx, self.eager_tx = sim_device.p.eager_rx_bytes, sim_device.p.eager_tx_bytes

    def clock(self) -> int:
        return self.sd.clock()

    def idle(self, ns: int) -> None:
        self.sd.now += ns

    def runner(self, strategy: str, durations_ns: np.ndarray, sync: bool) -> SimRunner:
        return SimRunner(self, strategy, durations_ns, sync)

    def close(self) -> None:
        """Nothing to release (the simulated device holds no GPU)."""
