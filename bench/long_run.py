"""A long attach run's analysis cost: CPU seconds and peak memory of load, analysis, each format and Perfetto,
as laws in ranges and samples.

Recordings are synthesised from a committed real one (default ``tests/data/attach_h100_blind_graphs``): one
process per GPU as under torchrun, each replaying that run's range block tiled over the program's run (its
timing compressed or stretched to fit), its counters' in-run rates sampled at ``--rate-hz`` and its idle windows'
rates before and after. Each stage runs in a fresh interpreter that states its own CPU time and peak RSS.
A least-squares fit ``a + b*ranges + c*samples`` per stage gives the law, extrapolated to the goals:

- 8 GPUs, one hour (4.8e7 samples), 1e7 range instances of 1e4 names: report <= 60 s CPU, <= 3 GB peak;
  <= 15 s at 1e6 ranges; ``--format json`` within 1.5x of the report; Perfetto <= 60 s, <= 2 GB, <= 500 MB file.

    python3 bench/long_run.py --quick          # a few minutes on 2 cores
    python3 bench/long_run.py                  # larger sizes
    python3 bench/long_run.py --synth DIR --gpus 8 --samples 8e6 --ranges 1e5   # one recording, kept
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "data" / "attach_h100_blind_graphs"
STAGES = ("load", "analyze", "table", "json", "csv", "perfetto")
#: In-range sampling rate of a GPU under attach's default interval (what the issue's real jobs showed).
RATE_HZ = 1700.0
#: The goals: (gpus, samples, ranges) -> stage -> (CPU s, peak GB[, file MB]); JSON: 1.5x the report's.
TARGETS = {(8, 4.8e7, 1e7): {"table": (60, 3.0), "json": (90, 4.5), "perfetto": (60, 2.0, 500)},
           (8, 4.8e7, 1e6): {"table": (15, 3.0)}}


def _max_ranges() -> int:
    from pcietrace.report.perfetto import MAX_RANGES

    return MAX_RANGES


def synthesise(out: Path, gpus: int, samples: int, ranges: int, names: int = 0, rate_hz: float = RATE_HZ,
               source: Path = SOURCE) -> Path:
    """Write an attach recording of ``gpus`` processes (one per GPU), ``samples`` counter samples in all and about
    ``ranges`` range instances in all (``names`` distinct names at most; 0: the source's), made from ``source``."""
    from pcietrace.session import Session

    src = Session.load(source)
    meta, ev, sm, win = dict(src.meta), src.events, src.samples, src.windows
    per_gpu = max(samples // gpus, 16)
    t_start, t_end = int(meta["t_app_start_ns"]), int(meta["t_app_end_ns"])
    # the source's counter rates (bytes/ns) in its run and in its idle windows, replayed at the new interval
    dt_src = np.diff(sm["t_ns"].to_numpy(np.int64)).astype(float)
    rates = {c: np.diff(sm[f"{c}_raw"].to_numpy(np.int64)) / dt_src for c in ("tx", "rx")}
    mid = sm["t_ns"].to_numpy(np.int64)[1:]
    run = (mid > t_start) & (mid < t_end)
    pre, post = win[win["t_end_ns"] <= t_start], win[win["t_start_ns"] >= t_end]
    lead, tail = t_start - int(pre["t_start_ns"].min()), int(post["t_end_ns"].max()) - t_end
    run_ns = int(max(per_gpu / rate_hz * 1e9 - lead - tail, 1e8))
    # the range block: from the first range edge to the last, per process
    edge = ev["event"].isin(["push", "pop", "start", "end"]).to_numpy()
    first, last = np.flatnonzero(edge)[[0, -1]]
    head, block, foot = ev.iloc[:first], ev.iloc[first:last + 1], ev.iloc[last + 1:]
    per_block = int(block["event"].isin(["push", "start"]).sum())
    tiles = max(-(-ranges // (gpus * per_block)), 1)
    span = int(block["t_ns"].iloc[-1] - block["t_ns"].iloc[0]) + 1
    base = int(block["t_ns"].iloc[0])  # (the source's set-up events before it stay where they were)
    run_ns = max(run_ns - (base - t_start), 10**8)
    period = run_ns // tiles
    scale = period / span * 0.98
    counts = [c for c in ("eager_thread", "graph_thread", "captured_thread", "call_ns_thread", "wait_ns_thread")
              if c in ev]
    proc_counts = [c.replace("_thread", "_process") for c in counts]
    grow = {c: (block.groupby("tid")[c].transform(lambda s: s.max() - s.min())).to_numpy(np.int64) for c in counts}
    grow |= {c: np.full(len(block), int(block[c].max() - block[c].min()), np.int64) for c in proc_counts}
    tile = np.repeat(np.arange(tiles, dtype=np.int64), len(block))
    rel = np.tile(block["t_ns"].to_numpy(np.int64) - int(block["t_ns"].iloc[0]), tiles)
    body = {c: np.tile(block[c].to_numpy(), tiles) for c in block.columns}
    body["t_ns"] = base + tile * period + (rel * scale).astype(np.int64)
    for c, g in grow.items():
        body[c] = body[c] + tile * np.tile(g, tiles) * (body[c] >= 0)
    body["id"] = np.where(np.isin(body["event"], ["start", "end"]), body["id"] + tile * 1000, body["id"])
    if names:
        groups = max(names // max(block["message"][block["event"] == "push"].nunique(), 1), 1)
        push = np.isin(body["event"], ["push", "start"])
        body["message"] = np.where(push, pd.Series(body["message"]) + "#" + pd.Series(tile % groups).astype(str),
                                   body["message"])
    body = pd.DataFrame(body)
    end_of_run = {c: int(body[c].max()) for c in proc_counts}
    foot = foot.assign(t_ns=base + run_ns - 1, **end_of_run)
    for c in counts:  # a thread's counts after the tiles go on from the last tile's (they never run backwards)
        per_tid = block.groupby("tid")[c].agg(lambda s: s.max() - s.min())
        foot[c] = foot[c] + (tiles - 1) * foot["tid"].map(per_tid).fillna(0).astype(np.int64) * (foot[c] >= 0)
    gpu0 = dict(meta["gpus"][0])
    gpu_list, frames, procs = [], [], []
    for i in range(gpus):
        bus = f"0000:{i + 1:02x}:00.0"
        gpu_list.append(gpu0 | {"nvml_index": i, "bus_id": bus, "uuid": f"GPU-synthetic-{i}", "cuda_ordinal": i})
        pid = 100_000 + i
        part = pd.concat([head, body, foot], ignore_index=True)
        part["pid"] = pid
        part["tid"] = np.where(part["tid"] == src.events["pid"].iloc[0], pid, part["tid"] + pid * 10)
        dev = part["dev"].to_numpy()
        part["dev"] = np.where(dev >= 0, i, dev)
        part["devmask"] = np.where(part["devmask"].to_numpy(np.uint64) != 0, np.uint64(1) << np.uint64(i), np.uint64(0))
        part.loc[part["event"] == "cudevice", ["id", "message"]] = [i, bus]
        frames.append(part)
        procs.append({"pid": pid, "nvtx": True, "cupti": meta["processes"][0].get("cupti"),
                      "ranges": int(part["event"].isin(["push", "start"]).sum()), "devices": [bus], "trace_full": False})
    events = pd.concat(frames, ignore_index=True).sort_values("t_ns", kind="stable", ignore_index=True)
    # samples: idle windows shifted to the new run's ends, idle rates there, in-run rates between
    t0, t1 = t_start - lead, base + run_ns + tail
    t = np.linspace(t0, t1, per_gpu).astype(np.int64)
    dt = np.diff(t, prepend=t[0] - 1).astype(float)
    inside = (t > t_start) & (t < base + run_ns)
    parts = []
    for i in range(gpus):
        cols = {"nvml_index": np.full(per_gpu, i, np.int64), "t_ns": t,
                "read_ns": np.resize(sm["read_ns"].to_numpy(np.int64), per_gpu)}
        for c, r in rates.items():
            busy, idle = np.roll(r[run], 37 * i), r[~run]
            inc = np.where(inside, np.resize(busy, per_gpu), np.resize(idle, per_gpu)) * dt
            start = int(sm[f"{c}_raw"].iloc[0])
            cols[f"{c}_raw"] = ((start + np.cumsum(np.maximum(inc, 0)).astype(np.int64)) % 2**32).astype(np.uint64)
        parts.append(pd.DataFrame(cols))
    samples_df = pd.concat(parts, ignore_index=True)
    shift = np.where(win["t_start_ns"] >= t_end, base + run_ns - t_end, 0)
    windows = pd.concat([win.assign(nvml_index=i, t_start_ns=win["t_start_ns"] + shift, t_end_ns=win["t_end_ns"] + shift)
                         for i in range(gpus)], ignore_index=True)
    meta |= {"gpus": gpu_list, "processes": procs, "t_app_end_ns": base + run_ns,
             "topology": {**(meta.get("topology") or {}), "gpus": []}}
    out.mkdir(parents=True, exist_ok=True)
    Session(meta=meta, samples=samples_df, events=events, windows=windows).save(out)
    return out


def _peak_rss_kib(maxrss_kib: int) -> int:
    """This process's own peak RSS (KiB): ``VmHWM`` where Linux states it. ``ru_maxrss`` keeps the forking
    parent's peak across fork and exec, so a stage started by this benchmark after it synthesised a large
    recording would read at least the benchmark's own size."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError):
        return maxrss_kib


def _stage(stage: str, folder: Path, scratch: Path) -> None:
    """Run one stage in this interpreter (``--stage``), its output thrown away."""
    import contextlib

    from pcietrace.cli import main

    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        if stage == "load":
            from pcietrace.session import Session

            Session.load(folder)
        elif stage == "analyze":
            from pcietrace.analysis import analyze
            from pcietrace.session import Session

            analyze(Session.load(folder))
        elif stage == "perfetto":
            main(["report", str(folder), "--perfetto", str(scratch / "trace.json")])  # (the table too, as attach)
        else:
            main(["report", str(folder), "--format", stage])


def measure(stage: str, folder: Path, scratch: Path, code: Path = ROOT) -> dict[str, float]:
    """CPU seconds and peak RSS (GB) of one stage, in a fresh interpreter importing pcietrace from ``code``;
    Perfetto: its file's size too."""
    cmd = [sys.executable, __file__, "--stage", stage, str(folder), "--scratch", str(scratch)]
    wall = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(code)})
    if p.returncode:
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["wall_s"] = time.perf_counter() - wall
    trace = scratch / "trace.json"
    if stage == "perfetto" and trace.exists():
        r["file_MB"] = trace.stat().st_size / 1e6
        trace.unlink()
    return r


def fit(rows: list[dict[str, float]], key: str) -> np.ndarray:
    """Least squares ``a + b*ranges + c*samples`` of ``key`` (NaN where too few sizes)."""
    ok = [r for r in rows if key in r]
    if len(ok) < 3:
        return np.full(3, np.nan)
    x = np.array([[1.0, r["ranges"], r["samples"]] for r in ok])
    return np.linalg.lstsq(x, np.array([r[key] for r in ok]), rcond=None)[0]


def print_laws(rows: dict[str, list[dict[str, float]]], stages: list[str]) -> None:
    """Each stage's fitted law and its extrapolation to :data:`TARGETS`, pass or fail. Perfetto's own part (its
    stage less the table report it runs with) is fitted and extrapolated at the ranges it draws
    (:data:`pcietrace.report.perfetto.MAX_RANGES` at most), as is its file, on top of the table report's law (what
    attach does: the console report and the trace)."""
    max_ranges = _max_ranges()
    drawn_rows = [{**pr, "ranges": min(pr["ranges"], max_ranges),
                   **{k: pr[k] - cr[k] for k in ("cpu_s", "rss_GB") if k in pr and k in cr}}
                  for pr, cr in zip(rows.get("perfetto", []), rows.get("table", []))]
    print("\nlaws (a + b*ranges + c*samples; per range instance and per counter sample, all GPUs; Perfetto's own "
          f"part beyond the table report's, and its file, at the ranges it draws ({max_ranges:,} at most), on the table's):")
    verdicts = []
    for s in stages:
        cpu, mem = fit(rows[s], "cpu_s"), fit(rows[s], "rss_GB")
        size = fit([{**r, "ranges": min(r["ranges"], max_ranges)} for r in rows[s]], "file_MB") \
            if s == "perfetto" else None
        print(f"  {s:9s} CPU {cpu[0]:.2f} s + {cpu[1] * 1e6:.2f} us/range + {cpu[2] * 1e6:.3f} us/sample;  "
              f"RSS {mem[0]:.2f} GB + {mem[1] * 1e9:.0f} B/range + {mem[2] * 1e9:.0f} B/sample"
              + (f";  file {size[0]:.0f} MB + {size[1] * 1e6:.0f} B/range drawn + {size[2] * 1e6:.1f} B/sample"
                 if size is not None else ""))
        if s == "perfetto" and drawn_rows:
            own_c, own_m = fit(drawn_rows, "cpu_s"), fit(drawn_rows, "rss_GB")
            print(f"            its own part: CPU {own_c[0]:.2f} s + {own_c[1] * 1e6:.2f} us/range drawn + "
                  f"{own_c[2] * 1e6:.3f} us/sample;  RSS {own_m[0]:.2f} GB + {own_m[1] * 1e9:.0f} B/range drawn + "
                  f"{own_m[2] * 1e9:.0f} B/sample")
        for (gpus, n_samples, n_ranges), goals in TARGETS.items():
            if s not in goals:
                continue
            at, drawn = np.array([1, n_ranges, n_samples]), np.array([1, min(n_ranges, max_ranges), n_samples])
            c, m = cpu @ at, mem @ at
            if s == "perfetto" and drawn_rows:
                base_c, base_m = fit(rows["table"], "cpu_s"), fit(rows["table"], "rss_GB")  # (as attach)
                c, m = base_c @ at + own_c @ drawn, base_m @ at + own_m @ drawn
            goal_s, goal_gb, *goal_mb = goals[s]
            ok = c <= goal_s and m <= goal_gb
            line = (f"    -> {gpus} GPUs, {n_samples:.1e} samples, {n_ranges:.0e} ranges: {c:.0f} s (goal <= {goal_s} s: "
                    f"{'pass' if c <= goal_s else 'FAIL'}), {m:.1f} GB (goal <= {goal_gb} GB: "
                    f"{'pass' if m <= goal_gb else 'FAIL'})")
            if size is not None and goal_mb:
                mb = size @ drawn
                ok &= mb <= goal_mb[0]
                line += f", file {mb:.0f} MB (goal <= {goal_mb[0]} MB: {'pass' if mb <= goal_mb[0] else 'FAIL'})"
            past = max(n_ranges / max(r["ranges"] for r in rows[s]), n_samples / max(r["samples"] for r in rows[s]))
            if past > 10:  # (a fixed cost or a law that bends counts for much there: --quick's sizes)
                line += (f"; extrapolated {past:.0f}x past the largest size measured, so indicative only: measure "
                         "that size itself (--synth DIR, then `pcietrace report DIR`)")
            print(line)
            verdicts.append(ok)
    if verdicts:
        print(f"\ngoals met: {sum(verdicts)} of {len(verdicts)}")


_LINE = re.compile(r"^(\d+) GPUs, ([\d.e+]+) samples, ([\d.e+]+) ranges:(.*)$")
_FIGURES = re.compile(r"(\w+) ([\d.]+) s ([\d.]+) GB(?: (\d+) MB)?")


def read_log(path: Path) -> tuple[dict[str, list[dict[str, float]]], list[str]]:
    """The measurements a previous run printed (its lines per size), to fit again without measuring."""
    rows: dict[str, list[dict[str, float]]] = {}
    for line in path.read_text().splitlines():
        m = _LINE.match(line)
        for stage, cpu, rss, mb in _FIGURES.findall(m.group(4)) if m else []:
            r = {"samples": float(m.group(2)), "ranges": float(m.group(3)), "cpu_s": float(cpu), "rss_GB": float(rss)}
            rows.setdefault(stage, []).append(r | ({"file_MB": float(mb)} if mb else {}))
    return rows, list(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="A long attach run's analysis cost, as laws in ranges and samples.")
    p.add_argument("--quick", action="store_true", help="small sizes (a few minutes)")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--stages", default=",".join(STAGES), help=f"of {', '.join(STAGES)}")
    p.add_argument("--sizes", help="SAMPLES:RANGES,... (default: a set for --quick or a larger one)")
    p.add_argument("--synth", type=Path, help="only write one recording here (--gpus, --samples, --ranges, --names)")
    p.add_argument("--samples", type=float, default=1e6)
    p.add_argument("--ranges", type=float, default=1e5)
    p.add_argument("--names", type=int, default=0)
    p.add_argument("--code", type=Path, default=ROOT,
                   help="the folder holding the pcietrace package to measure (e.g. an older commit's `git archive`)")
    p.add_argument("--log", type=Path, help="fit the laws again from a previous run's printed lines (no measuring)")
    p.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)
    p.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    p.add_argument("folder", nargs="?", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.stage:
        _stage(args.stage, args.folder, args.scratch)
        use = resource.getrusage(resource.RUSAGE_SELF)
        print(json.dumps({"cpu_s": use.ru_utime + use.ru_stime, "rss_GB": _peak_rss_kib(use.ru_maxrss) / 2**20}))
        return 0
    if args.log:
        print_laws(*read_log(args.log))
        return 0
    if args.synth:
        synthesise(args.synth, args.gpus, int(args.samples), int(args.ranges), args.names)
        return 0
    sizes = ([(2e5, 1e4), (1e6, 1e4), (2e5, 1e5), (1e6, 5e4)] if args.quick else
             [(1e6, 1e5), (8e6, 1e5), (1e6, 1e6), (8e6, 5e5), (4e6, 2e6)])
    if args.sizes:
        sizes = [tuple(float(x) for x in size.split(":")) for size in args.sizes.split(",")]
    stages = args.stages.split(",")
    rows: dict[str, list[dict[str, float]]] = {s: [] for s in stages}
    with tempfile.TemporaryDirectory(prefix="pcietrace-long-") as tmp:
        for n_samples, n_ranges in sizes:
            folder = Path(tmp) / "rec"
            synthesise(folder, args.gpus, int(n_samples), int(n_ranges), names=min(int(n_ranges) // 100, 10_000))
            have = pd.read_parquet(folder / "events.parquet", columns=["event"])["event"].isin(["push", "start"]).sum()
            line = [f"{args.gpus} GPUs, {n_samples:.0e} samples, {have:.1e} ranges:"]
            for s in stages:
                r = measure(s, folder, Path(tmp), args.code) | {"samples": n_samples, "ranges": float(have)}
                rows[s].append(r)
                line.append(f"{s} " + (r["error"] if "error" in r else
                                       f"{r['cpu_s']:.1f} s {r['rss_GB']:.2f} GB"
                                       + (f" {r['file_MB']:.0f} MB" if "file_MB" in r else "")))
            print("  ".join(line), flush=True)
            for f in folder.iterdir():
                f.unlink()
    print_laws(rows, stages)
    return 0


if __name__ == "__main__":
    sys.exit(main())
