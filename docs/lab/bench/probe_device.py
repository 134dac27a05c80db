"""Device facts the design depends on, measured on the lent GPU (run once per new machine kind).

Prints: counter read cost and update period, globaltimer resolution seen by the spin kernel, Python
launch cost (eager and graph), queue depth before cuLaunchKernel blocks, and a per-launch byte
ballpark. Usage: python3 docs/lab/bench/probe_device.py
"""

from __future__ import annotations

import time

import numpy as np

from pcietrace.device import cuda
from pcietrace.collectors import nvml
from pcietrace.collectors.sampler import CounterSampler
from pcietrace.device.kernels import SPIN_SOURCE


def main() -> None:
    gpu = cuda.Gpu(0)
    idx = nvml.index_for_bus_id(gpu.bus_id)
    print("gpu", gpu.name, gpu.bus_id, "cc", gpu.cc, "driver", nvml.driver_version(), nvml.gpu_info(idx))
    r = nvml.CounterReader(idx)
    print("counter mode", r.mode, "bits", r.bits)
    t, tx, rx = [], [], []
    for _ in range(3000):
        t0 = time.monotonic_ns()
        v = r.read()
        t.append((t0 + time.monotonic_ns()) // 2)
        tx.append(v[0])
        rx.append(v[1])
    t = np.array(t)
    rxa = np.array(rx, np.int64)
    ch = np.flatnonzero(np.diff(rxa) != 0)
    print(f"read cost median {np.median(np.diff(t))/1e3:.1f} us; rx changes {len(ch)} of {len(t)} reads;"
          f" median gap between changes {np.median(np.diff(t[ch+1]))/1e3 if len(ch)>1 else float('nan'):.1f} us")
    mod = gpu.compile(SPIN_SOURCE, "spin")
    k = gpu.kernel(mod, "pt_spin", 2)
    out = gpu.alloc_device(8)
    k.args[1] = out
    launch = gpu.launcher(k)
    for ns in (0, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 50000):
        k.args[0] = ns
        el = []
        for _ in range(20):
            gpu.check(launch())
            el.append(int(gpu.read_u64(out)[0]))
        print(f"spin request {ns} ns -> in-kernel {np.median(el):.0f} ns (min {min(el)}, max {max(el)}; distinct {sorted(set(el))[:6]})")
    k.args[1] = 0
    k.args[0] = 0
    for rep in range(2):
        n = 100_000
        t0 = time.perf_counter_ns()
        for _ in range(n):
            launch()
        t1 = time.perf_counter_ns()
        gpu.synchronize()
        t2 = time.perf_counter_ns()
        print(f"eager empty: enqueue {(t1-t0)/n/1e3:.3f} us/launch, incl sync {(t2-t0)/n/1e3:.3f} us/launch")
    exe = gpu.capture_graph(launch, 100)
    gl = gpu.graph_launcher(exe)
    n = 2000
    t0 = time.perf_counter_ns()
    for _ in range(n):
        gl()
    t1 = time.perf_counter_ns()
    gpu.synchronize()
    t2 = time.perf_counter_ns()
    print(f"graph K=100 empty: enqueue {(t1-t0)/n/1e3:.3f} us/graph, incl sync {(t2-t0)/n/100/1e3:.3f} us/kernel")
    # Queue depth: a 300 ms blocker, then time each launch until one blocks.
    k.args[0] = 300_000_000
    gpu.check(launch())
    k.args[0] = 0
    ts = np.zeros(20000, np.int64)
    for i in range(20000):
        launch()
        ts[i] = time.perf_counter_ns()
    gpu.synchronize()
    d = np.diff(ts)
    big = np.flatnonzero(d > 100_000)
    print("queue: first launch that waited >100us:", big[:3], "waits us", d[big[:3]] / 1e3)
    # Bytes ballpark with the sampler running.
    s = CounterSampler([idx])
    s.start()
    time.sleep(0.3)
    t_a = time.monotonic_ns()
    for _ in range(200_000):
        launch()
    gpu.synchronize()
    t_b = time.monotonic_ns()
    time.sleep(0.3)
    df = s.stop()
    rxs = np.cumsum(np.r_[0, np.diff(df.rx_raw.to_numpy().astype(np.int64)) % 2**32])
    txs = np.cumsum(np.r_[0, np.diff(df.tx_raw.to_numpy().astype(np.int64)) % 2**32])
    tt = df.t_ns.to_numpy()
    dt = (t_b - t_a) / 1e9
    pre = (np.interp(t_a, tt, rxs) - rxs[0]) / ((t_a - tt[0]) / 1e9)
    rx_w = np.interp(t_b, tt, rxs) - np.interp(t_a, tt, rxs)
    tx_w = np.interp(t_b, tt, txs) - np.interp(t_a, tt, txs)
    print(f"sampler: {len(df)} samples, {len(df)/((tt[-1]-tt[0])/1e9):.0f}/s, failed {s.failed_reads}")
    print(f"idle rx floor ~{pre:.0f} B/s; 200k launches in {dt:.3f}s: rx {rx_w/2e5:.1f} B/launch, tx {tx_w/2e5:.1f} B/launch")


if __name__ == "__main__":
    main()
