"""Machine topology for reports: each GPU's PCIe placement (sysfs) plus the GPU<->GPU matrix
(NVML common-ancestor level and NVLink link counts on a real machine; derived from sysfs paths for a
fixture tree, where there is no NVML)."""

from __future__ import annotations

from typing import Any

from pcietrace.collectors import nvml, sysfs


def collect(gpus: list[dict[str, Any]] | None = None, sysfs_root: str = "/sys") -> dict[str, Any]:
    """``gpus``: dicts with ``nvml_index`` and ``bus_id`` (a real machine), or None to take every
    NVIDIA GPU found under ``sysfs_root`` (fixtures; no NVML involved).

    Returns ``{"source", "gpus": [placement dicts + nvml_index/name], "labels", "matrix", "nvlinks"}``;
    ``matrix[i][j]`` is "X", "NV<n>" (n NVLink links) or the PCIe relation (PIX/PXB/PHB/NODE/SYS).
    """
    if gpus is None:
        entries = [{"bus_id": b, "nvml_index": None, "name": None} for b in sysfs.nvidia_gpus(sysfs_root)]
        source = "sysfs"
    else:
        entries, source = gpus, "nvml+sysfs"
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
        links = nvml.nvlink_peers(gi["nvml_index"]) if source != "sysfs" else {}
        to_switch = links.pop(nvml.NVSWITCH, 0)
        unmatched = sorted(b for b in links if b not in known)
        fanout = to_switch + sum(links[b] for b in unmatched)
        if fanout:
            # Links into NVSwitches reach every peer; so, in a VM whose remote ids match no GPU here,
            # do the unmatched ones. Like `nvidia-smi topo -m` (NV18 between every pair of an HGX
            # board), each counts fully toward every peer that NVML's NVLink P2P status names.
            peers = [j for j, (gj, _) in enumerate(places) if j != i and nvml.nvlink_over_p2p(gi["nvml_index"], gj["nvml_index"])]
            for j in peers:
                links[places[j][1].bdf] = links.get(places[j][1].bdf, 0) + fanout
            if peers:
                via = ([f"{to_switch} NVLink links to NVSwitches"] if to_switch else []) + \
                      ([f"{fanout - to_switch} NVLink links with remote PCI ids {unmatched} matching no GPU here"]
                       if unmatched else [])
                notes.append(f"GPU{gi['nvml_index']}: {' and '.join(via)}, counted toward every peer that NVML's "
                             "NVLink P2P status reports (as nvidia-smi does)")
        for j, (gj, pj) in enumerate(places):
            if i == j:
                continue
            nvlinks[i][j] = links.get(pj.bdf, 0)
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
