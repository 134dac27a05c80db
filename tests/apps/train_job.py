"""A training job annotated per layer, as issue-scale long runs are: a small MLP trained for ``--seconds`` with a
range per step, one around the forward pass, one per layer inside it, and one each around backward and the
optimizer step (14 ranges a step). Under torchrun each rank trains on its own GPU (LOCAL_RANK), independently.
At the end each rank writes ``--out``.rank<R>.json: its steps, ranges and the CLOCK_MONOTONIC ns its loop ended at
(the clock attach's trace uses), so a caller can time what attach does after the job.

    torchrun --nproc_per_node 4 tests/apps/train_job.py --seconds 150 --out /tmp/job
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

LAYERS = 10


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=150.0, help="training time (default 150)")
    ap.add_argument("--out", default="train_job", help="output file prefix (default train_job)")
    a = ap.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    # (more ranks than GPUs share them in turn: a 4-process job's post-job load on a 2-GPU machine)
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    nvtx = torch.cuda.nvtx
    layers = torch.nn.ModuleList(torch.nn.Linear(256, 256) for _ in range(LAYERS)).to(dev)
    opt = torch.optim.SGD(layers.parameters(), lr=1e-4)
    x = torch.randn(64, 256, device=dev)
    steps = 0
    end = time.monotonic() + a.seconds
    while time.monotonic() < end:
        nvtx.range_push("step")
        nvtx.range_push("forward")
        h = x
        for i, layer in enumerate(layers):
            nvtx.range_push(f"layer{i}")
            h = torch.relu(layer(h))
            nvtx.range_pop()
        nvtx.range_pop()
        nvtx.range_push("backward")
        h.square().mean().backward()
        nvtx.range_pop()
        nvtx.range_push("optimizer")
        opt.step()
        opt.zero_grad(set_to_none=True)
        nvtx.range_pop()
        nvtx.range_pop()
        steps += 1
    torch.cuda.synchronize(dev)
    with open(f"{a.out}.rank{rank}.json", "w") as f:
        json.dump({"rank": rank, "steps": steps, "ranges": steps * (LAYERS + 4), "end_ns": time.monotonic_ns()}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
