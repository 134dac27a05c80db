"""A small PyTorch transformer annotated the way users annotate a model whose code they do not touch, for
`pcietrace attach`: ranges pushed and popped by module hooks (nested as the modules are), bf16 autocast, AdamW, the
loss read back with ``.item()`` every step, and ``emit_nvtx`` with its defaults.

Each phase is one enclosing range whose truth the app reads itself with NVML around it (blind_app.py's method):

- ``hooked_fwd``: ``STEPS`` forward steps without grad, a range around every submodule's forward, from hooks;
- ``amp_train``: ``TRAIN_STEPS`` training steps, each ``step`` > ``data`` (a pinned batch copied H2D,
  non-blocking) / ``forward`` (autocast bf16, a range per encoder layer from hooks) / ``backward`` /
  ``optimizer`` (AdamW), the loss read with ``.item()`` (a small D2H copy and a sync) in ``step``;
- ``emit_train``: the same steps under ``torch.autograd.profiler.emit_nvtx()`` (a range per op, no shapes).

``launches_expected`` (per call): the kernels the GPU ran in one call, counted by torch.profiler (CUPTI) outside
every range (blind_app.py's rows; copies and memsets left out). ``op_launches`` (meta, per call of ``emit_train``):
per op, the kernels launched inside its calls that lie in no other call of the same op (autocast calls
``aten::linear`` again inside ``aten::linear``), from torch.profiler's op tree: what attach's per-op rows, grouped by
op, should count over ``emit_calls`` calls (the warm-ups' too).

    BLIND_OUT=hooks.jsonl python3 tests/apps/hooks_app.py
    HOOKS_TRAIN_STEPS=60 BLIND_OUT=hooks.jsonl python3 tests/apps/hooks_app.py   # training ranges of ~1 s
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch

from blind_app import Counters, bus_id_of, ranged, rounds, run_meta, settings, write_rows
from compile_app import kernels_run

BATCH, SEQ, DIM, HEADS, LAYERS, STEPS = 16, 128, 256, 4, 4, 10
#: Training steps per call of ``amp_train`` and ``emit_train`` (``HOOKS_TRAIN_STEPS``: longer ranges, more reads
#: in each).
TRAIN_STEPS = int(os.environ.get("HOOKS_TRAIN_STEPS", "4"))


def op_kernels(dev: torch.device, body) -> tuple[dict[str, int], int, int]:
    """Per op name, the kernels (copies and memsets left out) launched inside its outermost calls in one call of
    ``body``, by torch.profiler's op tree (each kernel is listed under the host event that launched it); with the
    kernels the tree placed and all the kernels the GPU ran, which should agree."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        body()
        torch.cuda.synchronize(dev)
    events = prof.events()
    cuda = torch.autograd.DeviceType.CUDA
    host = [e for e in events if e.device_type != cuda]
    host_names = {h.name for h in host}
    ran = sum(1 for e in events if e.device_type == cuda and not e.name.startswith(("Memcpy", "Memset"))
              and e.name not in host_names)
    own = {id(e): sum(1 for k in e.kernels if not k.name.startswith(("Memcpy", "Memset"))) for e in host}
    subtree: dict[int, int] = {}

    def inside(e) -> int:
        if id(e) not in subtree:
            subtree[id(e)] = own[id(e)] + sum(inside(c) for c in e.cpu_children)
        return subtree[id(e)]

    found: dict[str, int] = {}

    def walk(e, open_names: frozenset) -> None:
        if e.name not in open_names:
            found[e.name] = found.get(e.name, 0) + inside(e)
        for c in e.cpu_children:
            walk(c, open_names | {e.name})

    for e in host:
        if e.cpu_parent is None:
            walk(e, frozenset())
    return found, sum(own.values()), ran


def main() -> int:
    truth_on, calls, out_path = settings("hooks_app.jsonl", 4)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    nvtx = torch.cuda.nvtx

    layer = torch.nn.TransformerEncoderLayer(DIM, HEADS, 4 * DIM, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch_host = torch.randn(BATCH, SEQ, DIM).pin_memory()  # (2 MiB a step)
    batch_dev = torch.empty(BATCH, SEQ, DIM, device=dev)

    which = {"on": ()}  # the module kinds whose forward pushes a range now (none: hooks present, silent)

    def hook(name: str, module: torch.nn.Module) -> None:
        def pre(m, args):
            if isinstance(m, which["on"]):
                nvtx.range_push(name)

        def post(m, args, out):
            if isinstance(m, which["on"]):
                nvtx.range_pop()
        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)

    for name, m in model.named_modules():
        if name:
            hook(name, m)

    def hooked_fwd() -> None:
        which["on"] = (torch.nn.Module,)
        with torch.no_grad():
            for _ in range(STEPS):
                model(batch_dev)
        which["on"] = ()
        torch.cuda.synchronize(dev)

    def train(annotate: bool) -> None:
        rng = nvtx.range if annotate else (lambda name: contextlib.nullcontext())
        which["on"] = (torch.nn.TransformerEncoderLayer,) if annotate else ()
        for _ in range(TRAIN_STEPS):
            with rng("step"):
                with rng("data"):
                    batch_dev.copy_(batch_host, non_blocking=True)
                with rng("forward"), torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(batch_dev).float().square().mean()
                with rng("backward"):
                    loss.backward()
                with rng("optimizer"):
                    opt.step()
                    opt.zero_grad()
                loss.item()
        which["on"] = ()
        torch.cuda.synchronize(dev)

    def emit_train() -> None:
        with torch.autograd.profiler.emit_nvtx():
            train(False)

    bodies = {"hooked_fwd": hooked_fwd, "amp_train": lambda: train(True), "emit_train": emit_train}
    for body in bodies.values():  # warm-up outside any range: kernels loaded, allocator and optimizer state made
        for _ in range(2):
            body()
    # (emit_nvtx is the profiler too: its phase's kernels counted on the same steps without it)
    kernels = {name: kernels_run(dev, lambda: train(False) if name == "emit_train" else body())
               for name, body in bodies.items()}
    op_launches, placed, ran = op_kernels(dev, lambda: train(False))
    payload = BATCH * SEQ * DIM * 4 * TRAIN_STEPS
    phases = {"hooked_fwd": (ranged("hooked_fwd", hooked_fwd), 0, None, kernels["hooked_fwd"]),
              "amp_train": (ranged("amp_train", bodies["amp_train"]), payload, "h2d", kernels["amp_train"]),
              "emit_train": (ranged("emit_train", emit_train), payload, "h2d", kernels["emit_train"])}

    counters = Counters(bus_id_of(dev.index)) if truth_on else None
    lines, loop_ns = rounds(dev, counters, calls, phases)
    write_rows(out_path, run_meta(dev, truth_on, calls, counters, list(phases), kernels=kernels,
                                  op_launches=op_launches, op_kernels_placed=placed, op_kernels_ran=ran,
                                  emit_calls=2 + calls), lines, loop_ns,
               calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
