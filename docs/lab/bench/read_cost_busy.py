"""What one NVML counter read costs in PCIe bytes while a PyTorch training loop runs, against idle (run on a GPU
machine with torch; not a test).

attach's floor charges each sampler read what the idle windows and the ranges' quiet intervals say a read costs;
no interval of a recording shows a read's cost inside a busy stretch alone. Here another process reads the counters
every ``--interval-ms`` (as attach's sampler does) while the app either trains (``tests/apps/hooks_app.py``'s
model and step under ``emit_nvtx``) or sleeps as long, and every window is run twice in a row, reader off and on
(the order alternating per round); the app's own NVML reads around each window give its bytes. A read's cost is
the paired difference over the reads made, with its 95 % interval over the rounds. Measured on the lent H200
(2026-11-29, 1 ms): 17,920 +- 167 B H2D and 23,757 +- 196 B D2H a read while training (reads of 449 us), 16,244
+- 150 and 22,065 +- 209 B while idle (361 us), 24 rounds; 18,761 +- 209 and 24,548 +- 311 B against 16,602 +-
199 and 22,359 +- 292 B (440 and 343 us), 16 rounds: the source of ``floor.STATE_MIN_SHARE``.

    python3 docs/lab/bench/read_cost_busy.py [--rounds 24] [--interval-ms 1] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "apps"))

from blind_app import Counters, bus_id_of, delta  # noqa: E402  (the apps' own NVML truth reader)

BATCH, SEQ, DIM, HEADS, LAYERS, STEPS = 16, 128, 256, 4, 4, 4


def reader(bus: str, ready, on, stop, reads, busy, read_ns, interval_s: float) -> None:
    """Another process: reads the counters every ``interval_s`` while ``on`` is set, counting its reads."""
    c = Counters(bus)
    ready.set()
    while not stop.is_set():
        if not on.is_set():
            time.sleep(0.0002)
            continue
        busy.value = 1
        t = time.perf_counter_ns()
        c.read()
        read_ns.value += time.perf_counter_ns() - t
        reads.value += 1
        busy.value = 0
        time.sleep(interval_s)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=24, help="paired rounds (default 24)")
    ap.add_argument("--interval-ms", type=float, default=1.0, help="the reader's pause between reads (default 1)")
    ap.add_argument("--json", type=Path, help="write every window's row here")
    a = ap.parse_args()

    import torch

    from pcietrace.analysis.spread import t975

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    layer = torch.nn.TransformerEncoderLayer(DIM, HEADS, 4 * DIM, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch_host = torch.randn(BATCH, SEQ, DIM).pin_memory()
    batch_dev = torch.empty(BATCH, SEQ, DIM, device=dev)

    def train() -> None:
        with torch.autograd.profiler.emit_nvtx():
            for _ in range(STEPS):
                batch_dev.copy_(batch_host, non_blocking=True)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(batch_dev).float().square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                loss.item()
        torch.cuda.synchronize(dev)

    for _ in range(3):
        train()
    t = time.perf_counter()
    train()
    train_s = time.perf_counter() - t

    bus = bus_id_of(0)
    ctx = mp.get_context("spawn")
    ready, on, stop = ctx.Event(), ctx.Event(), ctx.Event()
    reads, busy, read_ns = ctx.Value("q", 0, lock=False), ctx.Value("i", 0, lock=False), ctx.Value("q", 0, lock=False)
    proc = ctx.Process(target=reader, args=(bus, ready, on, stop, reads, busy, read_ns, a.interval_ms / 1e3))
    proc.start()
    counters = Counters(bus)
    if not ready.wait(120):  # (the reader's own imports and NVML first)
        stop.set()
        proc.join()
        sys.exit("read_cost_busy: the reader process did not start")
    rows = []
    try:
        for k in range(a.rounds):
            for phase, body in (("train", train), ("idle", lambda: time.sleep(train_s))):
                for reading in ((False, True) if k % 2 == 0 else (True, False)):
                    torch.cuda.synchronize(dev)
                    time.sleep(0.005)
                    n0, ns0 = reads.value, read_ns.value
                    before = counters.read()
                    if reading:
                        on.set()
                    body()
                    on.clear()
                    time.sleep(0.003)
                    while busy.value:  # (a read in flight ends before the window closes)
                        time.sleep(0.0005)
                    h2d, d2h = delta(counters.read(), before)
                    n = reads.value - n0
                    rows.append({"round": k, "phase": phase, "reading": reading, "h2d": h2d, "d2h": d2h, "reads": n,
                                 "read_us": (read_ns.value - ns0) / max(n, 1) / 1e3})
    finally:
        stop.set()
        proc.join()
    if a.json:
        a.json.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{a.rounds} rounds, a read every {a.interval_ms:g} ms at most, training window {train_s * 1e3:.1f} ms")
    for phase in ("train", "idle"):
        off = {r["round"]: r for r in rows if r["phase"] == phase and not r["reading"]}
        hot = {r["round"]: r for r in rows if r["phase"] == phase and r["reading"]}
        for d in ("h2d", "d2h"):
            per = np.array([(hot[k][d] - off[k][d]) / hot[k]["reads"] for k in off if hot[k]["reads"]])
            half = t975(per.size - 1) * per.std(ddof=1) / np.sqrt(per.size)
            print(f"  {phase:5s} {d.upper()}: {per.mean():8,.0f} +- {half:5,.0f} B a read")
        print(f"  {phase:5s} {np.mean([r['reads'] for r in hot.values()]):.1f} reads a window, "
              f"{np.median([r['read_us'] for r in hot.values()]):.0f} us each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
