"""Launches through PyTorch, for the "from PyTorch" host-cost row (torch is optional: absent -> None).

The launch is ``x.fill_(0)`` on a 1-element float32 CUDA tensor: the cheapest real kernel launch torch
offers from Python. ``fill_`` takes its scalar directly (``add_(0)`` would first wrap the Python number
in a CPU tensor) and launches ATen's elementwise fill kernel (``gpu_kernel`` with a fill functor, one
block) on the current stream; nothing is allocated per call. Torch's current stream is set to the
backend's own stream (``torch.cuda.ExternalStream``), and torch's runtime uses the device's primary
context, the one :class:`pcietrace.device.cuda.Gpu` retains: so the launches queue behind the
backend's blocker kernel exactly like the native and cuda.bindings ones.
"""

from __future__ import annotations

import functools
from typing import Any

from pcietrace.device.base import Backend, Loops, PythonLoops


def torch_loops(backend: Backend, ordinal: int, stream: int) -> Loops | None:
    """Loops over ``x.fill_(0)`` on CUDA device ``ordinal`` and CUstream ``stream`` (an integer handle),
    or None where torch is not installed or sees no GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available() or ordinal >= torch.cuda.device_count():
        return None
    dev = torch.device("cuda", ordinal)
    torch.cuda.set_device(dev)
    before = torch.cuda.current_stream(dev)
    torch.cuda.set_stream(torch.cuda.ExternalStream(stream, device=dev))
    try:
        x: Any = torch.zeros(1, device=dev)
        launch = functools.partial(x.fill_, 0)
        launch()  # first call: lazy module loading, kernel lookup
        torch.cuda.current_stream(dev).synchronize()
    except BaseException:  # (Ctrl-C included) no loops come back to restore it: torch's stream goes back now
        torch.cuda.set_stream(before)
        raise
    loops = PythonLoops(backend, launch, path="torch", checked=False)
    loops.tensor = x  # type: ignore[attr-defined]  # keep the tensor alive with the loops
    # Before the backend destroys its stream (close()): torch's current stream goes back to what it was, so
    # later torch work in this process does not queue on a destroyed (or reused) handle.
    loops.restore = functools.partial(torch.cuda.set_stream, before)  # type: ignore[attr-defined]
    return loops
