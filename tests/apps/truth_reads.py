"""The blind apps' truth, with no framework: a GPU's NVML PCIe byte counters read outside each range (a window:
synchronize, read, sleep 6 ms, the range, sleep 6 ms, read; each round's empty reference window subtracted) and the
apps' JSON-lines output. tests/apps/blind_app.py (PyTorch) and tests/apps/cupy_app.py (CuPy) give it their own
``sync``; their docstrings say the protocol."""

from __future__ import annotations

import json
import os
import time
from typing import Callable

MiB = 1 << 20
GAP_S = 0.006                # sleep between a truth read and a range edge (longer than attach's 5 ms idle sampling)
WRAP = 1 << 32               # NVML fields 197/198 are 32-bit counters
FIELD_TX, FIELD_RX = 197, 198  # PCIE_COUNT_TX_BYTES (device->host), PCIE_COUNT_RX_BYTES (host->device)


class Counters:
    """One GPU's NVML PCIe byte counters (pynvml), read as (rx_bytes, tx_bytes) mod 2**32."""

    def __init__(self, bus_id: str):
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        domain, rest = bus_id.lower().split(":", 1)
        spellings = [f"{int(domain, 16):08x}:{rest}", f"{int(domain, 16):04x}:{rest}"]  # NVML's and CUDA's
        for i, spelling in enumerate(spellings):
            try:
                self.handle = pynvml.nvmlDeviceGetHandleByPciBusId(spelling.encode())
                break
            except pynvml.NVMLError:
                if i == len(spellings) - 1:
                    raise
        self.nvml_index = int(pynvml.nvmlDeviceGetIndex(self.handle))
        self.read()  # fail here, before the loop, if the fields are not supported

    def read(self) -> tuple[int, int]:
        """(rx_bytes, tx_bytes), each the low 32 bits of the counter (NVML reports them as 32-bit)."""
        vals = self.nvml.nvmlDeviceGetFieldValues(self.handle, [FIELD_RX, FIELD_TX])
        out = []
        for v, fid in zip(vals, (FIELD_RX, FIELD_TX)):
            if v.nvmlReturn != 0:
                raise RuntimeError(f"NVML field {fid}: return code {v.nvmlReturn}")
            out.append(int(v.value.ullVal) % WRAP)
        return out[0], out[1]


def delta(after: tuple[int, int], before: tuple[int, int]) -> tuple[int, int]:
    """(h2d_bytes, d2h_bytes) between two reads, unwrapped mod 2**32 (a window is far below one wrap)."""
    return (after[0] - before[0]) % WRAP, (after[1] - before[1]) % WRAP


def window(sync: Callable[[], None], counters: Counters | None, body) -> tuple[tuple[int, int] | None, int]:
    """Run ``body`` between truth reads GAP_S away from it (none without ``counters``): ((h2d, d2h) bytes or
    None, body's ns); ``sync`` (the app's devices synchronized) first."""
    sync()
    before = counters.read() if counters else None
    time.sleep(GAP_S)
    t0 = time.perf_counter_ns()
    body()
    t1 = time.perf_counter_ns()
    time.sleep(GAP_S)
    after = counters.read() if counters else None
    return (delta(after, before) if counters else None), t1 - t0


def ref_row(rnd: int, ref: tuple[int, int] | None) -> dict:
    """The output line of round ``rnd``'s empty reference window (bytes None without truth)."""
    return {"kind": "ref", "name": "_ref", "call": rnd,
            "h2d_bytes": ref[0] if ref else None, "d2h_bytes": ref[1] if ref else None}


def range_row(name: str, rnd: int, raw: tuple[int, int] | None, ref: tuple[int, int] | None, ns: int,
              payload_bytes: int, direction: str | None, launches: int | None) -> dict:
    """The output line of one outer range call: its window's bytes less the round's reference window's."""
    return {"kind": "range", "name": name, "call": rnd, "depth": 0, "truth": raw is not None,
            "h2d_bytes": raw[0] - ref[0] if raw else None, "d2h_bytes": raw[1] - ref[1] if raw else None,
            "raw_h2d_bytes": raw[0] if raw else None, "raw_d2h_bytes": raw[1] if raw else None,
            "duration_ns": ns, "payload_bytes": payload_bytes, "direction": direction,
            "launches_expected": launches}


def rounds(sync: Callable[[], None], counters: Counters | None, calls: int, phases: dict) -> tuple[list[dict], int]:
    """``calls`` rounds, each an empty reference window then every phase in its own (:func:`window`); ``phases``:
    name -> (body, payload bytes, direction, launches expected). The rows (:func:`ref_row`, :func:`range_row`)
    and the loop's ns."""
    lines: list[dict] = []
    t0 = time.perf_counter_ns()
    for rnd in range(calls):
        ref, _ = window(sync, counters, lambda: None)
        lines.append(ref_row(rnd, ref))
        for name, (body, nbytes, direction, launches) in phases.items():
            raw, ns = window(sync, counters, body)
            lines.append(range_row(name, rnd, raw, ref, ns, nbytes, direction, launches))
    return lines, time.perf_counter_ns() - t0


def settings(out: str, calls: int) -> tuple[bool, int, str]:
    """An app's environment: whether it reads its truth (``BLIND_TRUTH``, on unless "0"), its rounds
    (``BLIND_CALLS``, default ``calls``) and its output file (``BLIND_OUT``, default ``out``)."""
    return (os.environ.get("BLIND_TRUTH", "1") != "0", int(os.environ.get("BLIND_CALLS", str(calls))),
            os.environ.get("BLIND_OUT", out))


def write_rows(path: str, meta: dict, lines: list[dict], loop_ns: int, rounds: int) -> None:
    """The app's output: its meta line, one line per range call and reference window, and the end line."""
    with open(path, "w") as f:
        for row in [meta, *lines, {"kind": "end", "loop_wall_ns": loop_ns, "rounds": rounds}]:
            f.write(json.dumps(row) + "\n")
