"""Benchmark (run on a GPU machine; not a test): what the collector costs, in one run.

1. Slowdown the collector causes on a launch-bound loop (the generator at max rate, sampler off vs on,
   interleaved): goal < 3 %.
2. The idle PCIe floor with the sampler reading as fast as it can vs once per ms (NVML reads are
   themselves PCIe traffic).
(The launch loops against a C++ oracle are bench/native_core.py.)
Usage: python3 docs/lab/bench/launch_rate.py [--pairs 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from pcietrace.analysis.counters import unwrap
from pcietrace.device.backend import CudaBackend
from pcietrace.collectors import CounterSampler, nvml
from pcietrace.record.generate import LaunchConfig, LaunchGenerator

def idle_floor(idx: int, interval_ns: int, seconds: float) -> tuple[float, float]:
    s = CounterSampler([idx], interval_ns=interval_ns)
    s.start()
    time.sleep(seconds)
    df = s.stop()
    rx = unwrap(df["rx_raw"].to_numpy())
    t = df["t_ns"].to_numpy()
    return float(rx[-1] / ((t[-1] - t[0]) / 1e9)), len(df) / ((t[-1] - t[0]) / 1e9)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=30, help="off/on window pairs for the collector overhead")
    a = ap.parse_args()
    be = CudaBackend(0)
    idx = nvml.index_for_bus_id(be.gpu.bus_id)
    gen = LaunchGenerator(be)
    gen.window(LaunchConfig("eager", 0.0, 1, None, 1.0, "bench"))  # warm up
    # Collector overhead: the sampler process keeps running and is paused/resumed between short
    # windows, so off/on pairs sit side by side in time; the paired ratios' median is the estimate.
    short = LaunchConfig("eager", 0.0, 1, None, 0.25, "bench")
    sampler = CounterSampler([idx])
    sampler.start()
    py_off, py_on, pairs = [], [], []
    for _ in range(a.pairs):
        sampler.pause(True)
        time.sleep(0.01)
        off = gen.window(short)["achieved_rate_hz"]
        sampler.pause(False)
        time.sleep(0.01)
        on = gen.window(short)["achieved_rate_hz"]
        py_off.append(off)
        py_on.append(on)
        pairs.append(on / off)
    sampler.stop()
    rng = np.random.default_rng(0)
    boot = np.median(rng.choice(pairs, (2000, len(pairs))), axis=1)
    slow_lo, slow_hi = 1 - np.percentile(boot, 97.5), 1 - np.percentile(boot, 2.5)
    floor_fast = idle_floor(idx, 0, 1.0)
    floor_slow = idle_floor(idx, 1_000_000, 1.0)
    med = statistics.median
    print(f"device: {be.gpu.name} ({be.gpu.bus_id}), driver {nvml.driver_version()}, {time.strftime('%Y-%m-%d')}")
    print(f"pcietrace eager, sampler off:    median {med(py_off):,.0f} over {len(py_off)} windows of 0.25 s")
    print(f"pcietrace eager, sampler on:     median {med(py_on):,.0f} over {len(py_on)} windows of 0.25 s")
    print(f"RATIO collector slowdown = {1 - med(pairs):+.2%} (95% CI {slow_lo:+.2%} .. {slow_hi:+.2%}, "
          f"{len(pairs)} paired 0.25 s windows)  (goal < 3 %)")
    print(f"idle H2D floor: sampler as fast as possible {floor_fast[0] / 1e6:.2f} MB/s at {floor_fast[1]:,.0f} reads/s; "
          f"1 ms interval {floor_slow[0] / 1e6:.2f} MB/s at {floor_slow[1]:,.0f} reads/s "
          f"=> {(floor_fast[0] - floor_slow[0]) / (floor_fast[1] - floor_slow[1]):,.0f} B per NVML read")
    return 0


if __name__ == "__main__":
    sys.exit(main())
