"""Benchmark (GPU machine): what an NVTX range edge costs a PyTorch emit_nvtx app, against what attach says it costs.

Paired runs of separate processes (bench/dense_overhead.py) vary by more than the edges cost on the lent VMs, so
this measures inside one process: the injection library is built again from pcietrace/native with one word
added (``pcietrace_edges_off``, exported) that makes its push and pop handlers return at once, and the app
(tests/apps/dense_app.py's model, forward calls under ``emit_nvtx``) switches it every ``--per`` calls, in a
rotated order. The truth per edge is the difference of the two kinds of calls' medians over the edges a recorded
call makes; attach's figure is the library's own (``edge_ns``: :func:`pcietrace.record.attach.processes` of the
trace the recorded calls wrote). Prints both per process and their ratio (the figure is the time inside the
library: a lower bound, its stores' cost to the program's caches after is not in it).

    python3 bench/edge_ab.py --processes 3 --rounds 30 --per 3 [--cpus 2-9] [--native DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "pcietrace" / "native"
WARM_UP = 5  # recorded calls before the pairs (kernels loaded, allocator warm)
#: The handlers' entry points as pt_inject_nvtx.c writes them, and the same with the switch in front.
SWITCHES = {"static int push_(const char *d, const char *m) { ":
            "EXPORT volatile int pcietrace_edges_off;\nstatic int push_(const char *d, const char *m) { "
            "if (pcietrace_edges_off) return t_depth++; ",
            "static int pop_(const char *d) { ":
            "static int pop_(const char *d) { if (pcietrace_edges_off) { if (t_depth > 0) --t_depth; return t_depth; } "}


def build(out: Path, native: Path = NATIVE) -> Path:
    """The injection library with the switch, built from ``native`` (pcietrace/native) into ``out``."""
    src = out / "native"
    shutil.copytree(native, src)
    nvtx = src / "pt_inject_nvtx.c"
    text = nvtx.read_text()
    for was, now in SWITCHES.items():
        if text.count(was) != 1:
            sys.exit(f"edge_ab: pt_inject_nvtx.c no longer has {was.splitlines()[0]!r} once: update SWITCHES")
        text = text.replace(was, now)
    nvtx.write_text(text)
    lib = out / "libpt_inject_ab.so"
    cc = shutil.which("cc") or shutil.which("gcc") or sys.exit("edge_ab: no C compiler")
    # (setup.py's flags: without its TLS dialect every thread-local an edge reads was a call, ~10 an edge)
    tls = ["-mtls-dialect=gnu2"] if platform.machine() in ("x86_64", "AMD64") else []
    subprocess.run([cc, "-O2", "-fvisibility=hidden", "-std=gnu11", *tls, "-shared", "-fPIC", "-I", str(src), "-o",
                    str(lib), *map(str, sorted(src.glob("pt_inject*.c"))), "-ldl", "-lpthread"], check=True)
    return lib


def child(lib: str, rounds: int, per: int) -> None:
    """The app: forward calls under emit_nvtx, the library's handlers on and off in turns; prints the calls'
    median ms each way and how many calls were recorded."""
    import ctypes

    import torch

    sys.path.insert(0, str(ROOT / "tests" / "apps"))
    from dense_app import BATCH, BLOCKS, DIM, STEPS, Block

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    blocks = torch.nn.ModuleList(Block() for _ in range(BLOCKS)).to(dev)
    x = torch.randn(BATCH, DIM, device=dev)

    def call() -> int:
        t0 = time.perf_counter_ns()
        with torch.autograd.profiler.emit_nvtx(record_shapes=True), torch.no_grad():
            for _ in range(STEPS):
                h = x
                for b in blocks:
                    h = b(h)
            torch.cuda.synchronize(dev)
        return time.perf_counter_ns() - t0

    for _ in range(WARM_UP):
        call()
    off = ctypes.c_int.in_dll(ctypes.CDLL(lib), "pcietrace_edges_off")  # (the copy NVTX loaded: the same path)
    ns: dict[int, list[int]] = {0: [], 1: []}
    for r in range(rounds):
        for state in ((0, 1) if r % 2 == 0 else (1, 0)):
            off.value = state
            ns[state] += [call() for _ in range(per)]
    off.value = 0
    print(json.dumps({"on_ms": statistics.median(ns[0]) / 1e6, "off_ms": statistics.median(ns[1]) / 1e6,
                      "recorded_calls": WARM_UP + len(ns[0])}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="example: python3 bench/edge_ab.py --processes 3 --rounds 30 --per 3")
    ap.add_argument("--processes", type=int, default=3, help="app processes, each its own pairs (default 3)")
    ap.add_argument("--rounds", type=int, default=30, help="rounds of recorded and unrecorded calls (default 30)")
    ap.add_argument("--per", type=int, default=3, help="calls each way a round (default 3)")
    ap.add_argument("--cpus", default="", help="hold the app to these CPUs (taskset list, e.g. 2-9)")
    ap.add_argument("--native", type=Path, default=NATIVE,
                    help="the library's sources (default pcietrace/native; another copy to compare two)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.rounds, a.per)
        return 0
    if a.processes < 1 or a.rounds < 1 or a.per < 1:
        ap.error("--processes, --rounds and --per must be >= 1")
    from pcietrace.record.attach import injection_env, processes
    from pcietrace.record.trace import read_traces

    with tempfile.TemporaryDirectory(prefix="edge-ab-") as tmp:
        lib = str(build(Path(tmp), a.native))
        ratios = []
        for k in range(a.processes):
            traces = Path(tmp) / f"traces{k}"
            traces.mkdir()
            env = injection_env(traces, "interpose", None, [0], False)
            env["NVTX_INJECTION64_PATH"] = env["LD_PRELOAD"] = lib
            cmd = ["taskset", "-c", a.cpus] * bool(a.cpus) + [sys.executable, __file__, "--child", lib,
                                                                "--rounds", str(a.rounds), "--per", str(a.per)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
            got = json.loads(out.strip().splitlines()[-1])
            proc = next(p for p in processes(read_traces(traces), "interpose") if p.get("edges"))
            per_call = proc["edges"] / got["recorded_calls"]
            truth_ns = (got["on_ms"] - got["off_ms"]) * 1e6 / per_call
            ratios.append(proc["edge_ns"] / truth_ns)
            print(f"process {k}: calls {got['on_ms']:.3f} ms recorded, {got['off_ms']:.3f} ms not ({per_call:,.0f} "
                  f"edges a call): truth {truth_ns:.0f} ns an edge; attach's edge_ns {proc['edge_ns']:.0f} "
                  f"({ratios[-1]:.2f} of it)", flush=True)
        print(f"RATIO attach's edge_ns / the in-process cost: median {statistics.median(ratios):.2f} "
              f"({a.processes} processes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
