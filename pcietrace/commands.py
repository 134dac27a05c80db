"""The commands behind ``pcietrace``'s subcommands: each takes the parsed arguments, returns an exit code."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from pcietrace.errors import NoGpuError, UsageError

SIM_HINT = "run `pcietrace run --simulate` to try the whole pipeline on a simulated device"


def parse_gpus(spec: str, count: int) -> list[int]:
    """'all' or comma-separated CUDA ordinals (as CUDA_VISIBLE_DEVICES presents them), each named once -> sorted list."""
    if spec == "all":
        return list(range(count))
    try:
        ords = [int(x) for x in spec.split(",")]
    except ValueError:
        raise UsageError(f"--gpu takes 'all' or CUDA device numbers like 0,1 (got {spec!r})") from None
    twice = [o for o in ords if ords.count(o) > 1]
    if twice:  # `--gpu 0,0` is a typo for 0,1 more often than a wish to measure GPU 0 once
        raise UsageError(f"--gpu {spec}: GPU {twice[0]} given twice")
    bad = [o for o in ords if not 0 <= o < count]
    if bad:
        raise UsageError(f"--gpu {spec}: no CUDA device {bad[0]} ({count} visible)")
    return sorted(ords)


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
    if args.contexts is not None:
        kw["gpu_time_contexts"] = args.contexts
    return RunPlan(**kw)


def _run_folder(args: argparse.Namespace, meta: dict[str, Any], ordinals: list[int], suffix: str = "") -> Any:
    """Where the run will be saved (checked and staged before measuring), or None with --no-save."""
    from pcietrace.record.guard import RunFolder, default_folder

    if getattr(args, "no_save", False):
        return None
    if args.output is not None:
        return RunFolder(args.output, explicit=True, force=args.force)
    return RunFolder(default_folder(meta, ordinals, suffix), explicit=False)


def cmd_run(args: argparse.Namespace) -> int:
    from pcietrace.analysis import analyze
    from pcietrace.report.saved import to_jsonable
    from pcietrace.record import box, guard
    from pcietrace.report.console import tell

    plan = _plan(args)
    _check_plot(args)
    if args.gpus != 1 and not args.simulate:
        raise UsageError("--gpus N simulates an N-GPU box: it needs --simulate (real GPUs are chosen with --gpu)")
    repeats = None if args.no_latency else args.repeats
    if args.simulate:
        ordinals = parse_gpus(args.gpu, args.gpus)  # --gpu beyond the simulated box is an error, not ignored
        session, record = box.simulated(plan, ordinals, args.gpus, args.seed, repeats)
    else:
        from pcietrace.device import backend, cuda

        try:
            ordinals = parse_gpus(args.gpu, cuda.device_count())
            gpus = backend.describe_gpus(ordinals)
        except NoGpuError as exc:
            raise NoGpuError(f"{exc}; {SIM_HINT}") from None
        session, record = box.real(plan, gpus, ordinals, args.throughput_api, args.sample_interval_ms, repeats)
    folder = _run_folder(args, session.meta, ordinals)
    saving = guard.Saving(session, folder, lambda: analyze(session, args.us_per_level)
                          if session.meta.get("status") == "complete" else None,
                          to_jsonable=to_jsonable, tell=tell,
                          saved_line=lambda s: f"saved {'partial ' if s.results is None else ''}run to {s.out_dir}")
    with saving, _progress(plan.steps() * len(session.meta["gpus"])) as (advance, note):
        record(advance, note)
    return saving.end(lambda results: _emit(session.meta, results, args))


@contextlib.contextmanager
def _progress(steps: int) -> Iterator[tuple[Callable[[str], None], Callable[[str], None]]]:
    """A progress bar of ``steps`` on a terminal (off one: a blank line): ``advance(label)`` ends a step and names
    the next, ``note(label)`` renames the current one."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    err = Console(stderr=True)
    with Progress(TextColumn("{task.description:<36}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True, disable=not err.is_terminal) as prog:
        task = prog.add_task("starting counter sampler", total=steps)
        first = [True]

        def advance(label: str) -> None:
            if not first[0]:
                prog.advance(task)
            first[0] = False
            prog.update(task, description=label)

        yield advance, lambda label: prog.update(task, description=label)


def _check_plot(args: argparse.Namespace) -> None:
    if args.plot is not None:  # before measuring, not after
        from pcietrace.report import plots

        plots.check(args.plot)


def _emit(meta: dict[str, Any], results: Any, args: argparse.Namespace) -> None:
    from pcietrace.analysis.summary import summarize
    from pcietrace.report.console import RangeView
    from pcietrace.report.output import emit

    view = RangeView(None if args.all else args.top, args.sort, args.filter, args.group_by) \
        if hasattr(args, "group_by") else None
    emit(meta, results, summarize(meta, results), "json" if args.json else args.format, args.detail, args.plot,
         view=view)


def _check_perfetto_target(target: Path, recording: Path, option: str = "--perfetto") -> None:
    """Refuse a --perfetto (``option``) file that is standard output or one of the files the report is read from
    (writing it would replace the recording with the trace)."""
    from pcietrace.session import recording_files

    if str(target) == "-":
        raise UsageError(f"{option} writes a file: give its name (standard output holds the report)")
    files = recording_files(recording) if target.exists() else []
    own = [f for f in files if f.exists() and os.path.samefile(target, f)]
    if own:
        raise UsageError(f"{option} {target}: that is the report's own {own[0].name}, which it is read from; "
                         "choose another file")
    from pcietrace.record.guard import is_run
    from pcietrace.session import EVENTS_FILE, REPORT_FILE, SAMPLES_FILE

    if target.is_dir():
        raise UsageError(f"--perfetto {target}: that is a folder; give the trace file's name")
    own_dir = recording_files(recording)[0].parent
    other = is_run(target.parent) and not (own_dir.exists() and os.path.samefile(target.parent, own_dir))
    if other or (target.name in (REPORT_FILE, SAMPLES_FILE, EVENTS_FILE) and is_run(target.parent)):
        raise UsageError(f"--perfetto {target}: that is in the folder of another saved run ({target.parent}), whose "
                         "files it could replace; choose another folder")


def cmd_report(args: argparse.Namespace) -> int:
    from pcietrace.analysis import analyze
    from pcietrace.multinode import is_merged
    from pcietrace.session import Session

    if args.perfetto is not None:
        _check_perfetto_target(args.perfetto, args.path)
    if args.instances is not None:
        _check_perfetto_target(args.instances, args.path, "--instances")
    if is_merged(args.path):
        return _report_merged(args)
    session = Session.load(args.path)
    results = analyze(session, args.us_per_level, args.group_by)
    if args.instances is not None:
        from pcietrace.session import write_instances

        try:
            # (a result is read-only: the rendered tables are a copy naming the file instead)
            results = {**results, "range_instances": write_instances(results["range_instances"], args.instances)}
        except OSError as exc:
            raise UsageError(f"cannot write the range instances to {args.instances}: {exc.strerror or exc}") from None
    if args.perfetto is not None:
        if session.meta.get("kind") == "attach-failed":
            raise UsageError(f"--perfetto: {args.path} is an attach run stopped before its program ran: no trace")
        if session.meta.get("kind") != "attach":
            raise UsageError("--perfetto needs a report made by `pcietrace attach`")
        from pcietrace.report.perfetto import write_trace

        from pcietrace.record.attach import trace_size

        try:
            info = write_trace(session, results, args.perfetto)
        except (OSError, MemoryError) as exc:
            raise UsageError(f"cannot write the Perfetto trace to {args.perfetto}: "
                             f"{getattr(exc, 'strerror', None) or exc or 'out of memory'}") from None
        print(f"Perfetto trace: {args.perfetto}{trace_size(info)}", file=sys.stderr)
    _emit(session.meta, results, args)
    return 0


def _report_merged(args: argparse.Namespace) -> int:
    """`report` of a merged report: its saved tables (the nodes' raw samples are never loaded together)."""
    from pcietrace import multinode

    merged = multinode.load(args.path, timelines=args.plot is not None)
    if args.perfetto is not None:
        folder = args.path if args.path.is_dir() else args.path.parent
        try:
            multinode.write_trace(folder, merged.meta, args.perfetto)
        except OSError as exc:
            raise UsageError(f"cannot write the Perfetto trace to {args.perfetto}: {exc.strerror or exc}") from None
    _emit(merged.meta, merged.results, args)
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from pcietrace import multinode
    from pcietrace.report.console import tell

    _check_plot(args)
    scheduler = args.scheduler or os.environ.get(multinode.SCHEDULER_ENV) or None
    out = multinode.merge(args.paths, args.output, args.workers, scheduler, args.force)
    tell(f"pcietrace: merged {len(args.paths)} recordings into {out} (Perfetto trace: {out / multinode.TRACE_FILE})")
    loaded = multinode.load(out, timelines=args.plot is not None)
    _emit(loaded.meta, loaded.results, args)
    return 0


def cmd_topo(args: argparse.Namespace) -> int:
    from pcietrace.collectors import nvml, topology

    if args.fixture is not None:
        from pcietrace.collectors import sysfs_fixture

        if args.sysfs_root is not None:  # else one of the two machines named would be silently ignored
            raise UsageError("--fixture and --sysfs-root each name the machine to show: give one of them")

        return _emit_topology(sysfs_fixture.topology(args.fixture), args)
    gpus = None
    root = args.sysfs_root or "/sys"
    if Path(root).resolve() == Path("/sys"):  # this machine's own tree: NVML names its GPUs and links
        try:
            infos = [nvml.gpu_info(i) for i in range(nvml.device_count())]
            gpus = [{"nvml_index": g.nvml_index, "bus_id": g.bus_id, "name": g.name} for g in infos]
        except NoGpuError:
            gpus = None  # no driver: sysfs alone still shows the placement
    topo = topology.collect(gpus, root)
    if not topo["gpus"]:
        raise UsageError(f"no NVIDIA GPU found under {root}")
    return _emit_topology(topo, args)


def _emit_topology(topo: dict[str, Any], args: argparse.Namespace) -> int:
    if args.json or args.format == "json":
        json.dump(topo, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        from rich.console import Console

        from pcietrace.report.console import topology_tables
        from pcietrace.report.text import clean_all

        for t in topology_tables(clean_all(topo)):
            Console().print(t)
    return 0


def cmd_latency(args: argparse.Namespace) -> int:
    from rich.console import Console

    from pcietrace.device import backend, cuda
    from pcietrace.analysis import analyze
    from pcietrace.report.saved import to_jsonable
    from pcietrace.collectors import topology
    from pcietrace.record import guard
    from pcietrace.record.latency import LatencyProbe, measure
    from pcietrace.record.run import RunPlan, base_meta
    from pcietrace.report.console import tell
    from pcietrace.session import Session

    _check_plot(args)
    if args.gpus != 1 and not args.simulate:
        raise UsageError("--gpus N simulates an N-GPU box: it needs --simulate (real GPUs are chosen with --gpu)")
    if args.simulate:
        return _simulated_latency(args)
    try:
        ordinals = parse_gpus(args.gpu, cuda.device_count())
        gpus = backend.open_gpus(ordinals)
    except NoGpuError as exc:
        raise NoGpuError(f"{exc}; `pcietrace topo` needs no driver (only the GPUs), {SIM_HINT}") from None
    err = Console(stderr=True)

    def release() -> None:
        for _, be in gpus:
            with contextlib.suppress(Exception):  # the figures are in the session: a failed release keeps them
                be.close()

    try:  # the GPUs are released on every way out, a refused -o included
        session = Session(meta=base_meta(RunPlan(), False))
        session.meta.update(kind="latency", status="running", driver=backend.driver_version(),
                            gpus=[g for g, _ in gpus], topology=topology.collect([g for g, _ in gpus]))
        folder = _run_folder(args, session.meta, ordinals, "-latency")
        with guard.discard_on_error(folder), guard.Interrupts(), err.status("measuring latency") as status:
            session.latency = measure({g["nvml_index"]: LatencyProbe(be) for g, be in gpus}, args.repeats,
                                      progress=lambda label: status.update(label))
    except BaseException:
        release()
        raise
    session.meta["status"] = "complete"
    saving = guard.Saving(session, folder, lambda: analyze(session), to_jsonable=to_jsonable, tell=tell,
                          before=lambda _: release())
    with saving:  # the suite is measured: a signal while the GPUs are released waits until it is saved
        pass
    return saving.end(lambda results: _emit(session.meta, results, args))


def _simulated_latency(args: argparse.Namespace) -> int:
    """``latency --simulate``: the suite's figures from the SIMULATED device's model of a recorded run."""
    from pcietrace.analysis import analyze
    from pcietrace.report.saved import to_jsonable
    from pcietrace.device import sim
    from pcietrace.record import guard
    from pcietrace.record.run import RunPlan, base_meta
    from pcietrace.report.console import tell
    from pcietrace.session import Session

    params = sim.SimParams.default()
    ordinals = parse_gpus(args.gpu, args.gpus)
    gpu_meta = [sim.gpu_records(params, args.gpus)[o] for o in ordinals]
    session = Session(meta=base_meta(RunPlan(), True))
    session.meta.update(kind="latency", status="running", driver="simulated", sim_source=params.source,
                        gpus=gpu_meta, topology=sim.topology(params, gpu_meta))
    folder = _run_folder(args, session.meta, ordinals, "-latency")
    with guard.discard_on_error(folder), guard.Interrupts():
        session.latency = sim.latency(params, gpu_meta, args.repeats, args.seed)
    session.meta["status"] = "complete"
    saving = guard.Saving(session, folder, lambda: analyze(session), to_jsonable=to_jsonable, tell=tell)
    with saving:
        pass
    return saving.end(lambda results: _emit(session.meta, results, args))


def _launch_costs(args: argparse.Namespace, ordinal: int) -> dict[str, Any] | None:
    if args.no_calibrate:
        return None
    if args.baseline is not None:
        from pcietrace.analysis.costs import from_run
        from pcietrace.session import Session

        return from_run(Session.load(args.baseline), str(args.baseline))
    from pcietrace.analysis.costs import from_records
    from pcietrace.record.attach import calibrate_in_child

    return from_records(*calibrate_in_child(ordinal), "measured on the spot")


def cmd_attach(args: argparse.Namespace) -> int:
    from rich.console import Console

    from pcietrace.analysis import analyze
    from pcietrace.report.saved import saved_tables
    from pcietrace.collectors import nvml, topology
    from pcietrace.device import backend, cuda
    from pcietrace.record import guard
    from pcietrace.record.attach import exit_code, record_attach
    from pcietrace.record.node import expand_output, node_meta
    from pcietrace.record.run import RunPlan, base_meta
    from pcietrace.report.console import tell
    from pcietrace.report.perfetto import write_trace
    from pcietrace.schema import NO_LAUNCH_COUNTER
    from pcietrace.session import Session

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise UsageError("attach needs a program to run: pcietrace attach -- CMD [ARGS...]")
    if shutil.which(cmd[0]) is None:  # before anything is measured or saved
        why = "not an executable file" if os.path.exists(cmd[0]) else "no such program (not on PATH)"
        raise UsageError(f"attach cannot run {cmd[0]!r}: {why}")
    _check_plot(args)
    try:
        ordinals = parse_gpus(args.gpu, len(cuda.bus_ids()))
    except NoGpuError as exc:
        raise NoGpuError(f"{exc}; attach needs an NVIDIA GPU") from None
    gpus = backend.describe_gpus(ordinals)
    session = Session(meta=base_meta(RunPlan(), False))
    session.meta.update(kind="attach", command=cmd, gpus=gpus, driver=nvml.driver_version(), launch_costs=None,
                        sample_interval_ms=args.sample_interval_ms, topology=topology.collect(gpus),
                        launch_counter=NO_LAUNCH_COUNTER if args.no_count_launches else args.launch_counter,
                        exact_edges=args.exact_edges, sampler_duty=args.sampler_duty,
                        idle_sample_interval_ms=args.idle_sample_interval_ms, slow_domains=args.slow_domains)
    session.meta["gpu_time"] = args.gpu_time
    session.meta["node"] = node_meta(args.label)  # what `pcietrace merge` lines nodes up by
    if args.output is not None:
        args.output = Path(expand_output(str(args.output), args.label))
    suffix = "-attach" + (f"-{args.label}" if args.label else "")
    folder = _run_folder(args, session.meta, ordinals, suffix)  # checked before anything is measured
    with guard.discard_on_error(folder), Console(stderr=True).status("measuring per-launch costs on this GPU"):
        session.meta["launch_costs"] = _launch_costs(args, ordinals[0])
    machine_output = args.json or args.format != "table"  # stdout carries the report alone: the program's goes to stderr
    saving = record_attach(session, folder, args.idle_s, sys.stderr if machine_output else None,
                           lambda: analyze(session, group_by=args.group_by), write_trace, to_jsonable=saved_tables,
                           tell=tell)
    return saving.end(lambda results: _emit(session.meta, results, args), exit_code(session.meta))


def cmd_compare(args: argparse.Namespace) -> int:
    from pcietrace.analysis import analyze
    from pcietrace.analysis.compare import compare, run_name
    from pcietrace.analysis.summary import compare_summary
    from pcietrace import multinode
    from pcietrace.multinode import is_merged
    from pcietrace.report.output import emit_compare
    from pcietrace.session import Session

    if len(args.paths) < 2:
        raise UsageError("compare needs at least two saved runs")
    merged = [is_merged(p) for p in args.paths]
    if any(merged):  # a merged report holds its results, not the nodes' samples
        return _compare_attach(args, [multinode.load(p) if m else Session.load(p) for p, m in zip(args.paths, merged)])
    sessions = [Session.load(p) for p in args.paths]
    attach = [str(s.meta.get("kind")).startswith("attach") for s in sessions]  # (attach-failed too)
    if all(attach):
        return _compare_attach(args, sessions)
    if any(attach):  # an attach run has none of the figures a run's comparison lines up
        raise UsageError("an attach run compares only with another attach run (pcietrace compare EAGER_ATTACH GRAPHED_ATTACH)")
    runs = []
    for i, (p, s) in enumerate(zip(args.paths, sessions)):
        folder = (p.parent if p.name == "report.json" else p).resolve().name
        runs.append((run_name(chr(65 + i), folder, s.meta), analyze(s, args.us_per_level), s.meta))
    cmp = compare(runs, args.us_per_level)
    names = [r[0] for r in runs]
    _refuse_nothing_in_common(cmp, names, args.paths, sessions)
    emit_compare(cmp, names, compare_summary(cmp, names), "json" if args.json else args.format)
    return 0


def _refuse_nothing_in_common(cmp: Any, names: list[str], paths: list[Path], sessions: list[Any]) -> None:
    from pcietrace.analysis.compare import shares_figures

    kinds = [s.meta.get("kind") or "run" for s in sessions]
    for i, name in enumerate(names[1:], 1):
        if not shares_figures(cmp, name):  # else a table of one-sided rows would read "no significant difference"
            hint = ("other sizes, other GPUs, or steps one of them never reached" if kinds[i] == kinds[0] else
                    "compare graphs reports with graphs reports, runs with runs or latency reports")
            raise UsageError(f"{paths[i]} (kind: {kinds[i]}) and {paths[0]} (kind: {kinds[0]}) have no figure in "
                             f"common: {hint}")


def cmd_graphs(args: argparse.Namespace) -> int:
    from pcietrace.record import graphs
    from pcietrace.report.prometheus import NO_METRICS

    _check_plot(args)
    if args.format == "prometheus" and not args.json:
        raise UsageError(NO_METRICS["graphs"])
    plan = graphs.GraphsPlan(kernels=args.kernels, param_sets=args.param_sets, order=args.order,
                             strategies=tuple(s.strip() for s in args.strategies.split(",") if s.strip()),
                             kernel_us=tuple(args.kernel_us), iterations=args.iterations, rounds=args.rounds,
                             sync=args.sync_each_iteration, seed=args.seed)
    try:
        gpu, device, sampler, probe, extra = graphs.open_device(args.simulate, args.gpu, args.seed, args.sample_interval_ms)
    except NoGpuError as exc:
        raise NoGpuError(f"{exc}; `pcietrace graphs --simulate` runs on a simulated device") from None
    try:
        return _record_graphs(args, plan, gpu, device, sampler, probe, extra)
    finally:  # every exit path (a taken -o, Ctrl-C, a failed run) releases the GPU
        with contextlib.suppress(Exception):  # saved by now: a failed release keeps the run
            device.close()


def _record_graphs(args: argparse.Namespace, plan: Any, gpu: dict[str, Any], device: Any, sampler: Any, probe: Any,
                   extra: dict[str, Any]) -> int:
    from rich.console import Console

    from pcietrace.analysis import analyze
    from pcietrace.report.saved import to_jsonable
    from pcietrace.record import graphs, guard
    from pcietrace.record.run import RunPlan, base_meta
    from pcietrace.report.console import tell
    from pcietrace.session import Session

    session = Session(meta={**base_meta(RunPlan(), args.simulate), **graphs.meta_for(plan, device), **extra, "gpus": [gpu]})
    session.meta.pop("plan")  # that is `run`'s plan; this run's is graphs_plan
    folder = _run_folder(args, session.meta, [args.gpu], "-graphs")
    err = Console(stderr=True)
    saving = guard.Saving(session, folder, lambda: analyze(session), to_jsonable=to_jsonable, tell=tell)
    with saving, err.status("graphs") as status:
        graphs.record(session, plan, device, gpu["nvml_index"], sampler, probe, progress=status.update)
    return saving.end(lambda results: _emit(session.meta, results, args))


def _compare_attach(args: argparse.Namespace, sessions: list[Any]) -> int:
    """Two attach runs of one program, eager then graphed: attach's savings prediction against the measured."""
    from pcietrace.analysis import analyze
    from pcietrace.analysis.savings import savings
    from pcietrace.multinode import Merged
    from pcietrace.report.output import emit_savings

    if len(sessions) != 2:
        raise UsageError("attach runs are compared in pairs: EAGER_ATTACH GRAPHED_ATTACH")
    if any(not str(s.meta.get("kind")).startswith("attach") for s in sessions):
        raise UsageError("a merged report compares only with an attach run or another merged report")
    eager, graphed = (s.results if isinstance(s, Merged) else analyze(s) for s in sessions)
    table = savings(eager, graphed)
    if not len(table):  # else an empty table and exit 0
        raise UsageError(f"{args.paths[0]} and {args.paths[1]} have no NVTX range in common (by domain and name): "
                         "compare two attach runs of one program, eager then graphed")
    emit_savings(table, [str(p) for p in args.paths], "json" if args.json else args.format)
    return 0
