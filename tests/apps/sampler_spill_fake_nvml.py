"""CounterSampler's real child processes with a stand-in counter reader (no driver needed), streaming their
samples to a folder as they arrive (tests/test_long_run.py).

    python3 sampler_spill_fake_nvml.py SECONDS GPUS [SPILL_ROWS]
        -> JSON: samples returned, batches streamed ("files"), the most samples the parent held at once, its
           resident memory (MB) every 50 ms
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from pcietrace.collectors import nvml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, for its NVML stand-ins
from fake_nvml import FakeCounterReader  # noqa: E402

nvml.CounterReader = FakeCounterReader

if __name__ == "__main__":
    from pcietrace.collectors import sampler

    seconds, gpus = float(sys.argv[1]), int(sys.argv[2])
    sampler.SPILL_ROWS = int(sys.argv[3]) if len(sys.argv) > 3 else 2_000
    with tempfile.TemporaryDirectory() as spill:
        s = sampler.CounterSampler(list(range(gpus)), interval_ns=500_000, spill_dir=spill)
        held, rss = 0, []
        s.start()
        try:
            t_end = time.monotonic() + seconds
            while time.monotonic() < t_end:
                time.sleep(0.05)
                held = max(held, s._held)
                with open("/proc/self/statm") as f:  # resident now (not the peak)
                    rss.append(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20)
        finally:
            samples = s.stop()
        files = s._stream.batches if s._stream is not None else 0
    ok = bool((samples.groupby("nvml_index")["t_ns"].diff().dropna() > 0).all())
    print(json.dumps({"samples": len(samples), "files": files, "held": held, "in_order": ok,
                      "gpus": sorted(int(i) for i in samples["nvml_index"].unique()), "rss_mb": rss}))
