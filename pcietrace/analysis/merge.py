"""One report from the attach recordings of a job's nodes: each node's result tables (analysed on their own,
see :mod:`pcietrace.multinode`) put side by side with the node they came from, their times moved onto one clock,
and each NVTX range summed across nodes. Pure: tables in, tables out.

Every merged table starts with :data:`NODE_COLUMNS`. Times (``t_start_ns``/``t_end_ns``/``t_ns``) are
wall-clock ns (CLOCK_REALTIME): each node's CLOCK_MONOTONIC times plus its recorded offset
(:func:`pcietrace.record.node.clock_offset`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from pcietrace.analysis import attribution
from pcietrace.analysis.notes import Note

#: The columns every merged table starts with: the node's name (its label, else its host), host and label.
NODE_COLUMNS = ["node", "host", "label"]
#: The result tables each node's worker hands back: a few rows per GPU or range name (the range instances and
#: timelines, which grow with the run, stay in the node's folder: the merging process never holds every node's).
NODE_TABLES = ("sampling", "floor", "ranges", "whole_run", "notes")
#: Columns of the ``ranges`` table of a merged report: a range's figures summed over every node's calls
#: (:data:`attribution.SUMMARY_COLUMNS`, ``gpus`` as "node:index" strings; a column that describes the range
#: rather than counting, e.g. its parent, is taken from its first node), and the nodes it ran on.
MERGED_RANGE_COLUMNS = [*attribution.SUMMARY_COLUMNS, "nodes"]
#: Time columns moved onto the wall clock.
TIME_COLUMNS = ("t_start_ns", "t_end_ns", "t_ns")
#: Sums that are unknown (NaN) where any node's is.
_STRICT_SUMS = ("h2d_bytes", "d2h_bytes", "excl_h2d_bytes", "h2d_floor_err_bytes", "d2h_floor_err_bytes",
                "eager_launches", "graph_launches", "captured_launches", "graph_savings_ms", "gpu_busy_ms",
                "launch_overhead_ms")
_SUMS = ("calls", "incl_ms", "excl_ms", "h2d_raw_bytes", "d2h_raw_bytes", "h2d_edge_bytes", "d2h_edge_bytes",
         "stalls", "short_calls", "unknown_calls", "h2d_measured_bytes", "d2h_measured_bytes")


def node_info(meta: dict[str, Any], path: str) -> dict[str, Any]:
    """Who a recording is: ``node`` (its label, else its host), ``host``, ``label``, ``launcher`` (rank
    variables), ``offset_ns``/``offset_uncertainty_ns`` (wall clock minus the samples' clock; None where the
    recording predates them) and ``path``."""
    node = meta.get("node") or {}
    host = str(node.get("host") or meta.get("host") or "?")
    label = node.get("label")
    clock = node.get("clock") or {}
    return {"node": str(label or host), "host": host, "label": label, "launcher": node.get("launcher") or {},
            "offset_ns": clock.get("realtime_minus_monotonic_ns"), "offset_uncertainty_ns": clock.get("uncertainty_ns"),
            "path": path}


def tag(df: pd.DataFrame, info: dict[str, Any]) -> pd.DataFrame:
    """``df`` with :data:`NODE_COLUMNS` in front and its times on the wall clock (unchanged where the node
    recorded no offset)."""
    shift = int(info.get("offset_ns") or 0)
    out = df.assign(**{c: df[c] + shift for c in TIME_COLUMNS if c in df.columns})
    out.insert(0, "label", pd.Series([info["label"]] * len(df), index=df.index, dtype=object))
    out.insert(0, "host", info["host"])
    out.insert(0, "node", info["node"])
    return out


def sum_ranges(by_node: pd.DataFrame) -> pd.DataFrame:
    """Each (domain, name) summed over the nodes' ``ranges`` rows (``by_node``: :data:`NODE_COLUMNS` +
    :data:`attribution.SUMMARY_COLUMNS`): totals add up (those unknown on any node stay unknown), ``status`` is
    the worst, ``gpus`` every "node:index" charged, ``nodes`` how many nodes ran it; ``h2d_bytes_per_launch``
    is recomputed from the sums; the parent is the first node's, and ``parent_calls`` the nodes' calls in it
    where every node placed the range under that parent (else unknown: NaN)."""
    if not len(by_node):
        return pd.DataFrame(columns=MERGED_RANGE_COLUMNS)
    rank = {s: i for i, s in enumerate(attribution.STATUSES)}
    at = by_node.assign(status_rank=by_node["status"].map(rank),
                        gpus=[[f"{n}:{int(i)}" for i in g] for n, g in zip(by_node["node"], by_node["gpus"])])
    strict = [*_STRICT_SUMS, *["parent_calls"] * ("parent_calls" in at)]
    if "parent_calls" in at:  # (nodes that placed it under different parents counted calls in different ranges)
        parents = at[["parent_domain", "parent_name"]].groupby([at["domain"], at["name"]], sort=False)
        at["parent_calls"] = at["parent_calls"].astype(float).where(
            ~(parents.transform("nunique", dropna=False) > 1).any(axis=1))
    g = at.groupby(["domain", "name"], sort=False)
    handled = {"domain", "name", "status", "gpus", "h2d_bytes_per_launch", *_SUMS, *strict}
    same = [c for c in attribution.SUMMARY_COLUMNS if c not in handled and c in at]  # alike on every node
    out = g.agg(**{c: (c, "sum") for c in _SUMS},
                **{c: (c, lambda s: s.sum(min_count=len(s))) for c in strict},
                **{c: (c, "first") for c in same},
                status_rank=("status_rank", "max"), nodes=("node", "nunique"),
                gpus=("gpus", lambda s: sorted({i for g in s for i in g}))).reset_index()
    out["status"] = out.pop("status_rank").map(dict(enumerate(attribution.STATUSES)))
    launches = out["eager_launches"] + out["graph_launches"]
    out["h2d_bytes_per_launch"] = np.where(launches > 0, out["h2d_bytes"] / launches.where(launches > 0, 1), np.nan)
    return out[MERGED_RANGE_COLUMNS].sort_values("incl_ms", ascending=False, kind="stable").reset_index(drop=True)


def combine(nodes: list[tuple[dict[str, Any], dict[str, pd.DataFrame]]]) -> dict[str, pd.DataFrame]:
    """The merged tables from each node's ``(info, tables)`` (:func:`node_info`; :data:`NODE_TABLES`), in the
    nodes' order: every node table tagged and stacked, ``ranges`` summed across nodes
    (:func:`sum_ranges`) and ``ranges_by_host`` each node's own; notes say which node they are about. (The
    range instances are each node's, :func:`tag`-ged by its worker.)"""
    stacked = {t: pd.concat([tag(tables[t], info) for info, tables in nodes if len(tables[t])], ignore_index=True)
               if any(len(tables[t]) for _, tables in nodes) else
               pd.DataFrame(columns=[*NODE_COLUMNS, *nodes[0][1][t].columns]) for t in NODE_TABLES}
    notes = stacked.pop("notes")
    out = dict(stacked, ranges=sum_ranges(stacked["ranges"]), ranges_by_host=stacked["ranges"])
    out["notes"] = pd.DataFrame({"note": pd.Series([Note("node_note", node=r.node, note=r.note)
                                                    for r in notes.itertuples()] + clock_notes(nodes), dtype=object)},
                                columns=["note"])
    return out


def clock_notes(nodes: list[tuple[dict[str, Any], dict[str, pd.DataFrame]]]) -> list[Note]:
    """How the nodes' times were put on one clock, and which could not be."""
    missing = [info["node"] for info, _ in nodes if info.get("offset_ns") is None]
    worst = max((info["offset_uncertainty_ns"] or 0 for info, _ in nodes if info.get("offset_ns") is not None), default=0)
    out = [Note("wall_clock", uncertainty_us=worst / 1e3)]
    if missing:
        out.append(Note("no_clock_offset", nodes=", ".join(missing)))
    return out
