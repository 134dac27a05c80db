"""Where host-timing noise between runs comes from (run on a GPU machine; not a test).

The C++ oracle (bench/oracle_loops.cu, built with nvcc here) times host cost per eager launch (bursts of 900
behind a blocker), launch + synchronize and the eager launch rate on GPU 0. Rounds alternate the conditions
below, each a fresh process unless said, and the spread of each figure over rounds is printed per condition
(IQR and range in % of the median; pair P95: the 95th percentile of two rounds' difference in % of their
mean, what ``pcietrace.analysis.compare.RUN_TO_RUN_PCT`` is set from):

- pinned: the process on the CPU `pcietrace run` times GPU 0 on (collectors.sysfs.timing_cpu);
- sibling busy: the same, with a spinning process on that CPU's SMT sibling (skipped without SMT);
- other core busy: the same, with the spinner on another physical core;
- sampler beside: the same, with pcietrace's counter sampler reading GPU 0 every 10 ms (as in `run`) in
  its own unpinned process;
- unpinned: no affinity;
- one process: the oracle loaded once (ctypes) and pinned, measured again each round (drift over time
  inside one process, not between processes).

    python3 bench/host_noise.py [--rounds 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stats import iqr_pct, pair_p95_pct, range_pct  # noqa: E402
from native_core import BURST_CALLS, build_oracle  # noqa: E402

from pcietrace.collectors.sysfs import parse_cpulist, timing_cpu  # noqa: E402
from pcietrace.schema import normalize_bus_id  # noqa: E402

SPIN = [sys.executable, "-c", "while True: pass"]
SAMPLER = [sys.executable, "-c", "import sys\nfrom pcietrace.collectors import CounterSampler\n"
           "s = CounterSampler([0], interval_ns=10_000_000); s.start(); sys.stdin.read(); s.stop()"]


def siblings(cpu: int) -> set[int]:
    p = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
    return parse_cpulist(p.read_text()) - {cpu} if p.exists() else set()


def gpu0_bdf() -> str:
    return normalize_bus_id(subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=pci.bus_id", "--format=csv,noheader"],
                                           capture_output=True, text=True, check=True).stdout)


def exe_round(exe: Path, cpu: int | None, side: list[str] | None, side_cpu: int | None, n_rate: int,
              bursts: int) -> dict[str, float]:
    spinner = None
    if side is not None:
        pin = (lambda: os.sched_setaffinity(0, {side_cpu})) if side_cpu is not None else None
        spinner = subprocess.Popen(side, preexec_fn=pin, stdin=subprocess.PIPE)
        time.sleep(0.2 if side is SPIN else 1.0)
    try:
        pre = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
        out = subprocess.run([str(exe), str(n_rate), "201", str(bursts), str(BURST_CALLS)], preexec_fn=pre,
                             capture_output=True, text=True, check=True).stdout
    finally:
        if spinner:  # the sampler stops when its stdin closes (it may have children); the spinner is killed
            spinner.stdin.close()
            if side is SPIN:
                spinner.kill()
            spinner.wait(timeout=30)
    return {k: float(v) for k, v in re.findall(r"^(\S+) (\S+)$", out, re.M)}


def spread(v: list[float]) -> dict[str, float]:
    return {"median": statistics.median(v), "iqr_pct": iqr_pct(v), "range_pct": range_pct(v),
            "pair_p95_pct": pair_p95_pct(v), "min": min(v), "max": max(v)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--rate-launches", type=int, default=100_000)
    ap.add_argument("--bursts", type=int, default=31)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    exe, lib_path = build_oracle(), build_oracle(shared=True)
    allowed = os.sched_getaffinity(0)
    cpu = timing_cpu(gpu0_bdf(), 0, allowed)
    sib = sorted(siblings(cpu) & allowed)
    other = sorted(c for c in allowed if c != cpu and c not in sib and not (siblings(c) & {cpu}))
    print(f"timing CPU {cpu}; SMT sibling(s) {sib or 'none'}; CPUs {len(allowed)}; spinner elsewhere on {other[-1]}")
    conds = {"pinned": (cpu, None, None), "other core busy": (cpu, SPIN, other[-1]),
             "sampler beside": (cpu, SAMPLER, None), "unpinned": (None, None, None)}
    if sib:
        conds["sibling busy"] = (cpu, SPIN, sib[0])
    res: dict[str, list[dict[str, float]]] = {c: [] for c in [*conds, "one process"]}
    # one process: the oracle library in a child pinned to the timing CPU, one burst set per round
    child = subprocess.Popen([sys.executable, "-c", ONE_PROCESS, str(lib_path), str(cpu), str(a.bursts),
                              str(BURST_CALLS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout and child.stdin
    child.stdout.readline()
    for i in range(a.rounds):
        order = list(conds) if i % 2 == 0 else list(conds)[::-1]
        for c in order:
            res[c].append(exe_round(exe, *conds[c], a.rate_launches, a.bursts))
        child.stdin.write("go\n")
        child.stdin.flush()
        res["one process"].append({"host_us_per_launch": float(child.stdout.readline())})
        print(f"round {i + 1}: " + ", ".join(f"{c} {res[c][-1]['host_us_per_launch']:.3f}" for c in res), flush=True)
    child.stdin.close()
    child.wait()
    table = {c: {k: spread([r[k] for r in rows]) for k in rows[0]} for c, rows in res.items()}
    print(f"\n{'condition':18s} {'figure':24s} {'median':>10s} {'IQR %':>7s} {'range %':>8s} {'pair P95 %':>10s}")
    for c, figs in table.items():
        for k, s in figs.items():
            print(f"{c:18s} {k:24s} {s['median']:10.3f} {s['iqr_pct']:7.2f} {s['range_pct']:8.2f} "
                  f"{s['pair_p95_pct']:10.2f}")
    if a.json:
        a.json.write_text(json.dumps({"timing_cpu": cpu, "siblings": sib, "rounds": res, "table": table}, indent=1))
    return 0


ONE_PROCESS = """
import ctypes, os, statistics, sys
lib = ctypes.CDLL(sys.argv[1]); os.sched_setaffinity(0, {int(sys.argv[2])})
bursts, calls = int(sys.argv[3]), int(sys.argv[4])
assert lib.oracle_init(0) == 0
out = (ctypes.c_double * bursts)()
print("ready", flush=True)
for line in sys.stdin:
    assert lib.oracle_host_per_launch(bursts, calls, out) == 0
    print(statistics.median(out), flush=True)
lib.oracle_close()
"""

if __name__ == "__main__":
    sys.exit(main())
