"""A PyTorch training script as users write one, for `pcietrace attach`: batches from a DataLoader with worker
processes and pinned memory, mixed precision, a loss read back every step, an evaluation pass and a checkpoint.

Each phase is one enclosing range whose truth the app reads itself with NVML around it (outside the range, 6 ms
away, less an empty reference window of the same round: blind_app.py's method):

- ``epoch``: an epoch of ``STEPS`` batches from ``DataLoader(num_workers=2, pin_memory=True)`` (its workers forked
  when the epoch's iterator starts, inside the range), each step ``step`` > ``data`` (the batch copied H2D,
  non-blocking) / ``forward`` (fp16 autocast) / ``backward`` (GradScaler) / ``optimizer`` / ``log`` (``loss.item()``);
- ``eval``: the model on a held-out pinned batch under ``torch.no_grad()``, its predictions copied back (``.cpu()``);
- ``checkpoint``: ``torch.save`` of the model's and the optimizer's state into memory (every tensor copied D2H).

Rows: blind_app.py's JSON lines, so `bench/blind_attach.py --app loader` compares them with attach.
``BLIND_CALLS`` rounds; ``BLIND_TRUTH=0`` skips the NVML reads.

    BLIND_OUT=loader.jsonl python3 tests/apps/loader_app.py
"""

from __future__ import annotations

import io
import sys

import torch

from blind_app import Counters, bus_id_of, ranged, rounds, run_meta, settings, write_rows

IMAGE = (3, 64, 64)
BATCH, STEPS, CLASSES, WORKERS = 32, 12, 100, 2


class Images(torch.utils.data.Dataset):
    """Random images made in the workers (as decoding would), with labels."""

    def __len__(self) -> int:
        return BATCH * STEPS

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(i)
        return torch.rand(IMAGE, generator=g), i % CLASSES


def model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(64 * 16 * 16, 512), torch.nn.ReLU(), torch.nn.Linear(512, CLASSES))


def main() -> int:
    truth_on, calls, out_path = settings("loader_app.jsonl", 4)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    nvtx = torch.cuda.nvtx

    net = model().to(dev)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    scaler = torch.cuda.amp.GradScaler()
    loader = torch.utils.data.DataLoader(Images(), batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                                         pin_memory=True, drop_last=True)
    held_out = torch.rand(256, *IMAGE).pin_memory()
    losses: list[float] = []

    def epoch() -> None:
        net.train()
        for images, labels in loader:
            with nvtx.range("step"):
                with nvtx.range("data"):
                    images = images.to(dev, non_blocking=True)
                    labels = labels.to(dev, non_blocking=True)
                with nvtx.range("forward"), torch.autocast("cuda", dtype=torch.float16):
                    loss = torch.nn.functional.cross_entropy(net(images), labels)
                with nvtx.range("backward"):
                    scaler.scale(loss).backward()
                with nvtx.range("optimizer"):
                    scaler.step(opt)
                    scaler.update()
                    opt.zero_grad(set_to_none=True)
                with nvtx.range("log"):
                    losses.append(loss.item())

    def evaluate() -> None:
        net.eval()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
            predictions = net(held_out.to(dev, non_blocking=True)).argmax(1)
        predictions.cpu()

    def checkpoint() -> None:
        torch.save({"model": net.state_dict(), "optimizer": opt.state_dict()}, io.BytesIO())

    epoch(), evaluate(), checkpoint()  # warm-up outside any range: kernels loaded, optimizer state made
    torch.cuda.synchronize(dev)
    state_bytes = sum(t.numel() * t.element_size() for t in net.state_dict().values()) + sum(
        t.numel() * t.element_size() for s in opt.state_dict()["state"].values() for t in s.values()
        if torch.is_tensor(t) and t.is_cuda)
    phases = {"epoch": (ranged("epoch", epoch), STEPS * BATCH * (4 * IMAGE[0] * IMAGE[1] * IMAGE[2] + 8), "h2d", None),
              "eval": (ranged("eval", evaluate), held_out.numel() * 4, "h2d", None),
              "checkpoint": (ranged("checkpoint", checkpoint), state_bytes, "d2h", None)}

    counters = Counters(bus_id_of(dev.index)) if truth_on else None
    lines, loop_ns = rounds(dev, counters, calls, phases)

    meta = run_meta(dev, truth_on, calls, counters, list(phases), final_loss=losses[-1])
    write_rows(out_path, meta, lines, loop_ns, calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
