"""`pcietrace attach` against a blind oracle: an app whose traffic is known (run on a GPU).

Apps, each written from the user's side by someone who did not read attach's code, with the same output:
``--app torch`` (default) is tests/apps/blind_app.py (PyTorch: torch.cuda.nvtx, pinned, pageable, zero-copy);
``--app cpp`` is tests/apps/blind_app.cu (CUDA runtime + NVTX3 C++ in a named domain, unified memory,
registered host memory, 2D copies, cooperative / Ex / per-thread-stream launches, graph replays, 4 threads),
built here with nvcc; ``--app graphs`` is tests/apps/blind_graphs_app.py (PyTorch: copies inside replayed CUDA
graphs, a side stream's copy beside compute, a capture with no replay, a start/end range ended on another
thread, 50 short ranges inside one); ``--app dense`` is tests/apps/dense_app.py (a range per layer, emit_nvtx,
Megatron-style nesting); ``--app loader`` is tests/apps/loader_app.py (a training epoch fed by a DataLoader with
forked workers and pinned memory, fp16 autocast with GradScaler, an evaluation pass, a checkpoint to memory);
``--app compile`` is tests/apps/compile_app.py (the same inference loop eager, under torch.compile's Triton
kernels and under its CUDA graphs, launches counted by torch.profiler); ``--app pipeline`` is
tests/apps/pipeline_app.py (two GPUs, one thread: a model split over them, copies to and from cuda:1 made
from a thread on cuda:0; its truth both GPUs' bytes); ``--app hooks`` is tests/apps/hooks_app.py (a transformer
annotated by module hooks, bf16 autocast, AdamW, ``.item()`` every step, emit_nvtx with its defaults); ``--app serve``
is tests/apps/serve_app.py (an inference server: worker threads on streams of their own serving requests ranged by
the ``nvtx`` package's decorator in a named domain, a decode loop replaying a CUDA graph, bulk copies); ``--app procs``
is tests/apps/procs_app.py (a second process on the same GPU, started by torch.multiprocessing's spawn, copying and
launching in ranges of its own); ``--app cupy`` is tests/apps/cupy_app.py (CuPy alone, no torch).

Written as an outside reviewer would, from what a user has: the README, `pcietrace attach --help` and the
JSON that `pcietrace report RUN --format json` prints. Steps:

1. the app alone, with its own NVML reads outside every range (the truth; per range, the median call);
2. the same app under `pcietrace attach -o OUT/attach` (the same truth reads on, so attach sees the same app),
   then `pcietrace report OUT/attach --format json`;
3. per range and direction: truth per call, attach per call (its `ranges` table holds totals over the calls:
   divided by `calls`), error in bytes and %, attach's stated bound (edges + floor interval, `*_edge_bytes` +
   `*_floor_err_bytes`, also totals), whether |error| <= bound, and launches expected vs counted;
4. runtime: the app alone vs attached with BLIND_TRUTH=0 (no NVML reads in the app, same sleeps), alternated
   (ABBA), `--pairs` pairs: the loop's wall time and each range's median duration.

Everything lands under --out: the app's JSON lines, the attach folders and logs, summary.json.

    python3 bench/blind_attach.py --out DIR [--calls 8] [--pairs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _goals import BIG_BYTES, GOAL_PCT, GOAL_TEXT, checked_in_pct, meets_goal  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
APPS = ROOT / "tests" / "apps"
NVCC = ["nvcc", "-O2", "-std=c++17", "-ldl", "-lpthread"]
DIRS = ("h2d", "d2h")
PY_APPS = {"torch": "blind_app.py", "graphs": "blind_graphs_app.py", "dense": "dense_app.py",
           "loader": "loader_app.py", "compile": "compile_app.py",
           "pipeline": "pipeline_app.py", "hooks": "hooks_app.py", "serve": "serve_app.py",
           "procs": "procs_app.py", "cupy": "cupy_app.py"}  # --app: the Python apps (cupy: CuPy, the rest PyTorch)


def run(cmd: list[str], log: Path, env: dict[str, str], timeout_s: float) -> tuple[int, float]:
    """Run ``cmd`` with stdout+stderr to ``log``; (exit code, wall seconds)."""
    t0 = time.monotonic()
    with open(log, "w") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        f.flush()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT, timeout=timeout_s).returncode
    return rc, time.monotonic() - t0


def read_jsonl(path: Path) -> tuple[dict, pd.DataFrame, dict]:
    """The app's output: (meta line, one row per range call / reference window, end line)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    meta = next(r for r in rows if r["kind"] == "meta")
    end = next(r for r in rows if r["kind"] == "end")
    return meta, pd.DataFrame([r for r in rows if r["kind"] in ("range", "ref")]), end


class Runner:
    """Runs the app alone or under attach, with the app's environment set per run."""

    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.out: Path = a.out

    def app(self, tag: str, truth: bool, attach: bool) -> tuple[Path, Path | None]:
        """One run of the app; its JSON lines (and the attach folder). Exits on a failed run."""
        jsonl = self.out / f"{tag}.jsonl"
        env = {**os.environ, "BLIND_OUT": str(jsonl), "BLIND_CALLS": str(self.a.calls),
               "BLIND_TRUTH": "1" if truth else "0", "PYTHONUNBUFFERED": "1"}
        app_cmd = self.a.app_cmd
        folder = self.out / tag if attach else None
        cmd = ([self.a.python, "-m", "pcietrace", "attach", "-o", str(folder), *self.a.attach_args, "--", *app_cmd]
               if attach else app_cmd)
        rc, wall_s = run(cmd, self.out / f"{tag}.log", env, self.a.timeout_s)
        print(f"  {tag}: exit {rc}, {wall_s:.1f} s ({self.out / f'{tag}.log'})", flush=True)
        if rc != 0 or not jsonl.exists():
            sys.exit(f"blind_attach: {tag} failed (exit {rc}); see {self.out / f'{tag}.log'}")
        return jsonl, folder

    def report_json(self, folder: Path) -> dict:
        """`pcietrace report FOLDER --format json`, as a user reads an attach run (also saved beside it)."""
        cmd = [self.a.python, "-m", "pcietrace", "report", str(folder), "--format", "json"]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=self.a.timeout_s)
        if p.returncode != 0:
            sys.exit(f"blind_attach: {shlex.join(cmd)} failed (exit {p.returncode}): {p.stderr.strip()[-500:]}")
        (folder.parent / f"{folder.name}_report.json").write_text(p.stdout)
        return json.loads(p.stdout)


def truth_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per range name: the median call's truth bytes (None for ranges without truth), duration, launches."""
    r = df[df["kind"] == "range"]
    if "domain" not in r:
        r = r.assign(domain=None)
    g = r.groupby("name", sort=False)
    return pd.DataFrame({
        "domain": g["domain"].first().fillna("default"),  # the C++ app names its NVTX3 domain; the rest are NVTX's default
        "calls": g.size(),
        "depth": g["depth"].first(),
        "truth_h2d": g["h2d_bytes"].median(),  # NaN where the app took no truth (inner ranges, BLIND_TRUTH=0)
        "truth_d2h": g["d2h_bytes"].median(),
        "truth_h2d_min": g["h2d_bytes"].min(), "truth_h2d_max": g["h2d_bytes"].max(),
        "truth_d2h_min": g["d2h_bytes"].min(), "truth_d2h_max": g["d2h_bytes"].max(),
        "ms": g["duration_ns"].median() / 1e6,
        "launches_expected": g["launches_expected"].first(),
        "payload_bytes": g["payload_bytes"].first(),
    })


def attach_tables(rep: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """attach's `ranges` (totals over calls, one row per domain and name) and `range_instances` (one per call)."""
    res = rep["results"]
    return pd.DataFrame(res["ranges"]), pd.DataFrame(res["range_instances"])


def compare(truth: pd.DataFrame, ranges: pd.DataFrame, inst: pd.DataFrame, app_calls: int) -> pd.DataFrame:
    """One row per range and direction: truth per call vs attach per call, with attach's stated bound."""
    rows = []
    for name, t in truth.iterrows():
        m = ranges[(ranges["name"] == name) & (ranges["domain"] == t["domain"])]
        a = m.iloc[0] if len(m) else None
        calls = int(a["calls"]) if a is not None else 0
        ii = inst[inst["name"] == name] if len(inst) else inst
        for d in DIRS:
            tv = t[f"truth_{d}"]
            row = {"range": name if t["domain"] == "default" else f"{t['domain']}:{name}", "dir": d.upper(), "depth": int(t["depth"]), "ms": t["ms"],
                   "truth": tv, "truth_min": t[f"truth_{d}_min"], "truth_max": t[f"truth_{d}_max"],
                   "attach_calls": calls, "app_calls": int(t["calls"])}
            if d == "h2d":
                row["launches_expected"] = t["launches_expected"]
            if a is None:
                rows.append({**row, "attach_status": "MISSING"})
                continue
            per_call = a[f"{d}_bytes"] / calls
            bound = (a[f"{d}_edge_bytes"] + a[f"{d}_floor_err_bytes"]) / calls
            err = per_call - tv
            row.update(attach=per_call, err_bytes=err, err_pct=err / tv * 100 if tv and abs(tv) >= BIG_BYTES else np.nan,
                       bound=bound, in_bound=bool(abs(err) <= bound) if np.isfinite(err) else None,
                       attach_status=f"{a['status']}" + "".join(f", {int(a[k])} {w}" for k, w in
                                                                (("stalls", "stalls"), ("short_calls", "short"))
                                                                if pd.notna(a.get(k)) and a.get(k)),
                       gpus=",".join(map(str, a["gpus"])) if isinstance(a.get("gpus"), list) else str(a.get("gpus")))
            if len(ii) and np.isfinite(tv):
                bi = ii[f"{d}_edge_bytes"] + ii[f"{d}_floor_err_bytes"]
                row["calls_in_bound"] = f"{int(((ii[f'{d}_bytes'] - tv).abs() <= bi).sum())}/{len(ii)}"
                row["attach_median_call"] = float(ii[f"{d}_bytes"].median())
            if d == "h2d":
                row["launches_attach"] = (a["eager_launches"] + a["graph_launches"]) / calls if calls else np.nan
                if len(ii) and "eager_launches_process" in ii:  # (every thread's, while the range was open)
                    row["launches_process"] = float((ii["eager_launches_process"] + ii["graph_launches_process"]).sum()
                                                    / len(ii))
            row["goal"] = ("–" if not np.isfinite(tv) else ("ok" if meets_goal(tv, per_call, bound, t["ms"]) else "FAIL")
                           + (f" ({GOAL_PCT:g} %)" if checked_in_pct(tv, t["ms"]) else " (bound)"))
            rows.append(row)
    return pd.DataFrame(rows)


def op_launches(meta: dict, ranges: pd.DataFrame) -> pd.DataFrame:
    """Per op both sides name (the hooks app's ``op_launches``: torch.profiler's op tree, per call, times the app's
    ``emit_calls``): launches expected vs attach's per-op row (grouped by op, the default)."""
    truth = pd.Series(meta["op_launches"], dtype=float) * meta["emit_calls"]
    got = ranges[ranges["domain"] == "default"].set_index("name")
    both = truth.index.intersection(got.index)
    counted = got.loc[both, "eager_launches"] + got.loc[both, "graph_launches"]
    return pd.DataFrame({"expected": truth[both], "attach": counted, "calls": got.loc[both, "calls"]}).sort_values(
        "expected", ascending=False)


def overhead(r: Runner, pairs: int) -> dict:
    """Alone vs attached, BLIND_TRUTH=0, alternated ABBA; the loop's wall time and per-range durations."""
    od = r.out / "overhead"
    od.mkdir(exist_ok=True)
    sub = Runner(r.a)
    sub.out = od
    res = []
    for p in range(pairs):
        order = ("alone", "attach") if p % 2 == 0 else ("attach", "alone")
        runs = {}
        for which in order:
            jsonl, _ = sub.app(f"{which}_{p}", truth=False, attach=which == "attach")
            _, df, end = read_jsonl(jsonl)
            runs[which] = (end["loop_wall_ns"] / 1e9, df[df["kind"] == "range"].groupby("name")["duration_ns"].median())
        (wa, da), (wt, dt) = runs["alone"], runs["attach"]
        res.append({"pair": p, "order": "/".join(order), "alone_s": wa, "attach_s": wt, "change_pct": (wt / wa - 1) * 100,
                    "range_change_pct": ((dt / da - 1) * 100).round(2).to_dict()})
    return {"pairs": res}


def fmt_bytes(x) -> str:
    return "–" if x is None or not np.isfinite(x) else f"{x:,.0f}"


def print_compare(c: pd.DataFrame) -> None:
    show = pd.DataFrame({
        "range": np.where(c["depth"] > 0, "└ " + c["range"], c["range"]), "dir": c["dir"], "ms": c["ms"].round(2),
        "truth B/call": c["truth"].map(fmt_bytes),
        # (the app's own calls differ: a call checked against the median call can miss by that much alone)
        "truth calls ± B": ((c["truth_max"] - c["truth_min"]) / 2).map(fmt_bytes),
        "attach B/call": c.get("attach", pd.Series(np.nan, c.index)).map(fmt_bytes),
        "err B": c.get("err_bytes", pd.Series(np.nan, c.index)).map(fmt_bytes),
        "err %": c.get("err_pct", pd.Series(np.nan, c.index)).map(lambda v: "–" if not np.isfinite(v) else f"{v:+.2f}"),
        "± bound B": c.get("bound", pd.Series(np.nan, c.index)).map(fmt_bytes),
        "in bound": c.get("in_bound", pd.Series(None, c.index)).map(lambda v: "–" if v is None or v != v else ("yes" if v else "NO")),
        "calls in bound": c.get("calls_in_bound", pd.Series("–", c.index)).fillna("–"),
        "goal": c.get("goal", pd.Series("–", c.index)).fillna("–"),
        "launches app/attach": [
            "" if r["dir"] != "H2D" else
            f"{'?' if pd.isna(r.get('launches_expected')) else int(r['launches_expected'])}/"
            f"{'–' if pd.isna(r.get('launches_attach')) else format(r['launches_attach'], 'g')}"
            + ("" if pd.isna(r.get("launches_process", np.nan)) or r.get("launches_process") == r.get("launches_attach")
               else f" (process {r['launches_process']:g})")
            for _, r in c.iterrows()],
        "attach status": c["attach_status"], "gpus": c.get("gpus", pd.Series("", c.index)).fillna(""),
    })
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.max_colwidth", 40):
        print(show.to_string(index=False))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="example: python3 bench/blind_attach.py --out /tmp/blind --calls 8 --pairs 3")
    ap.add_argument("--out", type=Path, required=True, help="folder for everything (new or empty)")
    ap.add_argument("--calls", type=int, default=8, help="rounds of the app: calls of each range (default 8)")
    ap.add_argument("--app", choices=tuple(PY_APPS) + ("cpp",), default="torch",
                    help="torch: tests/apps/blind_app.py; cpp: tests/apps/blind_app.cu, built with nvcc; the others: "
                         "tests/apps/<name>_app.py (blind_graphs_app.py for graphs; default torch)")
    ap.add_argument("--pairs", type=int, default=3, help="alone/attached runtime pairs, ABBA (0 = skip; default 3)")
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter with torch, pynvml and pcietrace for the app and attach (default: this one)")
    ap.add_argument("--attach-args", default="", type=shlex.split,
                    help="extra `pcietrace attach` options, one string, e.g. --attach-args='--exact-edges'")
    ap.add_argument("--timeout-s", type=float, default=600, help="per subprocess (default 600)")
    a = ap.parse_args()
    if a.calls < 1 or a.pairs < 0:
        ap.error("--calls must be >= 1 and --pairs >= 0")
    if a.out.exists() and any(a.out.iterdir()):
        ap.error(f"--out {a.out} is not empty")
    a.out.mkdir(parents=True, exist_ok=True)
    a.out = a.out.resolve()

    # a Python app needs its framework and pynvml in --python; the C++ one (NVML through dlopen) only pcietrace
    framework = ("cupy" if a.app == "cupy" else "torch") if a.app in PY_APPS else None
    check = {"cupy": "import cupy, pynvml, pcietrace; cupy.cuda.runtime.getDeviceCount(); "
                     "print('cupy', cupy.__version__)",
             "torch": "import torch, pynvml, pcietrace; assert torch.cuda.is_available(), 'no CUDA'; "
                      "print('torch', torch.__version__, torch.cuda.get_device_name(0))",
             None: "import pcietrace; print('pcietrace', pcietrace.__version__)"}[framework]
    pre = subprocess.run([a.python, "-c", check], capture_output=True, text=True, cwd=ROOT)
    if pre.returncode != 0:
        why = pre.stderr.strip().splitlines()[-1] if pre.stderr.strip() else f"exit {pre.returncode}"
        ap.error(f"{a.python} cannot run the {a.app} app ({why}); name an interpreter with "
                 f"{f'{framework}, pynvml and ' if framework else ''}pcietrace with --python (on the lent GPUs: "
                 "after `. bench/device_setup.sh`)")
    print(f"{pre.stdout.strip()}; {a.calls} calls per range; python {a.python}", flush=True)
    if a.app in PY_APPS:
        a.app_cmd = [a.python, str(APPS / PY_APPS[a.app])]
    else:
        exe = a.out / "blind_app_cpp"
        build = subprocess.run([*NVCC[:3], "-o", str(exe), str(APPS / "blind_app.cu"), *NVCC[3:]],
                               capture_output=True, text=True, cwd=ROOT)
        if build.returncode != 0:
            sys.exit(f"blind_attach: nvcc failed: {build.stderr.strip()[-800:]}")
        a.app_cmd = [str(exe)]

    r = Runner(a)
    print("truth: the app alone", flush=True)
    truth_jsonl, _ = r.app("truth_alone", truth=True, attach=False)
    print("attach: the same app under pcietrace attach", flush=True)
    att_jsonl, folder = r.app("attach", truth=True, attach=True)
    rep = r.report_json(folder)

    meta, tdf, _ = read_jsonl(truth_jsonl)
    ameta, adf, _ = read_jsonl(att_jsonl)
    truth = truth_table(tdf)
    ranges, inst = attach_tables(rep)
    c = compare(truth, ranges, inst, a.calls)
    print(f"\nPer range and direction (truth: median call of the alone run, its empty reference window subtracted; "
          f"attach: its `ranges` totals / calls; bound: (edge + floor_err) / calls; GPU {meta.get('gpu', meta.get('device'))}, "
          f"NVML index {meta.get('nvml_index')}; app {a.app}; skipped: {meta.get('skipped') or meta.get('zero_copy')})")
    print_compare(c)
    checked = c[c["goal"].astype(str).str.contains("ok|FAIL", regex=True)] if "goal" in c else c.iloc[:0]
    fails = checked[checked["goal"].str.startswith("FAIL")]
    print(f"\n{len(checked) - len(fails)}/{len(checked)} checked directions meet issue 7's goal "
          f"({GOAL_TEXT}); in bound: {int(c.get('in_bound', pd.Series(dtype=object)).eq(True).sum())}/{int(c['truth'].notna().sum())}")
    extra = sorted(set(ranges["name"]) - set(truth.index)) if len(ranges) else []
    if extra:  # (emit_nvtx's per-op ranges: thousands)
        print(f"ranges attach saw that the app did not make: {len(extra)}, e.g. {extra[:5]}")
    if "op_launches" in ameta:
        ol = op_launches(ameta, ranges)
        exact = int((ol["expected"] == ol["attach"]).sum())
        print(f"\nper op (torch.profiler's op tree: its kernels {ameta['op_kernels_placed']} placed of "
              f"{ameta['op_kernels_ran']} run per call; x{ameta['emit_calls']} calls): launches exact for {exact} of "
              f"{len(ol)} ops both name")
        with pd.option_context("display.width", 200, "display.max_rows", 400):
            print(ol.to_string())
        summary_ops = json.loads(ol.reset_index(names="op").to_json(orient="records"))
    else:
        summary_ops = None
    wr = rep["results"].get("whole_run", [])
    if wr:
        mb = lambda v: "–" if v is None else f"{v / 1e6:,.1f}"  # (None: a wrap risk, no figure)
        print("whole run per GPU:", "; ".join(f"GPU{w['nvml_index']}: {mb(w['h2d_bytes'])} MB H2D, "
                                              f"{mb(w['d2h_bytes'])} MB D2H, {w['eager_launches']:g} eager, "
                                              f"status {w['status']}" for w in wr))

    summary = {"app": a.app, "calls": a.calls, "python": a.python, "attach_args": a.attach_args, "app_meta_alone": meta,
               "app_meta_attached": ameta, "comparison": json.loads(c.to_json(orient="records")),
               "truth_alone": json.loads(truth.reset_index().to_json(orient="records")),
               "attach_summary_lines": rep.get("summary", {}).get("lines"), "op_launches": summary_ops}
    if a.pairs:
        print(f"\nruntime: alone vs attached, BLIND_TRUTH=0, {a.pairs} pairs (ABBA)", flush=True)
        ov = overhead(r, a.pairs)
        for p in ov["pairs"]:
            print(f"  pair {p['pair']} ({p['order']}): loop {p['alone_s']:.3f} s alone, {p['attach_s']:.3f} s attached: "
                  f"{p['change_pct']:+.2f} %")
        ch = np.array([p["change_pct"] for p in ov["pairs"]])
        per_range = pd.DataFrame([p["range_change_pct"] for p in ov["pairs"]]).median()
        print(f"  median change {np.median(ch):+.2f} % (pairs {ch.min():+.2f} … {ch.max():+.2f} %; issue 7: < 3 %)")
        print("  per range, median over pairs of (attached / alone - 1) of the median call, %:")
        print("   " + ", ".join(f"{k} {v:+.1f}" for k, v in per_range.items()))
        ov["median_change_pct"] = float(np.median(ch))
        ov["per_range_median_change_pct"] = per_range.round(2).to_dict()
        summary["overhead"] = ov
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(f"\nsaved under {a.out} (summary.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
