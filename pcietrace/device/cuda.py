"""The one module that imports cuda.bindings (driver API and NVRTC), and cuda.pathfinder (libcupti's path).

Every call goes through :func:`handle_return`, which turns a non-success code into :class:`CudaError`.
Importing this module needs neither cuda-python nor a driver; :func:`open_gpu` raises
:class:`NoGpuError` where there is none.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from pcietrace.errors import CudaError, NoGpuError

_drv: Any = None
_rtc: Any = None


def _bindings() -> tuple[Any, Any]:
    global _drv, _rtc
    if _drv is None:
        try:
            from cuda.bindings import driver, nvrtc
        except ImportError as exc:
            raise NoGpuError("cuda-python (cuda.bindings) is not installed") from exc
        _drv, _rtc = driver, nvrtc
    return _drv, _rtc


def handle_return(result: tuple[Any, ...], call: str = "CUDA call") -> Any:
    """Check a cuda.bindings result tuple ``(err, *values)``; return the value(s) or raise CudaError."""
    drv, rtc = _bindings()
    err = result[0]
    if int(err) != 0:
        if isinstance(err, rtc.nvrtcResult):
            name = rtc.nvrtcGetErrorString(err)[1].decode()
        else:
            got = drv.cuGetErrorName(err)
            name = got[1].decode() if int(got[0]) == 0 else str(err)
        raise CudaError(call, int(err), name)
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def device_count() -> int:
    """CUDA devices visible to this process (honours CUDA_VISIBLE_DEVICES); raises NoGpuError if none."""
    drv, _ = _bindings()
    try:
        handle_return(drv.cuInit(0), "cuInit")
    except CudaError as exc:
        raise NoGpuError(f"CUDA driver present but no usable GPU ({exc.name})") from exc
    except Exception as exc:  # cuda.pathfinder raises its own error when libcuda.so is absent
        raise NoGpuError(f"no NVIDIA driver found ({type(exc).__name__})") from exc
    return int(handle_return(drv.cuDeviceGetCount(), "cuDeviceGetCount"))


def _bus_id(dev: Any) -> str:
    """A device's PCI bus id (the binding returns a NUL-padded byte buffer)."""
    drv, _ = _bindings()
    raw = handle_return(drv.cuDeviceGetPCIBusId(32, dev), "cuDeviceGetPCIBusId")
    return raw.split(b"\0", 1)[0].decode() if isinstance(raw, bytes) else str(raw)


def _ready(err: Any, call: str) -> bool:
    """False for CUDA_ERROR_NOT_READY (work still running), True for success; raises otherwise."""
    drv, _ = _bindings()
    if err == drv.CUresult.CUDA_ERROR_NOT_READY:
        return False
    handle_return((err,), call)
    return True


def bus_ids() -> list[str]:
    """PCI bus id of every visible CUDA device, in CUDA ordinal order (no context is created)."""
    drv, _ = _bindings()
    return [_bus_id(handle_return(drv.cuDeviceGet(o), "cuDeviceGet")) for o in range(device_count())]


def cupti_library() -> str | None:
    """libcupti's path: $PCIETRACE_CUPTI, else what cuda-pathfinder finds (pip wheel or CUDA toolkit)."""
    if os.environ.get("PCIETRACE_CUPTI"):
        return os.environ["PCIETRACE_CUPTI"]
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        return str(load_nvidia_dynamic_lib("cupti").abs_path)
    except Exception:  # no CUPTI anywhere: launches are then not counted, and the report says so
        return None


@functools.lru_cache(maxsize=None)
def _cubin(source: str, name: str, cc: tuple[int, int]) -> bytes:
    """NVRTC's cubin of ``source`` for compute capability ``cc`` (cached: a context of its own loads the
    same code without compiling again)."""
    _, rtc = _bindings()
    prog = handle_return(rtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], []),
                         "nvrtcCreateProgram")
    opts = [f"--gpu-architecture=sm_{cc[0]}{cc[1]}".encode(), b"-default-device"]
    try:
        handle_return(rtc.nvrtcCompileProgram(prog, len(opts), opts), "nvrtcCompileProgram")
    except CudaError as exc:
        size = handle_return(rtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        log = b" " * size
        handle_return(rtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
        raise CudaError(exc.call, exc.code, exc.name, log.decode(errors="replace").strip()) from exc
    size = handle_return(rtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
    cubin = b" " * size
    handle_return(rtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
    handle_return(rtc.nvrtcDestroyProgram(prog), "nvrtcDestroyProgram")
    return cubin


@dataclass
class Kernel:
    """A compiled kernel plus a prebuilt parameter block: launches pass one integer address.

    ``args`` holds the argument values (uint64 each); ``_ptrs`` the ``void*[]`` pointing at them.
    Changing ``args`` in place changes the next launch (the driver copies parameters at launch).
    """

    func: Any
    args: np.ndarray
    _ptrs: np.ndarray = field(repr=False)

    @property
    def params_address(self) -> int:
        return int(self._ptrs.ctypes.data)


class Gpu:
    """A CUDA device with a context (its primary context, or with ``own_context`` a new one) and one
    non-blocking stream. It owns what it creates (modules, graphs, events, memory, the stream) and
    :meth:`close` releases all of it and the context; ``with Gpu(0) as gpu:`` closes on exit."""

    def __init__(self, ordinal: int, own_context: bool = False) -> None:
        drv, _ = _bindings()
        n = device_count()
        if not 0 <= ordinal < n:
            raise NoGpuError(f"CUDA device {ordinal} does not exist ({n} visible)")
        self.ordinal = ordinal
        self.device = handle_return(drv.cuDeviceGet(ordinal), "cuDeviceGet")
        self.own_context = own_context
        # What close() releases, by kind, in the order it releases them.
        self._owned: dict[str, list[Any]] = {"exec": [], "graph": [], "event": [], "device": [], "pinned": [],
                                              "module": []}
        self.stream: Any = None
        self.context: Any = None
        if own_context:  # a context of its own draws its own launch-fetch level (docs/lab/bench/eager_gpu_probe.py)
            try:
                self.context = handle_return(drv.cuCtxCreate(None, 0, self.device), "cuCtxCreate")
            except TypeError:  # cuda-bindings 12: cuCtxCreate(flags, dev)
                self.context = handle_return(drv.cuCtxCreate(0, self.device), "cuCtxCreate")
        else:
            self.context = handle_return(drv.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        try:
            self.make_current()
            self.stream = handle_return(drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING),
                                        "cuStreamCreate")
            self.bus_id = _bus_id(self.device)
            self.name = handle_return(drv.cuDeviceGetName(256, self.device),
                                      "cuDeviceGetName").split(b"\0", 1)[0].decode()
            attr = drv.CUdevice_attribute
            self.cc = (self.attribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                       self.attribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))
            self.driver_version = handle_return(drv.cuDriverGetVersion(), "cuDriverGetVersion")
        except BaseException:  # (Ctrl-C included) a half-made Gpu must not keep a context: nobody could close it
            with contextlib.suppress(Exception):
                self.close()
            raise

    def __enter__(self) -> "Gpu":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release everything this object created and its context (idempotent). Tries every release
        and raises the first error after."""
        if self.context is None:
            return
        drv, _ = _bindings()
        first: CudaError | None = None

        def release(call: str, result: tuple[Any, ...]) -> None:
            nonlocal first
            try:
                handle_return(result, call)
            except CudaError as exc:
                first = first or exc

        release("cuCtxSetCurrent", drv.cuCtxSetCurrent(self.context))
        if self.stream is not None:
            release("cuStreamSynchronize", drv.cuStreamSynchronize(self.stream))
        destroy = {"exec": ("cuGraphExecDestroy", drv.cuGraphExecDestroy),
                   "graph": ("cuGraphDestroy", drv.cuGraphDestroy),
                   "event": ("cuEventDestroy", drv.cuEventDestroy), "device": ("cuMemFree", drv.cuMemFree),
                   "pinned": ("cuMemFreeHost", drv.cuMemFreeHost), "module": ("cuModuleUnload", drv.cuModuleUnload)}
        for kind, handles in self._owned.items():
            call, fn = destroy[kind]
            for h in handles:
                release(call, fn(h))
            handles.clear()
        if self.stream is not None:
            release("cuStreamDestroy", drv.cuStreamDestroy(self.stream))
        if self.own_context:
            release("cuCtxDestroy", drv.cuCtxDestroy(self.context))
        else:
            release("cuDevicePrimaryCtxRelease", drv.cuDevicePrimaryCtxRelease(self.device))
        self.context = None
        if first is not None:
            raise first

    def attribute(self, attr: Any) -> int:
        drv, _ = _bindings()
        return int(handle_return(drv.cuDeviceGetAttribute(attr, self.device), "cuDeviceGetAttribute"))

    def _live(self) -> None:
        """Refuse use after :meth:`close` (cuCtxSetCurrent(NULL) would quietly leave no context current, and
        what is made then would never be released)."""
        if self.context is None:
            raise RuntimeError(f"CUDA device {self.ordinal}: this Gpu was closed")

    def make_current(self) -> None:
        self._live()
        drv, _ = _bindings()
        handle_return(drv.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    # -- compilation -------------------------------------------------------------------------------
    def compile(self, source: str, name: str) -> Any:
        """Compile CUDA C++ with NVRTC for this GPU's architecture (once per source and architecture in a
        process); return the module, loaded into this GPU's context."""
        self._live()
        drv, _ = _bindings()
        module = handle_return(drv.cuModuleLoadData(_cubin(source, name, self.cc)), "cuModuleLoadData")
        self._owned["module"].append(module)
        return module

    def kernel(self, module: Any, name: str, nargs: int) -> Kernel:
        """A kernel whose ``nargs`` arguments are all 64-bit (integers or pointers)."""
        drv, _ = _bindings()
        func = handle_return(drv.cuModuleGetFunction(module, name.encode()), "cuModuleGetFunction")
        args = np.zeros(nargs, np.uint64)
        ptrs = np.array([args.ctypes.data + 8 * i for i in range(nargs)], np.uint64)
        return Kernel(func, args, ptrs)

    # -- launching ---------------------------------------------------------------------------------
    def launcher(self, k: Kernel, grid: int = 1, block: int = 1) -> Callable[[], tuple[Any, ...]]:
        """A zero-argument callable that launches ``k`` once on the stream and returns ``(err,)``.

        A ``functools.partial`` over the binding is called in C, so the Python launch loop pays only
        the binding's own cost per launch.
        """
        drv, _ = _bindings()
        return functools.partial(drv.cuLaunchKernel, k.func, grid, 1, 1, block, 1, 1, 0,
                                 self.stream, k.params_address, 0)

    def capture_graph(self, launch: Callable[[], tuple[Any, ...]], nodes: int) -> Any:
        """Capture ``nodes`` calls of ``launch`` into a graph; return the instantiated executable graph."""
        self._live()
        drv, _ = _bindings()
        handle_return(drv.cuStreamBeginCapture(
            self.stream, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture")
        try:
            for _ in range(nodes):
                handle_return(launch(), "cuLaunchKernel (capture)")
        finally:
            graph = handle_return(drv.cuStreamEndCapture(self.stream), "cuStreamEndCapture")
            self._owned["graph"].append(graph)  # owned from here: a failed instantiate or upload leaks nothing
        exe = handle_return(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        self._owned["exec"].append(exe)
        handle_return(drv.cuGraphUpload(exe, self.stream), "cuGraphUpload")
        return exe

    def graph_launcher(self, exe: Any) -> Callable[[], tuple[Any, ...]]:
        drv, _ = _bindings()
        return functools.partial(drv.cuGraphLaunch, exe, self.stream)

    def check(self, result: tuple[Any, ...], call: str = "launch") -> None:
        handle_return(result, call)

    def synchronize(self) -> None:
        drv, _ = _bindings()
        handle_return(drv.cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    # -- events ------------------------------------------------------------------------------------
    def event(self) -> Any:
        self._live()
        drv, _ = _bindings()
        ev = handle_return(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")
        self._owned["event"].append(ev)
        return ev

    def record(self, ev: Any) -> None:
        drv, _ = _bindings()
        handle_return(drv.cuEventRecord(ev, self.stream), "cuEventRecord")

    def done(self, ev: Any) -> bool:
        """True once the work before ``ev`` has finished on the GPU."""
        drv, _ = _bindings()
        return _ready(drv.cuEventQuery(ev)[0], "cuEventQuery")

    def elapsed_ms(self, a: Any, b: Any) -> float:
        drv, _ = _bindings()
        handle_return(drv.cuEventSynchronize(b), "cuEventSynchronize")
        return float(handle_return(drv.cuEventElapsedTime(a, b), "cuEventElapsedTime"))

    # -- memory ------------------------------------------------------------------------------------
    def alloc_device(self, nbytes: int) -> int:
        self._live()
        drv, _ = _bindings()
        ptr = int(handle_return(drv.cuMemAlloc(nbytes), "cuMemAlloc"))
        self._owned["device"].append(ptr)
        return ptr

    def alloc_pinned(self, nbytes: int, mapped: bool = False) -> int:
        """Page-locked host memory (optionally mapped into the GPU's address space)."""
        self._live()
        drv, _ = _bindings()
        flags = drv.CU_MEMHOSTALLOC_DEVICEMAP if mapped else 0
        ptr = int(handle_return(drv.cuMemHostAlloc(nbytes, flags), "cuMemHostAlloc"))
        self._owned["pinned"].append(ptr)
        return ptr

    def device_pointer(self, host_ptr: int) -> int:
        drv, _ = _bindings()
        return int(handle_return(drv.cuMemHostGetDevicePointer(host_ptr, 0), "cuMemHostGetDevicePointer"))

    def free_device(self, ptr: int) -> None:
        """Free memory :meth:`alloc_device` gave (anything else is refused before freeing: its owner's
        :meth:`close` would free it again)."""
        self._mine("device", ptr)
        drv, _ = _bindings()
        handle_return(drv.cuMemFree(ptr), "cuMemFree")
        self._owned["device"].remove(ptr)

    def free_pinned(self, ptr: int) -> None:
        """Free memory :meth:`alloc_pinned` gave (as :meth:`free_device`)."""
        self._mine("pinned", ptr)
        drv, _ = _bindings()
        handle_return(drv.cuMemFreeHost(ptr), "cuMemFreeHost")
        self._owned["pinned"].remove(ptr)

    def _mine(self, kind: str, ptr: int) -> None:
        if ptr not in self._owned[kind]:
            raise ValueError(f"{ptr:#x} is not {kind} memory this Gpu allocated (or it was freed already)")

    def copy_h2d(self, dst: int, src: int, nbytes: int) -> None:
        drv, _ = _bindings()
        handle_return(drv.cuMemcpyHtoDAsync(dst, src, nbytes, self.stream), "cuMemcpyHtoDAsync")

    def copy_d2h(self, dst: int, src: int, nbytes: int) -> None:
        drv, _ = _bindings()
        handle_return(drv.cuMemcpyDtoHAsync(dst, src, nbytes, self.stream), "cuMemcpyDtoHAsync")

    def copy_h2d_sync(self, dst: int, src: int, nbytes: int) -> None:
        drv, _ = _bindings()
        handle_return(drv.cuMemcpyHtoD(dst, src, nbytes), "cuMemcpyHtoD")

    def query(self) -> bool:
        """True once all work on the stream has finished."""
        drv, _ = _bindings()
        return _ready(drv.cuStreamQuery(self.stream)[0], "cuStreamQuery")

    def can_access_peer(self, other: "Gpu") -> bool:
        drv, _ = _bindings()
        return bool(handle_return(drv.cuDeviceCanAccessPeer(self.device, other.device), "cuDeviceCanAccessPeer"))

    def enable_peer_access(self, other: "Gpu") -> None:
        """Let kernels in this context read ``other``'s memory (idempotent)."""
        drv, _ = _bindings()
        self.make_current()
        err = drv.cuCtxEnablePeerAccess(other.context, 0)[0]
        if err != drv.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED:
            handle_return((err,), "cuCtxEnablePeerAccess")

    def read_u64(self, dptr: int, n: int = 1) -> np.ndarray:
        """Copy ``n`` uint64 values from device memory (synchronously)."""
        drv, _ = _bindings()
        out = np.zeros(n, np.uint64)
        self.synchronize()
        handle_return(drv.cuMemcpyDtoH(out.ctypes.data, dptr, 8 * n), "cuMemcpyDtoH")
        return out
