"""`pcietrace attach` of a torchrun job annotated at real NVTX density, against NVML read inside each rank.

tests/apps/dense_app.py under ``torchrun --nproc_per_node N`` (one process per GPU; every rank runs the five
phases: one range, a range per layer, emit_nvtx, Megatron-style nesting, emit_nvtx training), first alone (each
rank's truth: its own NVML reads around each phase, less an empty window's), then under attach. Per rank, phase and
direction: the truth (median call), attach's mean call, the error and attach's stated bound; every rank's ranges
must be charged its own GPU only, every direction within its bound, those of >= 1 MB within 2 %. Exit 1 if not.

    python3 bench/dense_torchrun.py --gpus 2 --calls 4 --out DIR [--attach-args='--sample-interval-ms 2']
    python3 bench/dense_torchrun.py --out DIR --again     # the comparison again, from DIR's runs (no GPU)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "tests" / "apps" / "dense_app.py"


def job(a: argparse.Namespace, tag: str, attach: bool) -> Path | None:
    out = a.out / tag
    out.mkdir(parents=True)
    env = {**os.environ, "BLIND_OUT": str(out / "app.jsonl"), "BLIND_CALLS": str(a.calls)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(a.gpus), str(APP)]
    if attach:
        cmd = [sys.executable, "-m", "pcietrace", "attach", "-o", str(out / "attach"), *a.attach_args, "--", *cmd]
    with open(out / "log.txt", "w") as log:
        rc = subprocess.run(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=a.timeout_s).returncode
    if rc:
        sys.exit(f"dense_torchrun: {tag} failed (exit {rc}); see {out / 'log.txt'}")
    return out


def ranks(folder: Path) -> dict[int, tuple[dict, pd.DataFrame]]:
    """Per rank: its meta line and its range rows."""
    out = {}
    for f in sorted(folder.glob("app.rank*.jsonl")):
        rows = [json.loads(x) for x in f.read_text().splitlines()]
        out[int(f.stem.split("rank")[1])] = (rows[0], pd.DataFrame([r for r in rows if r.get("kind") == "range"]))
    return out


def sample_counter(folder: Path) -> Any:
    """``reads(gpu, t0, t1)``: how many of the recording's counter samples of GPU ``gpu`` lie inside (t0, t1)."""
    from pcietrace.session import Session

    s = Session.load(folder)
    if len(s.samples):  # (held: a recording made before samples were saved a GPU at a time)
        times = {int(i): g["t_ns"].to_numpy() for i, g in s.samples.groupby("nvml_index")}
    else:
        times = {int(i): s.sample_file.read(i)["t_ns"].to_numpy() for i in s.sample_file.gpus}

    def reads(gpu: int, t0: int, t1: int) -> int:
        t = times[int(gpu)]
        return int(np.searchsorted(t, t1, "left") - np.searchsorted(t, t0, "right"))
    return reads


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=2, help="ranks, one per GPU (default 2)")
    ap.add_argument("--calls", type=int, default=4, help="calls of each phase per rank (default 4)")
    ap.add_argument("--out", type=Path, required=True, help="a new folder for everything")
    ap.add_argument("--timeout-s", type=float, default=500)
    ap.add_argument("--attach-args", default="", type=shlex.split,
                    help="extra `pcietrace attach` options, one string, e.g. --attach-args='--sample-interval-ms 2'")
    ap.add_argument("--again", action="store_true", help="compare the runs already in --out again (no GPU)")
    a = ap.parse_args()
    a.out = a.out.resolve()
    alone, attached = (a.out / "alone", a.out / "attached") if a.again else \
        (job(a, "alone", False), job(a, "attached", True))
    rep = subprocess.run([sys.executable, "-m", "pcietrace", "report", str(attached / "attach"), "--format", "json"],
                         capture_output=True, text=True, cwd=ROOT, check=True)
    results = json.loads(rep.stdout)["results"]
    inst = pd.DataFrame(results["range_instances"])
    floor = pd.DataFrame(results["floor"]).set_index("nvml_index")
    reads_in = sample_counter(attached / "attach")
    truth, seen = ranks(alone), ranks(attached)
    rows, details, fails = [], [], 0
    for rank, (meta, df) in sorted(truth.items()):
        pid, gpu = seen[rank][0]["pid"], seen[rank][0]["nvml_index"]
        mine = inst[inst["pid"] == pid]
        own = mine["gpus"].map(lambda g: list(g) == [gpu]).all()
        med = df.groupby("name")[["h2d_bytes", "d2h_bytes"]].median()
        for name, t in med.iterrows():
            calls = mine[mine["name"] == name]
            for d in ("h2d", "d2h"):
                got = calls[f"{d}_bytes"].mean()
                bound = (calls[f"{d}_edge_bytes"] + calls[f"{d}_floor_err_bytes"]).mean()
                ok = own and abs(got - t[f"{d}_bytes"]) <= bound and (
                    t[f"{d}_bytes"] < 1e6 or abs(got / t[f"{d}_bytes"] - 1) <= 0.02)
                fails += not ok
                if not ok:  # (each call of a direction that failed, against the truth's calls: where it went wrong)
                    lo, hi = df.loc[df["name"] == name, f"{d}_bytes"].agg(["min", "max"])
                    # the attached app's own reads around each call: they hold attach's reads too, but a call that
                    # moved more in this run than alone shows there (2x H200: one call +270 kB D2H in both)
                    own_reads = seen[rank][1].loc[seen[rank][1]["name"] == name, f"{d}_bytes"].tolist()
                    for i, c in enumerate(calls.sort_values("t_start_ns").itertuples()):
                        bound_c = getattr(c, f"{d}_edge_bytes") + getattr(c, f"{d}_floor_err_bytes")
                        app = f", the app's own reads attached {own_reads[i]:,.0f}" if i < len(own_reads) else ""
                        # what a counter read cost inside the call, had the truth been exact, against what the
                        # floor charged one (a read's cost moves with the GPU's state: docs/method.md)
                        n = reads_in(gpu, c.t_start_ns, c.t_end_ns)
                        bg = floor[f"{d}_background_Bps"].get(gpu, np.nan) * c.duration_ns / 1e9
                        cost = (getattr(c, f"{d}_raw_bytes") - t[f"{d}_bytes"] - bg) / n if n else np.nan
                        app += (f", a read {cost:,.0f} B implied ({n} reads), "
                                f"{floor[f'{d}_bytes_per_read_program'].get(gpu, np.nan):,.0f} B charged")
                        details.append(f"  rank {rank} {name} {d.upper()} call {i}: attach {getattr(c, f'{d}_bytes'):,.0f} "
                                       f"± {bound_c:,.0f}, truth {lo:,.0f} ... {hi:,.0f}{app}, {c.duration_ns / 1e6:.2f} ms, "
                                       f"stalls {c.stalls}, {c.status}")
                rows.append({"rank": rank, "GPU": gpu, "own GPU": own, "range": name, "dir": d.upper(),
                             "truth": round(t[f"{d}_bytes"]), "attach": round(got), "err %": 100 * (got / t[f"{d}_bytes"] - 1),
                             "± bound": round(bound), "ok": ok, "launches": int(calls["eager_launches"].mean())})
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda x: f"{x:+.2f}"))
    print(f"\n{len(table) - fails}/{len(table)} directions within their stated error (>= 1 MB: within 2 %), every rank "
          f"on its own GPU: {bool(table['own GPU'].all())}")
    if details:
        print("\nthe calls of each direction that failed:", *details, sep="\n")
    table.to_csv(a.out / "comparison.csv", index=False)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
