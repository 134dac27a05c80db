"""One function per measuring command, recording a Session from its config (:mod:`pcietrace.config`): the
GPUs selected and opened, the run folder settled before anything is measured, the recording, its analysis
and its save (what was recorded is kept through Ctrl-C, SIGTERM and failures). The CLI
(:mod:`pcietrace.commands`) and the Python API (:mod:`pcietrace.api`) both call these, and render or return
what they give back (:class:`Recorded`). :func:`topology` is ``pcietrace topo``'s collection."""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator

from pcietrace.config import AttachConfig, GraphsConfig, LatencyConfig, RunConfig, Saved
from pcietrace.errors import ConfigError, NoGpuError, UsageError

if TYPE_CHECKING:
    from pcietrace.device.gpus import GpuRecord
    from pcietrace.record.graphs import GraphsPlan, OpenedDevice
    from pcietrace.record.guard import Saving
    from pcietrace.session import Session

SIM_HINT = "run `pcietrace run --simulate` to try the whole pipeline on a simulated device"

Say = Callable[[str], None]


class _Quiet:
    """A status that shows nothing (:attr:`Feedback.busy`'s default)."""

    def update(self, label: str) -> None:
        pass


@contextlib.contextmanager
def _busy(label: str) -> Iterator[_Quiet]:
    yield _Quiet()


@contextlib.contextmanager
def _steps(total: int) -> Iterator[tuple[Say, Say]]:
    yield (lambda label: None), (lambda label: None)


@dataclass(frozen=True)
class Feedback:
    """How a recording shows its progress; the defaults show nothing (the Python API). ``tell(line)``: a
    status line (``saved to DIR``, attach's ``running CMD``); ``busy(label)``: a context whose value has
    ``update(label)`` (a spinner); ``steps(total)``: a context giving ``(advance, note)`` for ``total`` steps
    (a progress bar: ``advance(label)`` ends a step and names the next, ``note(label)`` renames it)."""

    tell: Say = lambda line: None  # noqa: E731
    busy: Callable[[str], ContextManager[Any]] = _busy
    steps: Callable[[int], ContextManager[tuple[Say, Say]]] = _steps


@dataclass
class Recorded:
    """What a recording gave: ``session``, ``results`` (None: not analysed, e.g. interrupted), ``path`` where
    it was saved (None: not saved), ``interrupted`` (the signal that stopped it), ``save_error`` (the line
    said when the save failed). :meth:`end` renders it the CLI's way and gives the exit code."""

    saving: Saving = field(repr=False)
    program_exit_code: Callable[[], int] = field(default=lambda: 0, repr=False)

    @property
    def session(self) -> Session:
        return self.saving.session

    @property
    def results(self) -> Any:
        return self.saving.results

    @property
    def path(self) -> Path | None:
        return self.saving.out_dir

    @property
    def interrupted(self) -> KeyboardInterrupt | None:
        return self.saving.interrupted

    @property
    def save_error(self) -> str | None:
        return self.saving.save_error

    def end(self, render: Callable[[Any], None]) -> int:
        """Interrupted: the one line saying what was saved and where, and 128 + the signal; else
        ``render(results)`` and the exit code (attach: the program's; never 0 when the save failed)."""
        return self.saving.end(render, self.program_exit_code())


def _run_folder(config: Saved, meta: dict[str, Any], ordinals: list[int], suffix: str = "") -> Any:
    """Where the run will be saved (checked and staged before measuring), or None when not saved."""
    from pcietrace.record.guard import RunFolder, default_folder

    if not config.save:
        return None
    if config.output is not None:
        return RunFolder(config.output, explicit=True, force=config.force)
    return RunFolder(default_folder(meta, ordinals, suffix), explicit=False)


def _select(config: RunConfig | LatencyConfig | AttachConfig, hint: str) -> list[GpuRecord]:
    """The GPUs ``config.gpu`` names (of the SIMULATED box where ``config.simulate``)."""
    from pcietrace.device import gpus

    if getattr(config, "simulate", False):
        return gpus.select(config.gpu, simulate=True, gpus=config.gpus)  # type: ignore[union-attr]
    try:
        return gpus.select(config.gpu)
    except NoGpuError as exc:
        raise NoGpuError(f"{exc}; {hint}") from None


def _ordinals(gpus: list[GpuRecord]) -> list[int]:
    return [g.cuda_ordinal for g in gpus]


def record_run(config: RunConfig, feedback: Feedback = Feedback()) -> Recorded:
    """``pcietrace run``: the plan on every selected GPU at once (or on the SIMULATED box), then the latency
    suite (``config.latency``); analysed and saved."""
    from pcietrace.analysis import analyze
    from pcietrace.report.saved import to_jsonable
    from pcietrace.record import box, guard

    plan = config.plan()
    repeats = config.repeats if config.latency else None
    gpus = _select(config, SIM_HINT)
    if config.simulate:
        session, record = box.simulated(plan, gpus, config.seed, repeats)
    else:
        session, record = box.real(plan, gpus, config.throughput_api, config.sample_interval_ms, repeats)
    folder = _run_folder(config, session.meta, _ordinals(gpus))
    saving = guard.Saving(session, folder, lambda: analyze(session, config.us_per_level)
                          if session.meta.get("status") == "complete" else None,
                          to_jsonable=to_jsonable, tell=feedback.tell, steps=guard.PartialRun())
    with saving, feedback.steps(plan.steps() * len(session.meta["gpus"])) as (advance, note):
        record(advance, note)
    return Recorded(saving)


def record_latency(config: LatencyConfig, feedback: Feedback = Feedback()) -> Recorded:
    """``pcietrace latency``: the latency suite on every selected GPU (or the SIMULATED box's model of a
    recorded run); analysed and saved. The GPUs are released on every way out."""
    from pcietrace.analysis import analyze
    from pcietrace.report.saved import to_jsonable
    from pcietrace.collectors import topology
    from pcietrace.device import backend
    from pcietrace.record import guard
    from pcietrace.record import latency
    from pcietrace.record.run import RunPlan, base_meta
    from pcietrace.session import Session

    if config.simulate:
        return _simulated_latency(config, feedback)
    hint = f"`pcietrace topo` needs no driver (only the GPUs), {SIM_HINT}"
    selected = _select(config, hint)
    try:
        gpus = backend.open_gpus(selected)
    except NoGpuError as exc:
        raise NoGpuError(f"{exc}; {hint}") from None

    def release() -> None:
        for _, be in gpus:
            with contextlib.suppress(Exception):  # the figures are in the session: a failed release keeps them
                be.close()

    try:  # the GPUs are released on every way out, a refused output folder included
        session = Session(meta=base_meta(RunPlan(), False))
        saved = [g.meta() for g, _ in gpus]
        session.meta.update(kind="latency", status="running", driver=backend.driver_version(), gpus=saved,
                            topology=topology.collect(saved))
        folder = _run_folder(config, session.meta, _ordinals(selected), "-latency")
        with guard.discard_on_error(folder), guard.Interrupts(), feedback.busy("measuring latency") as status:
            session.latency = latency.measure({g.nvml_index: latency.LatencyProbe(be) for g, be in gpus},
                                              config.repeats, progress=status.update)
    except BaseException:
        release()
        raise
    session.meta["status"] = "complete"
    saving = guard.Saving(session, folder, lambda: analyze(session), to_jsonable=to_jsonable, tell=feedback.tell,
                          steps=guard.ReleaseFirst(release))
    with saving:  # the suite is measured: a signal while the GPUs are released waits until it is saved
        pass
    return Recorded(saving)


def _simulated_latency(config: LatencyConfig, feedback: Feedback) -> Recorded:
    """The latency suite's figures from the SIMULATED device's model of a recorded run."""
    from pcietrace.analysis import analyze
    from pcietrace.report.saved import to_jsonable
    from pcietrace.device import sim
    from pcietrace.record import guard
    from pcietrace.record.run import RunPlan, base_meta
    from pcietrace.session import Session

    params = sim.SimParams.default()
    gpus = _select(config, SIM_HINT)
    session = Session(meta=base_meta(RunPlan(), True))
    session.meta.update(kind="latency", status="running", driver="simulated", sim_source=params.source,
                        gpus=[g.meta() for g in gpus], topology=sim.topology(params, gpus))
    folder = _run_folder(config, session.meta, _ordinals(gpus), "-latency")
    with guard.discard_on_error(folder), guard.Interrupts():
        session.latency = sim.latency(params, gpus, config.repeats, config.seed)
    session.meta["status"] = "complete"
    saving = guard.Saving(session, folder, lambda: analyze(session), to_jsonable=to_jsonable, tell=feedback.tell)
    with saving:
        pass
    return Recorded(saving)


def record_graphs(config: GraphsConfig, feedback: Feedback = Feedback()) -> Recorded:
    """``pcietrace graphs``: each strategy's iterations in counter windows on one GPU (or the SIMULATED one);
    analysed and saved. The GPU is released on every way out."""
    from pcietrace.record import graphs

    plan = config.plan()
    try:
        opened = graphs.open_device(config.simulate, config.gpu, config.seed, config.sample_interval_ms)
    except NoGpuError as exc:
        raise NoGpuError(f"{exc}; `pcietrace graphs --simulate` runs on a simulated device") from None
    try:
        return _record_graphs(config, feedback, plan, opened)
    finally:  # every way out (a taken output folder, Ctrl-C, a failed run) releases the GPU
        with contextlib.suppress(Exception):  # saved by now: a failed release keeps the run
            opened.device.close()


def _record_graphs(config: GraphsConfig, feedback: Feedback, plan: GraphsPlan, opened: OpenedDevice) -> Recorded:
    from pcietrace.analysis import analyze
    from pcietrace.report.saved import to_jsonable
    from pcietrace.record import graphs, guard
    from pcietrace.record.run import RunPlan, base_meta
    from pcietrace.session import Session

    session = Session(meta={**base_meta(RunPlan(), config.simulate), **graphs.meta_for(plan, opened.device),
                            **opened.meta, "gpus": [opened.gpu.meta()]})
    session.meta.pop("plan")  # that is `run`'s plan; this run's is graphs_plan
    folder = _run_folder(config, session.meta, [config.gpu], "-graphs")
    saving = guard.Saving(session, folder, lambda: analyze(session), to_jsonable=to_jsonable, tell=feedback.tell)
    with saving, feedback.busy("graphs") as status:
        graphs.record(session, plan, opened.device, opened.gpu.nvml_index, opened.sampler, opened.probe,
                      progress=status.update)
    return Recorded(saving)


def _launch_costs(config: AttachConfig, ordinal: int) -> dict[str, Any] | None:
    if not config.calibrate:
        return None
    if config.baseline is not None:
        from pcietrace.analysis.costs import from_run
        from pcietrace.session import Session

        return from_run(Session.load(config.baseline), str(config.baseline))
    from pcietrace.analysis.costs import from_records
    from pcietrace.record.attach import calibrate_in_child

    return from_records(*calibrate_in_child(ordinal), "measured on the spot")


def record_attach(config: AttachConfig, feedback: Feedback = Feedback(), program_stdout: Any = None) -> Recorded:
    """``pcietrace attach``: the program run under the samplers and the injection library, between idle
    windows; analysed, saved, and its Perfetto trace written beside the saved run. ``program_stdout``: where
    the program's output goes (None: ours). :meth:`Recorded.end` gives the program's exit code."""
    from pcietrace.analysis import analyze
    from pcietrace.report.saved import saved_tables
    from pcietrace.collectors import nvml, topology
    from pcietrace.record import guard
    from pcietrace.record.attach import exit_code, record_attach as record
    from pcietrace.record.node import expand_output, node_meta
    from pcietrace.record.run import RunPlan, base_meta
    from pcietrace.report.perfetto import write_trace
    from pcietrace.session import EVENTS_FILE, Session

    cmd = list(config.command)
    if shutil.which(cmd[0]) is None:  # before anything is measured or saved
        why = "not an executable file" if os.path.exists(cmd[0]) else "no such program (not on PATH)"
        raise UsageError(f"attach cannot run {cmd[0]!r}: {why}")
    gpus = _select(config, "attach needs an NVIDIA GPU")
    saved = [g.meta() for g in gpus]
    session = Session(meta=base_meta(RunPlan(), False))
    session.meta.update(kind="attach", command=cmd, gpus=saved, driver=nvml.driver_version(), launch_costs=None,
                        sample_interval_ms=config.sample_interval_ms, topology=topology.collect(saved),
                        launch_counter=config.launch_counter, exact_edges=config.exact_edges,
                        sampler_duty=config.sampler_duty, idle_sample_interval_ms=config.idle_sample_interval_ms,
                        quiet_sample_interval_ms=config.quiet_sample_interval_ms, slow_domains=config.slow_domains,
                        max_depth=config.max_depth)
    session.meta["gpu_time"] = config.gpu_time
    session.meta["node"] = node_meta(config.label)  # what `pcietrace merge` lines nodes up by
    if config.output is not None:
        config = replace(config, output=Path(expand_output(str(config.output), config.label)))
    suffix = "-attach" + (f"-{config.label}" if config.label else "")
    folder = _run_folder(config, session.meta, _ordinals(gpus), suffix)  # checked before anything is measured
    with guard.discard_on_error(folder), feedback.busy("measuring per-launch costs on this GPU"):
        session.meta["launch_costs"] = _launch_costs(config, gpus[0].cuda_ordinal)
    # (the events written into the staging folder and let go once the ranges are made: the save keeps that file)
    session.events_file = folder.staging / EVENTS_FILE if folder is not None else None
    saving = record(session, folder, config.idle_s, program_stdout,
                    lambda: analyze(session, group_by=config.group_by, release_events=True), write_trace,
                    to_jsonable=saved_tables,
                    tell=feedback.tell)
    return Recorded(saving, lambda: exit_code(session.meta))



def topology(fixture: Path | None = None, sysfs_root: str | None = None) -> dict[str, Any]:
    """``pcietrace topo``: where each GPU sits on PCIe, from this machine's sysfs (its GPUs named by NVML where
    a driver answers), another sysfs tree (``sysfs_root``: no NVML), or a topology ``fixture`` file."""
    from pcietrace.collectors import nvml, topology as collect

    if fixture is not None:
        from pcietrace.collectors import sysfs_fixture

        if sysfs_root is not None:  # else one of the two machines named would be silently ignored
            raise ConfigError("fixture", "and {sysfs_root} each name the machine to show: give one of them")
        return sysfs_fixture.topology(fixture)
    gpus = None
    root = sysfs_root or "/sys"
    if Path(root).resolve() == Path("/sys"):  # this machine's own tree: NVML names its GPUs and links
        try:
            infos = [nvml.gpu_info(i) for i in range(nvml.device_count())]
            gpus = [{"nvml_index": g.nvml_index, "bus_id": g.bus_id, "name": g.name} for g in infos]
        except NoGpuError:
            gpus = None  # no driver: sysfs alone still shows the placement
    topo = collect.collect(gpus, root)
    if not topo["gpus"]:
        raise UsageError(f"no NVIDIA GPU found under {root}")
    return topo
