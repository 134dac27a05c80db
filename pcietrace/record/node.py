"""What one node's recording of a multi-node job keeps to be merged with the others: the host, a label, the
launcher's rank variables and where the samples' clock stands against wall-clock time; and the ``-o`` name
patterns (``%h``, ``%p``, ``%q{VAR}``, as Nsight Systems' ``-o``) that give each node its own folder."""

from __future__ import annotations

import os
import re
import socket
import time
from typing import Any

from pcietrace.errors import UsageError

#: The variables torchrun (elastic) and SLURM set in each process: kept in the recording to say which node and
#: job it was (only those set are kept).
LAUNCHER_VARS = ("GROUP_RANK", "NODE_RANK", "ROLE_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID",
                 "SLURM_NODEID", "SLURM_LOCALID", "SLURM_NNODES", "SLURM_NTASKS", "SLURMD_NODENAME",
                 "OMPI_COMM_WORLD_RANK", "PMI_RANK")
#: Paired clock reads taken for the offset; the tightest bracket is kept (a read preempted between the three
#: calls only widens its own bracket).
CLOCK_READS = 15
_PATTERN = re.compile(r"%(?:q\{([^}]*)\}|(.))", re.S)


def clock_offset(reads: int = CLOCK_READS) -> dict[str, int]:
    """CLOCK_REALTIME - CLOCK_MONOTONIC in ns (the samples' and events' clock is CLOCK_MONOTONIC: add this to
    one of their times for wall-clock time), from the tightest of ``reads`` brackets monotonic / realtime /
    monotonic, with its uncertainty (half that bracket). Nodes' wall clocks agree only as well as NTP or PTP
    keeps them: the merge states this offset's uncertainty, not theirs."""
    best: tuple[int, int] | None = None
    for _ in range(reads):
        m0 = time.monotonic_ns()
        r = time.clock_gettime_ns(time.CLOCK_REALTIME)
        m1 = time.monotonic_ns()
        if best is None or m1 - m0 < best[1]:
            best = (r - (m0 + m1) // 2, m1 - m0)
    assert best is not None
    return {"realtime_minus_monotonic_ns": best[0], "uncertainty_ns": (best[1] + 1) // 2, "reads": reads}


def node_meta(label: str | None, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """``meta["node"]`` of an attach recording: ``host``, ``label`` (None unless given), ``launcher`` (the
    :data:`LAUNCHER_VARS` set) and ``clock`` (:func:`clock_offset`)."""
    env = os.environ if environ is None else environ
    return {"host": socket.gethostname(), "label": label,
            "launcher": {v: env[v] for v in LAUNCHER_VARS if v in env}, "clock": clock_offset()}


def expand_output(text: str, label: str | None = None, environ: dict[str, str] | None = None) -> str:
    """``-o`` with ``%h`` (this host's name), ``%p`` (pcietrace's process id), ``%l`` (the ``--label``),
    ``%q{VAR}`` (the environment variable VAR, e.g. ``%q{SLURM_NODEID}``) and ``%%`` (a %) replaced. A variable
    that is not set, ``%l`` without a label and any other ``%x`` are errors: two nodes would write one folder."""
    env = os.environ if environ is None else environ

    def one(m: re.Match[str]) -> str:
        var, code = m.group(1), m.group(2)
        if var is not None:
            if var not in env:
                raise UsageError(f"-o {text}: %q{{{var}}} names an environment variable that is not set here")
            return env[var]
        if code == "l" and not label:
            raise UsageError(f"-o {text}: %l is the --label, and none was given")
        known = {"h": socket.gethostname, "p": lambda: str(os.getpid()), "l": lambda: str(label), "%": lambda: "%"}
        if code not in known:
            raise UsageError(f"-o {text}: unknown pattern %{code} (known: %h host, %p process id, %l label, "
                             "%q{VAR} environment variable, %% a percent sign)")
        return known[code]()

    return _PATTERN.sub(one, text)
