"""One GPU as every layer names it (:class:`GpuRecord`), and which GPUs a command measures (:func:`select`):
the user's selection resolved to records, for real GPUs (CUDA ordinals as CUDA_VISIBLE_DEVICES numbers them,
matched to NVML by PCI bus id) or a SIMULATED box. Workers, the simulated device and the saved meta's
``gpus`` are built from these records."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence, Union

from pcietrace.errors import ConfigError

#: A GPU selection: "all", comma-separated CUDA ordinals ("0,1"), one ordinal, or a list of them.
GpuSpec = Union[str, int, Sequence[int]]


def parse(spec: GpuSpec) -> list[int] | None:
    """``spec`` ("all", "0,1", 2 or [0, 1]) -> the CUDA ordinals it names, sorted, each named once (None: all),
    before any device is counted."""
    if spec == "all":
        return None
    try:
        ords = _as_ints(spec)
    except (TypeError, ValueError):
        raise ConfigError("gpu", f"takes 'all' or CUDA device numbers like 0,1 (got {spec!r})") from None
    twice = [o for o in ords if ords.count(o) > 1]
    if twice:  # `--gpu 0,0` is a typo for 0,1 more often than a wish to measure GPU 0 once
        raise ConfigError("gpu", f"{_text(spec)}: GPU {twice[0]} given twice")
    return sorted(ords)


def ordinals(spec: GpuSpec, count: int) -> list[int]:
    """``spec`` (:func:`parse`: CUDA ordinals, as CUDA_VISIBLE_DEVICES presents them) among ``count`` visible
    devices -> the sorted ordinals, each named once."""
    ords = parse(spec)
    if ords is None:
        return list(range(count))
    bad = [o for o in ords if not 0 <= o < count]
    if bad:
        raise ConfigError("gpu", f"{_text(spec)}: no CUDA device {bad[0]} ({count} visible)")
    return ords


def _text(spec: GpuSpec) -> str:
    return spec if isinstance(spec, str) else ",".join(map(str, _as_ints(spec)))


def _as_ints(spec: Any) -> list[int]:
    if isinstance(spec, bool):
        raise TypeError(spec)
    if isinstance(spec, int):
        return [spec]
    if isinstance(spec, str):
        return [int(x) for x in spec.split(",")]
    if any(isinstance(x, bool) or not isinstance(x, int) for x in spec):
        raise TypeError(spec)
    return list(spec)


#: The saved meta's keys of a GPU, in order: NVML's facts first, then what CUDA and the sampler add.
NVML_KEYS = ("nvml_index", "name", "uuid", "bus_id", "pcie_gen_current", "pcie_gen_max", "pcie_width_current",
             "pcie_width_max", "numa_node")
#: A SIMULATED GPU's keys, in order (those it has no value for are left out).
SIM_KEYS = ("nvml_index", "cuda_ordinal", "name", "uuid", "bus_id", "pcie_gen_current", "pcie_gen_max",
            "pcie_width_current", "pcie_width_max")


@dataclass(frozen=True)
class GpuRecord:
    """One GPU: ``nvml_index`` (NVML's numbering, all of the machine's GPUs), ``cuda_ordinal`` (CUDA's, as
    CUDA_VISIBLE_DEVICES presents them), PCI ``bus_id``, ``uuid``, ``name``, PCIe link generation and width
    (current and max; None where NVML does not say), ``numa_node``, ``compute_capability`` (major, minor; once
    a context was opened on it), ``counter`` (the sampler's counter mode and bits, once it has started) and
    whether it is ``simulated``."""

    nvml_index: int
    cuda_ordinal: int
    bus_id: str
    name: str
    uuid: str | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    numa_node: int | None = None
    compute_capability: tuple[int, int] | None = None
    counter: dict[str, Any] | None = None
    simulated: bool = False

    @classmethod
    def from_nvml(cls, info: Any, cuda_ordinal: int) -> "GpuRecord":
        """From NVML's facts (:class:`pcietrace.collectors.nvml.GpuInfo`) and the GPU's CUDA ordinal."""
        return cls(cuda_ordinal=cuda_ordinal, **{k: getattr(info, k) for k in NVML_KEYS})

    @classmethod
    def from_meta(cls, saved: dict[str, Any]) -> "GpuRecord":
        """From a saved meta's GPU (:meth:`meta`); keys it does not know are left out."""
        known = {k: v for k, v in saved.items() if k in cls.__dataclass_fields__}
        if known.get("compute_capability") is not None:
            known["compute_capability"] = tuple(known["compute_capability"])
        return cls(**known)

    def with_(self, **changes: Any) -> "GpuRecord":
        """A copy with ``changes`` (e.g. the compute capability once known)."""
        return replace(self, **changes)

    def meta(self) -> dict[str, Any]:
        """The GPU as the saved meta's ``gpus`` holds it (keys and order as every saved run has them)."""
        if self.simulated:
            return {k: getattr(self, k) for k in SIM_KEYS if getattr(self, k) is not None}
        out: dict[str, Any] = {**{k: getattr(self, k) for k in NVML_KEYS}, "cuda_ordinal": self.cuda_ordinal}
        if self.compute_capability is not None:
            out["compute_capability"] = list(self.compute_capability)
        if self.counter is not None:
            out["counter"] = self.counter
        return out


def select(spec: GpuSpec = "all", *, simulate: bool = False, gpus: int = 1) -> list[GpuRecord]:
    """The GPUs ``spec`` names (:func:`ordinals`): this machine's (no CUDA context is created), or, with
    ``simulate``, those of a SIMULATED box of ``gpus`` GPUs."""
    if simulate:
        from pcietrace.device import sim

        box = sim.gpu_records(sim.SimParams.default(), gpus)
        return [box[o] for o in ordinals(spec, gpus)]
    from pcietrace.collectors import nvml
    from pcietrace.device import cuda

    buses = cuda.bus_ids()
    return [GpuRecord.from_nvml(nvml.gpu_info(nvml.index_for_bus_id(buses[o])), o)
            for o in ordinals(spec, len(buses))]
