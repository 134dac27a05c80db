"""A PyTorch app annotated the way users annotate, for `pcietrace attach` at real NVTX density.

The same small model (8 blocks of LayerNorm + Linear 256->1024 + GELU + Linear 1024->256, batch 4) under the
four annotations users write, each phase one enclosing range whose truth the app reads itself with NVML around
it (outside the range, 6 ms away, less an empty reference window of the same round: blind_app.py's method):

- ``fwd_one``: 20 forward steps in one range, nothing inside;
- ``fwd_layers``: the same steps with a range around every block (160 inside);
- ``fwd_emit``: the same steps under ``torch.autograd.profiler.emit_nvtx(record_shapes=True)``: a range per op
  (~1,000 inside), named as PyTorch names them (``aten::linear, seq = N, op_id = N, sizes = [...]``);
- ``train_step``: Megatron-style nesting, ``train_step`` > ``data`` (a 16 MiB pinned batch copy H2D) /
  ``forward`` > ``layer{i}`` / ``backward`` / ``optimizer`` / ``loss_d2h`` (a 16 MiB copy back, pinned), 4 steps;
- ``emit_train``: a training step with a 16 MiB H2D copy, all under emit_nvtx (backward ops too).

Rows: blind_app.py's JSON lines (``kind`` meta/ref/range/end), so `bench/blind_attach.py --app dense` compares
them with attach. ``DENSE_PHASES`` (comma-separated) picks phases; ``BLIND_CALLS`` rounds; ``BLIND_TRUTH=0``
skips the NVML reads (runtime pairs); under torchrun each rank uses cuda:$LOCAL_RANK and writes its own file
(``.rankN.jsonl``); ``DENSE_EPOCH=1`` puts every round inside one range, ``all_rounds`` (a second or more long,
its own truth read around it: the floor of hundreds of reads in one range); ``DENSE_LINGER_S=4``: rank 0 stays 4 s
after its rounds, so the others' GPUs are left without a context before attach's idle windows after the job (a
rank that ends first). The forward phases launch the same
kernels, so attach's launch count per call must be the same whatever the annotation (800 a call: 20 steps of 8
blocks of 5 kernels); each row's ``launches_expected`` is its phase's kernels counted by torch.profiler on
the same work unannotated, outside every range (compile_app.py's count).

    BLIND_OUT=dense.jsonl python3 tests/apps/dense_app.py
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

import torch

# the truth as blind_app.py takes it (this folder is on sys.path as a script)
from blind_app import GAP_S, Counters, bus_id_of, range_row, ref_row, window, write_rows
from compile_app import kernels_run

MiB = 1 << 20
BLOCKS, DIM, HIDDEN, BATCH, STEPS, TRAIN_STEPS = 8, 256, 1024, 4, 20, 4
COPY_BYTES = 16 * MiB
PHASES = ("fwd_one", "fwd_layers", "fwd_emit", "train_step", "emit_train")


class Block(torch.nn.Module):
    """A pre-norm residual MLP block (tests/apps/serve_app.py's too, at its own widths)."""

    def __init__(self, dim: int = DIM, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, hidden)
        self.down = torch.nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def main() -> int:
    truth_on = os.environ.get("BLIND_TRUTH", "1") != "0"
    calls = int(os.environ.get("BLIND_CALLS", "8"))
    out_path = os.environ.get("BLIND_OUT", "dense_app.jsonl")
    if "RANK" in os.environ:  # under torchrun: a file per rank (dense_app.jsonl -> dense_app.rank1.jsonl)
        out_path = out_path.removesuffix(".jsonl") + f".rank{os.environ['RANK']}.jsonl"
    phases = [p for p in os.environ.get("DENSE_PHASES", ",".join(PHASES)).split(",") if p]
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(dev)
    nvtx = torch.cuda.nvtx

    blocks = torch.nn.ModuleList(Block() for _ in range(BLOCKS)).to(dev)
    opt = torch.optim.SGD(blocks.parameters(), lr=1e-4)
    x = torch.randn(BATCH, DIM, device=dev)
    batch_host = torch.full((COPY_BYTES,), 1, dtype=torch.uint8, pin_memory=True)
    batch_dev = torch.empty(COPY_BYTES, dtype=torch.uint8, device=dev)
    back_dev = torch.full((COPY_BYTES,), 2, dtype=torch.uint8, device=dev)
    back_host = torch.empty(COPY_BYTES, dtype=torch.uint8, pin_memory=True)

    def forward(per_layer: bool) -> torch.Tensor:
        h = x
        for i, b in enumerate(blocks):
            if per_layer:
                nvtx.range_push(f"layer{i}")
            h = b(h)
            if per_layer:
                nvtx.range_pop()
        return h

    def fwd_steps(per_layer: bool) -> None:
        with torch.no_grad():
            for _ in range(STEPS):
                forward(per_layer)
        torch.cuda.synchronize(dev)

    def train(annotate: bool) -> None:
        rng = nvtx.range if annotate else (lambda name: contextlib.nullcontext())
        for _ in range(TRAIN_STEPS):
            with rng("data"):
                batch_dev.copy_(batch_host, non_blocking=True)
            with rng("forward"):
                loss = forward(annotate).square().mean()
            with rng("backward"):
                loss.backward()
            with rng("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=False)
        with rng("loss_d2h"):
            back_host.copy_(back_dev, non_blocking=True)
            torch.cuda.synchronize(dev)

    def fwd_emit() -> None:
        with torch.autograd.profiler.emit_nvtx(record_shapes=True):
            fwd_steps(False)

    def one_step() -> None:
        batch_dev.copy_(batch_host, non_blocking=True)
        loss = forward(False).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        torch.cuda.synchronize(dev)

    def emit_train() -> None:
        with torch.autograd.profiler.emit_nvtx(record_shapes=True):
            one_step()

    def pushed(name, body):
        def run():
            nvtx.range_push(name)
            body()
            nvtx.range_pop()
        return run

    bodies = {"fwd_one": pushed("fwd_one", lambda: fwd_steps(False)),
              "fwd_layers": pushed("fwd_layers", lambda: fwd_steps(True)),
              "fwd_emit": pushed("fwd_emit", fwd_emit),
              "train_step": pushed("train_step", lambda: train(True)),
              "emit_train": pushed("emit_train", emit_train)}
    # (payload bytes, direction) of the copies each phase makes
    payload = {"train_step": (2 * COPY_BYTES, "h2d+d2h"), "emit_train": (COPY_BYTES, "h2d")}

    for name in phases:  # warm-up outside any range: kernels loaded, allocator and optimizer state made
        {"fwd_one": lambda: fwd_steps(False), "fwd_layers": lambda: fwd_steps(True), "fwd_emit": fwd_emit,
         "train_step": lambda: train(False), "emit_train": emit_train}[name]()
    torch.cuda.synchronize(dev)
    # each phase's kernels by torch.profiler, on the same work unannotated (emit_nvtx is the profiler itself)
    plain = {"fwd_one": lambda: fwd_steps(False), "fwd_layers": lambda: fwd_steps(False),
             "fwd_emit": lambda: fwd_steps(False), "train_step": lambda: train(False), "emit_train": one_step}
    kernels = {name: kernels_run(dev, plain[name]) for name in phases}

    counters = Counters(bus_id_of(dev.index)) if truth_on else None
    lines: list[dict] = []

    def rounds() -> None:
        for rnd in range(calls):
            ref, _ = window(dev, counters, lambda: None)
            lines.append(ref_row(rnd, ref))
            for name in phases:
                raw, ns = window(dev, counters, bodies[name])
                nbytes, direction = payload.get(name, (0, None))
                lines.append(range_row(name, rnd, raw, ref, ns, nbytes, direction, kernels[name]))

    t_loop0 = time.perf_counter_ns()
    if os.environ.get("DENSE_EPOCH") == "1":  # every round inside one long range, as an epoch's range holds its steps
        raw, ns = window(dev, counters, pushed("all_rounds", rounds))
        ref = (lines[0]["h2d_bytes"], lines[0]["d2h_bytes"]) if raw else None
        lines.append(range_row("all_rounds", 0, raw, ref, ns, 0, None, None))
    else:
        rounds()
    loop_ns = time.perf_counter_ns() - t_loop0

    meta = {"kind": "meta", "pid": os.getpid(), "device": str(dev), "truth": truth_on, "calls": calls,
            "gap_s": GAP_S, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(dev),
            "nvml_index": counters.nvml_index if counters else None, "order": phases}
    write_rows(out_path, meta, lines, loop_ns, calls)
    if os.environ.get("LOCAL_RANK", "0") == "0":  # DENSE_LINGER_S: rank 0 (its context alive) outlives the others
        time.sleep(float(os.environ.get("DENSE_LINGER_S") or 0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
