"""The commands behind ``pcietrace``'s subcommands: each takes the parsed arguments and returns an exit code.
A measuring command is parse -> config (:mod:`pcietrace.config`) -> record (:mod:`pcietrace.workflow`, which
the Python API calls too) -> render; the others load a saved run, analyse it and render."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from pcietrace.errors import OutOfMemory, UsageError

if TYPE_CHECKING:
    from pcietrace.config import AttachConfig, GraphsConfig, LatencyConfig, RunConfig
    from pcietrace.workflow import Feedback


def _saved(args: argparse.Namespace) -> dict[str, Any]:
    """The save options every measuring command takes (-o, --force, --no-save) as config fields."""
    return {"output": args.output, "force": args.force, "save": not getattr(args, "no_save", False)}


def _feedback(progress_bar: bool = False) -> Feedback:
    """The rich status lines, spinners and (``progress_bar``) progress bar a recording shows on stderr."""
    from rich.console import Console

    from pcietrace.report.console import tell
    from pcietrace.workflow import Feedback

    err = Console(stderr=True)
    return Feedback(tell=tell, busy=err.status, **({"steps": _progress} if progress_bar else {}))


def run_config(args: argparse.Namespace) -> RunConfig:
    """``pcietrace run``'s flags as its config (:class:`pcietrace.config.RunConfig`)."""
    from pcietrace.config import RunConfig

    return RunConfig(gpu=args.gpu, simulate=args.simulate, gpus=args.gpus, seed=args.seed, quick=args.quick,
                     window_s=args.window_s, durations_us=args.durations, graph_ks=args.graph_k,
                     contexts=args.contexts, sample_interval_ms=args.sample_interval_ms,
                     throughput_api=args.throughput_api, latency=not args.no_latency, repeats=args.repeats,
                     us_per_level=args.us_per_level, **_saved(args))


def cmd_run(args: argparse.Namespace) -> int:
    from pcietrace import workflow

    config = run_config(args)
    _check_plot(args)
    recorded = workflow.record_run(config, _feedback(progress_bar=True))
    return recorded.end(lambda results: _emit(recorded.session.meta, results, args))


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
    from pcietrace.report.console import SCREEN_LINES, RangeView
    from pcietrace.report.output import emit

    fit = not (args.all or args.top or args.detail) if hasattr(args, "group_by") else False  # (a screen's worth)
    view = RangeView(None if args.all else args.top or RangeView.top, args.sort, args.filter, args.group_by,
                     SCREEN_LINES if fit else None) if hasattr(args, "group_by") else None
    emit(meta, results, summarize(meta, results), "json" if args.json else args.format, args.detail, args.plot,
         view=view)
    if sys.stdout is not None:  # (None: started with standard output closed, `>&-`)
        sys.stdout.flush()  # (the report reaches a pipe before attach goes on to write its Perfetto trace)


def _check_range_view(args: argparse.Namespace, kind: str | None) -> None:
    """Refuse the options that choose among NVTX ranges for a report that has none to choose (a run, latency
    or graphs report): they would be dropped without a word."""
    from pcietrace.analysis.names import DEFAULT_GROUP_BY, DEFAULT_SORT

    if str(kind).startswith("attach"):
        return
    given = [o for o, on in (("--top", args.top), ("--all", args.all), ("--filter", args.filter),
                             ("--sort", args.sort != DEFAULT_SORT), ("--group-by", args.group_by != DEFAULT_GROUP_BY))
             if on]
    if given:
        raise UsageError(f"{', '.join(given)}: {args.path} is a {kind or 'run'} report; these choose among an attach "
                         "run's NVTX ranges")


def _one_file(a: Path, b: Path) -> bool:
    """Whether two output names are one file (the second written would replace the first), a device such as
    /dev/null aside."""
    if a.exists() and b.exists():
        return os.path.samefile(a, b) and a.is_file()
    return os.path.realpath(a) == os.path.realpath(b)


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
        raise UsageError(f"{option} {target}: that is a folder; give the file's name")
    own_dir = recording_files(recording)[0].parent
    other = is_run(target.parent) and not (own_dir.exists() and os.path.samefile(target.parent, own_dir))
    if other or (target.name in (REPORT_FILE, SAMPLES_FILE, EVENTS_FILE) and is_run(target.parent)):
        raise UsageError(f"{option} {target}: that is in the folder of another saved run ({target.parent}), whose "
                         "files it could replace; choose another folder")


def cmd_report(args: argparse.Namespace) -> int:
    from pcietrace.analysis import analyze
    from pcietrace.multinode import is_merged
    from pcietrace.session import Session

    if args.perfetto is not None:
        _check_perfetto_target(args.perfetto, args.path)
    if args.instances is not None:
        _check_perfetto_target(args.instances, args.path, "--instances")
        if args.perfetto is not None and _one_file(args.perfetto, args.instances):
            raise UsageError(f"--perfetto and --instances both name {args.instances}: give each a file of its own")
    if is_merged(args.path):
        return _report_merged(args)
    session = Session.load(args.path, samples_on_disk=True)  # (an attach run's: read a GPU at a time)
    _check_range_view(args, session.meta.get("kind"))
    if args.instances is not None and not str(session.meta.get("kind")).startswith("attach"):
        raise UsageError(f"--instances: {args.path} is a {session.meta.get('kind') or 'run'} report; it writes an "
                         "attach run's NVTX range calls")
    if args.perfetto is not None and session.meta.get("kind") == "attach-failed":  # (before the analysis' minute)
        raise UsageError(f"--perfetto: {args.path} is an attach run stopped before its program ran: no trace")
    if args.perfetto is not None and session.meta.get("kind") != "attach":
        raise UsageError("--perfetto needs a report made by `pcietrace attach`")
    samples = session.sample_file.rows if session.sample_file else len(session.samples)
    sizes = f"{samples:,} counter samples, {len(session.events):,} events"
    trace = None
    # (a spinner on a terminal, nothing elsewhere: a long run's analysis takes a minute; it ends before the report)
    with _feedback().busy(f"analysing {args.path} ({sizes})") as status:
        try:
            # (the events let go once the ranges are made, the samples once read: nothing after the analysis reads
            # them)
            results = analyze(session, args.us_per_level, args.group_by, release_events=True, release_samples=True)
        except MemoryError:
            raise OutOfMemory(f"out of memory analysing {args.path} ({sizes}): report it on a machine with more "
                              f"memory") from None
        if args.instances is not None:
            from pcietrace.session import write_instances

            status.update(f"writing the range instances to {args.instances}")
            try:
                # (a result is read-only: the rendered tables are a copy naming the file instead)
                results = {**results, "range_instances": write_instances(results["range_instances"], args.instances)}
            except OSError as exc:
                raise UsageError(f"cannot write the range instances to {args.instances}: {exc.strerror or exc}") \
                    from None
        if args.perfetto is not None:
            from pcietrace.report.perfetto import write_trace

            status.update(f"writing the Perfetto trace {args.perfetto}")
            try:
                trace = write_trace(session, results, args.perfetto)
            except (OSError, MemoryError) as exc:
                raise UsageError(f"cannot write the Perfetto trace to {args.perfetto}: "
                                 f"{getattr(exc, 'strerror', None) or exc or 'out of memory'}") from None
    if trace is not None:
        from pcietrace.record.attach import trace_size

        print(f"Perfetto trace: {args.perfetto}{trace_size(trace)}", file=sys.stderr)
    _emit(session.meta, results, args)
    return 0


def _report_merged(args: argparse.Namespace) -> int:
    """`report` of a merged report: its saved tables (the nodes' raw samples are never loaded together)."""
    from pcietrace import multinode

    merged = multinode.load(args.path, timelines=args.plot is not None)
    if args.instances is not None:  # (every call on every node, each naming its node: as report.json holds them)
        from pcietrace.session import write_instances

        try:
            merged.results["range_instances"] = write_instances(merged.results["range_instances"], args.instances)
        except OSError as exc:
            raise UsageError(f"cannot write the range instances to {args.instances}: {exc.strerror or exc}") from None
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
    alone = multinode.apart(loaded.meta)
    if alone:
        tell(f"pcietrace: warning: {', '.join(alone)}: " + ("its" if len(alone) == 1 else "each one's")
             + " program ran at no time any other node's did: recordings of different jobs? (merged anyway)")
    _emit(loaded.meta, loaded.results, args)
    return 0


def cmd_topo(args: argparse.Namespace) -> int:
    from pcietrace import workflow

    return _emit_topology(workflow.topology(args.fixture, args.sysfs_root), args)


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


def latency_config(args: argparse.Namespace) -> LatencyConfig:
    """``pcietrace latency``'s flags as its config (:class:`pcietrace.config.LatencyConfig`)."""
    from pcietrace.config import LatencyConfig

    return LatencyConfig(gpu=args.gpu, simulate=args.simulate, gpus=args.gpus, seed=args.seed, repeats=args.repeats,
                         **_saved(args))


def cmd_latency(args: argparse.Namespace) -> int:
    from pcietrace import workflow

    config = latency_config(args)
    _check_plot(args)
    recorded = workflow.record_latency(config, _feedback())
    return recorded.end(lambda results: _emit(recorded.session.meta, results, args))


def attach_config(args: argparse.Namespace) -> AttachConfig:
    """``pcietrace attach``'s flags as its config (:class:`pcietrace.config.AttachConfig`)."""
    from pcietrace.config import AttachConfig
    from pcietrace.schema import NO_LAUNCH_COUNTER

    return AttachConfig(command=tuple(args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd), gpu=args.gpu,
                        sample_interval_ms=args.sample_interval_ms,
                        idle_sample_interval_ms=args.idle_sample_interval_ms,
                        quiet_sample_interval_ms=args.quiet_sample_interval_ms, slow_domains=args.slow_domains,
                        sampler_duty=args.sampler_duty, idle_s=args.idle_s, calibrate=not args.no_calibrate,
                        baseline=args.baseline,
                        launch_counter=NO_LAUNCH_COUNTER if args.no_count_launches else args.launch_counter,
                        exact_edges=args.exact_edges, max_depth=args.max_depth, gpu_time=args.gpu_time,
                        label=args.label, group_by=args.group_by, **_saved(args))


def cmd_attach(args: argparse.Namespace) -> int:
    from pcietrace import workflow

    config = attach_config(args)
    _check_plot(args)
    machine_output = args.json or args.format != "table"  # stdout carries the report alone: the program's goes to stderr
    recorded = workflow.record_attach(config, _feedback(), sys.stderr if machine_output else None)
    return recorded.end(lambda results: _emit(recorded.session.meta, results, args))


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
                    "graphs reports compare with graphs reports; a latency report with a run only where the run "
                    "measured round trips too (not with --no-latency), on the same GPUs")
            raise UsageError(f"{paths[i]} (kind: {kinds[i]}) and {paths[0]} (kind: {kinds[0]}) have no figure in "
                             f"common: {hint}")


def graphs_config(args: argparse.Namespace) -> GraphsConfig:
    """``pcietrace graphs``'s flags as its config (:class:`pcietrace.config.GraphsConfig`)."""
    from pcietrace.config import GraphsConfig

    return GraphsConfig(gpu=args.gpu, simulate=args.simulate, kernels=args.kernels, param_sets=args.param_sets,
                        order=args.order, strategies=args.strategies, kernel_us=args.kernel_us,
                        iterations=args.iterations, rounds=args.rounds, sync_each_iteration=args.sync_each_iteration,
                        sample_interval_ms=args.sample_interval_ms, seed=args.seed, **_saved(args))


def cmd_graphs(args: argparse.Namespace) -> int:
    from pcietrace import workflow

    config = graphs_config(args)  # (--format prometheus is not among its choices: no metrics, refused before measuring)
    _check_plot(args)
    recorded = workflow.record_graphs(config, _feedback())
    return recorded.end(lambda results: _emit(recorded.session.meta, results, args))


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
    graphed = table["graph_launches_graphed"]
    if graphed.notna().any() and not graphed.fillna(0).sum() > 0:  # (two unrelated runs, or both eager; not a run
        # whose launches were not counted, --no-count-launches)
        print(f"pcietrace: note: {args.paths[1]} made no graph launch in the ranges both runs name: its ranges ran "
              "eager, so what it saved is not what CUDA graphs save (compare an eager run, then a graphed one, of "
              "one program)", file=sys.stderr)
    emit_savings(table, [str(p) for p in args.paths], "json" if args.json else args.format)
    return 0
