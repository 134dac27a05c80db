"""Builds a sysfs-like tree from a fixture description in tests/data/topo/*.json (see its README)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def config_space(port_type: int | None) -> bytes:
    """256 bytes of config space whose capability list holds one PCIe capability with ``port_type``."""
    cfg = bytearray(256)
    if port_type is not None:
        cfg[0x06] = 0x10  # status: capabilities list present
        cfg[0x34] = 0x40  # first capability
        cfg[0x40:0x44] = bytes([0x10, 0x00, (port_type << 4) | 0x2, 0x00])
    return bytes(cfg)


def build(fixture: Path, root: Path) -> Path:
    doc = json.loads(Path(fixture).read_text())
    by_bdf = {d["bdf"]: d for d in doc["devices"]}

    def folder(d: dict) -> Path:
        parent = folder(by_bdf[d["parent"]]) if d["parent"] else root / "devices" / d["host_bridge"]
        return parent / d["bdf"]

    links = root / "bus" / "pci" / "devices"
    links.mkdir(parents=True, exist_ok=True)
    for d in doc["devices"]:
        f = folder(d)
        f.mkdir(parents=True, exist_ok=True)
        files = {"vendor": d["vendor"], "device": d["device"], "class": d["class"],
                 "numa_node": str(d["numa_node"]), "local_cpulist": d["local_cpulist"]}
        if "link" in d:
            files.update(current_link_speed=d["link"][0], current_link_width=str(d["link"][1]),
                         max_link_speed=d["link"][2], max_link_width=str(d["link"][3]))
        for name, text in files.items():
            (f / name).write_text(text + "\n")
        (f / "config").write_bytes(config_space(d["port_type"]))
        os.symlink(os.path.relpath(f, links), links / d["bdf"])
    return root
