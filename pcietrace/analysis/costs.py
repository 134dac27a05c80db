"""Per-launch costs that attach multiplies by its launch counts: one place derives them, whether from a
saved ``pcietrace run`` or from attach's on-the-spot bursts. Stateless: tables in, a dict out."""

from __future__ import annotations

from typing import Any

import pandas as pd

from pcietrace.analysis import analyze, launch
from pcietrace.errors import UsageError

#: The launch-cost keys (us): host time per eager / graph launch call with the queue never full, and
#: end-to-end wall time per empty kernel launched eager vs from a graph.
LAUNCH_COST_KEYS = ("host_us_per_eager_launch", "host_us_per_graph_launch", "wall_us_per_kernel_eager",
                    "wall_us_per_kernel_graph")


def launch_costs(cpu_cost: pd.DataFrame, speedup: pd.DataFrame, source: str,
                 nvml_index: int | None = None) -> dict[str, Any]:
    """:data:`LAUNCH_COST_KEYS` from the ``cpu_cost`` and ``speedup`` tables of one GPU (``nvml_index``,
    default the lowest), at the shortest kernel duration measured; ``source`` says where they came from."""
    if not len(cpu_cost) or not len(speedup):
        raise UsageError(f"{source} has no launch-cost tables (is it a `pcietrace run`?)")
    idx = int(cpu_cost["nvml_index"].min()) if nvml_index is None else nvml_index
    host = cpu_cost[cpu_cost["nvml_index"] == idx].set_index("mode")["host_us_per_call"]
    sp = speedup[speedup["nvml_index"] == idx].sort_values("kernel_us")
    if not {"eager", "graph"} <= set(host.index) or not len(sp):
        raise UsageError(f"{source} has no eager and graph launch costs for GPU {idx}")
    return {"host_us_per_eager_launch": float(host["eager"]), "host_us_per_graph_launch": float(host["graph"]),
            "wall_us_per_kernel_eager": float(sp["eager_wall_us"].iloc[0]),
            "wall_us_per_kernel_graph": float(sp["graph_wall_us"].iloc[0]), "source": source}


def from_records(bursts: list[dict[str, Any]], e2e: list[dict[str, Any]], source: str) -> dict[str, Any]:
    """Launch costs from raw burst and end-to-end records (attach's on-the-spot calibration)."""
    b, e = pd.DataFrame(bursts).assign(nvml_index=0), pd.DataFrame(e2e).assign(nvml_index=0)
    return launch_costs(launch.cpu_cost(b), launch.speedup(e), source)


def from_run(session: Any, source: str) -> dict[str, Any]:
    """Launch costs from a saved ``pcietrace run`` (attach's ``--baseline``), at its lowest GPU."""
    res = analyze(session)
    return launch_costs(res["cpu_cost"], res["speedup"], source)
