"""Stand-ins for NVML with no driver: a fake pynvml built from a topology fixture's ``nvml`` section
(tests/data/topo/README.md), enough of NVML's NVLink and topology queries for
:mod:`pcietrace.collectors.topology`; and a counter reader for the sampler (:class:`FakeCounterReader`)."""

from __future__ import annotations

import types
from typing import Any


def fake_pynvml(nvml_doc: dict[str, Any]) -> types.SimpleNamespace:
    """A module-like object; install with ``monkeypatch.setattr(nvml, "_nvml", fake)``."""
    gpus = nvml_doc["gpus"]

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    class NVMLError_FunctionNotFound(NVMLError):
        pass

    def link(h: int, n: int) -> dict[str, Any]:
        links = gpus[h]["nvlinks"]
        if n >= len(links):
            raise NVMLError_NotSupported()
        return links[n]

    def remote_type(h: int, n: int) -> int:
        t = link(h, n)["remote_type"]
        if t is None:  # not recorded on the machine: the driver's answer is unknown
            raise NVMLError_NotSupported()
        return {"gpu": 0, "switch": 2}[t]

    return types.SimpleNamespace(
        NVMLError=NVMLError, NVMLError_NotSupported=NVMLError_NotSupported,
        NVMLError_FunctionNotFound=NVMLError_FunctionNotFound,
        NVML_FEATURE_ENABLED=1, NVML_P2P_CAPS_INDEX_NVLINK=2, NVML_P2P_STATUS_OK=0, NVML_NVLINK_DEVICE_TYPE_SWITCH=2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetNvLinkState=lambda h, n: (link(h, n), 1)[1],
        nvmlDeviceGetNvLinkRemotePciInfo_v2=lambda h, n: types.SimpleNamespace(busId=link(h, n)["remote_bus_id"].encode()),
        nvmlDeviceGetNvLinkRemoteDeviceType=remote_type,
        nvmlDeviceGetP2PStatus=lambda a, b, cap: 0 if nvml_doc["nvlink_p2p"][a][b] else 4,
        nvmlDeviceGetTopologyCommonAncestor=lambda a, b: 30,
    )


class FakeCounterReader:
    """Stands in for NVML's CounterReader: a counter read that returns at once; every read moves both
    32-bit counters by ``bytes_per_read`` (as if a read were all the PCIe traffic there is)."""

    bytes_per_read = 1

    def __init__(self, index: int, mode: str | None = None) -> None:
        self.index, self.mode, self.bits, self.n = index, "fields", 32, 0

    def read(self) -> tuple[int, int]:
        self.n += 1
        v = self.n * self.bytes_per_read % 2**32
        return v, v
