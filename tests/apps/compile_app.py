"""A PyTorch inference loop as users write one to ask what CUDA graphs would save, for `pcietrace attach`: the same
model eager, under ``torch.compile`` (Triton kernels, launched through the driver API) and under
``torch.compile(mode="reduce-overhead")`` (CUDA graphs replayed by torch's cudagraph trees).

Each phase is one enclosing range whose truth the app reads itself with NVML around it (blind_app.py's method);
each call copies a pinned batch H2D, runs ``STEPS`` forward steps, and copies the logits back (pinned):

- ``eager``, ``compiled``, ``graphed``: the three ways, ``STEPS`` steps each, a range ``step`` around each step.

``launches_expected`` (per call): the kernels the GPU ran in one call, counted by torch.profiler (CUPTI) outside
every range, for ``eager`` and ``compiled`` (each kernel is one launch); null for ``graphed`` (a replay is one
graph launch however many kernels it holds; its count is printed beside the rows, ``graph_kernels``).

Rows: blind_app.py's JSON lines, so `bench/blind_attach.py --app compile` compares them with attach.

    BLIND_OUT=compile.jsonl python3 tests/apps/compile_app.py
"""

from __future__ import annotations

import sys

import torch

from blind_app import Counters, bus_id_of, ranged, rounds, run_meta, settings, write_rows

BATCH, DIM, LAYERS, STEPS = 64, 1024, 6, 10


def model() -> torch.nn.Module:
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(DIM, DIM), torch.nn.LayerNorm(DIM), torch.nn.GELU()]
    return torch.nn.Sequential(*layers)


def kernels_run(dev: torch.device, body) -> int:
    """The kernels one call of ``body`` ran on the GPU (copies and memsets left out), by torch.profiler. Its GPU
    events also hold the spans of ranges annotated on the host (``Optimizer.step#AdamW.step``): those, named as
    host events are, are no kernel."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        body()
        torch.cuda.synchronize(dev)
    events = prof.events()
    host = {e.name for e in events if e.device_type != torch.autograd.DeviceType.CUDA}
    return sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.name.startswith(("Memcpy", "Memset")) and e.name not in host)


def main() -> int:
    truth_on, calls, out_path = settings("compile_app.jsonl", 4)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    nvtx = torch.cuda.nvtx

    net = model().to(dev).eval()
    ways = {"eager": net, "compiled": torch.compile(net), "graphed": torch.compile(net, mode="reduce-overhead")}
    batch_host = torch.randn(BATCH, DIM).pin_memory()
    logits_host = torch.empty(BATCH, DIM).pin_memory()

    def steps(fn):
        def body() -> None:
            with torch.no_grad():
                x = batch_host.to(dev, non_blocking=True)
                for _ in range(STEPS):
                    with nvtx.range("step"):
                        x = fn(x).clone()  # (a graphed step's output is overwritten by its next replay)
                logits_host.copy_(x, non_blocking=True)
                torch.cuda.synchronize(dev)
        return body

    bodies = {name: steps(fn) for name, fn in ways.items()}
    for body in bodies.values():  # warm-up outside any range: compiled, graphs recorded
        for _ in range(3):
            body()
    kernels = {name: kernels_run(dev, body) for name, body in bodies.items()}
    payload = BATCH * DIM * 4
    phases = {name: (ranged(name, body), 2 * payload, "h2d+d2h", None if name == "graphed" else kernels[name])
              for name, body in bodies.items()}

    counters = Counters(bus_id_of(dev.index)) if truth_on else None
    lines, loop_ns = rounds(dev, counters, calls, phases)

    meta = run_meta(dev, truth_on, calls, counters, list(bodies), graph_kernels=kernels["graphed"], kernels=kernels)
    write_rows(out_path, meta, lines, loop_ns, calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
