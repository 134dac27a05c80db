"""The one module that imports pynvml.

Every NVML call goes through :func:`query` (lazy ``nvmlInit``, errors mapped to typed exceptions,
"not supported" handled in one place), in the manner of nvitop's ``libnvml``. Importing this module
needs neither pynvml nor a driver.
"""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from pcietrace.errors import NoGpuError, NvmlError, NvmlNotSupported
from pcietrace.schema import normalize_bus_id

# Field ids from nvml.h (driver >= 555). The values are cumulative, 32-bit, wrapping, and count TLP headers.
FI_PCIE_COUNT_TX_BYTES = 197  # GPU -> host (device-to-host)
FI_PCIE_COUNT_RX_BYTES = 198  # host -> GPU (host-to-device)
VALUE_TYPE_UINT = 1  # nvmlValueType_t NVML_VALUE_TYPE_UNSIGNED_INT
#: NVML_VALUE_TYPE_UNSIGNED_LONG (2) and _UNSIGNED_LONG_LONG (3): both 8 bytes on 64-bit Linux, same union slot
VALUE_TYPES_64 = {2, 3}

_lock = threading.Lock()
_nvml: Any = None


def _module() -> Any:
    """pynvml, initialised once (lazily, so `import pcietrace` works without a driver)."""
    global _nvml
    with _lock:
        if _nvml is None:
            try:
                import pynvml
            except ImportError as exc:  # pragma: no cover - dependency missing
                raise NoGpuError("nvidia-ml-py (pynvml) is not installed") from exc
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as exc:
                raise NoGpuError(f"no NVIDIA driver/GPU found via NVML ({exc})") from exc
            _nvml = pynvml
        return _nvml


def query(name: str, *args: Any) -> Any:
    """Call ``pynvml.<name>(*args)``; raise NvmlNotSupported / NvmlError instead of pynvml's errors."""
    nv = _module()
    fn = getattr(nv, name, None)
    if fn is None:  # older nvidia-ml-py releases lack newer entry points
        raise NvmlNotSupported(f"{name}: not in this nvidia-ml-py")
    try:
        return fn(*args)
    except nv.NVMLError_NotSupported as exc:
        raise NvmlNotSupported(f"{name}: not supported on this GPU/driver") from exc
    except nv.NVMLError_FunctionNotFound as exc:
        raise NvmlNotSupported(f"{name}: not in this driver's NVML") from exc
    except nv.NVMLError as exc:
        raise NvmlError(f"{name}: {exc}") from exc


def query_or(default: Any, name: str, *args: Any) -> Any:
    """Like :func:`query` but return ``default`` where the query is not supported."""
    try:
        return query(name, *args)
    except NvmlNotSupported:
        return default


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def device_count() -> int:
    """GPUs NVML sees (all of the machine's: NVML ignores CUDA_VISIBLE_DEVICES)."""
    return int(query("nvmlDeviceGetCount"))


def handle(index: int) -> Any:
    """NVML's device handle of NVML index ``index``."""
    return query("nvmlDeviceGetHandleByIndex", index)


def index_for_bus_id(bus_id: str) -> int:
    """NVML index of the GPU at a PCI bus id (how CUDA ordinals map to NVML under CUDA_VISIBLE_DEVICES)."""
    h = query("nvmlDeviceGetHandleByPciBusId", normalize_bus_id(bus_id).encode())
    return int(query("nvmlDeviceGetIndex", h))


def driver_version() -> str:
    """The NVIDIA driver's version string (e.g. "580.159.04")."""
    return _str(query("nvmlSystemGetDriverVersion"))


@dataclass(frozen=True)
class GpuInfo:
    """Static facts about one GPU, as NVML reports them."""

    nvml_index: int
    name: str
    uuid: str
    bus_id: str
    pcie_gen_current: int | None
    pcie_gen_max: int | None
    pcie_width_current: int | None
    pcie_width_max: int | None
    numa_node: int | None


def gpu_info(index: int) -> GpuInfo:
    """Static facts about GPU ``index`` (NVML index); link generation, width and NUMA node None where NVML
    does not say."""
    h = handle(index)
    pci = query("nvmlDeviceGetPciInfo", h)
    return GpuInfo(
        nvml_index=index,
        name=_str(query("nvmlDeviceGetName", h)),
        uuid=_str(query("nvmlDeviceGetUUID", h)),
        bus_id=normalize_bus_id(_str(pci.busId)),
        pcie_gen_current=query_or(None, "nvmlDeviceGetCurrPcieLinkGeneration", h),
        pcie_gen_max=query_or(None, "nvmlDeviceGetMaxPcieLinkGeneration", h),
        pcie_width_current=query_or(None, "nvmlDeviceGetCurrPcieLinkWidth", h),
        pcie_width_max=query_or(None, "nvmlDeviceGetMaxPcieLinkWidth", h),
        numa_node=query_or(None, "nvmlDeviceGetNumaNodeId", h),
    )


NVML_ERROR_NOT_SUPPORTED = 3
PROBE_TRIES = 5  # a transient failure at start must not switch a GPU to the throughput API for good


class CounterReader:
    """Reads one GPU's PCIe TX/RX byte counters as cheaply as NVML allows.

    ``mode`` is ``"fields"`` (fields 197/198: raw cumulative counters that wrap at ``2**bits``) or
    ``"throughput"`` (the pre-555 ``nvmlDeviceGetPcieThroughput``: KB/s averaged over ~20 ms; each read
    blocks ~20 ms). Pass ``mode`` to force one (so that every reader of a run agrees with the sampler);
    ``None`` probes the fields, retrying transient errors, and falls back only where the driver says the
    fields are not supported. :meth:`read` returns ``(tx, rx)`` raw values, or ``None`` where either
    field's own return code says the read failed.
    """

    def __init__(self, index: int, mode: str | None = None) -> None:
        if mode not in (None, "fields", "throughput"):
            raise NvmlError(f"unknown counter mode {mode!r}")
        self.index = index
        self._h = handle(index)
        self.bits = 32
        self.mode = "throughput" if mode == "throughput" else self._probe_fields(required=mode == "fields")
        self.read: Callable[[], tuple[int, int] | None] = (
            self._read_fields if self.mode == "fields" else self._read_throughput
        )

    def _probe_fields(self, required: bool) -> str:
        nv = _module()
        try:
            fn = nv._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
        except nv.NVMLError:
            if required:
                raise NvmlError(f"GPU {self.index}: this driver has no field values, but the run uses them") from None
            return "throughput"
        # One preallocated array reused for every read: the sampling loop allocates nothing.
        self._values = (nv.c_nvmlFieldValue_t * 2)()
        self._fn, self._n, self._ref = fn, ctypes.c_int32(2), ctypes.byref(self._values)
        for attempt in range(PROBE_TRIES):
            self._values[0].fieldId = FI_PCIE_COUNT_TX_BYTES
            self._values[1].fieldId = FI_PCIE_COUNT_RX_BYTES
            ret = fn(self._h, self._n, self._ref)
            codes = {v.nvmlReturn for v in self._values}
            if ret == 0 and codes == {0}:
                break
            if not required and (ret == NVML_ERROR_NOT_SUPPORTED or NVML_ERROR_NOT_SUPPORTED in codes):
                return "throughput"
            time.sleep(0.02 * (attempt + 1))
        else:
            raise NvmlError(f"GPU {self.index}: PCIe counter fields failed {PROBE_TRIES} times (NVML {ret}, "
                            f"fields {sorted(codes)})")
        vtypes = {v.valueType for v in self._values}
        if vtypes <= VALUE_TYPES_64:
            self.bits = 64
        elif vtypes != {VALUE_TYPE_UINT}:
            if required:
                raise NvmlError(f"GPU {self.index}: unexpected counter value types {sorted(vtypes)}")
            return "throughput"
        return "fields"

    def _read_fields(self) -> tuple[int, int] | None:
        if self._fn(self._h, self._n, self._ref) != 0:
            return None
        tx, rx = self._values[0], self._values[1]
        if tx.nvmlReturn or rx.nvmlReturn:
            return None
        if self.bits == 64:
            return tx.value.ullVal, rx.value.ullVal
        return tx.value.uiVal, rx.value.uiVal

    def _read_throughput(self) -> tuple[int, int] | None:
        nv = _module()
        try:
            return (
                nv.nvmlDeviceGetPcieThroughput(self._h, nv.NVML_PCIE_UTIL_TX_BYTES),
                nv.nvmlDeviceGetPcieThroughput(self._h, nv.NVML_PCIE_UTIL_RX_BYTES),
            )
        except nv.NVMLError:
            return None


#: nvmlGpuTopologyLevel_t -> the labels ``nvidia-smi topo -m`` prints
TOPOLOGY_LEVELS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
NVLINK_MAX_LINKS = 18


def common_ancestor(a: int, b: int) -> str:
    """PCIe relation of two GPUs (by NVML index) as NVML's common-ancestor level, e.g. "PIX"."""
    if a == b:
        return "X"
    level = query("nvmlDeviceGetTopologyCommonAncestor", handle(a), handle(b))
    return TOPOLOGY_LEVELS.get(int(level), str(level))


def nvlink_over_p2p(a: int, b: int) -> bool:
    """Whether NVML reports NVLink peer-to-peer between two GPUs (works where remote ids do not)."""
    nv = _module()
    try:
        status = query("nvmlDeviceGetP2PStatus", handle(a), handle(b), nv.NVML_P2P_CAPS_INDEX_NVLINK)
    except NvmlError:
        return False
    return status == nv.NVML_P2P_STATUS_OK


#: Key under which :func:`nvlink_peers` counts links whose far end is an NVSwitch (they reach every peer).
NVSWITCH = "nvswitch"


def nvlink_peers(index: int) -> dict[str, int]:
    """Active NVLink links of one GPU, counted per remote PCI bus id (normalised); links whose remote
    device is an NVSwitch (``nvmlDeviceGetNvLinkRemoteDeviceType``) count under :data:`NVSWITCH`. In a
    virtual machine the remote ids can be the host's, matching no GPU the guest sees."""
    h = handle(index)
    nv = _module()
    switch_type = getattr(nv, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
    peers: dict[str, int] = {}
    for link in range(NVLINK_MAX_LINKS):
        try:
            if query("nvmlDeviceGetNvLinkState", h, link) != nv.NVML_FEATURE_ENABLED:
                continue
            try:
                remote = query("nvmlDeviceGetNvLinkRemotePciInfo_v2", h, link)
            except NvmlNotSupported:
                remote = query("nvmlDeviceGetNvLinkRemotePciInfo", h, link)
        except NvmlError:  # NvmlNotSupported included: no NVLink, or link index past this GPU's count
            continue
        try:
            to_switch = query("nvmlDeviceGetNvLinkRemoteDeviceType", h, link) == switch_type
        except NvmlError:  # older drivers: the remote type is unknown, the bus id decides
            to_switch = False
        bus = NVSWITCH if to_switch else normalize_bus_id(_str(remote.busId))
        peers[bus] = peers.get(bus, 0) + 1
    return peers
