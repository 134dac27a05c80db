"""GPU tests (marked ``gpu``): run on a real NVIDIA GPU with `pytest -m gpu`; skipped elsewhere."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

import pcietrace
from pcietrace.cli import main
from pcietrace.session import Session

from conftest import REPORTS
from paired import paired_extra_us

pytestmark = pytest.mark.gpu

MiB = 1 << 20


def _idle(seconds: float) -> None:
    time.sleep(seconds)


#: The last :func:`_copy_bytes` call's samples and copy edges, for a failing test to show (an H200 suite read one
#: 256 MiB copy at 0.777 of copied once, unexplained, and 80 repeats did not bring it back).
_LAST_COPY: dict = {}


def _samples_near_edges(ms: float = 3.0) -> str:
    """The last copy's samples within ``ms`` of its two exact edge reads, as text (times relative to the first)."""
    df, t0, t1 = _LAST_COPY["samples"], _LAST_COPY["t0_ns"], _LAST_COPY["t1_ns"]
    near = df[((df.t_ns - t0).abs() < ms * 1e6) | ((df.t_ns - t1).abs() < ms * 1e6)]
    return f"copy edges at 0 and {(t1 - t0) / 1e6:.3f} ms:\n" + near.assign(
        t_ms=(near.t_ns - t0) / 1e6).drop(columns="t_ns").to_string()


def _copy_bytes(nbytes: int, repeats: int, direction: str) -> tuple[float, float, int]:
    """Copy ``nbytes`` ``repeats`` times between pinned host and device memory while sampling;
    return (counter bytes in the copy window minus the floor, bytes copied, counter wraps seen)."""
    from pcietrace.analysis.counters import unwrap
    from pcietrace.device.backend import CudaBackend

    from pcietrace.collectors import BoundaryProbe, CounterSampler, nvml

    be = CudaBackend(0)
    gpu = be.gpu
    idx = nvml.index_for_bus_id(gpu.bus_id)
    host, dev = gpu.alloc_pinned(nbytes), gpu.alloc_device(nbytes)
    copy = gpu.copy_h2d if direction == "h2d" else gpu.copy_d2h
    args = (dev, host, nbytes) if direction == "h2d" else (host, dev, nbytes)
    copy(*args)  # warm the path
    gpu.synchronize()
    # Background samples every 1 ms (enough to see every wrap) plus exact reads at the copy's edges:
    # at ~55 GB/s one sample gap is ~10 MB, so interpolated edges would blur a 256 MiB copy by ~2 %.
    s = CounterSampler([idx], interval_ns=1_000_000)
    probe = BoundaryProbe(idx)
    s.start()
    try:
        _idle(0.3)
        t0 = probe()
        for _ in range(repeats):
            copy(*args)
        gpu.synchronize()
        t1 = probe()
        _idle(0.3)
    finally:
        df = pd.concat([s.stop(), probe.frame()]).sort_values("t_ns", kind="stable").reset_index(drop=True)
        gpu.free_pinned(host)
        gpu.free_device(dev)
    if os.environ.get("PCIETRACE_SAVE_TRACES"):  # how tests/data/copy_traces.parquet was recorded
        df.assign(direction=direction, nbytes=nbytes, repeats=repeats, copy_start_ns=t0, copy_end_ns=t1).to_parquet(
            os.path.join(os.environ["PCIETRACE_SAVE_TRACES"], f"copy_{direction}_{nbytes}x{repeats}.parquet"))
    _LAST_COPY.update(samples=df, t0_ns=t0, t1_ns=t1)
    col = "rx_raw" if direction == "h2d" else "tx_raw"
    raw = df[col].to_numpy()
    cum = unwrap(raw).astype(float)
    t = df["t_ns"].to_numpy()
    floor_bps = (np.interp(t0, t, cum) - cum[0]) / ((t0 - t[0]) / 1e9)
    window = np.interp(t1, t, cum) - np.interp(t0, t, cum) - floor_bps * (t1 - t0) / 1e9
    wraps = int((np.diff(raw.astype(np.int64)) < 0).sum())
    return window, float(nbytes * repeats), wraps


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_known_copy_is_accounted_within_2_percent(direction: str) -> None:
    # Header overhead measured on one copy size predicts a different size within 2 %.
    big, big_size, _ = _copy_bytes(1024 * MiB, 1, direction)
    overhead = big / big_size
    print(f"{direction}: counted/copied = {overhead:.4f}")
    assert 1.0 <= overhead < 1.25, f"counters should count payload plus TLP headers: counted/copied {overhead:.4f}"
    small, small_size, _ = _copy_bytes(256 * MiB, 1, direction)
    print(f"{direction}: 256 MiB counted/copied = {small / small_size:.4f}")
    assert small == pytest.approx(small_size * overhead, rel=0.02), _samples_near_edges()


def test_pinned_copy_that_wraps_the_counter_several_times() -> None:
    counted, copied, wraps = _copy_bytes(1024 * MiB, 16, "h2d")  # 17 GB: 4 wraps of a 32-bit counter
    print(f"wraps seen {wraps}; counted/copied = {counted / copied:.4f}")
    assert wraps >= 3 and 1.0 <= counted / copied < 1.25, f"wraps seen {wraps}; counted/copied {counted / copied:.4f}"


def test_full_run_reports_every_table(tmp_path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "pcietrace", "run", "--quick", "--json", "-o", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["meta"]["simulated"] is False
    res = doc["results"]
    for table in ("floor", "calibration", "per_launch", "per_node", "by_duration", "cpu_cost", "gpu_time", "speedup",
                  "per_gpu", "host_cost_by_language"):
        assert res[table], f"{table} is empty"
    assert len(res["per_gpu"]) == len(doc["meta"]["gpus"]) == doc["meta"]["parallel_workers"], res["per_gpu"]
    lang = {(r["nvml_index"], r["path"]): r for r in res["host_cost_by_language"]}
    # Native vs Python burst by burst (tests/paired.py): the medians over separate bursts can swap when the
    # host changes speed mid-run (4x H200: a GPU's native bursts at 3.2 us, then 5.4 us; Python's extra 0.6 us)
    pairs = paired_extra_us(Session.load(out).bursts, "python")
    for g in doc["meta"]["gpus"]:
        assert g["status"] == "complete"
        i = g["nvml_index"]
        assert lang[(i, "native")]["us_per_launch"] > 0 and lang[(i, "python")]["us_per_launch"] > 0
        p = pairs[pairs["nvml_index"] == i]
        print(f"GPU {i} host us per launch, native vs Python in pairs:\n{p.to_string()}")
        assert len(p) >= doc["meta"]["plan"]["language_repeats"] // 2 and p["extra_us"].median() > 0, p.to_string()
        try:
            import torch  # noqa: F401
        except ImportError:
            continue
        assert lang[(i, "torch")]["saturated"] and lang[(i, "torch")]["us_per_launch"] > 0, lang[(i, "torch")]
    # the default plan measures the empty eager kernel's GPU time in 5 CUDA contexts on every GPU
    shortest = [r for r in res["gpu_time"] if r["kernel_us"] == min(x["kernel_us"] for x in res["gpu_time"])]
    assert len(shortest) == len(doc["meta"]["gpus"]), shortest
    for r in shortest:
        assert r["eager_contexts"] == doc["meta"]["plan"]["gpu_time_contexts"] == 5, r
        assert r["eager_gpu_us_min"] <= r["eager_gpu_us"] <= r["eager_gpu_us_max"] < 1.5 * r["eager_gpu_us_min"], r
    eager = [r for r in res["per_launch"] if r["mode"] == "eager" and r["direction"] == "h2d"][0]
    assert eager["bytes_per_call"] > 0 and eager["ci95"] < 0.1 * eager["bytes_per_call"], eager
    assert (out / "report.json").is_file() and (out / "samples.parquet").is_file()
    again = subprocess.run([sys.executable, "-m", "pcietrace", "report", str(out), "--json"],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["results"]["per_launch"] == res["per_launch"]


def test_fresh_contexts_are_released_by_close() -> None:
    # A context of its own holds ~0.5 GB of the GPU's memory (plus what it allocated) until destroyed: three
    # left open with 256 MiB each would take > 1 GB.
    from pcietrace.device.backend import CudaBackend
    from pcietrace.device.cuda import _bindings, handle_return
    from pcietrace.record.generate import LaunchGenerator

    drv, _ = _bindings()
    be = CudaBackend(0)
    free_before = handle_return(drv.cuMemGetInfo(), "cuMemGetInfo")[0]
    levels = []
    for _ in range(3):
        fresh = be.in_new_context()
        fresh.gpu.alloc_device(256 * MiB)
        r = LaunchGenerator(fresh).burst("eager", 0.0, 1, 900)
        levels.append(r["gpu_ns"] / r["launches"] / 1e3)
        fresh.close()
        fresh.close()  # a second close does nothing
        be.activate()
    free_after = handle_return(drv.cuMemGetInfo(), "cuMemGetInfo")[0]
    own = LaunchGenerator(be).burst("eager", 0.0, 1, 900)
    own_us = own["gpu_ns"] / own["launches"] / 1e3
    print(f"free before {free_before / MiB:.0f} MiB, after {free_after / MiB:.0f} MiB; eager us per kernel: own "
          f"context {own_us:.3f}, fresh ones {', '.join(f'{x:.3f}' for x in levels)}")
    assert free_before - free_after < 64 * MiB, (free_before, free_after)
    assert all(0.7 < x / own_us < 1.4 for x in levels), (own_us, levels)
    be.close()
    assert be.gpu.context is None


def test_latency_suite_is_stable_run_to_run() -> None:
    from pcietrace.analysis.latency import summary
    from pcietrace.device.backend import CudaBackend
    from pcietrace.collectors import nvml
    from pcietrace.record.latency import LatencyProbe, measure

    be = CudaBackend(0)
    idx = nvml.index_for_bus_id(be.gpu.bus_id)
    probes = {idx: LatencyProbe(be)}
    # Two suites of 32 repeats (the default is 11; with 11 this check failed once in three runs on the H100),
    # taken interleaved in 4 chunks each (a, b, a, b, ...): the host's drift over seconds then falls on both
    # alike, where two suites one after the other differed by up to 4.4 % in host round trips (1.25 vs 1.31 us).
    chunks = [measure(probes, repeats=8) for _ in range(8)]
    a, b = (summary(pd.concat(chunks[i::2], ignore_index=True)).set_index("test") for i in (0, 1))
    print(a[["median_us", "ci95_us", "p10_us", "p90_us", "spread_pct"]].join(b[["median_us", "ci95_us"]], rsuffix="_again").to_string())
    assert 0.3 < a.loc["host_read_rtt", "median_us"] < 5, a["median_us"]  # a PCIe read round trip, in us
    assert (a.loc["device_read_l2", "median_us"] < a.loc["device_read_hbm", "median_us"]
            < a.loc["host_read_rtt", "median_us"]), a["median_us"]
    # Stable = the two suites' medians agree within their bootstrap 95 % CIs plus 3 % (a one-run
    # spread bound flaked: 4.5 % IQR once on the H100 while the medians agreed to 2 %).
    # Round trips to host memory get 5 %: their median drifts with the host (1.20-1.31 us over 6 back-to-back
    # pairs of suites in one H100 call, 2026-11-22; a pair differed by 4.4 % with CIs of 0.02 us; this test
    # failed once in 10 runs that day, message lost, most likely there; the suites were not interleaved then).
    # On-GPU reads keep 3 %.
    drift = {"host_read_rtt": 0.05, "host_read_rtt_2mib": 0.05, "device_read_l2": 0.03, "device_read_hbm": 0.03}
    for test, frac in drift.items():  # GPU-timed
        ma, mb = a.loc[test, "median_us"], b.loc[test, "median_us"]
        bound = a.loc[test, "ci95_us"] + b.loc[test, "ci95_us"] + frac * (ma + mb) / 2
        assert abs(ma - mb) <= bound, f"{test}: {ma:.3f} vs {mb:.3f} us (allowed {bound:.3f})"
    # Host-timed tests run in C: a launch + sync costs more than a graph-of-1 launch + sync minus noise,
    # and the kernel's first store reaches the host before the stream reports done.
    assert a.loc["launch_sync_graph1", "median_us"] < a.loc["launch_sync_eager", "median_us"] * 1.2, a["median_us"]
    assert (0 < a.loc["launch_to_first_instruction", "median_us"]
            < a.loc["launch_sync_eager", "median_us"] + 20), a["median_us"]


def test_native_launches_cost_less_host_time_than_python() -> None:
    from pcietrace.device.backend import CudaBackend
    from pcietrace.record.generate import LaunchConfig, LaunchGenerator

    be = CudaBackend(0)
    nat, py = LaunchGenerator(be), LaunchGenerator(be, path="python")
    # Interleaved and compared pair by pair (tests/paired.py): 5 native bursts then 5 Python ones saw
    # different hosts whenever its speed moved between them (10-35 % over seconds on the H100 VM; Python's
    # extra is 12-40 %).
    bursts = pd.DataFrame([b for _ in range(9)
                           for b in (nat.burst("eager", 0.0, 1, 900), py.burst("eager", 0.0, 1, 900))])
    pairs = paired_extra_us(bursts.assign(nvml_index=0), "python")
    print(f"host us per eager launch, native vs Python in pairs:\n{pairs.to_string()}")
    assert list(bursts["path"]) == ["native", "python"] * 9
    # most bursts keep their blocker running; a pair with one that did not (a host stall) is left out
    assert len(pairs) >= 5 and pairs["extra_us"].median() > 0, bursts.to_string()
    w = nat.window(LaunchConfig("eager", 0.0, 1, 20_000, 0.2))  # the paced C loop holds its rate
    assert w["path"] == "native" and w["achieved_rate_hz"] == pytest.approx(20_000, rel=0.02), w
    g = nat.window(LaunchConfig("graph", 0.0, 10, None, 0.2))
    assert g["launches"] == 10 * g["calls"] > 0, g


def test_real_topology() -> None:
    from pcietrace.collectors import nvml, topology

    gpus = [{"nvml_index": i, "bus_id": nvml.gpu_info(i).bus_id, "name": nvml.gpu_info(i).name}
            for i in range(nvml.device_count())]
    topo = topology.collect(gpus)
    print(json.dumps(topo, indent=1))
    for g in topo["gpus"]:
        assert g["hops"] and g["hops"][-1]["bdf"] == g["bdf"] and g["hops"][-1]["link_width"] > 0, g
    m, nv = topo["matrix"], topo["nvlinks"]
    n = len(m)
    assert all(m[i][i] == "X" for i in range(n))
    assert all(nv[i][j] == nv[j][i] for i in range(n) for j in range(n))
    # NVLink counts as nvidia-smi shows them (NV18 between every pair of an HGX H200 board).
    import re
    import shutil

    if shutil.which("nvidia-smi") is None:
        return
    smi = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=60).stdout
    rows = {int(x.group(1)): x.group(2).split()[:n] for x in re.finditer(r"^GPU(\d+)\s+(.*)$", smi, re.M)}
    for i in range(n):
        for j in range(n):
            if i != j and i in rows and rows[i][j].startswith("NV"):
                assert m[i][j] == rows[i][j], f"GPU{i}-GPU{j}: pcietrace {m[i][j]}, nvidia-smi {rows[i][j]}"


APPS = __import__("pathlib").Path(__file__).parent / "apps"


def _reference(tmp_path, n: int, counter: str) -> tuple[float, float]:
    """(H2D bytes per eager launch of the demo's kernel, H2D counted/copied ratio), measured now on this GPU.
    Per launch: the demo app, reading NVML itself around its ``eager_launches`` range (DEMO_TRUTH=1), alone, or for
    ``counter`` "cupti" with CUPTI's launch callbacks on as attach sets them (no sampler): they add real bytes,
    +3.0 % H2D per launch on the H100 (docs/lab/bench/launch_counter_bytes.py), which attach then
    measures. (A zero-parameter kernel: ~1,770 B on the H100, 3.5 % below the 1,834 B of the 16-byte-parameter
    kernel that `pcietrace run` times; taking that run's figure instead, attach
    read -3.2 ... -5.2 % against it.)"""
    env = dict(os.environ)
    if counter == "cupti":
        from pcietrace.record.attach import injection_env

        (tmp_path / "ref-trace").mkdir()
        env = injection_env(tmp_path / "ref-trace", counter, None, [0], False)
    proc = subprocess.run([sys.executable, str(APPS / "demo_nvtx.py"), str(n), "1000", "16"], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, env={**env, "DEMO_TRUTH": "1"})
    assert proc.returncode == 0, proc.stderr
    per_launch = json.loads(proc.stdout.splitlines()[-1])["truth_h2d_bytes"] / n
    counted, copied, _ = _copy_bytes(256 * MiB, 1, "h2d")
    return per_launch, counted / copied


def _attach(tmp_path, name: str, cmd: list[str], counter: str = "interpose") -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / name
    proc = subprocess.run([sys.executable, "-m", "pcietrace", "attach", "--json", "--launch-counter", counter,
                           "-o", str(out), "--", *cmd],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.stdout, proc.stderr
    trace = json.loads((out / "trace.json").read_text())  # the Perfetto/Chrome trace is valid JSON
    phases = {e["ph"] for e in trace["traceEvents"]}
    assert {"C", "X", "M"} <= phases and all(isinstance(e.get("ts", 0), (int, float)) for e in trace["traceEvents"])
    return proc, json.loads(proc.stdout[re.search(r'\{\s*"schema"', proc.stdout).start():])  # the app prints first


def _check_demo(doc: dict, domain: str, per_launch: float, overhead: float, n: int, copy_bytes: int) -> None:
    ranges = {(r["domain"], r["name"]): r for r in doc["results"]["ranges"]}
    print(f"reference: {per_launch:.1f} B H2D per eager launch, counted/copied {overhead:.4f}")
    shown = ("calls", "incl_ms", "h2d_bytes", "h2d_edge_bytes", "eager_launches", "graph_launches")
    print(json.dumps({k[1]: {c: ranges[k][c] for c in shown} for k in ranges}, indent=1))
    eager, graph = ranges[(domain, "eager_launches")], ranges[(domain, "graph_launch")]
    copy, idle = ranges[(domain, "h2d_copy")], ranges[(domain, "idle")]
    assert eager["eager_launches"] == n and eager["graph_launches"] == 0, eager
    assert eager["h2d_bytes"] == pytest.approx(n * per_launch, rel=0.05)
    assert graph["graph_launches"] == 1 and graph["eager_launches"] == 0, graph
    # ~1 kB expected for one graph launch and 0 for a sleep: what is left is floor noise (~0.3 MB)
    assert abs(graph["h2d_bytes"]) < 1e6 + graph["h2d_edge_bytes"], graph
    assert abs(idle["h2d_bytes"]) < 1e6 + idle["h2d_edge_bytes"], idle
    assert copy["h2d_bytes"] == pytest.approx(copy_bytes * overhead, rel=0.05)
    assert abs(copy["h2d_bytes"] - copy_bytes * overhead) <= copy["h2d_edge_bytes"] + 0.01 * copy["h2d_bytes"], copy
    assert (domain, "worker_thread") in ranges, sorted(ranges)


@pytest.mark.parametrize("counter", ["cupti", "interpose"])
def test_attach_python_and_cpp_apps(tmp_path, counter: str) -> None:
    import shutil

    n, copy = 20000, 1024 * MiB  # a large copy: its edges, interpolated between samples, weigh little
    per_launch, overhead = _reference(tmp_path, n, counter)
    proc, doc = _attach(tmp_path, "py", [sys.executable, str(APPS / "demo_nvtx.py"), str(n), "1000", "1024", "3"], counter)
    assert proc.returncode == 3, proc.stderr  # the app's exit code is passed through
    _check_demo(doc, "demo", per_launch, overhead, n, copy)
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc: C++ demo not built")
    exe = tmp_path / "demo_nvtx"
    subprocess.run(["nvcc", "-O2", "-o", str(exe), str(APPS / "demo_nvtx.cu"), "-ldl"], check=True)
    proc, doc = _attach(tmp_path, "cpp", [str(exe), str(n), "1000", "1024"], counter)
    assert proc.returncode == 0, proc.stderr
    _check_demo(doc, "demo_cpp", per_launch, overhead, n, copy)
    assert any(r["name"] == "demo_app" and r["domain"] == "default" for r in doc["results"]["ranges"])


def test_attach_without_nvtx_gives_totals_and_a_hint(tmp_path) -> None:
    out = tmp_path / "plain"
    proc = subprocess.run([sys.executable, "-m", "pcietrace", "attach", "-o", str(out), "--no-calibrate", "--",
                           sys.executable, "-c", "print('hello')"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0 and "hello" in proc.stdout, proc.stdout + proc.stderr  # (LD_PRELOAD did not disturb it)
    assert "Whole run" in proc.stdout and "no NVTX ranges" in proc.stdout, proc.stdout


@pytest.mark.gpu
def test_real_run_answers_first_in_every_format(tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    parser = pytest.importorskip("prometheus_client.openmetrics.parser")
    out = tmp_path / "run"
    assert main(["run", "--gpu", "0", "--quick", "--no-latency", "-o", str(out), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    line = doc["summary"]["lines"][0]
    print(line)
    assert line.startswith("One eager launch on GPU") and "B H2D" in line and "Graphs save" in line, line
    ref = pcietrace.load(REPORTS[0]).summary["gpus"].iloc[0]  # the committed real H100 run
    got = doc["summary"]["gpus"][0]
    ratio = got["eager_h2d_bytes"] / ref["eager_h2d_bytes"]
    # same launch path, same order of bytes
    assert 0.5 < ratio < 2, f"{got['eager_h2d_bytes']} vs {ref['eager_h2d_bytes']} B"
    assert main(["report", str(out), "--format", "csv"]) == 0 and "# table: per_launch" in capsys.readouterr().out
    assert main(["report", str(out), "--format", "prometheus"]) == 0
    names = {f.name for f in parser.text_string_to_metric_families(capsys.readouterr().out)}
    assert {"pcietrace_launch_pcie_bytes", "pcietrace_launch_host_seconds"} <= names
    assert main(["report", str(out), "--plot", str(tmp_path / "png"), "--format", "md"]) == 0
    assert {"bytes_vs_launches.png", "time_per_kernel.png"} <= {p.name for p in (tmp_path / "png").iterdir()}
