#!/usr/bin/env bash
# Issue 41 on a lent machine with 4 GPUs: a two-"node" torchrun job over localhost (2 GPUs per node), each node
# under its own `pcietrace attach --label nodeK -o DIR/node-%q{NODE_RANK}` with its own GPUs
# (CUDA_VISIBLE_DEVICES=0,1 and 2,3), the app (tests/apps/truth_app.py --torch) reading NVML inside itself
# around its ranges as the truth; then `pcietrace merge` and bench/multinode_check.py: every rank charged its own
# GPU on its own node, each range's bytes within its stated error of the truth (bench/_goals.py), the merged
# ranges the sum of the nodes' own recordings. Prints a compact table; exits non-zero on any failure.
#   . bench/device_setup.sh; bash bench/multinode_torchrun.sh [OUTPUT_DIR (default $OUT)]
# PY: a Python with torch (default python3); PORT: the rendezvous port (default 29541); RDZV=static: torchrun's
# static rendezvous (--master-addr, --node-rank) instead of c10d; READS=outside: the app's truth reads sit outside
# its ranges (a range's truth is then its window minus an empty range's); REPS: rounds of ranges (default 5).
set -u
R=${1:-${OUT:?give OUTPUT_DIR or set OUT}}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-python3}
PORT=${PORT:-29541}
mkdir -p "$R"
rm -rf "$R"/node-0 "$R"/node-1 "$R"/merged "$R"/truth-node*.jsonl "$R"/truth-alone-node*.jsonl
exec > >(tee "$R/multinode_torchrun.log") 2>&1
echo "commit: ${COMMIT:-not given}"
ngpu=$(nvidia-smi -L | grep -c '^GPU ')
if [ "$ngpu" -lt 4 ]; then echo "needs 4 GPUs, found $ngpu"; exit 2; fi
export TRUTH_READS=${READS:-inside} COLUMNS=200

node() {  # node K GPUS [alone]: one "node" of the job, under its own attach (or alone: the truth), in the background
    local k=$1 gpus=$2 rdzv attach=()
    if [ "${RDZV:-c10d}" = static ]; then
        rdzv=(--master-addr localhost --master-port "$PORT")
    else
        rdzv=(--rdzv-backend c10d --rdzv-endpoint "localhost:$PORT" --rdzv-id "pcietrace-multinode-${3:-attach}")
    fi
    [ "${3:-}" = alone ] || attach=("$PY" -m pcietrace attach --label "node$k" -o "$R/node-%q{NODE_RANK}" --)
    NODE_RANK=$k CUDA_VISIBLE_DEVICES=$gpus TRUTH_OUT="$R/truth${3:+-$3}-node$k.jsonl" timeout 420 \
        "${attach[@]}" \
        "$PY" -m torch.distributed.run --nnodes 2 --node-rank "$k" --nproc-per-node 2 "${rdzv[@]}" \
        "$HERE/tests/apps/truth_app.py" --torch --reps "${REPS:-5}" > "$R/${3:-attach}-node$k.log" 2>&1 &
}

# the truth: the same job alone (the app's NVML reads under attach would also count the sampler's own reads)
node 0 0,1 alone; a0=$!
node 1 2,3 alone; a1=$!
wait $a0 && wait $a1 || { echo "the job alone failed"; tail -20 "$R"/alone-node*.log; exit 1; }
t0=$SECONDS
node 0 0,1; p0=$!
node 1 2,3; p1=$!
wait $p0; rc0=$?
wait $p1; rc1=$?
echo "== the job: node0 exit $rc0, node1 exit $rc1 ($((SECONDS - t0)) s); attach logs: $R/attach-node{0,1}.log"
if [ $rc0 -ne 0 ] || [ $rc1 -ne 0 ]; then tail -20 "$R"/attach-node*.log; exit 1; fi
"$PY" -m pcietrace merge "$R/node-0" "$R/node-1" -o "$R/merged" > "$R/merged-report.txt" || { echo "merge failed"; exit 1; }
"$PY" -m pcietrace report "$R/merged" --format json > "$R/merged-report.json" || { echo "report failed"; exit 1; }
echo "== merged: $R/merged (report: $R/merged-report.txt, Perfetto: $R/merged/trace.json)"
"$PY" "$HERE/bench/multinode_check.py" "$R/merged" --truth "node0=$R/truth-node0.jsonl" \
    --truth "node1=$R/truth-node1.jsonl" --alone "node0=$R/truth-alone-node0.jsonl" \
    --alone "node1=$R/truth-alone-node1.jsonl"
