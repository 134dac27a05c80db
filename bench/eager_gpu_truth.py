"""GPU time per empty eager kernel: `pcietrace run` against a C++ oracle, on GPU 0 (run on a GPU machine;
not a test).

A CUDA context draws its own level of this figure (H200: 1.29-1.45 us, within 0.1 % inside one context;
docs/lab/bench/eager_gpu_probe.py), so the truth is a distribution over C++ processes, not one number. Rounds
alternate ``--oracles`` runs of bench/eager_gpu_oracle.cu (built here with nvcc; each its own process and
primary context) with one `pcietrace run --quick --no-latency` (its figure: the median over ``--contexts``
contexts, with their range). Prints per run: ours, its context range, its own context's level alone (what
one context would have said), and the error of each against the oracles' median; then the run-to-run
spread of both.

    python3 bench/eager_gpu_truth.py [--rounds 5] [--oracles 4] [--contexts 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stats import range_pct  # noqa: E402

HERE = Path(__file__).resolve().parent


def build(out: Path) -> Path:
    exe = out / "eager_gpu_oracle"
    subprocess.run(["nvcc", "-O2", "-o", str(exe), str(HERE / "eager_gpu_oracle.cu"), "-lcuda"], check=True)
    return exe


def oracle(exe: Path) -> float:
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    got = dict(line.split() for line in out.splitlines())
    if int(got["saturated"]) < 3:
        raise RuntimeError(f"oracle: the blocker ran dry in most bursts ({got})")
    return float(got["eager_gpu_us"])


def ours(folder: Path, contexts: int) -> dict[str, float]:
    from pcietrace.analysis import analyze
    from pcietrace.analysis.launch import context_levels
    from pcietrace.session import Session

    subprocess.run([sys.executable, "-m", "pcietrace", "run", "--gpu", "0", "--quick", "--no-latency", "--contexts",
                    str(contexts), "-o", str(folder), "--force"], check=True, capture_output=True, text=True)
    s = Session.load(folder)
    gt = analyze(s)["gpu_time"]
    row = gt[gt["kernel_us"] == gt["kernel_us"].min()].iloc[0]
    levels = context_levels(s.bursts, s.contexts)
    own = levels[levels["context"] == 0]["eager_gpu_us"]
    return {"eager_gpu_us": float(row["eager_gpu_us"]), "min": float(row["eager_gpu_us_min"]),
            "max": float(row["eager_gpu_us_max"]), "contexts": int(row["eager_contexts"]),
            "own_context_us": float(own.iloc[0]) if len(own) else float(row["eager_gpu_us"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--oracles", type=int, default=4, help="oracle processes per round")
    ap.add_argument("--contexts", type=int, default=5, help="pcietrace run --contexts")
    ap.add_argument("--json", type=Path, help="save every figure here")
    a = ap.parse_args()
    truth: list[float] = []
    runs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))
        for r in range(a.rounds):
            got = [oracle(exe) for _ in range(a.oracles)]
            truth += got
            runs.append(ours(Path(tmp) / "run", a.contexts))
            o = runs[-1]
            print(f"round {r}: oracle processes {' '.join(f'{x:.3f}' for x in got)} us; pcietrace "
                  f"{o['eager_gpu_us']:.3f} us (contexts {o['min']:.3f}-{o['max']:.3f}, {o['contexts']}), its own "
                  f"context alone {o['own_context_us']:.3f}", flush=True)
    t = statistics.median(truth)
    print(f"\ntruth: {len(truth)} C++ processes, median {t:.3f} us, range {min(truth):.3f}-{max(truth):.3f} "
          f"({range_pct(truth):.1f} %)")
    print(f"{'run':>4} {'ours us':>8} {'error %':>8} {'truth in range':>15} {'own ctx us':>11} {'error %':>8}")
    for i, o in enumerate(runs):
        print(f"{i:>4} {o['eager_gpu_us']:>8.3f} {(o['eager_gpu_us'] / t - 1) * 100:>+8.2f} "
              f"{str(o['min'] <= t <= o['max']):>15} {o['own_context_us']:>11.3f} "
              f"{(o['own_context_us'] / t - 1) * 100:>+8.2f}")
    ours_all = [o["eager_gpu_us"] for o in runs]
    own_all = [o["own_context_us"] for o in runs]
    print(f"run-to-run spread: median over {a.contexts} contexts {range_pct(ours_all):.1f} %, one context "
          f"{range_pct(own_all):.1f} %; median error {statistics.median(abs(x / t - 1) * 100 for x in ours_all):.2f} "
          f"% vs {statistics.median(abs(x / t - 1) * 100 for x in own_all):.2f} %")
    if a.json:
        a.json.write_text(json.dumps({"truth_us": truth, "runs": runs, "contexts": a.contexts}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
