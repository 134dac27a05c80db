"""Where `pcietrace run`'s wall time goes, per GPU: the same recording as `pcietrace run` with defaults
(every GPU, one worker process each), with every progress step and note timestamped as the parent receives it.

Prints each GPU's phases (start-up until its first step, byte windows, waiting for its turn, its timed turn,
the latency suite and peer chases) and the whole run's wall time, so the time an N-GPU box takes can be
put as start-up + windows + N x turn from a run on fewer GPUs. ``--json FILE`` saves the timeline.

    python3 bench/run_phases.py [--json timeline.json] [-- RUN OPTIONS]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pcietrace.cli import build_parser  # noqa: E402
from pcietrace.commands import run_config  # noqa: E402
from pcietrace.device import gpus  # noqa: E402
from pcietrace.record import box  # noqa: E402

GPU_LABEL = re.compile(r"GPU ?(\d+)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("run_args", nargs="*", help="`pcietrace run` options after --, e.g. -- --gpu 0")
    args = ap.parse_args()
    run = run_config(build_parser().parse_args(["run", *args.run_args]))  # pcietrace run's own defaults
    t0 = time.monotonic()
    events: list[tuple[float, str, str]] = []
    session, record = box.real(run.plan(), gpus.select(run.gpu), run.throughput_api, run.sample_interval_ms,
                               run.repeats if run.latency else None)
    t_setup = time.monotonic() - t0
    record(lambda label: events.append((time.monotonic() - t0, "step", label)),
           lambda label: events.append((time.monotonic() - t0, "note", label)))
    wall = time.monotonic() - t0
    for t, kind, label in events:
        print(f"{t:8.2f} s  {kind:4}  {label}")
    print(f"set-up before the workers: {t_setup:.2f} s; wall time: {wall:.2f} s on {len(ordinals)} GPU(s); "
          f"status {session.meta.get('status')}")
    if args.json:
        args.json.write_text(json.dumps({"gpus": ordinals, "wall_s": wall, "setup_s": t_setup,
                                         "events": events}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
