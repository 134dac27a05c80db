"""Sysfs trees from fixture descriptions (tests/data/topo/*.json, see its README): for tests, and for
``pcietrace topo --fixture`` to show a described machine without having it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any


def config_space(port_type: int | None) -> bytes:
    """256 bytes of config space whose capability list holds one PCIe capability with ``port_type``."""
    cfg = bytearray(256)
    if port_type is not None:
        cfg[0x06] = 0x10  # status: capabilities list present
        cfg[0x34] = 0x40  # first capability
        cfg[0x40:0x44] = bytes([0x10, 0x00, (port_type << 4) | 0x2, 0x00])
    return bytes(cfg)


#: Names that become folders: a PCI address (domain:bus:device.function) and a host bridge (pci<domain>:<bus>).
#: Anything else (``..``, ``/``) could write outside the tree.
BDF = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")
HOST_BRIDGE = re.compile(r"pci[0-9a-fA-F]{4}:[0-9a-fA-F]{2}")


def _checked(name: Any, pattern: re.Pattern, what: str) -> str:
    if not isinstance(name, str) or not pattern.fullmatch(name):
        raise ValueError(f"{what} {name!r} is not a PCI name like {'0000:3b:00.0' if pattern is BDF else 'pci0000:00'}")
    return name


def build(fixture: Path, root: Path) -> Path:
    """Write the sysfs-like tree the fixture describes under ``root``; returns ``root``. Raises ValueError for a
    name that is not a PCI address, a ``link`` that is not [speed, width, max speed, max width], or parents
    that form a cycle."""
    from pcietrace.schema import load_json  # (nesting limited: a deep file is refused, not a RecursionError)

    doc = load_json(Path(fixture).read_bytes())
    by_bdf = {_checked(d["bdf"], BDF, "bdf"): d for d in doc["devices"]}

    def folder(d: dict, seen: tuple[str, ...] = ()) -> Path:
        if d["bdf"] in seen:
            raise ValueError(f"parents form a cycle: {' -> '.join(seen + (d['bdf'],))}")
        if not d["parent"]:
            return root / "devices" / _checked(d["host_bridge"], HOST_BRIDGE, "host_bridge") / d["bdf"]
        return folder(by_bdf[d["parent"]], seen + (d["bdf"],)) / d["bdf"]

    links = root / "bus" / "pci" / "devices"
    links.mkdir(parents=True, exist_ok=True)
    for d in doc["devices"]:
        f = folder(d)
        f.mkdir(parents=True, exist_ok=True)
        files = {"vendor": d["vendor"], "device": d["device"], "class": d["class"],
                 "numa_node": str(d["numa_node"]), "local_cpulist": d["local_cpulist"]}
        if "link" in d:
            if not isinstance(d["link"], list) or len(d["link"]) != 4:
                raise ValueError(f"{d['bdf']}: link {d['link']!r} is not [speed, width, max speed, max width]")
            files.update(current_link_speed=d["link"][0], current_link_width=str(d["link"][1]),
                         max_link_speed=d["link"][2], max_link_width=str(d["link"][3]))
        for name, text in files.items():
            (f / name).write_text(text + "\n")
        (f / "config").write_bytes(config_space(d["port_type"]))
        os.symlink(os.path.relpath(f, links), links / d["bdf"])
    return root


def topology(fixture: Path) -> dict[str, Any]:
    """The topology record (:func:`pcietrace.collectors.topology.collect`) of the machine a fixture describes,
    read through a temporary sysfs tree built from it. Raises UsageError for a file that is not a fixture."""
    import tempfile

    from pcietrace.collectors import topology as topo
    from pcietrace.errors import UsageError

    with tempfile.TemporaryDirectory(prefix="topo-") as tmp:
        try:
            build(Path(fixture), Path(tmp))
            links = _recorded_links(json.loads(Path(fixture).read_bytes()).get("nvml"))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise UsageError(f"{fixture} is not a topology fixture ({type(exc).__name__}: {exc})") from None
        out = topo.collect(None, tmp, links=links)
    # No NVML here: number the GPUs in bus order so narrow tables can say GPU0 instead of a bus id.
    for i, g in enumerate(out["gpus"]):
        g["nvml_index"] = i
    out.update(source=f"fixture {Path(fixture).name}", sysfs_root=None, labels=[f"GPU{i}" for i in range(len(out["gpus"]))],
               notes=out.get("notes", []) + ["GPUs numbered in bus-id order (a fixture has no NVML indices)"])
    return out


def _recorded_links(recorded: Any) -> Any:
    """The NVLink answers a fixture recorded (its ``nvml`` section: each GPU's links by remote PCI id and type,
    the NVLink P2P matrix) as :func:`pcietrace.collectors.topology.collect` reads a live machine's NVML
    (:class:`~pcietrace.collectors.topology.NvLinks`); None where it recorded none."""
    from pcietrace.collectors import nvml, topology as topo

    gpus = recorded.get("gpus") if isinstance(recorded, dict) else None
    if not gpus:
        return None
    counted: dict[str, dict[str, int]] = {}  # (per GPU's bus id: its links per far end, as nvml.nvlink_peers)
    for g in gpus:
        links = counted.setdefault(str(g.get("bus_id", "")).lower(), {})
        for link in g.get("nvlinks") or []:
            far = nvml.NVSWITCH if link.get("remote_type") == "switch" else str(link.get("remote_bus_id", "")).lower()
            links[far] = links.get(far, 0) + 1
    order, p2p = list(counted), recorded.get("nvlink_p2p") or []
    joined = {(a, b) for i, a in enumerate(order) for j, b in enumerate(order)
              if i < len(p2p) and j < len(p2p[i]) and p2p[i][j]}
    return topo.NvLinks(peers=lambda g: counted.get(g["bus_id"].lower(), {}),
                        p2p=lambda a, b: (a["bus_id"].lower(), b["bus_id"].lower()) in joined)
