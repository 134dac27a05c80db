"""CounterSampler's real child processes with a stand-in counter reader (no driver needed), for
tests/test_idle_sampling.py. Spawned children import this main module first, so the patch below reaches them.

    python3 sampler_fake_nvml.py      -> JSON: per phase (idle, held fast, range open, paused), the reads
                                         seen after its first 15 ms and their median gap (ms); stop time (s)
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import time

import sys
from pathlib import Path

import numpy as np

from pcietrace.collectors import edges, nvml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, for its NVML stand-ins
from fake_nvml import FakeCounterReader  # noqa: E402

nvml.CounterReader = FakeCounterReader

if __name__ == "__main__":
    from pcietrace.collectors import CounterSampler

    page = edges.create()
    fd = os.open(page, os.O_RDWR)
    mm = mmap.mmap(fd, edges.PAGE)
    os.close(fd)
    words = (ctypes.c_uint32 * 4).from_buffer(mm)
    words[edges.COUNTING] = 1  # as the injection library does when it maps the page
    s = CounterSampler([0], interval_ns=1_000_000, edge_file=page, idle_interval_ns=10_000_000)
    marks = []
    try:
        s.start()
        for phase in ("idle", "held", "idle", "open", "paused", "idle"):
            if phase == "held":
                s.hold_fast(True)    # attach's idle windows: fast although no range is open
            elif phase == "paused":
                s.pause(True)
            elif phase == "open":
                words[edges.OPEN_RANGES] = 1  # what the injection library does at a push (no wake-up here)
            start = time.monotonic_ns()
            time.sleep(0.1)
            # (the phase ends before its state is lifted: a read right after the pause is not one of its reads)
            marks.append((phase, start, time.monotonic_ns()))
            s.hold_fast(False)
            s.pause(False)
            words[edges.OPEN_RANGES] = 0
        t_stop = time.monotonic_ns()
    finally:
        t = s.stop()["t_ns"].to_numpy()
        del words
        mm.close()
        os.unlink(page)
    phases = []
    for phase, a, b in marks:
        sel = t[(t > a + 15_000_000) & (t < b)]
        phases.append({"phase": phase, "reads": int(sel.size),
                       "median_gap_ms": float(np.median(np.diff(sel))) / 1e6 if sel.size > 1 else None})
    print(json.dumps({"phases": phases, "stop_s": (time.monotonic_ns() - t_stop) / 1e9}))
