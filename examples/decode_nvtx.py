"""A small-batch LLM decode loop with NVTX ranges, eager or as one CUDA graph per step (``--graph``).

A transformer-like decoder (random fp16 weights, nothing downloaded): per layer a LayerNorm, QKV projection,
attention of the new token over a fixed-length KV cache, output projection and a GELU MLP; then the LM head,
argmax and the next token's embedding. Shapes are static, so a step can be captured into a graph
(``torch.cuda.CUDAGraph``); the captured step writes its next tokens back into its own input, so eager and
graphed runs do the same work. Each step ends with a synchronize, as a decode loop that hands tokens back does.

NVTX ranges (torch.cuda.nvtx): ``batch_<B>`` around all steps of a batch size, ``decode_step_b<B>`` per step;
graph capture and warm-up happen outside them. Run eager and graphed under ``pcietrace attach`` and compare
(see examples/README.md): graphs matter most at small batch, where the kernels are short.

Usage: python decode_nvtx.py [--graph] [--batch-sizes 1,4,16,64] [--steps 30] [--layers 6] [--hidden 1024]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F


class Decoder(torch.nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, vocab: int) -> None:
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.blocks = torch.nn.ModuleList(torch.nn.ModuleDict({
            "ln1": torch.nn.LayerNorm(hidden), "qkv": torch.nn.Linear(hidden, 3 * hidden, bias=False),
            "out": torch.nn.Linear(hidden, hidden, bias=False), "ln2": torch.nn.LayerNorm(hidden),
            "up": torch.nn.Linear(hidden, 4 * hidden, bias=False), "down": torch.nn.Linear(4 * hidden, hidden, bias=False),
        }) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(hidden)
        self.head = torch.nn.Linear(hidden, vocab, bias=False)

    def step(self, tokens: torch.Tensor, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """One decode step for ``tokens`` (B,), written back in place with the next tokens."""
        x = self.embed(tokens)  # (B, H)
        b, h = x.shape
        hd = h // self.heads
        for blk, (k, v) in zip(self.blocks, kv):
            q, _, _ = blk["qkv"](blk["ln1"](x)).view(b, 3, self.heads, hd).unbind(1)  # new K/V not appended: static shapes
            a = F.scaled_dot_product_attention(q.unsqueeze(2), k, v).reshape(b, h)
            x = x + blk["out"](a)
            x = x + blk["down"](F.gelu(blk["up"](blk["ln2"](x))))
        tokens.copy_(self.head(self.ln_f(x)).argmax(-1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", action="store_true", help="replay each step as a CUDA graph")
    ap.add_argument("--batch-sizes", default="1,2,4,8,16,32,64")
    ap.add_argument("--steps", type=int, default=30, help="decode steps per batch size")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--context", type=int, default=256, help="KV cache length")
    ap.add_argument("--vocab", type=int, default=16384)
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = Decoder(args.layers, args.hidden, args.heads, args.vocab).to(dev, torch.float16).eval()
    hd = args.hidden // args.heads
    out = []
    with torch.no_grad():
        for b in (int(x) for x in args.batch_sizes.split(",")):
            kv = [(torch.randn(b, args.heads, args.context, hd, device=dev, dtype=torch.float16),
                   torch.randn(b, args.heads, args.context, hd, device=dev, dtype=torch.float16))
                  for _ in range(args.layers)]
            tokens = torch.randint(0, args.vocab, (b,), device=dev)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graph wants
                for _ in range(3):
                    model.step(tokens, kv)
            torch.cuda.current_stream().wait_stream(side)
            graph = None
            if args.graph:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    model.step(tokens, kv)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            torch.cuda.nvtx.range_push(f"batch_{b}")
            for _ in range(args.steps):
                torch.cuda.nvtx.range_push(f"decode_step_b{b}")
                if graph is not None:
                    graph.replay()
                else:
                    model.step(tokens, kv)
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_pop()
            torch.cuda.nvtx.range_pop()
            ms = (time.perf_counter() - t0) * 1e3 / args.steps
            out.append({"batch": b, "ms_per_step": round(ms, 4), "tokens_per_s": round(b / ms * 1e3, 1)})
            del graph, kv
    print(json.dumps({"app": "decode", "graph": args.graph, "layers": args.layers, "hidden": args.hidden,
                      "steps": args.steps, "per_batch": out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
