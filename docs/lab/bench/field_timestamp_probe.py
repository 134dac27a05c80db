"""Probe (run on a GPU machine; not a test): does NVML's own per-field timestamp say when a PCIe counter value
was taken, better than the read's midpoint does?

pcietrace places each counter read at the midpoint of the NVML call and lets its value apply anywhere in it
(`analysis.counters.value_span_ns`). A read that stalls (tens of ms under torchrun) then widens edges and can
hide a counter wrap. ``nvmlFieldValue_t.timestamp`` is documented as the "CPU timestamp of this value" (us since
1970). This probe reads fields 197/198 on GPU 0 while torch streams pinned H2D copies at a steady rate, with
``--stallers`` extra threads reading the same GPU so that reads queue behind each other (NVML serializes them
inside a process) and some take much longer. Per read it keeps CLOCK_REALTIME before/after, the field
timestamp and latencyUsec, and the RX value. It reports:
- where the timestamp falls inside the read (0 = start, 1 = end), and how often outside it;
- the residual of the RX counter against a straight line in time (the copy rate is steady), placing each value
  at the read's midpoint vs at its field timestamp, for short and for long reads. If the timestamp places long
  reads' values much better, the sampler can record it and narrow the span a value applies over.
Measured on the H100, 2026-11-23 (`docs/lab/reports/field-timestamp-20261123/`), 3,000 reads each:
- no staller: reads 0.21 ms median (max 1.7); the timestamp at 0.47-0.57 of the read (5-95 %), never outside;
- 3 stallers: reads 0.85 ms median (max 9.4); the timestamp at 0.40-0.59 of the read, never outside.
RX and TX never share a timestamp. So the field timestamp sits at the call's midpoint even when the read waited
behind other threads: it says no more than the midpoint pcietrace already records, and cannot narrow a stalled
read's span. (The residual half is uninformative in that run: the copy stream, synchronized every 8 copies from
Python, averaged 4.7-5.0 GB/s with 30-200 MB residuals for every read, not a steady line.)
Usage: python3 docs/lab/bench/field_timestamp_probe.py [--reads 3000] [--stallers 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import numpy as np
import pynvml
import torch

RX, TX = 197, 198


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reads", type=int, default=3000)
    ap.add_argument("--stallers", type=int, default=3, help="extra threads reading the same GPU")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    src = torch.empty(64 << 20, dtype=torch.uint8).pin_memory()
    dst = torch.empty(64 << 20, dtype=torch.uint8, device="cuda:0")
    stop = threading.Event()

    def copies() -> None:  # a steady H2D stream: the counter rises on a straight line
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            while not stop.is_set():
                for _ in range(8):
                    dst.copy_(src, non_blocking=True)
                s.synchronize()

    def staller() -> None:
        while not stop.is_set():
            pynvml.nvmlDeviceGetFieldValues(h, [RX, TX])

    threads = [threading.Thread(target=copies)] + [threading.Thread(target=staller) for _ in range(a.stallers)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    rows = []
    for _ in range(a.reads):
        r0 = time.clock_gettime_ns(time.CLOCK_REALTIME)
        fv = pynvml.nvmlDeviceGetFieldValues(h, [RX, TX])
        r1 = time.clock_gettime_ns(time.CLOCK_REALTIME)
        if fv[0].nvmlReturn == 0:
            rows.append((r0, r1, fv[0].timestamp * 1000, fv[1].timestamp * 1000, fv[0].latencyUsec, fv[0].value.uiVal))
    stop.set()
    for t in threads:
        t.join()
    r0, r1, ts_rx, ts_tx, lat_us, rx = (np.array(c, dtype=np.float64) for c in zip(*rows))
    rx = np.concatenate([[0], np.cumsum(np.diff(rx.astype(np.int64)) % (1 << 32))]).astype(float)
    read_ms, pos = (r1 - r0) / 1e6, (ts_rx - r0) / np.maximum(r1 - r0, 1)
    mid = (r0 + r1) / 2
    out = {"reads": len(rows), "stallers": a.stallers,
           "read_ms_p50_p99_max": np.percentile(read_ms, [50, 99, 100]).round(3).tolist(),
           "timestamp_pos_in_read_p5_p50_p95": np.percentile(pos, [5, 50, 95]).round(3).tolist(),
           "timestamp_outside_read_frac": float(((pos < 0) | (pos > 1)).mean()),
           "rx_tx_timestamps_equal_frac": float((ts_rx == ts_tx).mean()),
           "latency_us_p50_p99": np.percentile(lat_us, [50, 99]).tolist()}
    long = read_ms > np.percentile(read_ms, 90)
    for name, t in (("midpoint", mid), ("field_timestamp", ts_rx)):
        fit = np.polyfit(t - t[0], rx, 1)
        res_mb = np.abs(rx - np.polyval(fit, t - t[0])) / 1e6
        out[f"residual_MB_{name}"] = {"rate_GBps": fit[0], "short_reads_p50_p95": np.percentile(res_mb[~long], [50, 95]).round(2).tolist(),
                                     "long_reads_p50_p95": np.percentile(res_mb[long], [50, 95]).round(2).tolist()}
    print(json.dumps(out, indent=1))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
