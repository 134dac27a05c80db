"""What one NVML counter read costs in PCIe bytes and time, by the GPU's state (run on a GPU machine; not a test).

attach's floor is fitted per counter read on idle windows before and after the program. On the lent GPUs the
windows before a program read a cold GPU (no CUDA context for a while): reads there took ~2x as long and moved
more bytes than after the program or inside its ranges, so the fitted floor was too high inside ranges. This
probe measures the read cost in one process, per phase: cold (no context for a while), with a CUDA context
held idle by another process, and at several delays after that context is gone.

    python3 docs/lab/bench/read_cost_by_state.py [--gpu 0] [--cycles 2] [--loop-s 0.5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

from pcietrace.analysis.counters import unwrap
from pcietrace.collectors import nvml

HOLD = ("import sys, time; from pcietrace.device.cuda import Gpu; g = Gpu(int(sys.argv[1])); "
        "print('ready', flush=True); sys.stdin.read(); g.close()")


def read_loop(reader: nvml.CounterReader, seconds: float) -> dict[str, float]:
    """Read back to back for ``seconds``: bytes per read (counter delta / reads, both directions) and the
    median time per read (us); the background between reads is included (idle GPU: ~0.1 MB/s)."""
    t, vals = [], []
    end = time.monotonic_ns() + int(seconds * 1e9)
    while True:
        a = time.monotonic_ns()
        v = reader.read()
        b = time.monotonic_ns()
        if v is not None:
            t.append(b - a)
            vals.append(v)
        if b >= end:
            break
    tx, rx = (unwrap(np.array([x[k] for x in vals], dtype=np.uint64), reader.bits) for k in (0, 1))
    n = len(vals) - 1  # reads between the first value and the last
    pstate = nvml.query_or(-1, "nvmlDeviceGetPerformanceState", nvml.handle(reader.index))
    return {"reads": n, "tx_bytes_per_read": float(tx[-1] / n), "rx_bytes_per_read": float(rx[-1] / n),
            "read_us_median": float(np.median(t) / 1e3), "pstate": int(pstate)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", type=int, default=0, help="NVML index = CUDA ordinal on the lent machines")
    ap.add_argument("--cycles", type=int, default=2)
    ap.add_argument("--loop-s", type=float, default=0.5)
    ap.add_argument("--cold-s", type=float, default=8.0, help="idle time without a context before 'cold'")
    ap.add_argument("--after-s", type=float, nargs="+", default=[0.0, 1.0, 3.0, 6.0])
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    reader = nvml.CounterReader(a.gpu)
    rows = []

    def measure(phase: str, cycle: int) -> None:
        r = {"phase": phase, "cycle": cycle, **read_loop(reader, a.loop_s)}
        rows.append(r)
        print(f"{phase:>14} c{cycle}: {r['reads']:5d} reads  rx {r['rx_bytes_per_read']:8.0f} B/read  "
              f"tx {r['tx_bytes_per_read']:8.0f} B/read  read {r['read_us_median']:6.0f} us  P{r['pstate']}",
              flush=True)

    for c in range(a.cycles):
        time.sleep(a.cold_s)
        measure("cold", c)
        hold = subprocess.Popen([sys.executable, "-c", HOLD, str(a.gpu)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        assert hold.stdout is not None and hold.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        measure("context held", c)
        assert hold.stdin is not None
        hold.stdin.close()
        hold.wait()
        t_gone = time.monotonic()
        for s in a.after_s:
            time.sleep(max(0.0, t_gone + s - time.monotonic()))
            measure(f"after +{s:g} s", c)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
