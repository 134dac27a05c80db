"""PCIe placement of each GPU read from sysfs (``root`` is configurable so tests use fixture trees).

The path from the root complex to a GPU is the chain of device folders under
``<root>/devices/pciDDDD:BB/``. Each hop's role comes from its PCIe capability (port type in config
space) where the config file is readable that far (as root), else from its position: the first
bridge below the host bridge is the root port, later bridges pair up as switch upstream/downstream.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_DECIMAL = re.compile(r"-?[0-9]{1,12}")
_HEX = re.compile(r"0[xX][0-9a-fA-F]{1,8}")
#: PCIe capability "device/port type" values (PCIe base spec, Express Capabilities register bits 7:4)
PORT_TYPES = {0: "endpoint", 1: "legacy endpoint", 4: "root port", 5: "switch upstream", 6: "switch downstream",
              7: "pcie-to-pci bridge", 8: "pci-to-pcie bridge", 9: "root complex endpoint"}
NVIDIA = "0x10de"


@dataclass
class PciHop:
    """One device on the path. Link speeds as sysfs spells them (e.g. "32.0 GT/s PCIe"), widths in lanes."""

    bdf: str
    role: str
    vendor: str
    device: str
    pci_class: str
    link_speed: str | None = None
    link_width: int | None = None
    max_link_speed: str | None = None
    max_link_width: int | None = None


@dataclass
class GpuPlacement:
    """Where one GPU sits: host bridge, NUMA node, CPU affinity, hops from the root port down (the GPU
    last), and ``switch_levels`` (PCIe switches between the root port and the GPU)."""

    bdf: str
    host_bridge: str
    numa_node: int | None
    local_cpulist: str | None
    hops: list[PciHop] = field(default_factory=list)

    @property
    def switch_levels(self) -> int:
        return sum(h.role == "switch upstream" for h in self.hops)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "switch_levels": self.switch_levels}


def _read(path: Path) -> str | None:
    """A sysfs attribute's text, or None if it is unreadable or not printable text (binary garbage)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(4096)  # attributes are short; a huge file is not one
    except OSError:
        return None
    try:
        text = raw.decode("utf-8").strip().strip("\x00").strip()
    except UnicodeDecodeError:
        return None
    return text if text.isprintable() else None


def _int(text: str | None) -> int | None:
    """A plain decimal integer (sysfs spelling), else None: no ``1_6``, no Unicode digits."""
    return int(text) if text is not None and _DECIMAL.fullmatch(text) else None


def _width(text: str | None) -> int | None:
    """A link width in lanes (1..32); 0, negative or garbage -> None (unknown)."""
    v = _int(text)
    return v if v is not None and 1 <= v <= 32 else None


def _hex(text: str | None) -> str | None:
    """An id such as ``0x10de`` (vendor, device, class), lower case; else None."""
    return text.lower() if text is not None and _HEX.fullmatch(text) else None


def port_type(config: bytes) -> int | None:
    """PCIe port type from config space bytes (None if the capability list is not readable)."""
    if len(config) < 0x40 or not config[0x06] & 0x10:  # status register: capability list present
        return None
    ptr, seen = config[0x34] & 0xFC, 0
    while ptr and ptr + 4 <= len(config) and seen < 48:
        if config[ptr] == 0x10:  # PCI Express capability
            return (config[ptr + 2] >> 4) & 0xF
        ptr, seen = config[ptr + 1] & 0xFC, seen + 1
    return None


def _hop(dev: Path) -> tuple[PciHop, int | None]:
    try:
        with open(dev / "config", "rb") as f:
            ptype = port_type(f.read(256))
    except OSError:
        ptype = None
    hop = PciHop(bdf=dev.name, role="", vendor=_hex(_read(dev / "vendor")) or "?",
                 device=_hex(_read(dev / "device")) or "?", pci_class=_hex(_read(dev / "class")) or "?",
                 link_speed=_read(dev / "current_link_speed"), link_width=_width(_read(dev / "current_link_width")),
                 max_link_speed=_read(dev / "max_link_speed"), max_link_width=_width(_read(dev / "max_link_width")))
    return hop, ptype


def placement(bdf: str, root: str | os.PathLike[str] = "/sys") -> GpuPlacement:
    """The PCIe path of device ``bdf`` (e.g. "0000:00:06.0") under sysfs ``root``."""
    root = Path(root)
    link = root / "bus" / "pci" / "devices" / bdf.lower()
    real = Path(os.path.realpath(link))
    parts = real.parts
    # the host bridge folder (pciDDDD:BB), not any folder above the sysfs root that merely starts with "pci"
    hb = next((i for i, p in enumerate(parts) if re.fullmatch(r"pci[0-9a-f]{4}:[0-9a-f]{2}", p)), None)
    if hb is None or not real.is_dir():
        raise FileNotFoundError(f"no PCI device {bdf} under {root}")
    chain = [real.parents[len(parts) - i - 2] for i in range(hb + 1, len(parts) - 1)] + [real]
    chain = [d for d in chain if _BDF.match(d.name)]
    hops, bridges_seen = [], 0
    for d in chain:
        hop, ptype = _hop(d)
        is_bridge = hop.pci_class.startswith("0x0604")
        if ptype is not None and ptype in PORT_TYPES:
            hop.role = PORT_TYPES[ptype]
        elif is_bridge:  # no config access: infer from position
            hop.role = "root port" if bridges_seen == 0 else ("switch upstream" if bridges_seen % 2 else "switch downstream")
        else:
            hop.role = "endpoint"
        bridges_seen += is_bridge
        hops.append(hop)
    return GpuPlacement(bdf=bdf.lower(), host_bridge=parts[hb], numa_node=_int(_read(real / "numa_node")),
                        local_cpulist=_read(real / "local_cpulist"), hops=hops)


def nvidia_gpus(root: str | os.PathLike[str] = "/sys") -> list[str]:
    """Bus ids of NVIDIA display/3D controllers (class 0x03xxxx) under sysfs ``root``."""
    out = []
    base = Path(root) / "bus" / "pci" / "devices"
    for dev in sorted(base.iterdir()) if base.is_dir() else []:
        pci_class = _hex(_read(dev / "class"))
        # An unreadable class still lists an NVIDIA function: better an unknown row than a GPU dropped.
        if _hex(_read(dev / "vendor")) == NVIDIA and (pci_class is None or pci_class.startswith("0x03")):
            out.append(dev.name)
    return out


def pcie_relation(a: GpuPlacement, b: GpuPlacement) -> str:
    """How two GPUs reach each other over PCIe, in ``nvidia-smi topo -m`` terms: PIX (one switch),
    PXB (several switches, no host bridge), PHB (same host bridge), NODE (same NUMA node, other host
    bridge), SYS (across NUMA nodes)."""
    if a.bdf == b.bdf:
        return "X"
    if a.host_bridge != b.host_bridge:
        same_node = a.numa_node is not None and a.numa_node == b.numa_node and a.numa_node >= 0
        return "NODE" if same_node else "SYS"
    common = 0
    for ha, hb in zip(a.hops, b.hops):
        if ha.bdf != hb.bdf:
            break
        common += 1
    # The deepest shared device is where the traffic turns round. Only a switch can fan out below a
    # shared device (a root port or downstream port has one link), so anything else means the root.
    if common == 0 or a.hops[common - 1].role != "switch upstream":
        return "PHB"
    deeper = sum(h.role == "switch upstream" for h in a.hops[common:] + b.hops[common:])
    return "PIX" if deeper == 0 else "PXB"


def parse_cpulist(text: str | None) -> set[int]:
    """CPUs of a sysfs cpulist such as "0-15,32-47" (empty for None or garbage)."""
    out: set[int] = set()
    for part in (text or "").split(","):
        lo, _, hi = part.strip().partition("-")
        if _int(lo) is None or (hi and _int(hi) is None):
            return set()
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def timing_cpu(bdf: str, slot: int, allowed: set[int], root: str | os.PathLike[str] = "/sys") -> int | None:
    """The CPU that times GPU ``bdf``'s host loops: one physical core per ``slot`` (e.g. the GPU's NVML
    index, so a GPU gets the same core alone and beside others), among ``allowed`` CPUs near the GPU
    (its ``local_cpulist``; all ``allowed`` where that is unknown or disjoint). The first core is left to
    the system unless every core is needed (slots 0..N-1 of N cores: the second core .. the last, then the
    first; further slots wrap round); SMT siblings of a core count once. None if nothing is allowed."""
    base = Path(root)
    near = parse_cpulist(_read(base / "bus" / "pci" / "devices" / bdf.lower() / "local_cpulist")) & allowed
    cpus = sorted(near or allowed)
    cores: dict[tuple[int | None, int | None], int] = {}
    for c in cpus:  # first logical CPU of each (package, core)
        topo = base / "devices" / "system" / "cpu" / f"cpu{c}" / "topology"
        key = (_int(_read(topo / "physical_package_id")), _int(_read(topo / "core_id")))
        cores.setdefault(key if None not in key else (c, None), c)
    firsts = sorted(cores.values())
    if not firsts:
        return None
    return firsts[(slot + 1) % len(firsts)]  # slot s: the core after the first s; the first only once all are used
