"""Typed errors. The CLI turns any PcietraceError into one line on stderr and exit code 2."""

from __future__ import annotations

import re
from typing import Callable


class PcietraceError(Exception):
    """Base class: an expected failure the user can act on (bad input, no GPU, unsupported driver)."""


class UsageError(PcietraceError):
    """Bad command-line input or a file that is not a pcietrace report."""


class ConfigError(UsageError):
    """A config value out of its range. ``field`` names it and ``reason`` says what is wrong; ``{name}`` in
    the reason names another field. ``str()`` says both by field name; the CLI says them by its flags
    (:meth:`say`)."""

    def __init__(self, field: str, reason: str) -> None:
        self.field, self.reason = field, reason
        super().__init__(self.say(lambda name: name))

    def say(self, name_of: Callable[[str], str]) -> str:
        """The message with every field named by ``name_of(field)`` (e.g. its command-line flag)."""
        return f"{name_of(self.field)} " + re.sub(r"\{(\w+)\}", lambda m: name_of(m.group(1)), self.reason)


class NoGpuError(PcietraceError):
    """No NVIDIA driver or no GPU visible. Carries a hint towards --simulate."""


class NvmlError(PcietraceError):
    """An NVML call failed (other than "not supported", which callers handle)."""


class NvmlNotSupported(NvmlError):
    """The driver/GPU does not support this NVML query."""


class CudaError(PcietraceError):
    """A CUDA driver or NVRTC call returned an error code."""

    def __init__(self, call: str, code: int, name: str, detail: str = "") -> None:
        self.call, self.code, self.name = call, code, name
        super().__init__(f"{call} failed: {name} ({code}){': ' + detail if detail else ''}")


class ReportError(UsageError):
    """A saved report is damaged, incomplete or from a newer pcietrace; the message names the file and field."""


class DataError(PcietraceError):
    """Recorded data break an invariant the analysis relies on (time order, finite counters, known counter
    modes, positive windows): refusing beats printing wrong figures."""


class OutOfMemory(PcietraceError):
    """The analysis (or a format) needed more memory than the machine gave it; the message says what was
    saved and how to report it elsewhere."""


def one_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's message on one line, shortened to ``limit`` characters (for the one-line errors)."""
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
