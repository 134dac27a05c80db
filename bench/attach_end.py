"""What attach does after the program ends, step by step, on a synthetic long recording: read the traces and
the streamed samples, analyse, save, print the report, write the Perfetto trace. Goal: the report within 30 s and
< 2 GB for a torchrun job of 4 ranks x ~860,000 ranges and 150 s of samples at ~1.7 kHz per GPU.

The recording is made by bench/long_run.py's synthesiser; its events are written back as binary trace files (one per
process, as the injection library writes them) and its samples as the samplers' stream, so every step reads
what it reads after a real run. Each step's wall and CPU seconds and the resident memory after it are printed,
with the peak.

    python3 bench/attach_end.py                                  # 4 GPUs, 1.02e6 samples, 3.44e6 ranges
    python3 bench/attach_end.py --gpus 8 --samples 8e6 --ranges 1e6
    python3 bench/attach_end.py --from DIR                       # a recording synthesised before
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

#: The goal for the whole path (seconds, GB of peak resident memory).
GOAL_S, GOAL_GB = 30.0, 2.0


def _rss_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def _peak_gb() -> float:
    """This process's own peak RSS (ru_maxrss alone keeps the bench's, which forked it: its synthesised run)."""
    from long_run import _peak_rss_kib

    return _peak_rss_kib(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 2**20


def _cpu_s() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def write_traces(events, trace_dir: Path) -> None:
    """``events`` (a saved attach run's) as the injection library writes them: one binary trace per process
    (pcietrace/native/pt_abi.h), every record committed."""
    import numpy as np

    from pcietrace.record.trace import EVENT_DTYPE, HEADER_DTYPE, TRACE_MAGIC, TRACE_RESERVE_BYTES, TRACE_VERSION

    header_bytes, size = 4096, EVENT_DTYPE.itemsize  # (PT_TRACE_HEADER_BYTES)
    for pid, g in events.groupby("pid", sort=False):
        text = {c: g[c].astype(str).str.encode("utf-8") for c in ("event", "domain", "message")}
        lens = {c: text[c].str.len().to_numpy(np.int64) for c in text}
        blob = b"".join((text["event"] + text["domain"] + text["message"]).tolist())
        rec = np.zeros(len(g), EVENT_DTYPE)
        for c in EVENT_DTYPE.names:
            if c in g.columns:
                rec[c] = g[c].to_numpy()
        rec["event_bytes"], rec["domain_bytes"], rec["message_bytes"] = lens["event"], lens["domain"], lens["message"]
        total = lens["event"] + lens["domain"] + lens["message"]
        rec["str_at"] = np.concatenate([[0], np.cumsum(total)[:-1]])
        rec["commit"] = 1
        ev_cap = (len(g) + 1) * size  # (+ the slot kept for a "tracefull" event)
        h = np.zeros(1, HEADER_DTYPE)
        h["line"] = b"%s %d\n" % (TRACE_MAGIC, TRACE_VERSION)
        h["events_at"], h["events_cap"] = header_bytes, ev_cap
        h["strings_at"], h["strings_cap"] = header_bytes + ev_cap, len(blob) + TRACE_RESERVE_BYTES
        h["events_taken"], h["strings_taken"] = len(g) * size, len(blob)
        with open(trace_dir / f"trace-{pid}.bin", "wb") as f:
            f.write(h.tobytes().ljust(header_bytes, b"\0"))
            f.write(rec.tobytes() + bytes(size))
            f.write(blob + bytes(TRACE_RESERVE_BYTES))


def steps(folder: Path) -> None:
    """The steps, in this interpreter, on the traces and stream under ``folder`` (made by :func:`main`)."""
    import json

    from pcietrace.analysis import analyze
    from pcietrace.report.saved import saved_tables
    from pcietrace.analysis.summary import summarize
    from pcietrace.collectors import merge_samples
    from pcietrace.collectors.sampler import read_stream
    from pcietrace.record.attach import processes
    from pcietrace.record.trace import edge_samples, read_traces
    from pcietrace.report.output import emit
    from pcietrace.report.perfetto import write_trace
    from pcietrace.session import EVENTS_FILE, Session

    doc = json.loads((folder / "meta.json").read_text())
    import pandas as pd

    session = Session(meta=doc["meta"])
    state: dict = {}
    out = folder / "run"

    def collect() -> None:
        session.events = read_traces(folder / "traces")
        session.samples = merge_samples([read_stream(folder / "samples"), edge_samples(session.events)])
        session.windows = pd.DataFrame(doc["windows"])
        session.meta["processes"] = processes(session.events, session.meta["launch_counter"])

    def analysis() -> None:  # (as attach does: the events written into the run's folder and let go once read)
        out.mkdir(exist_ok=True)
        session.events_file = out / EVENTS_FILE
        state["results"] = analyze(session, release_events=True)

    def save() -> None:
        session.save(out, saved_tables(state["results"]))

    def perfetto() -> None:
        write_trace(session, state["results"], out / "trace.json")

    def report() -> None:
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
            emit(session.meta, state["results"], summarize(session.meta, state["results"]), "table", False, None)

    total_wall = total_cpu = 0.0
    print(f"  {'step':9s} {'wall s':>7} {'CPU s':>7} {'RSS GB after':>13} {'peak GB so far':>15}")
    shown_wall = 0.0
    for name, step in (("collect", collect), ("analyze", analysis), ("save", save), ("report", report),
                       ("perfetto", perfetto)):
        w, c = time.perf_counter(), _cpu_s()
        step()
        w, c = time.perf_counter() - w, _cpu_s() - c
        total_wall, total_cpu = total_wall + w, total_cpu + c
        shown_wall = total_wall if name == "report" else shown_wall
        peak = _peak_gb()
        print(f"  {name:9s} {w:7.1f} {c:7.1f} {_rss_gb():13.2f} {peak:15.2f}", flush=True)
    peak = _peak_gb()
    print(f"after the program: the report shown at {shown_wall:.1f} s wall; all {total_wall:.1f} s wall, "
          f"{total_cpu:.1f} s CPU, peak RSS {peak:.2f} GB (goal: the report <= {GOAL_S:g} s, < {GOAL_GB:g} GB)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--samples", type=float, default=1.02e6, help="in all GPUs (150 s x 1.7 kHz x 4)")
    p.add_argument("--ranges", type=float, default=3.44e6, help="in all processes (4 x 860,000)")
    p.add_argument("--from", dest="source", type=Path, help="a recording bench/long_run.py synthesised")
    p.add_argument("--steps", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps:
        steps(args.steps)
        return 0

    import json
    import subprocess

    from long_run import synthesise

    from pcietrace.collectors.sampler import SampleStream, empty_samples
    from pcietrace.session import Session

    with tempfile.TemporaryDirectory(prefix="pcietrace-attach-end-") as tmp:
        tmp = Path(tmp)
        src = args.source or synthesise(tmp / "synth", args.gpus, int(args.samples), int(args.ranges))
        rec = Session.load(src)
        (tmp / "traces").mkdir()
        write_traces(rec.events, tmp / "traces")
        stream = SampleStream(tmp / "samples")
        for start in range(0, len(rec.samples), 50_000):  # (batches as the samplers' flushes write them)
            stream.write(rec.samples.iloc[start:start + 50_000].astype(empty_samples().dtypes.to_dict()))
        stream.close()
        meta = {k: v for k, v in rec.meta.items() if k != "processes"}
        (tmp / "meta.json").write_text(json.dumps({"meta": meta, "windows": rec.windows.to_dict("records")},
                                                  default=lambda o: o.item() if hasattr(o, "item") else str(o)))
        n_ranges = int(rec.events["event"].isin(["push", "start"]).sum())
        print(f"{len(meta['gpus'])} GPUs, {len(rec.samples):,} samples, {n_ranges:,} ranges "
              f"(trace files {sum(f.stat().st_size for f in (tmp / 'traces').iterdir()) / 1e6:,.0f} MB)", flush=True)
        del rec
        # the steps in a fresh interpreter: its peak memory is theirs alone
        return subprocess.run([sys.executable, __file__, "--steps", str(tmp)],
                              env=dict(os.environ, PYTHONPATH=str(ROOT))).returncode


if __name__ == "__main__":
    sys.exit(main())
