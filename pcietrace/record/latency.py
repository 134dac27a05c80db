"""Latency suite: PCIe round trips and launch/completion latencies, measured on a real GPU.

Each test is repeated; every repeat gives one value in microseconds. Rows (one per repeat):
``nvml_index``, ``test``, ``peer`` (NVML index of the peer GPU, -1 if none), ``repeat``, ``value_us``.

Tests:
- ``host_read_rtt``: one GPU thread chasing dependent pointers through pinned host-mapped memory
  (64 KiB, 128 B stride, random cycle, uncached loads): one PCIe read round trip per step. The
  buffer spans only 16 pages, so address translation (IOMMU) stays warm.
- ``host_read_rtt_2mib``: the same over 2 MiB (nvbandwidth's buffer size; 512 pages).
- ``device_read_l2`` / ``device_read_hbm``: the same chase in device memory, 2 MiB (L2-resident) and
  256 MiB (beyond L2; each repeat continues along the chain, so it meets lines not touched since).
- ``peer_read_rtt``: the chase in a peer GPU's memory (every pair with peer access).
- ``copy_h2d_4B`` / ``copy_d2h_4B``: a 4-byte cuMemcpy*Async plus stream synchronize, host-timed.
- ``launch_sync_eager`` / ``launch_sync_graph1``: launch an empty kernel (or a graph of one) and
  synchronize, host-timed.
- ``launch_to_first_instruction``: host clock before cuLaunchKernel until the host sees the kernel's
  first store to host-mapped memory (includes that store's one-way trip).
- ``kernel_end_to_host``: from the host seeing the kernel's last store until cuStreamQuery reports
  the stream done.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any, Callable

import numpy as np
import pandas as pd

from pcietrace.device.backend import CudaBackend
from pcietrace.device.kernels import LATENCY_SOURCE

LATENCY_COLUMNS = ["nvml_index", "test", "peer", "repeat", "value_us"]
STRIDE = 128


def _chain(base: int, nbytes: int, seed: int = 0) -> np.ndarray:
    """uint64 words for a buffer at device address ``base``: a random cycle through every ``STRIDE``-th
    word, each holding the address of the next (random order defeats prefetching)."""
    slots = nbytes // STRIDE
    order = np.random.default_rng(seed).permutation(slots)
    words = np.zeros(nbytes // 8, np.uint64)
    nxt = np.roll(order, -1)
    words[order * (STRIDE // 8)] = base + nxt.astype(np.uint64) * STRIDE
    return words


class LatencyProbe:
    """The latency kernels on one GPU (uses the generator's backend for the spin kernel and graphs)."""

    def __init__(self, backend: CudaBackend) -> None:
        self.be = backend
        gpu = backend.gpu
        gpu.make_current()
        mod = gpu.compile(LATENCY_SOURCE, "pt_latency")
        self.chase = gpu.kernel(mod, "pt_chase", 3)
        self.flag = gpu.kernel(mod, "pt_flag", 3)
        self.out = gpu.alloc_device(16)
        self._bufs: dict[Any, Any] = {}
        self._pos: dict[int, int] = {}  # chain start -> where the last chase along it stopped

    def _device_chain(self, owner: Any, nbytes: int) -> int:
        """A pointer chain in ``owner``'s device memory (cached per owner and size)."""
        key = (id(owner), nbytes)
        if key not in self._bufs:
            owner.make_current()
            base = owner.alloc_device(nbytes)
            words = _chain(base, nbytes)
            owner.copy_h2d_sync(base, words.ctypes.data, nbytes)
            self.be.gpu.make_current()
            self._bufs[key] = base
        return self._bufs[key]

    def _host_chain(self, nbytes: int) -> int:
        key = ("host", nbytes)
        if key not in self._bufs:
            host = self.be.gpu.alloc_pinned(nbytes, mapped=True)
            dev = self.be.gpu.device_pointer(host)
            words = _chain(dev, nbytes)
            ctypes.memmove(host, words.ctypes.data, nbytes)
            self._bufs[key] = dev
        return self._bufs[key]

    def chase_us(self, start: int, steps: int) -> float:
        """Microseconds per dependent load along the chain that starts at device address ``start``.

        Each call picks up where the previous call on the same chain stopped, so repeats walk lines
        not touched since the chain was built (a chain bigger than L2 really measures memory)."""
        gpu = self.be.gpu
        gpu.make_current()
        pos = self._pos.get(start, start)
        self.chase.args[:] = (pos, steps, self.out)
        gpu.check(gpu.launcher(self.chase)(), "pt_chase")
        ns, self._pos[start] = (int(x) for x in gpu.read_u64(self.out, 2))
        return ns / steps / 1e3

    def host_timed(self, fn: Callable[[], None]) -> float:
        t0 = time.perf_counter_ns()
        fn()
        return (time.perf_counter_ns() - t0) / 1e3

    def flag_times(self, spin_us: float = 20.0) -> tuple[float, float]:
        """(launch -> first instruction seen, last instruction seen -> stream reported done), in us."""
        gpu = self.be.gpu
        if "flag" not in self._bufs:
            host = gpu.alloc_pinned(64, mapped=True)
            self._bufs["flag"] = (host, gpu.device_pointer(host))
            self._flag_value = 0
        host, dev = self._bufs["flag"]
        flags = (ctypes.c_uint32 * 2).from_address(host)
        self._flag_value += 1
        v = self._flag_value
        self.flag.args[:] = (dev, v, int(spin_us * 1000))
        launch = gpu.launcher(self.flag)
        t0 = time.perf_counter_ns()
        gpu.check(launch(), "pt_flag")
        while flags[0] != v:
            if time.perf_counter_ns() - t0 > 2e9:  # never hang on a kernel that did not run
                gpu.synchronize()
                raise TimeoutError("pt_flag: the kernel's first store never reached host memory")
        t1 = time.perf_counter_ns()
        while flags[1] != v:
            if time.perf_counter_ns() - t0 > 2e9:
                raise TimeoutError("pt_flag: the kernel's last store never reached host memory")
        t2 = time.perf_counter_ns()
        while not gpu.query():
            pass
        t3 = time.perf_counter_ns()
        return (t1 - t0) / 1e3, (t3 - t2) / 1e3


def measure(probes: dict[int, LatencyProbe], repeats: int = 11, steps: int = 2000,
            progress: Callable[[str], None] = lambda _: None) -> pd.DataFrame:
    """Run every test on every GPU (and every peer pair); one row per repeat (:data:`LATENCY_COLUMNS`)."""
    rows: list[tuple[int, str, int, int, float]] = []

    def add(idx: int, test: str, peer: int, values: list[float]) -> None:
        rows.extend((idx, test, peer, r, v) for r, v in enumerate(values))

    for idx, pr in probes.items():
        gpu, be = pr.be.gpu, pr.be
        gpu.make_current()
        progress(f"GPU {gpu.ordinal}: PCIe read round trip")
        for test, nbytes in (("host_read_rtt", 64 << 10), ("host_read_rtt_2mib", 2 << 20)):
            host = pr._host_chain(nbytes)
            pr.chase_us(host, 100)  # warm
            add(idx, test, -1, [pr.chase_us(host, steps) for _ in range(repeats)])
        progress(f"GPU {gpu.ordinal}: device memory chase")
        for test, nbytes in (("device_read_l2", 2 << 20), ("device_read_hbm", 256 << 20)):
            d = pr._device_chain(gpu, nbytes)
            pr.chase_us(d, steps * 20)  # warm-up as long as a repeat: every page's translation is cached
            add(idx, test, -1, [pr.chase_us(d, steps * 20) for _ in range(repeats)])
        progress(f"GPU {gpu.ordinal}: small copies and launch round trips")
        src = gpu.alloc_pinned(64)
        dst = gpu.alloc_device(64)
        n = repeats * 20  # host-timed tests are short: more repeats for the same confidence

        def copy(fn: Callable[..., None], *args: int) -> Callable[[], None]:
            return lambda: (fn(*args), gpu.synchronize())  # type: ignore[func-returns-value]

        for test, fn in (("copy_h2d_4B", copy(gpu.copy_h2d, dst, src, 4)), ("copy_d2h_4B", copy(gpu.copy_d2h, src, dst, 4))):
            fn()
            add(idx, test, -1, [pr.host_timed(fn) for _ in range(n)])
        eager, graph = be.launcher(0), be.graph_launcher(1, 0)
        for test, launch in (("launch_sync_eager", eager), ("launch_sync_graph1", graph)):
            def once(launch: Any = launch) -> None:
                gpu.check(launch(), test)
                gpu.synchronize()
            once()
            add(idx, test, -1, [pr.host_timed(once) for _ in range(n)])
        progress(f"GPU {gpu.ordinal}: launch -> first instruction")
        pr.flag_times()
        ft = [pr.flag_times() for _ in range(n)]
        add(idx, "launch_to_first_instruction", -1, [a for a, _ in ft])
        add(idx, "kernel_end_to_host", -1, [b for _, b in ft])
    for idx, pr in probes.items():
        for jdx, other in probes.items():
            if idx == jdx or not pr.be.gpu.can_access_peer(other.be.gpu):
                continue
            progress(f"GPU {pr.be.gpu.ordinal} -> GPU {other.be.gpu.ordinal}: peer read round trip")
            pr.be.gpu.enable_peer_access(other.be.gpu)
            d = pr._device_chain(other.be.gpu, 2 << 20)
            pr.chase_us(d, 100)
            add(idx, "peer_read_rtt", jdx, [pr.chase_us(d, steps) for _ in range(repeats)])
    return pd.DataFrame(rows, columns=LATENCY_COLUMNS)
