"""The box a ``pcietrace run`` measures: a simulated one or the real GPUs. Each is set up as a session whose
meta describes it (GPUs, driver, topology) and a ``record(progress, note)`` that fills it, so
:func:`pcietrace.workflow.record_run` only chooses one."""

from __future__ import annotations

from typing import Any, Callable

from pcietrace.device.gpus import GpuRecord

#: ``record(progress, note)``: ``progress(label)`` ends a step and names the next, ``note(label)`` renames it.
Record = Callable[[Callable[[str], None], Callable[[str], None]], None]


def simulated(plan: Any, gpus: list[GpuRecord], seed: int, repeats: int | None) -> tuple[Any, Record]:
    """``gpus`` of the SIMULATED box (modelled on a real H100 run: :func:`pcietrace.device.gpus.select`),
    measured one after another; each GPU's device seeded ``seed`` + its index. ``repeats``: latency suite
    repeats (None: no suite)."""
    from pcietrace.device import sim
    from pcietrace.record.run import base_meta
    from pcietrace.session import Session

    params = sim.SimParams.default()
    host = sim.SimClock()
    devices = {g.nvml_index: sim.SimDevice(params, seed=seed + g.nvml_index, host=host) for g in gpus}
    backends = [(g, sim.SimBackend(devices[g.nvml_index])) for g in gpus]
    sampler = sim.SimSampler(devices)
    probes = {i: sampler.probe(i) for i in devices}
    session = Session(meta=base_meta(plan, True))
    session.meta.update(driver="simulated", sim_source=params.source, sim_params=params.__dict__,
                        topology=sim.topology(params, gpus))
    session.meta["gpus"] = [g.meta() for g in gpus]

    def record(progress: Callable[[str], None], note: Callable[[str], None]) -> None:
        from pcietrace.record import run  # (looked up here: tests stand in for run.record)

        run.record(session, plan, backends, sampler, probes, progress=progress)
        if repeats is not None:
            session.latency = sim.latency(params, gpus, repeats, seed)

    return session, record


def real(plan: Any, gpus: list[GpuRecord], throughput_api: bool, sample_interval_ms: float,
         repeats: int | None) -> tuple[Any, Record]:
    """This machine's ``gpus`` (:func:`pcietrace.device.gpus.select`), every GPU at once, one worker process
    each (:mod:`pcietrace.record.parallel`), which opens its own GPU; ``repeats``: latency suite repeats
    (None: no suite)."""
    from pcietrace.collectors import topology
    from pcietrace.device import backend
    from pcietrace.record.run import base_meta
    from pcietrace.session import Session

    session = Session(meta=base_meta(plan, False))
    session.meta["driver"] = backend.driver_version()
    session.meta["sample_interval_ms"] = sample_interval_ms
    session.meta["gpus"] = [g.meta() for g in gpus]
    session.meta["topology"] = topology.collect([g.meta() for g in gpus])

    def record(progress: Callable[[str], None], note: Callable[[str], None]) -> None:
        from pcietrace.record.parallel import cuda_openers, record_all

        record_all(session, plan, cuda_openers(gpus, throughput_api, sample_interval_ms), repeats,
                   progress=progress, ordinals=[g.cuda_ordinal for g in gpus], note=note)

    return session, record
