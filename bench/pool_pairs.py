"""Pool the per-pair runtime changes of several `bench/attach_overhead_matrix.py` logs (not a test): reads each
log's ``CONFIG: app runtime per pair a, b, ... %`` line and prints the median over every pair with its 95 %
bootstrap interval, as the matrix prints one call's.

    python3 bench/pool_pairs.py tests/data/bench/overhead/h100-run*-overhead-cpp.log [--config attach]

The pairs are pooled as printed (one decimal), so a pooled figure can be checked from the committed logs alone.
"""

from __future__ import annotations

import argparse
import re
import sys

from _stats import median_ci


def pairs_in(text: str, config: str) -> list[float]:
    """Every pair's runtime change, in %, from the lines of ``config`` in one log's ``text``."""
    lines = re.findall(rf"^{re.escape(config)}: app runtime per pair (.*?) %", text, flags=re.M)
    return [float(v) for line in lines for v in line.split(", ") if v.strip()]  # (a config with no pair: "pair  %")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+", help="attach_overhead_matrix.py logs")
    ap.add_argument("--config", default="attach", help="the configuration to pool (default: attach)")
    a = ap.parse_args()
    pooled = []
    for path in a.logs:
        with open(path) as f:
            found = pairs_in(f.read(), a.config)
        print(f"{path}: {len(found)} pairs")
        pooled += found
    if not pooled:
        print(f"no '{a.config}: app runtime per pair' line in these logs", file=sys.stderr)
        return 2
    med, lo, hi = median_ci(pooled)
    print(f"{a.config}: {len(pooled)} pairs, median {med:+.2f} % [95 % CI {lo:+.2f}, {hi:+.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
