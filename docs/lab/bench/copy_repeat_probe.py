"""Does one pinned copy's byte count ever come out short? (GPU machine; not a test)

Repeats the GPU suite's known-copy measurement (tests/test_gpu.py ``_copy_bytes``: a 1 ms background sampler plus
exact reads right before the copy is issued and right after it is synchronized, the floor taken from the idle
0.3 s before) and prints counted/copied per copy, a 1 GiB copy before each smaller one as in the suite. The
H200's suite in the twentieth session read one 256 MiB H2D copy at 0.777 (the same call later in that suite:
1.078; 80 copies repeated on a fresh H200: 1.0781-1.0786 H2D). Each copy's samples are saved (Parquet, one file
per copy, under OUT), so a short one can be looked at: did the counter catch up after the closing read?

    python3 docs/lab/bench/copy_repeat_probe.py OUT [--repeats 20] [--mib 256]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from test_gpu import _copy_bytes  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--mib", type=int, default=256)
    a = ap.parse_args()
    for direction in ("h2d", "d2h"):
        for i in range(a.repeats):
            for mib in (1024, a.mib):  # as the suite's test does: 1 GiB first, then the smaller copy
                keep = a.out / f"{direction}-{i:02d}"
                keep.mkdir(parents=True, exist_ok=True)
                os.environ["PCIETRACE_SAVE_TRACES"] = str(keep)
                counted, copied, _ = _copy_bytes(mib << 20, 1, direction)
                print(f"{direction} {i:2d} {mib:5d} MiB: counted/copied {counted / copied:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
