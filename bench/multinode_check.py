"""Checks a merged two-"node" torchrun job against the app's own truth (bench/multinode_torchrun.sh runs the job;
this is its CPU part, tests/test_merge.py runs it on recorded data): every rank's ranges charged its own GPU on
its own node, each range's bytes per call within what attach states of the truth (bench/_goals.py: >= 2 ms and
>= 1 MB per call within 5 %, else within the stated error + 1 % of the truth), and every range of the merged
report the sum of the nodes' own recordings analysed alone.

    python bench/multinode_check.py MERGED --truth node0=TRUTH0.jsonl --truth node1=TRUTH1.jsonl

TRUTH files: tests/apps/truth_app.py's rows (TRUTH_OUT) of that node's ranks, their pid and tid those of the
attached run; ALONE files (--alone, optional): the same from the job run without attach, whose bytes are then
the truth (the app's truth reads sit inside its ranges, or outside them with TRUTH_READS=outside: then a
range's truth is its window minus gap_ref's). Prints a table; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _goals import GOAL_TEXT, meets_goal  # noqa: E402
from attach_truth import outside_truth, truth_rows  # noqa: E402

#: Merged ranges against the nodes' sums: equal but for floating-point order.
SUM_RTOL = 1e-9


def per_rank(merged: dict, truths: dict[str, Path], alone: dict[str, Path] | None = None) -> pd.DataFrame:
    """One row per (node, rank, range): the truth and attach's bytes per call, its stated error, the GPUs its
    calls were charged and whether it meets the goal. ``truths``: the attached run's rows (which process and
    thread is which rank); ``alone``: where given, the same job run without attach, whose rows are the truth (the
    app's NVML reads under attach also count the sampler's own reads: ~30 kB each, ~2,000 a second)."""
    inst = merged["results"]["range_instances"]
    inst = inst[(inst["domain"] == "truth") & (inst["name"] != "gap_ref")]
    node_gpus = {}
    for g in merged["meta"]["gpus"]:
        node_gpus.setdefault(g["node"], set()).add(int(g["nvml_index"]))
    rows = []
    for node, path in truths.items():
        raw, _ = truth_rows(path)
        values = truth_rows((alone or {}).get(node, path))[0]
        truth = outside_truth(values) if (values.get("reads") == "outside").any() else values
        mine = inst[inst["node"] == node]
        if not len(mine):
            raise SystemExit(f"the merged report has no truth ranges of node {node!r}")
        rank_of = {(int(p), int(t)): (int(r), int(i)) for p, t, r, i in
                   raw[["pid", "tid", "rank", "nvml_index"]].drop_duplicates().itertuples(index=False)}
        keys = list(zip(mine["pid"].astype(int), mine["tid"].astype(int)))
        unknown = sorted({k for k in keys if k not in rank_of})
        if unknown:
            raise SystemExit(f"node {node}: ranges of (pid, tid) {unknown} match no truth row of {path}")
        mine = mine.assign(rank=[rank_of[k][0] for k in keys], own=[rank_of[k][1] for k in keys])
        for (rank, name), g in mine.groupby(["rank", "name"]):
            own = int(g["own"].iloc[0])
            # (by the rank's GPU on its node: c10d's rendezvous may give a node other global ranks in the job run alone)
            t = truth[(truth["nvml_index"] == own) & (truth["range"] == name)]
            row = {"node": node, "rank": int(rank), "gpu": own, "range": name, "calls": len(g),
                   "ms": g["duration_ns"].mean() / 1e6,
                   "own_gpu": own in node_gpus.get(node, set()) and all(list(x) == [own] for x in g["gpus"])}
            for d in ("h2d", "d2h"):
                want, got = float(t[d].median()), float(g[f"{d}_bytes"].mean())
                stated = float((g[f"{d}_edge_bytes"] + g[f"{d}_floor_err_bytes"]).mean())
                row.update({f"{d}_truth": want, f"{d}_ours": got, f"{d}_stated": stated,
                            f"{d}_ok": bool(len(t)) and meets_goal(want, got, stated + 0.01 * abs(want), row["ms"])})
            row["ok"] = row["own_gpu"] and row["h2d_ok"] and row["d2h_ok"]
            rows.append(row)
    return pd.DataFrame(rows)


def sums_match(merged: dict, nodes: dict[str, Path]) -> tuple[bool, pd.DataFrame]:
    """Whether each merged range (calls, bytes, launches) equals the sum of the nodes' own recordings' ranges
    (each analysed alone, as `pcietrace report` would); the differences, relative."""
    import pcietrace

    cols = ["calls", "h2d_bytes", "d2h_bytes", "eager_launches", "graph_launches"]
    alone = pd.concat([pcietrace.load(p).ranges[["domain", "name", *cols]] for p in nodes.values()])
    by_name = alone.groupby(["domain", "name"])[cols]
    # (a total unknown on any node is unknown merged: pcietrace.analysis.merge.sum_ranges)
    want = by_name.sum(min_count=1).mask(alone[cols].isna().groupby([alone["domain"], alone["name"]]).any())
    got = merged["results"]["ranges"].set_index(["domain", "name"])[cols].reindex(want.index)
    rel = ((got - want).abs() / want.abs().where(want.abs() > 0, 1)).astype(float)
    rel = rel.mask(got.isna() & want.isna(), 0.0)  # unknown in both (a range whose bytes no node knows): the same
    return bool(np.isfinite(rel.to_numpy()).all() and (rel.to_numpy() <= SUM_RTOL).all()), rel


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("merged", type=Path)
    ap.add_argument("--truth", action="append", default=[], metavar="NODE=FILE", help="a node's truth rows")
    ap.add_argument("--alone", action="append", default=[], metavar="NODE=FILE",
                    help="a node's truth rows from the same job without attach (the truth values; --truth then only "
                         "says which process is which rank)")
    a = ap.parse_args(argv)
    from pcietrace import multinode

    m = multinode.load(a.merged, timelines=False)
    merged = {"meta": m.meta, "results": m.results}
    truths = dict(x.split("=", 1) for x in a.truth)
    truths = {k: Path(v) for k, v in truths.items()}
    table = per_rank(merged, truths, {k: Path(v) for k, v in (x.split("=", 1) for x in a.alone)})
    nodes = {n["node"]: Path(n["path"]) for n in m.meta["merged"]["nodes"]}
    sums_ok, rel = sums_match(merged, nodes)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        show = table.assign(**{f"{d}_{k}": table[f"{d}_{k}"] / 1e6 for d in ("h2d", "d2h") for k in ("truth", "ours", "stated")})
        print(f"per (node, rank, range), MB per call, truth (in-app NVML) vs attach; ok: {GOAL_TEXT}")
        print(show[["node", "rank", "gpu", "range", "calls", "ms", "h2d_truth", "h2d_ours", "h2d_stated", "d2h_truth",
                    "d2h_ours", "d2h_stated", "own_gpu", "ok"]].to_string(index=False, float_format="{:,.3f}".format))
    ranks = table.groupby(["node", "rank"])["own_gpu"].all()
    print(f"ranks charged their own GPU on their own node: {int(ranks.sum())} of {len(ranks)}")
    print(f"ranges within the goal: {int(table['ok'].sum())} of {len(table)}")
    print(f"merged ranges equal the nodes' own recordings summed: {'yes' if sums_ok else 'NO'} "
          f"(largest relative difference {np.nanmax(rel.to_numpy()) if rel.size else 0:.1e})")
    ok = bool(len(table)) and bool(table["ok"].all()) and sums_ok and len(ranks) >= 2
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
