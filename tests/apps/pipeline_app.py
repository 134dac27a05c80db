"""A PyTorch model split over two GPUs in one process and one thread (pipeline / model parallel as users first
write it), for `pcietrace attach` on a machine with two GPUs or more.

Stage 0 (4 blocks) runs on cuda:0 and stage 1 (4 blocks and the loss) on cuda:1; the activations move between
them with ``.to("cuda:1")``; each step copies a pinned batch H2D to cuda:0 and reads the loss back from cuda:1.
Each phase is one enclosing range whose truth the app reads itself with NVML around it, on BOTH GPUs (their
bytes added: attach charges a range the GPUs it ran on), outside the range, 6 ms away, less an empty reference
window of the same round (blind_app.py's method):

- ``train``: ``STEPS`` training steps, each ``step`` > ``stage0`` / ``transfer`` / ``stage1`` / ``backward`` /
  ``optimizer``;
- ``to_gpu1``: a 64 MiB pinned batch copied H2D straight to cuda:1 (the current device stays cuda:0);
- ``from_gpu1``: a 64 MiB tensor of cuda:1 copied back into pinned memory, inside ``torch.cuda.device(1)``.

Rows: blind_app.py's JSON lines, so `bench/blind_attach.py --app pipeline` compares them with attach.
``BLIND_CALLS`` rounds; ``BLIND_TRUTH=0`` skips the NVML reads.

    BLIND_OUT=pipeline.jsonl python3 tests/apps/pipeline_app.py
"""

from __future__ import annotations

import sys

import torch

from blind_app import WRAP, Counters, bus_id_of, ranged, rounds, run_meta, settings, write_rows

MiB = 1 << 20
DIM, BATCH, STEPS, COPY_BYTES = 1024, 256, 8, 64 * MiB


class BothGpus:
    """The two GPUs' counters read as one: (rx, tx) each the sum of theirs mod 2**32, so that blind_app's windows
    give their bytes added."""

    def __init__(self) -> None:
        self.gpus = [Counters(bus_id_of(i)) for i in (0, 1)]
        self.nvml_index = ",".join(str(c.nvml_index) for c in self.gpus)

    def read(self) -> tuple[int, int]:
        reads = [c.read() for c in self.gpus]
        return sum(r[0] for r in reads) % WRAP, sum(r[1] for r in reads) % WRAP


def stage() -> torch.nn.Sequential:
    return torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(DIM, DIM), torch.nn.GELU())])


def main() -> int:
    if torch.cuda.device_count() < 2:
        sys.exit("pipeline_app: needs two GPUs")
    truth_on, calls, out_path = settings("pipeline_app.jsonl", 4)
    gpu0, gpu1 = torch.device("cuda", 0), torch.device("cuda", 1)
    torch.cuda.set_device(gpu0)
    nvtx = torch.cuda.nvtx

    first, second = stage().to(gpu0), stage().to(gpu1)
    opt = torch.optim.SGD([*first.parameters(), *second.parameters()], lr=1e-3)
    batch = torch.randn(BATCH, DIM).pin_memory()
    target = torch.randn(BATCH, DIM, device=gpu1)
    big_host = torch.ones(COPY_BYTES, dtype=torch.uint8).pin_memory()
    big_back = torch.empty(COPY_BYTES, dtype=torch.uint8).pin_memory()
    big_gpu1 = torch.full((COPY_BYTES,), 3, dtype=torch.uint8, device=gpu1)
    losses: list[float] = []

    def train() -> None:
        for _ in range(STEPS):
            with nvtx.range("step"):
                with nvtx.range("stage0"):
                    h = first(batch.to(gpu0, non_blocking=True))
                with nvtx.range("transfer"):
                    h = h.to(gpu1)
                with nvtx.range("stage1"):
                    loss = torch.nn.functional.mse_loss(second(h), target)
                with nvtx.range("backward"):
                    loss.backward()
                with nvtx.range("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                losses.append(loss.item())

    def to_gpu1() -> None:
        big_host.to(gpu1, non_blocking=True)
        torch.cuda.synchronize(gpu1)

    def from_gpu1() -> None:
        with torch.cuda.device(1):
            big_back.copy_(big_gpu1, non_blocking=True)
            torch.cuda.synchronize()

    phases = {"train": (ranged("train", train), STEPS * BATCH * DIM * 4, "h2d", None),
              "to_gpu1": (ranged("to_gpu1", to_gpu1), COPY_BYTES, "h2d", None),
              "from_gpu1": (ranged("from_gpu1", from_gpu1), COPY_BYTES, "d2h", None)}
    train(), to_gpu1(), from_gpu1()  # warm-up outside any range
    counters = BothGpus() if truth_on else None
    lines, loop_ns = rounds((gpu0, gpu1), counters, calls, phases)

    meta = run_meta((gpu0, gpu1), truth_on, calls, counters, list(phases), final_loss=losses[-1])
    write_rows(out_path, meta, lines, loop_ns, calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
