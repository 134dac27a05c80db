"""A PyTorch program that does GPU work in a second process on the same GPU, the way users do with
``torch.multiprocessing`` (start method "spawn", CUDA in both processes), for `pcietrace attach`.

At start-up, before the rounds, the main process starts ONE worker process (``get_context("spawn").Process``,
daemon) and talks to it through two one-way Pipes (commands in, replies out). The worker sets its device to the
same GPU (``cuda:$LOCAL_RANK``, default 0), makes its own tensors, warms its jobs up, and then serves commands until
told ``stop``: for each command it runs the named job inside its own NVTX range (``torch.cuda.nvtx.range``, the
job's name prefixed ``worker_``), synchronizes, and replies ``done``. The worker never reads NVML or writes output.

Each phase is one enclosing range of the MAIN process whose truth the main process reads itself with NVML around
it (outside the range, 6 ms away, less an empty reference window of the same round: blind_app.py's method). The
counters are the GPU's, not a process's: the truth of a phase holds the worker's bytes too. Per call:

- ``own_copies``: the main process alone copies 8 x 8 MiB pinned host tensors to the GPU (non-blocking, then a
  sync): 64 MiB H2D;
- ``worker_copies``: the main process asks the worker for its job ``d2h_6x8MiB`` (range ``worker_d2h_6x8MiB``:
  6 x 8 MiB device tensors copied into pinned host tensors, non-blocking, then a sync) and waits for ``done``; it
  launches nothing itself: 48 MiB D2H, all the worker's;
- ``both_at_once``: the main process asks the worker for its job ``h2d_8x8MiB`` (range ``worker_h2d_8x8MiB``:
  8 x 8 MiB pinned H2D copies) and, without waiting, makes its own 8 x 8 MiB pinned H2D copies, then waits for
  ``done`` and synchronizes: 128 MiB H2D, half each process's;
- ``worker_kernels``: the worker runs its job ``mul_400`` (range ``worker_mul_400``: 400 ``x.mul_(1.0001)`` on a
  1M-element float32 CUDA tensor, one elementwise kernel each) while the main process waits: no bytes.

``launches_expected`` (per call, the main process's own): counted by torch.profiler (CUPTI) in the main process
outside every range for ``own_copies`` and ``both_at_once`` (copies left out: likely 0); 0 for ``worker_copies``;
null for ``worker_kernels`` (its 400 launches are the worker's, in the worker's own range: meta ``worker_launches``,
with the worker's own profiler count of one call, ``worker_launches_profiled``). Meta ``worker_ranges``: per worker
range, its phase, payload, direction and launches per call. Every phase (the worker's jobs too) is warmed up twice
outside any range before the rounds.

Rows: blind_app.py's JSON lines (main process only). ``BLIND_CALLS`` rounds; ``BLIND_TRUTH=0`` skips the NVML reads.

    BLIND_OUT=procs.jsonl python3 tests/apps/procs_app.py
"""

from __future__ import annotations

import os
import sys
import traceback

import torch

from blind_app import Counters, bus_id_of, ranged, rounds, run_meta, settings, write_rows
from compile_app import kernels_run

MiB = 1 << 20
CHUNK = 8 * MiB                 # bytes of each copy
OWN_COPIES = 8                  # the main process's pinned H2D copies per call (own_copies, both_at_once)
WORKER_D2H, WORKER_H2D = 6, 8   # the worker's D2H copies (d2h_6x8MiB) and H2D copies (h2d_8x8MiB) per job
WORKER_LAUNCHES = 400           # the worker's mul_ launches per mul_400 job
MUL_ELEMS = 1 << 20             # float32 elements of the worker's kernel tensor
REPLY_POLL_S = 1.0              # how often the main process checks that the worker is alive while it waits
READY_TIMEOUT_S = 600.0         # the worker's start-up (CUDA context, tensors, warm-up) must end within this
#: Worker job name -> (phase of the main process it runs in, payload bytes, direction, launches per job).
WORKER_JOBS = {"d2h_6x8MiB": ("worker_copies", WORKER_D2H * CHUNK, "d2h", 0),
               "h2d_8x8MiB": ("both_at_once", WORKER_H2D * CHUNK, "h2d", 0),
               "mul_400": ("worker_kernels", 0, None, WORKER_LAUNCHES)}


def worker(index: int, commands, replies) -> None:
    """The worker process (spawned: module level, picklable arguments). Serves ``(job, in_range)`` commands from
    ``commands`` until ``"stop"``; replies ``("ready", profiled launches of mul_400)`` once, then ``"done"`` per
    command, or ``("error", traceback)`` on a failure."""
    try:
        dev = torch.device("cuda", index)
        torch.cuda.set_device(dev)
        d2h_src = [torch.full((CHUNK,), 10 + i, dtype=torch.uint8, device=dev) for i in range(WORKER_D2H)]
        d2h_dst = [torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True) for _ in range(WORKER_D2H)]
        h2d_src = [torch.full((CHUNK,), 20 + i, dtype=torch.uint8, pin_memory=True) for i in range(WORKER_H2D)]
        h2d_dst = [torch.empty(CHUNK, dtype=torch.uint8, device=dev) for _ in range(WORKER_H2D)]
        x = torch.ones(MUL_ELEMS, dtype=torch.float32, device=dev)

        def d2h() -> None:
            for dst, src in zip(d2h_dst, d2h_src):
                dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize(dev)

        def h2d() -> None:
            for dst, src in zip(h2d_dst, h2d_src):
                dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize(dev)

        def mul() -> None:
            for _ in range(WORKER_LAUNCHES):
                x.mul_(1.0001)  # in place, contiguous float32: one elementwise kernel
            torch.cuda.synchronize(dev)

        jobs = {"d2h_6x8MiB": d2h, "h2d_8x8MiB": h2d, "mul_400": mul}
        for job in jobs.values():  # the worker's own warm-up, outside any range
            for _ in range(2):
                job()
        profiled = kernels_run(dev, mul)  # one job's kernels by torch.profiler, outside any range
        torch.cuda.synchronize(dev)
        replies.send(("ready", int(profiled)))
        while True:
            cmd = commands.recv()
            if cmd == "stop":
                break
            name, in_range = cmd
            if in_range:
                with torch.cuda.nvtx.range("worker_" + name):
                    jobs[name]()  # (ends synchronized, inside the range)
            else:
                jobs[name]()
            replies.send("done")
    except Exception:
        try:
            replies.send(("error", traceback.format_exc()))
        except Exception:
            pass
        raise
    finally:
        replies.close()
        commands.close()


class Worker:
    """The main process's side of the worker: start it, send it jobs, wait for its replies, stop it."""

    def __init__(self, index: int):
        ctx = torch.multiprocessing.get_context("spawn")
        cmd_recv, self.cmd_send = ctx.Pipe(duplex=False)      # (receiving end, sending end)
        self.reply_recv, reply_send = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=worker, args=(index, cmd_recv, reply_send), daemon=True)
        self.proc.start()
        cmd_recv.close()    # the worker's ends: closed here, so a dead worker reads as EOF, not a hang
        reply_send.close()
        self.launches_profiled: int | None = None

    def _reply(self, timeout_s: float | None = None):
        waited = 0.0
        while not self.reply_recv.poll(REPLY_POLL_S):
            waited += REPLY_POLL_S
            if not self.proc.is_alive():
                raise RuntimeError(f"procs_app: the worker died (exit {self.proc.exitcode})")
            if timeout_s is not None and waited >= timeout_s:
                raise RuntimeError(f"procs_app: no reply from the worker in {timeout_s:.0f} s")
        msg = self.reply_recv.recv()
        if isinstance(msg, tuple) and msg and msg[0] == "error":
            raise RuntimeError(f"procs_app: the worker failed:\n{msg[1]}")
        return msg

    def ready(self) -> None:
        msg = self._reply(READY_TIMEOUT_S)
        if not (isinstance(msg, tuple) and msg[0] == "ready"):
            raise RuntimeError(f"procs_app: the worker said {msg!r}, not ready")
        self.launches_profiled = msg[1]

    def start(self, job: str, in_range: bool) -> None:
        self.cmd_send.send((job, in_range))

    def wait(self) -> None:
        msg = self._reply()
        if msg != "done":
            raise RuntimeError(f"procs_app: the worker said {msg!r}, not done")

    def stop(self) -> int | None:
        try:
            if self.proc.is_alive():
                self.cmd_send.send("stop")
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(60)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(10)
        self.cmd_send.close()
        self.reply_recv.close()
        return self.proc.exitcode


def main() -> int:
    truth_on, calls, out_path = settings("procs_app.jsonl", 8)
    index = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", index)
    torch.cuda.set_device(dev)

    w = Worker(index)  # spawned first: it makes its context and tensors while the main process makes its own
    try:
        own_src = [torch.full((CHUNK,), 1 + i, dtype=torch.uint8, pin_memory=True) for i in range(OWN_COPIES)]
        own_dst = [torch.empty(CHUNK, dtype=torch.uint8, device=dev) for _ in range(OWN_COPIES)]
        torch.cuda.synchronize(dev)
        w.ready()

        def copies() -> None:
            for dst, src in zip(own_dst, own_src):
                dst.copy_(src, non_blocking=True)

        def bodies(in_range: bool) -> dict:
            """The phases' bodies; ``in_range``: whether the worker runs its jobs inside its own range (not in
            the warm-ups and profiled calls)."""
            def own_copies() -> None:
                copies()
                torch.cuda.synchronize(dev)

            def worker_copies() -> None:
                w.start("d2h_6x8MiB", in_range)
                w.wait()
                torch.cuda.synchronize(dev)  # (nothing of the main process's: keeps every body ending synchronized)

            def both_at_once() -> None:
                w.start("h2d_8x8MiB", in_range)
                copies()  # at the same time as the worker's
                w.wait()
                torch.cuda.synchronize(dev)

            def worker_kernels() -> None:
                w.start("mul_400", in_range)
                w.wait()
                torch.cuda.synchronize(dev)

            return {"own_copies": own_copies, "worker_copies": worker_copies, "both_at_once": both_at_once,
                    "worker_kernels": worker_kernels}

        quiet = bodies(False)
        for body in quiet.values():  # warm-up outside any range (the worker's jobs too, unranged)
            for _ in range(2):
                body()
        kernels = {name: kernels_run(dev, quiet[name]) for name in ("own_copies", "both_at_once")}
        ranged_bodies = bodies(True)
        phases = {"own_copies": (ranged("own_copies", ranged_bodies["own_copies"]), OWN_COPIES * CHUNK, "h2d",
                                 kernels["own_copies"]),
                  "worker_copies": (ranged("worker_copies", ranged_bodies["worker_copies"]), WORKER_D2H * CHUNK,
                                    "d2h", 0),
                  "both_at_once": (ranged("both_at_once", ranged_bodies["both_at_once"]),
                                   (OWN_COPIES + WORKER_H2D) * CHUNK, "h2d", kernels["both_at_once"]),
                  "worker_kernels": (ranged("worker_kernels", ranged_bodies["worker_kernels"]), 0, None, None)}

        counters = Counters(bus_id_of(dev.index)) if truth_on else None
        lines, loop_ns = rounds(dev, counters, calls, phases)
        worker_pid = w.proc.pid
    finally:
        exit_code = w.stop()
    if exit_code != 0:
        print(f"procs_app: the worker exited with {exit_code}", file=sys.stderr)

    worker_ranges = {"worker_" + job: {"phase": phase, "payload_bytes": nbytes, "direction": direction,
                                       "launches_expected": launches}
                     for job, (phase, nbytes, direction, launches) in WORKER_JOBS.items()}
    meta = run_meta(dev, truth_on, calls, counters, list(phases), kernels=kernels, start_method="spawn",
                    worker_pid=worker_pid, worker_exit=exit_code, worker_launches=WORKER_LAUNCHES,
                    worker_launches_profiled=w.launches_profiled, worker_ranges=worker_ranges)
    write_rows(out_path, meta, lines, loop_ns, calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
