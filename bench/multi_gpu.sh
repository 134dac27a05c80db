#!/usr/bin/env bash
# Issues 7 and 8 on a lent 4x (or 8x) H200, one part per device call of under 10 minutes. Run after
# `. bench/device_setup.sh` (carry .whl):   bash bench/multi_gpu.sh issue8|pva|issue7 [OUTPUT_DIR (default $OUT)]
#   issue8: nvidia-smi's and pcietrace's topology (NV18 expected), `pcietrace run` with defaults timed (goal
#           <= 60 s) and where its wall time goes.
#   pva:    each GPU alone vs all at once, 2 rounds (bench/parallel_vs_alone.py; ~5 min on 4 GPUs, ~8 on 8).
#   issue7: attach against the truth with one process per GPU (torchrun) and one thread per GPU, the truth read
#           outside the ranges and the runtime alone vs attached; the blind C++ oracle on GPU 0.
# COMMIT=abc1234 names the commit in the log. Every step runs under its own time limit even if one before it
# failed; the log says which failed and how long each took.
PART=${1:?issue8, pva or issue7}
R=${2:-${OUT:?give OUTPUT_DIR or set OUT}}
mkdir -p "$R"
exec > >(tee "$R/multi_gpu-$PART.log") 2>&1
step() {  # step LIMIT_S CMD...: CMD under its own time limit; says how long it took
    local limit=$1 t0=$SECONDS; shift
    echo "== $* (limit ${limit} s)"
    timeout "$limit" "$@" || echo "!! FAILED ($?): $*"
    echo "== took $((SECONDS - t0)) s: $*"
}
export COLUMNS=200
echo "commit: ${COMMIT:-not given (set COMMIT: the device copy of .git can be stale)}"
nvidia-smi --query-gpu=index,name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
case "$PART" in
issue8)
    step 30 nvidia-smi topo -m
    step 60 pcietrace topo
    step 120 pcietrace run -o "$R/run-defaults"
    step 120 python3 bench/run_phases.py --json "$R/run-phases.json"
    ;;
pva)
    step 560 python3 bench/parallel_vs_alone.py --repeats 2 --json "$R/parallel-vs-alone.json"
    ;;
issue7)
    step 240 python3 bench/attach_truth.py torchrun threads --reads-outside --overhead-pairs 2 --out "$R/truth"
    step 150 python3 bench/blind_attach.py --app cpp --calls 8 --pairs 2 --out "$R/blind-cpp"
    step 150 python3 bench/blind_attach.py --app torch --calls 8 --pairs 2 --out "$R/blind-torch"
    ;;
*) echo "unknown part $PART (issue8, pva or issue7)"; exit 2 ;;
esac
echo "== done $(date -u +%T)"
