#!/usr/bin/env bash
# Issue 11 on a lent GPU: the graphs GPU tests, `pcietrace graphs` at the published workload sizes (504 and
# 2,520 kernels of 2-8 us), the demo apps and the decode example eager + graphed under attach, and the compares.
# Run after `. bench/device_setup.sh`:   bash bench/graphs_h100.sh [OUTPUT_DIR (default runs)] [--attach-only]
# (--attach-only: skip the `pcietrace graphs` runs and go straight to attach's savings prediction)
# Every step runs even if one before it failed; the log says which failed.
R=${1:-runs}
ONLY_ATTACH=${2:-}
mkdir -p "$R"
exec > >(tee "$R/graphs_h100.log") 2>&1
step() { echo "== $*"; "$@" || echo "!! FAILED ($?): $*"; }
export COLUMNS=200
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
step python3 setup.py -q build_ext --inplace  # the checkout's own native library, for the tests run from here
step python3 -m pytest -q -m gpu tests/test_graphs.py tests/test_savings.py
if [ "$ONLY_ATTACH" != "--attach-only" ]; then
step pcietrace graphs --kernels 504,2520 -o "$R/graphs-h100"
step pcietrace graphs --kernels 504,2520 --pipelined -o "$R/graphs-h100-pipelined"
step pcietrace graphs --kernels 504,2520 --order random --param-sets 20 -o "$R/graphs-h100-random20"
step pcietrace graphs --kernels 504,2520 --json --no-save > "$R/graphs-h100-rerun.json"
step pcietrace compare "$R/graphs-h100" "$R/graphs-h100-pipelined"
fi
# attach's savings prediction against measured savings: Python and C++ demo apps
step pcietrace attach -o "$R/demo-py-eager" -- python3 tests/apps/demo_nvtx.py 20000 1000 1024
step pcietrace attach -o "$R/demo-py-graph" -- python3 tests/apps/demo_nvtx.py --graphed 20000 1000 1024
step pcietrace compare "$R/demo-py-eager" "$R/demo-py-graph"
pcietrace compare "$R/demo-py-eager" "$R/demo-py-graph" --json > "$R/savings-demo-py.json"
step nvcc -O2 -o /tmp/demo_nvtx tests/apps/demo_nvtx.cu -ldl
step pcietrace attach -o "$R/demo-cpp-eager" -- /tmp/demo_nvtx 20000 1000 1024
step pcietrace attach -o "$R/demo-cpp-graph" -- /tmp/demo_nvtx --graphed 20000 1000 1024
step pcietrace compare "$R/demo-cpp-eager" "$R/demo-cpp-graph"
pcietrace compare "$R/demo-cpp-eager" "$R/demo-cpp-graph" --json > "$R/savings-demo-cpp.json"
# small-batch decode (PyTorch), eager and one CUDA graph per step
step pcietrace attach -o "$R/decode-eager" -- python3 examples/decode_nvtx.py --batch-sizes 1,4,16,64
step pcietrace attach --gpu-time -o "$R/decode-eager-gputime" -- python3 examples/decode_nvtx.py --batch-sizes 1,4,16,64
step pcietrace attach -o "$R/decode-graph" -- python3 examples/decode_nvtx.py --graph --batch-sizes 1,4,16,64
step pcietrace compare "$R/decode-eager" "$R/decode-graph"
pcietrace compare "$R/decode-eager" "$R/decode-graph" --json > "$R/savings-decode.json"
# the prediction from the GPU's busy time (attach --gpu-time), and what recording it costs the eager run
step pcietrace compare "$R/decode-eager-gputime" "$R/decode-graph"
pcietrace compare "$R/decode-eager-gputime" "$R/decode-graph" --json > "$R/savings-decode-gputime.json"
step python3 bench/savings_truth.py "$R/decode-eager" "$R/decode-eager-gputime" "$R/decode-graph" --json "$R/savings-truth-decode.json"
step pcietrace attach --gpu-time -o "$R/demo-py-eager-gputime" -- python3 tests/apps/demo_nvtx.py 20000 1000 1024
step pcietrace compare "$R/demo-py-eager-gputime" "$R/demo-py-graph"
pcietrace compare "$R/demo-py-eager-gputime" "$R/demo-py-graph" --json > "$R/savings-demo-py-gputime.json"
step python3 bench/savings_truth.py "$R/demo-py-eager" "$R/demo-py-eager-gputime" "$R/demo-py-graph" --json "$R/savings-truth-demo-py.json"
step pcietrace attach --gpu-time -o "$R/demo-cpp-eager-gputime" -- /tmp/demo_nvtx 20000 1000 1024
step pcietrace compare "$R/demo-cpp-eager-gputime" "$R/demo-cpp-graph"
pcietrace compare "$R/demo-cpp-eager-gputime" "$R/demo-cpp-graph" --json > "$R/savings-demo-cpp-gputime.json"
step python3 bench/savings_truth.py "$R/demo-cpp-eager" "$R/demo-cpp-eager-gputime" "$R/demo-cpp-graph" --json "$R/savings-truth-demo-cpp.json"
echo "== done"
