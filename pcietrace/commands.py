"""The commands behind ``pcietrace``'s subcommands: each takes the parsed arguments, returns an exit code."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from pcietrace.errors import NoGpuError, UsageError

SIM_HINT = "run `pcietrace run --simulate` to try the whole pipeline on a simulated device"


def parse_gpus(spec: str, count: int) -> list[int]:
    """'all' or comma-separated CUDA ordinals (as CUDA_VISIBLE_DEVICES presents them) -> list."""
    if spec == "all":
        return list(range(count))
    try:
        ords = [int(x) for x in spec.split(",")]
    except ValueError:
        raise UsageError(f"--gpu takes 'all' or CUDA device numbers like 0,1 (got {spec!r})") from None
    bad = [o for o in ords if not 0 <= o < count]
    if bad:
        raise UsageError(f"--gpu {spec}: no CUDA device {bad[0]} ({count} visible)")
    return sorted(set(ords))


def _plan(args: argparse.Namespace) -> Any:
    from pcietrace.record.run import RunPlan

    kw: dict[str, Any] = {}
    if args.quick:
        kw.update(durations_us=(0, 5, 50), graph_ks=(1, 100), window_s=0.1, e2e_repeats=1)
    if args.window_s is not None:
        kw["window_s"] = args.window_s
    if args.durations is not None:
        kw["durations_us"] = args.durations
    if args.graph_k is not None:
        kw["graph_ks"] = args.graph_k
    return RunPlan(**kw)


def _run_folder(args: argparse.Namespace, meta: dict[str, Any], ordinals: list[int], suffix: str = "") -> Any:
    """Where the run will be saved (checked and staged before measuring), or None with --no-save."""
    from pcietrace.record.guard import RunFolder, default_folder

    if args.no_save:
        return None
    if args.output is not None:
        return RunFolder(args.output, explicit=True, force=args.force)
    return RunFolder(default_folder(meta, ordinals, suffix), explicit=False)


def _say(line: str) -> None:
    print(line, file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from pcietrace.analysis import analyze, to_jsonable
    from pcietrace.record import guard
    from pcietrace.record.run import base_meta, record
    from pcietrace.session import Session

    plan = _plan(args)
    err = Console(stderr=True)
    if args.simulate:
        ordinals = parse_gpus(args.gpu, 1)  # one simulated GPU: --gpu 5 is an error, not ignored
        from pcietrace.device.sim import SimBackend, SimDevice, SimParams, SimSampler

        params = SimParams.default()
        device = SimDevice(params, seed=args.seed)
        gpu_meta = {"nvml_index": 0, "cuda_ordinal": 0, "name": f"SIMULATED {params.gpu_name}", "bus_id": "sim",
                    "pcie_gen_current": None, "pcie_gen_max": None, "pcie_width_current": None, "pcie_width_max": None}
        gpus: list[tuple[dict[str, Any], Any]] = [(gpu_meta, SimBackend(device))]
        sampler: Any = SimSampler(device)
        probes: dict[int, Any] | None = {0: sampler}
        session = Session(meta=base_meta(plan, True))
        session.meta.update(driver="simulated", sim_source=params.source, sim_params=params.__dict__)
    else:
        from pcietrace.device import backend, cuda
        from pcietrace.collectors import BoundaryProbe, CounterSampler

        try:
            ordinals = parse_gpus(args.gpu, cuda.device_count())
            gpus = backend.open_gpus(ordinals)
        except NoGpuError as exc:
            raise NoGpuError(f"{exc}; {SIM_HINT}") from None
        if args.sample_interval_ms < 0:
            raise UsageError("--sample-interval-ms must be >= 0")
        sampler = CounterSampler([g["nvml_index"] for g, _ in gpus], force_throughput=args.throughput_api,
                                 interval_ns=int(args.sample_interval_ms * 1e6))
        probes = {g["nvml_index"]: BoundaryProbe(g["nvml_index"], args.throughput_api) for g, _ in gpus}
        session = Session(meta=base_meta(plan, False))
        session.meta["driver"] = backend.driver_version()
        session.meta["sample_interval_ms"] = args.sample_interval_ms
    session.meta["gpus"] = [g for g, _ in gpus]
    if not args.simulate:
        from pcietrace.collectors import topology

        session.meta["topology"] = topology.collect([g for g, _ in gpus])
    folder = _run_folder(args, session.meta, ordinals)
    interrupted: KeyboardInterrupt | None = None
    intr = guard.Interrupts.install()  # SIGTERM/SIGHUP save like Ctrl-C; a second signal waits for the save
    try:
        with Progress(TextColumn("{task.description:<36}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err, transient=True, disable=args.json and not err.is_terminal) as prog:
            task = prog.add_task("starting counter sampler", total=plan.steps() * len(gpus))
            first = [True]

            def advance(label: str) -> None:
                if not first[0]:
                    prog.advance(task)
                first[0] = False
                prog.update(task, description=label)

            record(session, plan, gpus, sampler, probes, progress=advance)
            if not args.simulate and not args.no_latency:
                from pcietrace.record.latency import LatencyProbe, measure

                prog.update(task, total=None)
                session.latency = measure({g["nvml_index"]: LatencyProbe(be) for g, be in gpus}, args.repeats,
                                          progress=lambda label: prog.update(task, description=label))
    except KeyboardInterrupt as exc:
        interrupted = exc
        if session.meta.get("status") == "complete":  # the windows were done, the latency suite was not
            session.meta["status"] = "interrupted in the latency suite"
    finally:
        # Whatever happened, keep what was recorded: an analysis error still saves (and publishes) the raw data.
        with intr.finishing():
            results, out_dir = guard.finish(
                session, folder, lambda: analyze(session, args.us_per_level) if session.meta.get("status") == "complete"
                else None, to_jsonable, _say)
            if out_dir is not None:
                err.print(f"saved {'partial ' if results is None else ''}run to {out_dir}", markup=False, soft_wrap=True)
    if interrupted is not None:
        err.print("interrupted" + (f"; `pcietrace report {out_dir}` shows what was recorded" if out_dir else ""),
                  markup=False, soft_wrap=True)
        return guard.exit_code(interrupted)
    _emit(session.meta, results, args.json)
    return 0 if folder is None or out_dir is not None else 2


def _emit(meta: dict[str, Any], results: Any, as_json: bool) -> None:
    from rich.console import Console

    from pcietrace.analysis import to_jsonable
    from pcietrace.report.console import render
    from pcietrace.session import SCHEMA

    if as_json:
        json.dump({"schema": SCHEMA, "meta": meta, "results": to_jsonable(results)}, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        render(meta, results, Console())


def cmd_report(args: argparse.Namespace) -> int:
    from pcietrace.analysis import analyze
    from pcietrace.session import Session

    session = Session.load(args.path)
    results = analyze(session, args.us_per_level)
    if args.perfetto is not None:
        if session.meta.get("kind") != "attach":
            raise UsageError("--perfetto needs a report made by `pcietrace attach`")
        try:
            _write_perfetto(session, results, args.perfetto)
        except OSError as exc:
            raise UsageError(f"cannot write the Perfetto trace to {args.perfetto}: {exc.strerror or exc}") from None
    _emit(session.meta, results, args.json)
    return 0


def cmd_topo(args: argparse.Namespace) -> int:
    from rich.console import Console

    from pcietrace.collectors import nvml, topology

    gpus = None
    if args.sysfs_root == "/sys":
        try:
            gpus = [{"nvml_index": i, "bus_id": nvml.gpu_info(i).bus_id, "name": nvml.gpu_info(i).name}
                    for i in range(nvml.device_count())]
        except NoGpuError:
            gpus = None  # no driver: sysfs alone still shows the placement
    topo = topology.collect(gpus, args.sysfs_root)
    if not topo["gpus"]:
        raise UsageError(f"no NVIDIA GPU found under {args.sysfs_root}")
    if args.json:
        json.dump(topo, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        from pcietrace.report.console import topology_tables

        for t in topology_tables(topo):
            Console().print(t)
    return 0


def cmd_latency(args: argparse.Namespace) -> int:
    from rich.console import Console

    from pcietrace.device import backend, cuda
    from pcietrace.analysis import analyze, to_jsonable
    from pcietrace.collectors import topology
    from pcietrace.record import guard
    from pcietrace.record.latency import LatencyProbe, measure
    from pcietrace.record.run import RunPlan, base_meta
    from pcietrace.session import Session

    try:
        ordinals = parse_gpus(args.gpu, cuda.device_count())
        gpus = backend.open_gpus(ordinals)
    except NoGpuError as exc:
        raise NoGpuError(f"{exc}; `pcietrace topo` works without a GPU") from None
    session = Session(meta=base_meta(RunPlan(), False))
    session.meta.update(kind="latency", status="running", driver=backend.driver_version(), gpus=[g for g, _ in gpus],
                        topology=topology.collect([g for g, _ in gpus]))
    err = Console(stderr=True)
    folder = _run_folder(args, session.meta, ordinals, "-latency")
    try:
        with guard.Interrupts(), err.status("measuring latency") as status:
            session.latency = measure({g["nvml_index"]: LatencyProbe(be) for g, be in gpus}, args.repeats,
                                      progress=lambda label: status.update(label))
    except BaseException:
        if folder is not None:
            folder.discard()  # nothing was recorded: no folder at all
        raise
    session.meta["status"] = "complete"
    with guard.Interrupts.install().finishing():
        results, out = guard.finish(session, folder, lambda: analyze(session), to_jsonable, _say)
    if out is not None:
        err.print(f"saved to {out}", markup=False, soft_wrap=True)
    _emit(session.meta, results, args.json)
    return 0 if folder is None or out is not None else 2


def _launch_costs(args: argparse.Namespace, ordinal: int) -> dict[str, Any] | None:
    if args.no_calibrate:
        return None
    if args.baseline is not None:
        from pcietrace.analysis import analyze
        from pcietrace.analysis.costs import launch_costs
        from pcietrace.session import Session

        res = analyze(Session.load(args.baseline))
        return launch_costs(res["cpu_cost"], res["speedup"], str(args.baseline))
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from pcietrace.record.attach import calibrate

    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as ex:
        return ex.submit(calibrate, ordinal).result(timeout=120)


def cmd_attach(args: argparse.Namespace) -> int:
    import tempfile

    import pandas as pd
    from rich.console import Console

    from pcietrace.device import cuda
    from pcietrace.analysis import analyze, to_jsonable
    from pcietrace.record.attach import cupti_library, processes, read_traces, run_program
    from pcietrace.collectors import CounterSampler, nvml, topology
    from pcietrace.record.run import RunPlan, base_meta
    from pcietrace.session import Session

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise UsageError("attach needs a program to run: pcietrace attach -- CMD [ARGS...]")
    if args.sample_interval_ms < 0:
        raise UsageError("--sample-interval-ms must be >= 0")
    try:
        buses = cuda.bus_ids()
        ordinals = parse_gpus(args.gpu, len(buses))
    except NoGpuError as exc:
        raise NoGpuError(f"{exc}; attach needs an NVIDIA GPU") from None
    err = Console(stderr=True)
    gpus = [{**nvml.gpu_info(nvml.index_for_bus_id(buses[o])).__dict__, "cuda_ordinal": o} for o in ordinals]
    costs = None
    if not args.no_calibrate:
        with err.status("measuring per-launch costs on this GPU"):
            costs = _launch_costs(args, ordinals[0])
    session = Session(meta=base_meta(RunPlan(), False))
    session.meta.update(kind="attach", command=cmd, gpus=gpus, driver=nvml.driver_version(), launch_costs=costs,
                        sample_interval_ms=args.sample_interval_ms, topology=topology.collect(gpus))
    out_dir = args.output or Path("reports") / f"{time.strftime('%Y%m%d-%H%M%S')}-attach"
    trace_dir = Path(tempfile.mkdtemp(prefix="pcietrace-"))
    sampler = CounterSampler([g["nvml_index"] for g in gpus], interval_ns=int(args.sample_interval_ms * 1e6))
    sampler.start()
    for g in gpus:
        g["counter"] = sampler.modes.get(g["nvml_index"])
    windows: list[dict[str, Any]] = []

    def idle(seconds: float) -> None:
        """Sample with the program not running: an idle window per GPU, for the floor."""
        t = time.monotonic_ns()
        time.sleep(seconds)
        windows.extend({"nvml_index": g["nvml_index"], "mode": "idle", "t_start_ns": t, "t_end_ns": time.monotonic_ns()}
                       for g in gpus)

    rc = 1
    try:
        idle(args.idle_s)
        err.print(f"pcietrace: running {' '.join(cmd)}")
        counter = "none" if args.no_count_launches else args.launch_counter
        session.meta["launch_counter"] = counter
        rc, t0, t1 = run_program(cmd, trace_dir, cupti_library() if counter == "cupti" else None, counter)
        session.meta.update(t_app_start_ns=t0, t_app_end_ns=t1, exit_code=rc, status="complete")
        idle(0.3)
    finally:
        session.samples = sampler.stop()
        session.windows = pd.DataFrame(windows)
        session.events = read_traces(trace_dir)
        session.meta["processes"] = processes(session.events)
        shutil.rmtree(trace_dir, ignore_errors=True)  # its events now live in the session
        if "t_app_start_ns" not in session.meta:  # the program never ran: keep what exists, no attribution
            session.meta.update(kind="attach-failed", status="interrupted before the program ran")
        session.save(out_dir)  # raw data first: nothing below can lose it
        results = analyze(session)
        session.save(out_dir, to_jsonable(results))
        if session.meta["kind"] == "attach":
            _write_perfetto(session, results, out_dir / "trace.json")
            err.print(f"saved to {out_dir} (Perfetto trace: {out_dir / 'trace.json'})")
        else:
            err.print(f"saved what was recorded to {out_dir}")
    _emit(session.meta, results, args.json)
    return rc


def _write_perfetto(session: Any, results: dict[str, Any], path: Path) -> None:
    from pcietrace.analysis import counters
    from pcietrace.report.perfetto import chrome_trace

    cum = counters.cumulative_bytes(session.samples, session.counters)
    bin_ns = max(int(session.meta.get("sample_interval_ms", 1.0) * 1e6), 1_000_000)
    trace = chrome_trace(session.meta, counters.rates(cum, bin_ns), results["range_instances"])
    path.write_text(json.dumps(trace))


def cmd_compare(args: argparse.Namespace) -> int:
    from rich.console import Console

    from pcietrace.analysis import analyze
    from pcietrace.analysis.compare import compare
    from pcietrace.report.console import compare_table
    from pcietrace.session import Session

    if len(args.paths) < 2:
        raise UsageError("compare needs at least two saved runs")
    runs = []
    for i, p in enumerate(args.paths):
        s = Session.load(p)
        gpu = s.meta["gpus"][0]["name"].replace("NVIDIA ", "") if s.meta.get("gpus") else "?"
        name = f"{chr(65 + i)}: {gpu}{' (SIMULATED)' if s.meta.get('simulated') else ''}"
        runs.append((name, analyze(s, args.us_per_level), s.meta))
    cmp = compare(runs, args.us_per_level)
    if args.json:
        sys.stdout.write(cmp.to_json(orient="records", indent=1) + "\n")
    else:
        Console().print(compare_table(cmp, [r[0] for r in runs]))
    return 0


