"""A PyTorch training step (forward, backward, optimizer) in an NVTX range, and its launches counted another way.

PyTorch launches the backward pass from its autograd threads, not from the thread that opened the range. Run
plainly (or under `pcietrace attach`) the app makes ``STEPS`` ranges `train_step` (torch.cuda.nvtx). With
``BACKWARD_PROFILE=FILE`` it runs the same steps under torch.profiler instead (CUPTI runtime-API records, each with
its thread) and writes per step: the launches the range's own thread made and those of every thread in the
step's time (cudaLaunchKernel / cudaLaunchKernelExC / cuLaunchKernel(Ex) / cudaGraphLaunch records).

    python3 tests/apps/backward_app.py [STEPS]
    BACKWARD_PROFILE=launches.json python3 tests/apps/backward_app.py [STEPS]
"""

from __future__ import annotations

import json
import os
import sys

import torch

LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch")


def main() -> int:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)]).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 512, device="cuda")

    def step() -> None:
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()

    for _ in range(5):  # warm-up outside any range (autograd threads started, kernels loaded)
        step()
    out = os.environ.get("BACKWARD_PROFILE")
    if not out:
        for _ in range(steps):
            torch.cuda.nvtx.range_push("train_step")
            step()
            torch.cuda.nvtx.range_pop()
        return 0
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            with record_function("train_step"):
                step()
    events = prof.events()
    # the step as the host ran it (the profiler also shows it on the GPU's timeline, later); its thread is the
    # profiler's id of the thread that opened it
    cpu_steps = sorted((e for e in events if e.name == "train_step" and str(e.device_type).endswith("CPU")),
                       key=lambda e: e.time_range.start)
    launches = [(e.time_range.start, e.thread) for e in events if e.name in LAUNCH_CALLS]
    rows = []
    for e in cpu_steps:
        inside = [tid for t, tid in launches if e.time_range.start <= t < e.time_range.end]
        rows.append({"all_threads": len(inside), "own_thread": sum(tid == e.thread for tid in inside)})
    with open(out, "w") as f:
        json.dump({"steps": rows, "main_thread": cpu_steps[0].thread if cpu_steps else None,
                   "threads": sorted({tid for _, tid in launches})}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
