"""A PyTorch inference server as users write one, for `pcietrace attach`: a pool of worker threads, each on its own
CUDA stream, serving requests annotated with the ``nvtx`` package's decorator in a named domain; a decode loop
replaying a CUDA graph; and bulk copies of known size.

Each phase is one enclosing range (``torch.cuda.nvtx``, NVTX's default domain) whose truth the app reads itself with
NVML around it (blind_app.py's method); nested ranges get no truth. Per call (MiB = 2**20 B):

- ``serve_threads``: the main thread submits ``REQUESTS`` requests to a ``ThreadPoolExecutor`` of ``WORKERS``
  threads (made once, before the rounds; each thread has its own ``torch.cuda.Stream``) and waits for all. A
  request is a range ``request`` (domain ``serve``, from ``@nvtx.annotate``) holding ``preprocess`` (a 2 MiB pinned
  batch copied H2D, non-blocking, on the thread's stream), ``model`` (an MLP forward, no_grad, bf16 autocast) and
  ``postprocess`` (top-5 of the logits, then ``.cpu()`` of indices and values: 30 KiB D2H); the worker syncs its
  stream. 64 MiB H2D + 960 KiB D2H; its ranges' kernels run on the worker threads, not the range's thread.
- ``graph_decode``: ``DECODE_STEPS`` steps, each a range ``step`` (``torch.cuda.nvtx.range``): a new token's 16 KiB
  pinned input copied H2D into the graph's static input, one replay of a CUDA graph captured once before the rounds
  (an 8-block bf16 decoder step and its argmax), and every 8th step ``.cpu()`` of the static output (64 B D2H).
- ``bulk_h2d``: 8 pinned 4 MiB copies H2D (non-blocking, then synchronize), then 2 pageable 4 MiB copies; each copy
  in a range ``copy`` (domain ``serve``). 40 MiB H2D.
- ``bulk_d2h``: 6 device 4 MiB buffers copied into pinned host tensors, each in a ``copy`` range. 24 MiB D2H.

Payloads with both directions carry direction ``h2d+d2h`` and their sum (per direction in the meta's ``payloads``).
``launches_expected`` (per call): the kernels the GPU ran in one call, counted by torch.profiler (CUPTI, every thread
of the process) outside every range (compile_app.py's ``kernels_run``; copies and memsets left out), for every phase
but ``graph_decode``: there torch.profiler counts the kernels inside the replays, not the ``DECODE_STEPS`` graph
launches attach counts, so it is null and that count is in the meta (``graph_kernels``, beside ``graph_replays``).
Every body runs twice before, outside any range; ``BLIND_TRUTH=0`` runs the same work without NVML reads. A few
seconds of GPU work at the defaults (``BLIND_CALLS`` rounds, default 8).

    BLIND_OUT=serve.jsonl python3 tests/apps/serve_app.py
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import nvtx
import torch

from blind_app import Counters, bus_id_of, ranged, rounds, run_meta, settings, write_rows
from compile_app import kernels_run
from dense_app import Block

MiB = 1 << 20
WORKERS, REQUESTS = 4, 32
BATCH, SEQ, DIM, HIDDEN, VOCAB, LAYERS, TOPK = 4, 128, 1024, 4096, 8192, 2, 5  # a request: 2 MiB fp32 in
DEC_BATCH, DEC_LAYERS, DECODE_STEPS, READ_EVERY = 8, 8, 64, 8
BULK_PINNED, BULK_PAGEABLE, BULK_D2H = 8, 2, 6  # 4 MiB buffers each


def stack(n: int) -> torch.nn.Sequential:
    return torch.nn.Sequential(*[Block(DIM, HIDDEN) for _ in range(n)], torch.nn.LayerNorm(DIM))


def main() -> int:
    truth_on, calls, out_path = settings("serve_app.jsonl", 8)
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(dev)
    torch.manual_seed(0)

    # --- serving: the model, the requests' pinned inputs, one request (the worker threads come after the graph) ---
    net = torch.nn.Sequential(stack(LAYERS), torch.nn.Linear(DIM, VOCAB)).to(dev).eval()
    requests_host = torch.randn(REQUESTS, BATCH, SEQ, DIM).pin_memory()
    local = threading.local()

    @nvtx.annotate("request", domain="serve", color="blue")
    def serve_one(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        torch.cuda.set_device(dev)  # the current device is per thread
        s = local.stream
        with torch.cuda.stream(s):
            with nvtx.annotate("preprocess", domain="serve"):
                x = requests_host[i].to(dev, non_blocking=True)
            with nvtx.annotate("model", domain="serve"), torch.no_grad(), \
                    torch.autocast("cuda", dtype=torch.bfloat16):
                logits = net(x)
            with nvtx.annotate("postprocess", domain="serve"):
                top = logits.float().topk(TOPK, dim=-1)
                ids, scores = top.indices.cpu(), top.values.cpu()
        s.synchronize()
        return ids, scores

    # --- decoding: a CUDA graph of one decoder step, captured once (warm-up on a side stream first) ---
    dec = stack(DEC_LAYERS).to(dev, torch.bfloat16).eval()
    head = torch.nn.Linear(DIM, VOCAB).to(dev, torch.bfloat16).eval()
    tokens_host = torch.randn(DECODE_STEPS, DEC_BATCH, DIM).to(torch.bfloat16).pin_memory()
    static_in = torch.zeros(DEC_BATCH, DIM, dtype=torch.bfloat16, device=dev)
    state = torch.zeros(DEC_BATCH, DIM, dtype=torch.bfloat16, device=dev)

    def decode_step() -> torch.Tensor:
        h = dec(static_in + state)
        state.copy_(h.tanh())
        return head(h).argmax(dim=-1)

    side = torch.cuda.Stream(device=dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.no_grad():
        with torch.cuda.stream(side):
            for _ in range(3):
                decode_step()
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = decode_step()
    torch.cuda.synchronize(dev)

    def graph_decode() -> None:
        for i in range(DECODE_STEPS):
            with torch.cuda.nvtx.range("step"):
                static_in.copy_(tokens_host[i], non_blocking=True)
                graph.replay()
                if (i + 1) % READ_EVERY == 0:
                    static_out.cpu()
        torch.cuda.synchronize(dev)

    # --- the worker threads, each with its own stream ---
    pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="serve")
    started = threading.Barrier(WORKERS)

    def start_worker(w: int) -> None:
        """Run once on each pool thread (the barrier holds each until all WORKERS threads exist): its stream, and a
        first request on it (cuBLAS handle and workspace, allocator blocks of that stream)."""
        torch.cuda.set_device(dev)
        local.stream = torch.cuda.Stream(device=dev)
        serve_one(w)
        started.wait(timeout=120)

    # (after the capture: torch.cuda.graph empties the allocator's cache, and each stream's blocks stay made)
    for f in [pool.submit(start_worker, w) for w in range(WORKERS)]:
        f.result()

    def serve_threads() -> None:
        futures = [pool.submit(serve_one, i) for i in range(REQUESTS)]
        for f in futures:
            f.result()
        torch.cuda.synchronize(dev)

    # --- bulk copies of known size ---
    pinned_src = [torch.full((4 * MiB,), k, dtype=torch.uint8, pin_memory=True) for k in range(BULK_PINNED)]
    pinned_dst = [torch.empty(4 * MiB, dtype=torch.uint8, device=dev) for _ in range(BULK_PINNED)]
    pageable_src = [torch.full((4 * MiB,), 100 + k, dtype=torch.uint8) for k in range(BULK_PAGEABLE)]
    pageable_dst = [torch.empty(4 * MiB, dtype=torch.uint8, device=dev) for _ in range(BULK_PAGEABLE)]
    d2h_src = [torch.full((4 * MiB,), 200 + k, dtype=torch.uint8, device=dev) for k in range(BULK_D2H)]
    d2h_dst = [torch.empty(4 * MiB, dtype=torch.uint8, pin_memory=True) for _ in range(BULK_D2H)]

    def bulk_h2d() -> None:
        for src, dst in zip(pinned_src, pinned_dst):
            with nvtx.annotate("copy", domain="serve"):
                dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(dev)
        for src, dst in zip(pageable_src, pageable_dst):
            with nvtx.annotate("copy", domain="serve"):
                dst.copy_(src)
        torch.cuda.synchronize(dev)

    def bulk_d2h() -> None:
        for src, dst in zip(d2h_src, d2h_dst):
            with nvtx.annotate("copy", domain="serve"):
                dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(dev)

    bodies = {"serve_threads": serve_threads, "graph_decode": graph_decode, "bulk_h2d": bulk_h2d,
              "bulk_d2h": bulk_d2h}
    for body in bodies.values():  # warm-up outside any range: kernels loaded, allocator blocks made, graph uploaded
        for _ in range(2):
            body()
    kernels = {name: kernels_run(dev, body) for name, body in bodies.items()}

    out_bytes = BATCH * SEQ * TOPK * (8 + 4)  # int64 indices + fp32 values
    payloads = {  # name -> (H2D bytes, D2H bytes) per call
        "serve_threads": (REQUESTS * BATCH * SEQ * DIM * 4, REQUESTS * out_bytes),
        "graph_decode": (DECODE_STEPS * DEC_BATCH * DIM * 2, DECODE_STEPS // READ_EVERY * DEC_BATCH * 8),
        "bulk_h2d": ((BULK_PINNED + BULK_PAGEABLE) * 4 * MiB, 0),
        "bulk_d2h": (0, BULK_D2H * 4 * MiB),
    }
    directions = {"serve_threads": "h2d+d2h", "graph_decode": "h2d+d2h", "bulk_h2d": "h2d", "bulk_d2h": "d2h"}
    phases = {name: (ranged(name, body), sum(payloads[name]), directions[name],
                     None if name == "graph_decode" else kernels[name])
              for name, body in bodies.items()}

    counters = Counters(bus_id_of(dev.index)) if truth_on else None
    lines, loop_ns = rounds(dev, counters, calls, phases)
    pool.shutdown(wait=True)

    meta = run_meta(dev, truth_on, calls, counters, list(phases), kernels=kernels,
                    graph_kernels=kernels["graph_decode"], graph_replays=DECODE_STEPS,
                    payloads={k: {"h2d": h, "d2h": d} for k, (h, d) in payloads.items()},
                    workers=WORKERS, requests=REQUESTS)
    write_rows(out_path, meta, lines, loop_ns, calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
