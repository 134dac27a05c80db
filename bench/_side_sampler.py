"""A bare counter sampler in a process of its own beside an app, for the bench scripts: attach's sampling
without attach (0.5 ms reads of every GPU, as attach's inside a range; no injection library). With an
``edge_file`` (:mod:`pcietrace.collectors.edges`) a signalled edge also starts a read at once, as a range edge
does under attach.

    side = start()                 # returns once it reads (paused=True: once it waits, paused)
    set_reading(side, False)       # pause or resume; returns once applied
    side.communicate("")           # the end of its input stops it
"""

from __future__ import annotations

import subprocess
import sys

SCRIPT = ("import sys\nfrom pcietrace.collectors import CounterSampler, nvml\n"
          "s = CounterSampler(list(range(nvml.device_count())), interval_ns=500_000, edge_file=sys.argv[2] or None)\n"
          "s.start(); s.pause(sys.argv[1] == 'paused'); print('ok', flush=True)\n"
          "for line in sys.stdin:\n    s.pause(line.strip() != 'on'); print('ok', flush=True)\n"
          "s.stop()\n")


def start(paused: bool = False, env: dict[str, str] | None = None, edge_file: str = "") -> subprocess.Popen:
    """The sampler process, reading (or ``paused``), in ``env`` (None: ours), woken by ``edge_file``'s edges."""
    side = subprocess.Popen([sys.executable, "-c", SCRIPT, "paused" if paused else "reading", edge_file], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    side.stdout.readline()
    return side


def set_reading(side: subprocess.Popen, on: bool) -> None:
    """Resume (``on``) or pause the sampler; returns once it has."""
    side.stdin.write("on\n" if on else "off\n")
    side.stdin.flush()
    side.stdout.readline()
