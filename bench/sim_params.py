"""Simulation parameters derived from a real recorded run, printed as JSON (what
``pcietrace/data/sim_params.json`` holds, for :class:`pcietrace.device.sim.SimParams`).

Usage: python3 bench/sim_params.py REPORT_DIR > pcietrace/data/sim_params.json

A script beside the benches rather than ``python -m pcietrace.device.sim``: deriving them analyses the run
(:mod:`pcietrace.analysis`), which the device layer does not import (tests/test_layers.py).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pcietrace.analysis import analyze  # noqa: E402
from pcietrace.device.sim import params_from_results  # noqa: E402
from pcietrace.session import Session  # noqa: E402


def main(argv: list[str]) -> int:
    """Print the SimParams derived from the real report ``argv[0]`` as JSON; a simulated one is refused (exit 2)."""
    s = Session.load(Path(argv[0]))
    if s.meta.get("simulated"):
        print("refusing to derive simulation parameters from a simulated report", file=sys.stderr)
        return 2
    print(json.dumps(asdict(params_from_results(analyze(s), s.meta, argv[0])), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
