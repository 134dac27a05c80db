#!/usr/bin/env bash
# What one NVTX range edge costs a C++ program (bench/edge_cost.cu), in ROUNDS rounds of: plain, the injection
# library alone (as attach sets it up, no sampler), and under `pcietrace attach` (the library wakes the samplers
# at every edge). GPU machine, after `. bench/device_setup.sh`; not a test.
#   bash bench/edge_cost.sh [ROUNDS (default 2)] [PAIRS (default 3000)]
set -u
ROUNDS=${1:-2} PAIRS=${2:-3000}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
nvcc -O2 -o "$W/edge" "$(dirname "$0")/edge_cost.cu" -ldl || exit 1
library() {  # library CMD...: CMD with the injection library set up as attach does, no sampler
    env $(python3 -c 'import sys
from pathlib import Path
from pcietrace.record.attach import injection_env
env = injection_env(Path(sys.argv[1]), "interpose", None, [0], False)
print(" ".join(f"{k}={v}" for k, v in env.items() if k.startswith(("PCIETRACE_", "NVTX_", "LD_PRELOAD"))))' "$W") "$@"
}
for r in $(seq "$ROUNDS"); do
    echo "== round $r plain";          "$W/edge" "$PAIRS"
    echo "== round $r plain nocuda";   "$W/edge" "$PAIRS" nocuda
    echo "== round $r library only";   library "$W/edge" "$PAIRS"
    echo "== round $r attach";         python3 -m pcietrace attach --no-calibrate -o "$W/a$r" -- "$W/edge" "$PAIRS" | grep "ns per call"
    echo "== round $r dense (nested, a name each): plain, library only, attach"
    "$W/edge" 200000 cuda dense
    library "$W/edge" 200000 cuda dense
    python3 -m pcietrace attach --no-calibrate -o "$W/d$r" -- "$W/edge" 200000 cuda dense | grep "ns per"
    echo "== round $r attach --sample-interval-ms 10"
    python3 -m pcietrace attach --no-calibrate --sample-interval-ms 10 -o "$W/b$r" -- "$W/edge" "$PAIRS" | grep "ns per call"
done
