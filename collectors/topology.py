"""Machine topology for reports: each GPU's PCIe placement (sysfs) plus the GPU<->GPU matrix
(NVML common-ancestor level and NVLink link counts on a real machine; derived from sysfs paths for a
fixture tree, where there is no NVML, with the NVLinks the fixture recorded)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pcietrace.collectors import nvml, sysfs


@dataclass(frozen=True)
class NvLinks:
    """Where :func:`collect` reads a GPU's NVLinks (each a GPU entry: ``nvml_index``, ``bus_id``): ``peers``, its
    active links per remote PCI bus id, those to NVSwitches under :data:`nvml.NVSWITCH`; ``p2p``, whether NVLink
    peer-to-peer joins two GPUs. NVML on a live machine; the answers a fixture recorded."""

    peers: Callable[[dict[str, Any]], dict[str, int]]
    p2p: Callable[[dict[str, Any], dict[str, Any]], bool]


#: A live machine's NVLinks, from NVML.
NVML_LINKS = NvLinks(peers=lambda g: nvml.nvlink_peers(g["nvml_index"]),
                     p2p=lambda a, b: nvml.nvlink_over_p2p(a["nvml_index"], b["nvml_index"]))


def collect(gpus: list[dict[str, Any]] | None = None, sysfs_root: str = "/sys",
            links: NvLinks | None = None) -> dict[str, Any]:
    """``gpus``: dicts with ``nvml_index`` and ``bus_id`` (a real machine), or None to take every
    NVIDIA GPU found under ``sysfs_root`` (fixtures; no NVML involved). ``links``: where NVLinks are read
    (default: NVML for a real machine, none for a sysfs tree).

    Returns ``{"source", "gpus": [placement dicts + nvml_index/name], "labels", "matrix", "nvlinks"}``;
    ``matrix[i][j]`` is "X", "NV<n>" (n NVLink links) or the PCIe relation (PIX/PXB/PHB/NODE/SYS).
    """
    if gpus is None:
        entries = [{"bus_id": b, "nvml_index": None, "name": None} for b in sysfs.nvidia_gpus(sysfs_root)]
        source = "sysfs"
    else:
        entries, source = gpus, "nvml+sysfs"
    links = links or (NVML_LINKS if source != "sysfs" else None)
    places = []
    for g in entries:
        try:
            p = sysfs.placement(g["bus_id"], sysfs_root)
        except OSError:  # not in this tree, or unreadable: keep the GPU, with its placement unknown
            p = sysfs.GpuPlacement(bdf=g["bus_id"], host_bridge="?", numa_node=None, local_cpulist=None)
        places.append((g, p))
    n = len(places)
    matrix = [["X"] * n for _ in range(n)]
    nvlinks = [[0] * n for _ in range(n)]
    notes = []
    known = {p.bdf for _, p in places}
    for i, (gi, pi) in enumerate(places):
        peer_links = dict(links.peers(gi)) if links is not None else {}
        to_switch = peer_links.pop(nvml.NVSWITCH, 0)
        unmatched = sorted(b for b in peer_links if b not in known)
        fanout = to_switch + sum(peer_links[b] for b in unmatched)
        if fanout:
            # Links into NVSwitches reach every peer; so, in a VM whose remote ids match no GPU here,
            # do the unmatched ones. Like `nvidia-smi topo -m` (NV18 between every pair of an HGX
            # board), each counts fully toward every peer that NVML's NVLink P2P status names.
            peers = [j for j, (gj, _) in enumerate(places) if j != i and links.p2p(gi, gj)]
            for j in peers:
                peer_links[places[j][1].bdf] = peer_links.get(places[j][1].bdf, 0) + fanout
            if peers:
                via = ([f"{to_switch} NVLink links to NVSwitches"] if to_switch else []) + \
                      ([f"{fanout - to_switch} NVLink links with remote PCI ids {unmatched} matching no GPU here"]
                       if unmatched else [])
                who = f"GPU{gi['nvml_index']}" if gi.get("nvml_index") is not None else pi.bdf
                notes.append(f"{who}: {' and '.join(via)}, counted toward every peer that NVML's "
                             "NVLink P2P status reports (as nvidia-smi does)")
        for j, (gj, pj) in enumerate(places):
            if i == j:
                continue
            nvlinks[i][j] = peer_links.get(pj.bdf, 0)
            if nvlinks[i][j]:
                matrix[i][j] = f"NV{nvlinks[i][j]}"
            elif source == "sysfs":
                matrix[i][j] = sysfs.pcie_relation(pi, pj)
            else:
                matrix[i][j] = nvml.common_ancestor(gi["nvml_index"], gj["nvml_index"])
    return {"source": source, "sysfs_root": str(sysfs_root),
            "gpus": [{**p.to_dict(), "nvml_index": g.get("nvml_index"), "name": g.get("name")} for g, p in places],
            "labels": [f"GPU{g['nvml_index']}" if g.get("nvml_index") is not None else p.bdf for g, p in places],
            "matrix": matrix, "nvlinks": nvlinks, "notes": notes}
