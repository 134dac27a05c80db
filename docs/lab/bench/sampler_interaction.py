"""Does a sampler reading NVML slow an app's ranges: alone, beside attach's library, reading at range edges?

(GPU only.)

PyTorch's `eager_3000` range (3,000 `x.add_(1)` + synchronize) took +5 ... +10 % under attach on the H100, and
+6 % with the injection library and a bare sampler beside the app but no attach (twenty-first session); yet
each process draws its own level of that range (+-11 % between plain runs, pinned or not), so pairs of runs
cannot resolve a few %. Here the comparison stays inside one process: the app starts its side samplers (0.5 ms
reads, as attach's in a range; plain environment, no library) and runs blocks in each sampler state, in
rotating order, timing its ranges in each. The per-process level cancels in each block's ratio to the paused
block beside it. The app runs plain, with the library interposing launches (``inject``: LD_PRELOAD trampolines,
as attach sets it up, no edge page) and with NVTX injection only (``nvtx``: no trampolines), in rotating order;
``--configs`` may add ``inject-monotonic`` (calls timed on CLOCK_MONOTONIC, not the TSC), ``preload-nocount``
(the library preloaded and injected, its trampolines off: PCIETRACE_COUNT=none) and ``preload-empty`` (an empty
shared library preloaded: the address space shifted, nothing else), to tell which part of the library costs
where its level differs from plain (between plain processes, a 64 MiB copy's level varied by ~3 % on the H100,
PyTorch's eager range's by ~10 %).

Sampler states: ``off`` (paused), ``periodic`` (0.5 ms reads at their own phase) and, with ``--edges``,
``edges``: a second sampler that also reads at once when the app signals an edge page at each range's start and
end, as the injection library does at push and pop under attach (the app signals in every state, so the signal's
own cost cancels). ``--ranges all`` also times the 64 MiB and 256 MiB copies: under attach they took 37-53 us
longer per range (twenty-first session), 13-16 us (twenty-second; the edge reads ruled out). ``--no-sampler``:
no side sampler (the configurations' levels only).

    python3 docs/lab/bench/sampler_interaction.py [--rounds 6] [--blocks 10] [--reps 10] [--work torch|bindings]
                                         [--configs plain,inject,nvtx] [--edges] [--ranges all] [--no-sampler]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import _side_sampler  # noqa: E402
from _stats import median_ci, rotated  # noqa: E402

CONFIGS = ("plain", "inject", "nvtx", "inject-monotonic", "preload-nocount", "preload-empty")
#: the library's and pcietrace's variables: the side sampler runs as attach's do, without them
OURS = ("LD_PRELOAD", "NVTX_INJECTION64_PATH", "CUDA_INJECTION64_PATH")


def app(a: argparse.Namespace) -> None:
    """In the traced process: its ranges timed in blocks, one sampler state per block (rotating order)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "apps"))
    import truth_app
    from pcietrace.collectors import edges

    eager, _, _, copies, _ = (truth_app.torch_work if a.work == "torch" else truth_app.bindings_work)(0)
    work = {"eager_3000": eager, **copies}
    work = {n: fn for n, fn in work.items() if a.ranges == "all" or n in a.ranges.split(",")}
    env = {k: v for k, v in os.environ.items() if k not in OURS and not k.startswith("PCIETRACE_")}
    path = edges.create() if a.edges else ""
    page = edges.EdgeWaiter(path)  # without a file: signal() does nothing
    sides = {} if a.no_sampler else {"periodic": _side_sampler.start(paused=True, env=env)}
    if a.edges and not a.no_sampler:
        sides["edges"] = _side_sampler.start(paused=True, env=env, edge_file=path)
    states = ["off", *sides]
    for fn in work.values():
        fn()
    for b in range(a.blocks):
        for state in rotated(states, b):
            for name, side in sides.items():
                _side_sampler.set_reading(side, name == state)
            time.sleep(0.05)  # the sampler's first reads at the new state
            for name, fn in work.items():
                ms = []
                for _ in range(a.reps):
                    page.signal()  # as a push would
                    t0 = time.perf_counter_ns()
                    fn()
                    ms.append((time.perf_counter_ns() - t0) / 1e6)
                    page.signal()  # as a pop would
                print(json.dumps({"block": b, "sampler": state, "range": name, "ms": statistics.median(ms)}),
                      flush=True)
    for side in sides.values():
        side.communicate("")
    page.close()
    if path:
        os.unlink(path)


def config_env(config: str, work: Path) -> dict[str, str]:
    """The app's environment under ``config`` (its trace folder under ``work``)."""
    from pcietrace.record.attach import injection_env

    if config == "plain":
        return dict(os.environ)
    if config == "preload-empty":
        lib = work / "empty.so"
        if not lib.exists():
            subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), "-x", "c", "-"], input="int pt_empty;\n",
                           text=True, check=True)
        return {**os.environ, "LD_PRELOAD": str(lib)}
    preloaded = config.startswith("inject") or config == "preload-nocount"
    env = injection_env(Path(tempfile.mkdtemp(dir=work)), "interpose" if preloaded else "none", None, [0], False)
    if config == "inject-monotonic":
        env["PCIETRACE_CALL_CLOCK"] = "monotonic"
    if config == "preload-nocount":
        env["PCIETRACE_COUNT"] = "none"  # preloaded as for interposing, its trampolines off
    return env


def run(config: str, a: argparse.Namespace, work: Path) -> list[dict]:
    """One app process under ``config``: its blocks' rows."""
    out = subprocess.run([sys.executable, __file__, "--app", "--work", a.work, "--blocks", str(a.blocks),
                          "--reps", str(a.reps), "--ranges", a.ranges, *(["--edges"] if a.edges else []),
                          *(["--no-sampler"] if a.no_sampler else [])],
                         env=config_env(config, work), check=True, capture_output=True, text=True).stdout
    return [json.loads(x) for x in out.splitlines() if x.startswith("{")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--blocks", type=int, default=10, help="blocks per sampler state and process")
    ap.add_argument("--reps", type=int, default=10, help="calls of each range timed per block")
    ap.add_argument("--work", choices=("torch", "bindings"), default="torch")
    ap.add_argument("--configs", default=",".join(CONFIGS[:3]), help=f"the app's configurations, comma-separated, "
                    f"of {', '.join(CONFIGS)} (default: %(default)s)")
    ap.add_argument("--edges", action="store_true", help="also a sampler woken at each range's start and end")
    ap.add_argument("--ranges", default="eager_3000", help="the ranges timed, comma-separated, or all (with the "
                    "copies; default: %(default)s)")
    ap.add_argument("--no-sampler", action="store_true", help="no side sampler: the configurations' levels only")
    ap.add_argument("--app", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.app:
        app(a)
        return 0
    configs = a.configs.split(",")
    if not set(configs) <= set(CONFIGS):
        ap.error(f"--configs: choose from {', '.join(CONFIGS)}")
    work = Path(tempfile.mkdtemp())
    effect: dict[tuple, list[float]] = {}  # (config, range, state): per process, state vs off, %
    extra_us: dict[tuple, list[float]] = {}  # the same in us per range
    level: dict[tuple, list[float]] = {}  # (config, range): per process, ms per range, sampler paused
    for r in range(a.rounds):
        for c in rotated(configs, r):
            rows = run(c, a, work)
            ms = {(x["range"], x["sampler"], x["block"]): x["ms"] for x in rows}
            for rng in dict.fromkeys(x["range"] for x in rows):
                off = {b: v for (n, s, b), v in ms.items() if n == rng and s == "off"}
                level.setdefault((c, rng), []).append(float(np.median(list(off.values()))))
                print(f"round {r + 1} {c:16} {rng:11}: {level[c, rng][-1]:.3f} ms, sampler paused", flush=True)
                for state in dict.fromkeys(x["sampler"] for x in rows if x["sampler"] != "off"):
                    on = {b: v for (n, s, b), v in ms.items() if n == rng and s == state and b in off}
                    pct = [100 * (v / off[b] - 1) for b, v in on.items()]
                    effect.setdefault((c, rng, state), []).append(float(np.median(pct)))
                    extra_us.setdefault((c, rng, state), []).append(
                        float(np.median([1e3 * (v - off[b]) for b, v in on.items()])))
                    print(f"round {r + 1} {c:16} {rng:11}: {state}: {effect[c, rng, state][-1]:+.2f} % "
                          f"({extra_us[c, rng, state][-1]:+.1f} us; blocks {min(pct):+.1f} ... {max(pct):+.1f} %)",
                          flush=True)
    for (c, rng, state), v in effect.items():
        med, lo, hi = median_ci(v)
        umed, ulo, uhi = median_ci(extra_us[c, rng, state])
        print(f"{c:16} {rng:11} {state:8}: the sampler slows the range {med:+.2f} % [95 % CI {lo:+.2f}, {hi:+.2f}], "
              f"{umed:+.1f} us [{ulo:+.1f}, {uhi:+.1f}] (median over {len(v)} processes)")
    for c in configs[1:] if configs[0] == "plain" else []:
        for rng in dict.fromkeys(r for (cc, r) in level if cc == c):
            pairs = list(zip(level[c, rng], level["plain", rng]))
            lmed, llo, lhi = median_ci([100 * (x / y - 1) for x, y in pairs])
            umed, ulo, uhi = median_ci([1e3 * (x - y) for x, y in pairs])
            print(f"{c:16} {rng:11}: its level with the sampler paused vs plain, per round: "
                  f"{lmed:+.2f} % [{llo:+.2f}, {lhi:+.2f}], {umed:+.1f} us [{ulo:+.1f}, {uhi:+.1f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
