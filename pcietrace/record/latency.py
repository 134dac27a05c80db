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
- ``copy_h2d_4B`` / ``copy_d2h_4B``: a 4-byte cuMemcpy*Async plus stream synchronize, host-timed in C.
- ``launch_sync_eager`` / ``launch_sync_graph1``: launch an empty kernel (or a graph of one) and
  synchronize, host-timed in C (pcietrace/native/pt_loops.c).
- ``launch_to_first_instruction``: host clock before cuLaunchKernel until the host sees the kernel's
  first store to host-mapped memory (includes that store's one-way trip).
- ``kernel_end_to_host``: from the host seeing the kernel's last store until cuStreamQuery reports
  the stream done.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

import numpy as np
import pandas as pd

from pcietrace.device import native
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

    def forget(self, owner: Any) -> None:
        """Drop the chains cached in ``owner``'s memory: call before ``owner`` is closed (its memory goes
        with it; a later owner at the same ``id`` would otherwise be handed a freed chain)."""
        for key in [k for k in self._bufs if isinstance(k, tuple) and k[0] == id(owner)]:
            self._pos.pop(self._bufs.pop(key), None)

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

    def flag_us(self, repeats: int, spin_us: float = 20.0) -> tuple[np.ndarray, np.ndarray]:
        """Per repeat, in us: (launch -> first instruction seen by the host, kernel end seen -> stream
        reported done), timed by the native loop."""
        gpu = self.be.gpu
        if "flag" not in self._bufs:
            host = gpu.alloc_pinned(64, mapped=True)
            self._bufs["flag"] = (host, gpu.device_pointer(host))
            self._flag_value = 0
        host, dev = self._bufs["flag"]
        self.flag.args[:] = (dev, 0, int(spin_us * 1000))
        first, end = native.flag_each(int(self.flag.func), int(gpu.stream), self.flag.params_address,
                                      self.flag.args.ctypes.data + 8, host, self._flag_value + 1, repeats)
        self._flag_value += repeats
        return first / 1e3, end / 1e3


Rows = list[tuple[int, str, int, int, float]]


def _add(rows: Rows, idx: int, test: str, peer: int, values: Any) -> None:
    rows.extend((idx, test, peer, r, float(v)) for r, v in enumerate(values))


def measure_device_memory(idx: int, pr: LatencyProbe, repeats: int = 11, steps: int = 2000,
                          progress: Callable[[str], None] = lambda _: None) -> Rows:
    """The chases in the GPU's own memory (L2, HBM) on one GPU (NVML index ``idx``); rows as
    :data:`LATENCY_COLUMNS`. Timed on the GPU and crossing no link: ``pcietrace run`` does them before the
    GPU's timed turn, where other GPUs' work cannot move them (0.5 s of the turn on an H100)."""
    rows: Rows = []
    gpu = pr.be.gpu
    gpu.make_current()
    progress(f"GPU {gpu.ordinal}: device memory chase")
    for test, nbytes in (("device_read_l2", 2 << 20), ("device_read_hbm", 256 << 20)):
        d = pr._device_chain(gpu, nbytes)
        pr.chase_us(d, steps * 20)  # warm-up as long as a repeat: every page's translation is cached
        _add(rows, idx, test, -1, [pr.chase_us(d, steps * 20) for _ in range(repeats)])
    return rows


def measure_gpu(idx: int, pr: LatencyProbe, repeats: int = 11, steps: int = 2000,
                progress: Callable[[str], None] = lambda _: None, device_memory: bool = True) -> Rows:
    """Every single-GPU test on one GPU (NVML index ``idx``); rows as :data:`LATENCY_COLUMNS`. The
    host-timed tests run in the native loops (:mod:`pcietrace.device.native`). ``device_memory``: also
    :func:`measure_device_memory` (False: measured apart)."""
    rows: Rows = []
    gpu, be = pr.be.gpu, pr.be
    gpu.make_current()
    progress(f"GPU {gpu.ordinal}: PCIe read round trip")
    for test, nbytes in (("host_read_rtt", 64 << 10), ("host_read_rtt_2mib", 2 << 20)):
        host = pr._host_chain(nbytes)
        pr.chase_us(host, 100)  # warm
        _add(rows, idx, test, -1, [pr.chase_us(host, steps) for _ in range(repeats)])
    if device_memory:
        rows += measure_device_memory(idx, pr, repeats, steps, progress)  # (leaves this GPU current)
    progress(f"GPU {gpu.ordinal}: small copies and launch round trips")
    if "copy" not in pr._bufs:
        pr._bufs["copy"] = (gpu.alloc_pinned(64), gpu.alloc_device(64))
    src, dst = pr._bufs["copy"]
    stream = int(gpu.stream)
    n = repeats * 20  # host-timed tests are short: more repeats for the same confidence
    for test, h2d in (("copy_h2d_4B", True), ("copy_d2h_4B", False)):
        native.copy_sync_each(h2d, dst, src, 4, stream, 2)  # warm
        _add(rows, idx, test, -1, native.copy_sync_each(h2d, dst, src, 4, stream, n) / 1e3)
    for test, mode in (("launch_sync_eager", "eager"), ("launch_sync_graph1", "graph")):
        loops = be.native_loops(mode, 1, 0)
        loops.sync_each(2)
        _add(rows, idx, test, -1, loops.sync_each(n) / 1e3)
    progress(f"GPU {gpu.ordinal}: launch -> first instruction")
    pr.flag_us(2)
    first, end = pr.flag_us(n)
    _add(rows, idx, "launch_to_first_instruction", -1, first)
    _add(rows, idx, "kernel_end_to_host", -1, end)
    return rows


def measure_peers(idx: int, pr: LatencyProbe, peers: dict[int, Any], repeats: int = 11, steps: int = 2000,
                  progress: Callable[[str], None] = lambda _: None, ready: Callable[[], None] = lambda: None) -> Rows:
    """``peer_read_rtt`` from GPU ``idx`` into each peer it can access (``peers``: NVML index ->
    :class:`pcietrace.device.cuda.Gpu`). Peer access and the chains in the peers' memory are set up first;
    ``ready()`` is called between that and the chases (``pcietrace run`` takes its turn there: a chase is
    ~22,000 loads, ~30 ms, while the set-up copies a 2 MiB chain into each peer, and the caller has opened a
    context on each: ~0.13 s apiece on the H100; on 8 GPUs, 56 of them one at a time)."""
    rows: Rows = []
    chains = {}
    for jdx, other in peers.items():
        if jdx != idx and pr.be.gpu.can_access_peer(other):
            pr.be.gpu.enable_peer_access(other)
            chains[jdx] = (other, pr._device_chain(other, 2 << 20))
    ready()
    for jdx, (other, d) in chains.items():
        progress(f"GPU {pr.be.gpu.ordinal} -> GPU {other.ordinal}: peer read round trip")
        pr.chase_us(d, 100)
        _add(rows, idx, "peer_read_rtt", jdx, [pr.chase_us(d, steps) for _ in range(repeats)])
    return rows


def measure(probes: dict[int, LatencyProbe], repeats: int = 11, steps: int = 2000,
            progress: Callable[[str], None] = lambda _: None) -> pd.DataFrame:
    """Run every test on every GPU (and every peer pair); one row per repeat (:data:`LATENCY_COLUMNS`)."""
    rows: Rows = []
    for idx, pr in probes.items():
        rows += measure_gpu(idx, pr, repeats, steps, progress)
    gpus = {idx: pr.be.gpu for idx, pr in probes.items()}
    for idx, pr in probes.items():
        rows += measure_peers(idx, pr, gpus, repeats, steps, progress)
    return pd.DataFrame(rows, columns=LATENCY_COLUMNS)
