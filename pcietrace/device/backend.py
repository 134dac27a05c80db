"""The real-GPU backend of the launch generator: the spin kernel on one CUDA device."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from pcietrace.device import native
from pcietrace.device.base import Launch, Loops
from pcietrace.device.cuda import Gpu, handle_return
from pcietrace.device.gpus import GpuRecord
from pcietrace.device.kernels import SPIN_SOURCE


class CudaBackend:
    """Spin-kernel launches on CUDA device ``ordinal``; clock = ``time.monotonic_ns`` (the collector's)."""

    simulated = False
    clock = staticmethod(time.monotonic_ns)
    thread_time_ns = staticmethod(time.thread_time_ns)

    def __init__(self, ordinal: int, own_context: bool = False) -> None:
        """``own_context``: in a new CUDA context of its own rather than the device's primary context."""
        self.gpu = Gpu(ordinal, own_context)
        try:
            module = self.gpu.compile(SPIN_SOURCE, "pt_spin")
            self._kernel = self.gpu.kernel(module, "pt_spin", 2)
            # A second parameter block for blockers, so a blocker never changes the measured launches' args.
            self._blocker = self.gpu.kernel(module, "pt_spin", 2)
            self._launch = self.gpu.launcher(self._kernel)
            self._blocker_launch = self.gpu.launcher(self._blocker)
            self._graphs: dict[tuple[int, int], Any] = {}  # (nodes, kernel ns) -> executable graph
            self._elapsed = self.gpu.alloc_device(8)
        except BaseException:  # (Ctrl-C included) the caller never gets this object to close
            with contextlib.suppress(Exception):
                self.gpu.close()
            raise

    def in_new_context(self) -> "CudaBackend":
        """The same GPU in a context of its own (current on return): a context draws its own level of GPU
        time per eager kernel (H200: 1.29-1.45 us over contexts, within 0.1 % inside one;
        ``docs/lab/bench/eager_gpu_probe.py``). Close it when done; the caller re-activates this one."""
        return CudaBackend(self.gpu.ordinal, own_context=True)

    def close(self) -> None:
        """Release the GPU's resources and context (:meth:`pcietrace.device.cuda.Gpu.close`)."""
        self._graphs.clear()  # their executables die with the Gpu's
        torch, self._torch = getattr(self, "_torch", None), None
        try:
            if torch is not None:
                torch.restore()  # torch's current stream is ours: hand it back before ours is destroyed
        finally:
            self.gpu.close()

    @property
    def spin_function(self) -> Any:
        """The loaded spin kernel's CUfunction (``pt_spin(ns, elapsed_ptr)``), for loops that build their own
        launches (:class:`pcietrace.device.graphs.CudaGraphsDevice`)."""
        return self._kernel.func

    def activate(self) -> None:
        """Make this GPU's context current (several GPUs share one thread)."""
        self.gpu.make_current()

    def launcher(self, kernel_ns: int) -> Launch:
        # All eager launches share one prebuilt parameter block; setting the duration is a store.
        self._kernel.args[:] = (kernel_ns, 0)
        return self._launch

    def blocker(self, kernel_ns: int) -> Launch:
        self._blocker.args[:] = (kernel_ns, 0)
        return self._blocker_launch

    def _graph(self, nodes: int, kernel_ns: int) -> Any:
        key = (nodes, kernel_ns)
        if key not in self._graphs:
            self._graphs[key] = self.gpu.capture_graph(self.launcher(kernel_ns), nodes)
        return self._graphs[key]

    def graph_launcher(self, nodes: int, kernel_ns: int) -> Launch:
        return self.gpu.graph_launcher(self._graph(nodes, kernel_ns))

    def native_loops(self, mode: str, nodes: int, kernel_ns: int) -> Loops:
        """The C loops for an eager spin kernel of ``kernel_ns`` or a graph of ``nodes`` of them."""
        stream = int(self.gpu.stream)
        if mode == "graph":
            return native.NativeLoops(native.GRAPH, int(self._graph(nodes, kernel_ns)), stream)
        self.launcher(kernel_ns)  # sets the shared parameter block
        return native.NativeLoops(native.EAGER, int(self._kernel.func), stream, self._kernel.params_address)

    def torch_loops(self) -> Loops | None:
        """Empty-ish kernels launched through PyTorch on this GPU's stream (None without torch);
        made once, see :mod:`pcietrace.device.torch_launch`."""
        if not hasattr(self, "_torch"):
            from pcietrace.device.torch_launch import torch_loops

            self._torch = torch_loops(self, self.gpu.ordinal, int(self.gpu.stream))
            self.activate()
        return self._torch

    def synchronize(self) -> None:
        self.gpu.synchronize()

    def event(self) -> Any:
        return self.gpu.event()

    def record(self, ev: Any) -> None:
        self.gpu.record(ev)

    def done(self, ev: Any) -> bool:
        return self.gpu.done(ev)

    def elapsed_ms(self, a: Any, b: Any) -> float:
        return self.gpu.elapsed_ms(a, b)

    def raise_launch_error(self, result: tuple[Any, ...]) -> None:
        handle_return(result, "launch")

    def measure_kernel_ns(self, kernel_ns: int, repeats: int) -> list[int]:
        self._kernel.args[:] = (kernel_ns, self._elapsed)
        out = []
        for _ in range(repeats):
            handle_return(self._launch(), "cuLaunchKernel")
            out.append(int(self.gpu.read_u64(self._elapsed)[0]))
        self._kernel.args[1] = 0
        return out


def open_gpus(gpus: list[GpuRecord]) -> list[tuple[GpuRecord, CudaBackend]]:
    """Open a backend on each GPU (:func:`pcietrace.device.gpus.select`'s records); each record comes back
    with its compute capability."""
    backends: list[CudaBackend] = []
    try:
        for g in gpus:
            backends.append(CudaBackend(g.cuda_ordinal))
        return [(g.with_(compute_capability=tuple(be.gpu.cc)), be) for g, be in zip(gpus, backends)]
    except BaseException:  # (Ctrl-C included) the caller never gets the backends opened so far to close
        for be in backends:
            with contextlib.suppress(Exception):
                be.close()
        raise


def driver_version() -> str:
    """The NVIDIA driver's version string, as NVML reports it."""
    from pcietrace.collectors import nvml

    return nvml.driver_version()
