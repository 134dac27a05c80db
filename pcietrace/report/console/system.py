"""What the console shows of every command's session: the banners and summary lines first (:func:`head`), the
system (GPUs, sampling) and the PCIe topology."""

from __future__ import annotations

from typing import Any

import pandas as pd
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from pcietrace.analysis.summary import link_label, short_name
from pcietrace.report.console.cells import esc, new_table, node_gpu, num, pci_id, summary_lines, unknown
from pcietrace.report.notes import merge_gpu_notes
from pcietrace.analysis.summary import gpu_label


def system_table(meta: dict[str, Any], sampling: pd.DataFrame) -> Table:
    pinned = any(g.get("timing_cpu") is not None for g in meta.get("gpus", []))  # runs since timed steps took turns
    resets = "counter_jumps" in sampling and bool(sampling["counter_jumps"].any())
    # (the ways its GPUs were read; a report that reads no counter, `latency`, records none: not a low-res one)
    modes = {g["counter"].get("mode") == "fields" for g in meta.get("gpus", []) if g.get("counter")}
    counter = " or ".join(["NVML fields 197/198 (32-bit, wrapping)"] * (True in modes)
                          + ["the 20 ms throughput API (LOW RES)"] * (False in modes)) or "none read"
    t = new_table("System", [("GPU", "right"), ("model", "left"), ("bus id", "right"), ("PCIe", "left"),
                             ("counter", "left"), ("reads/s", "right"), ("gap ms", "right")]
                  + ([("timing CPU", "right")] if pinned else []),
                  caption=esc(f"driver {meta.get('driver', '?')}, host {meta.get('host', '?')}, {meta.get('created', '')}; "
                              f"counter: {counter}; "
                              + ("reset(s): steps no link could move, the bytes across them unknown (windows left out, "
                                 "ranges 'wrap risk'); " if resets else "")
                              + "gap: median time between background samples"
                              + ("; timing CPU: the core that timed the GPU's host loops, one GPU at a time (beside "
                                 "others: its turn did not come in time, so its timed figures may have shifted)" if pinned else "")))
    keys = ["node", "nvml_index"] if "node" in sampling else ["nvml_index"]  # (a merged report: GPUs of several nodes)
    smp = sampling.set_index(keys) if len(sampling) else None
    for g in meta.get("gpus", []):
        c = g.get("counter", {})
        src = f"{c.get('bits', 32)}-bit" if c.get("mode") == "fields" else "[yellow]LOW RES[/]" if c else "–"
        key = tuple(g.get(k) for k in keys) if len(keys) > 1 else g["nvml_index"]
        row = smp.loc[key] if smp is not None and key in smp.index else None
        jumps = int(row.get("counter_jumps", 0)) if row is not None else 0
        src += f" [yellow]{jumps} reset(s)[/]" if jumps else ""
        t.add_row(node_gpu(g), esc(short_name(g.get("name"))), esc(g.get("bus_id", "?")),
                  esc(link_label(g)), src, num(row["rate_hz"] if row is not None else None),
                  num(row["median_gap_us"] / 1e3 if row is not None else None, ".1f"),
                  *([num(g.get("timing_cpu")) + (" [yellow](beside others)[/]" if g.get("timed_beside_others") else "")]
                    if pinned else []))
    return t


def hop(h: dict[str, Any]) -> str:
    link = f" {h['link_speed'].replace(' PCIe', '')} x{unknown(h['link_width'])}" if h.get("link_speed") else ""
    best = ""
    if h.get("max_link_speed") and (h["max_link_speed"], h["max_link_width"]) != (h.get("link_speed"), h.get("link_width")):
        best = f" (max {h['max_link_speed'].replace(' PCIe', '')} x{unknown(h['max_link_width'])})"
    return esc(f"{h['bdf']} {h['role']} {pci_id(h.get('vendor'))}:{pci_id(h.get('device'))}{link}{best}")


def topology_tables(topo: dict[str, Any]) -> list[Any]:
    """Per-GPU placement, each GPU's PCIe path (as text under the table) and the GPU<->GPU matrix."""
    named = any(g.get("name") for g in topo.get("gpus", []))  # fixtures and sysfs alone have no model names
    t = new_table(esc(f"PCIe placement (source: {topo.get('source')})"),
                  [("GPU", "right")] + ([("model", "left")] if named else []) + [
                      ("bus id", "right"), ("NUMA", "right"), ("CPUs", "left"), ("levels", "right")],
                  caption="levels: PCIe switch levels between the GPU and its root port")
    paths = []
    for g in topo.get("gpus", []):
        label = gpu_label(g["nvml_index"]) if g.get("nvml_index") is not None else esc(g["bdf"])
        model = [esc(short_name(g.get("name"))) if g.get("name") else "–"] if named else []
        t.add_row(label, *model, esc(g["bdf"]), esc(unknown(g.get("numa_node"))),
                  esc(unknown(g.get("local_cpulist"))), esc(unknown(g.get("switch_levels"))))
        paths.append("\n".join([f"{label}: {g['host_bridge']}"] + [f"  {hop(h)}" for h in g.get("hops", [])]))
    parts: list[Any] = [t, Text("PCIe path from the root complex down:\n" + "\n".join(paths), style="dim")]
    labels = topo.get("labels", [])
    if labels:
        m = new_table("GPU <-> GPU", [("", "left")] + [(esc(lab), "right") for lab in labels])
        for lab, row in zip(labels, topo.get("matrix", [])):
            m.add_row(esc(lab), *(esc(x) for x in row))
        parts += [m, Text("X self; NV# NVLink links; PIX one PCIe switch; PXB several switches; PHB host bridge; "
                          "NODE across host bridges in a NUMA node; SYS across NUMA nodes", style="dim")]
    parts.extend(Text(f"note: {n}", style="dim") for n in merge_gpu_notes(topo.get("notes", [])))
    return parts


def head(meta: dict[str, Any], summary: dict[str, Any] | None) -> list[Any]:
    """A SIMULATED banner and an unfinished run's status where they apply, then the summary lines."""
    parts: list[Any] = []
    if meta.get("simulated"):
        parts.append(Panel(Text("SIMULATED — no GPU was used; figures come from a model of "
                                f"{meta.get('sim_source', 'a recorded real run')}", style="bold yellow")))
    if meta.get("status", "complete") != "complete":
        cut = meta.get("interrupted") if isinstance(meta.get("interrupted"), dict) else {}
        how = f"; {cut.get('how')}: its last {cut.get('lost_at_most_s', 0):g} s at most are missing" if cut else ""
        parts.append(Panel(Text(f"run status: {meta.get('status')} — tables show what was recorded{how}", style="bold red")))
    if summary and summary.get("lines"):
        parts.extend(summary_lines(summary) + [Text("")])
    return parts
