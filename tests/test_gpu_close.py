"""What ``Gpu.close()`` releases, and that a fresh-context step leaves the run's own context current however
it ends (review of "GPU time per empty eager kernel over several CUDA contexts").

No GPU here: the ``Gpu`` tests run the real :class:`pcietrace.device.cuda.Gpu` against a FAKE cuda.bindings
driver that logs every call and returns made-up handles (it checks bookkeeping, not CUDA); the ``record`` tests
run on the SIMULATED device, watched for context switches. tests/test_gpu.py checks the real release on a GPU.
"""

from __future__ import annotations

import types
from typing import Any

import pytest

from pcietrace.device import cuda
from pcietrace.device.sim import SimBackend, SimDevice, SimParams, SimSampler, gpu_records
from pcietrace.errors import CudaError
from pcietrace.record.run import CONTEXT_BURSTS, RunPlan, base_meta, record
from pcietrace.session import Session

ILLEGAL_ADDRESS = 700  # a sticky error: every later call in the context fails with it


class FakeDriver:
    """cuda.bindings.driver as far as Gpu uses it: every call is logged as (name, args); ``fail`` maps a
    call's name to an error code to return or an exception to raise."""

    CU_MEMHOSTALLOC_DEVICEMAP = 2
    CUstream_flags = types.SimpleNamespace(CU_STREAM_NON_BLOCKING=1)
    CUevent_flags = types.SimpleNamespace(CU_EVENT_DEFAULT=0)
    CUdevice_attribute = types.SimpleNamespace(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR=75,
                                               CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR=76)
    CUresult = types.SimpleNamespace(CUDA_ERROR_NOT_READY=600)
    CUstreamCaptureMode = types.SimpleNamespace(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL=1)

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.fail: dict[str, Any] = {}
        self._n = 0

    def _value(self, name: str) -> tuple[Any, ...]:
        self._n += 1
        fixed = {"cuInit": (), "cuDeviceGetCount": (1,), "cuDeviceGet": ("dev0",), "cuCtxCreate": ("ctx-own",),
                 "cuDevicePrimaryCtxRetain": ("ctx-primary",), "cuDeviceGetPCIBusId": (b"0000:01:00.0\0",),
                 "cuDeviceGetName": (b"FAKE\0",), "cuDeviceGetAttribute": (9,), "cuDriverGetVersion": (12080,),
                 "cuGetErrorName": (b"CUDA_ERROR_FAKE",)}
        if name in fixed:
            return fixed[name]
        if name in ("cuMemAlloc", "cuMemHostAlloc"):
            return (0x1000 * self._n,)
        if name in ("cuStreamCreate", "cuEventCreate", "cuModuleLoadData", "cuModuleGetFunction",
                    "cuStreamEndCapture", "cuGraphInstantiate"):
            return (f"{name}#{self._n}",)
        return ()  # releases, cuCtxSetCurrent, synchronisation

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("cu"):
            raise AttributeError(name)

        def call(*args: Any) -> tuple[Any, ...]:
            self.calls.append((name, args))
            f = self.fail.get(name)
            if isinstance(f, BaseException) or (isinstance(f, type) and issubclass(f, BaseException)):
                raise f
            return (f,) if f else (0, *self._value(name))
        return call

    def names(self) -> list[str]:
        return [n for n, _ in self.calls]


@pytest.fixture
def drv(monkeypatch) -> FakeDriver:
    fake = FakeDriver()
    monkeypatch.setattr(cuda, "_drv", fake)
    monkeypatch.setattr(cuda, "_rtc", types.SimpleNamespace(nvrtcResult=type("nvrtcResult", (), {})))
    monkeypatch.setattr(cuda, "_cubin", lambda source, name, cc: b"cubin")  # (NVRTC is not faked)
    return fake


def _busy_gpu(own_context: bool) -> cuda.Gpu:
    g = cuda.Gpu(0, own_context)
    g.compile("src", "k")
    g.event()
    g.alloc_device(64)
    g.alloc_pinned(64, mapped=True)
    g.capture_graph(lambda: (0,), 2)
    return g


@pytest.mark.parametrize("own_context, release", [(False, "cuDevicePrimaryCtxRelease"), (True, "cuCtxDestroy")])
def test_close_releases_everything_once(drv, own_context, release) -> None:
    g = _busy_gpu(own_context)
    made = len(drv.calls)
    g.close()
    freed = drv.names()[made:]
    assert freed[:2] == ["cuCtxSetCurrent", "cuStreamSynchronize"]  # in its own context, after its work
    for call in ("cuGraphExecDestroy", "cuGraphDestroy", "cuEventDestroy", "cuMemFree", "cuMemFreeHost",
                 "cuModuleUnload", "cuStreamDestroy", release):
        assert freed.count(call) == 1, (call, freed)
    assert freed[-1] == release and g.context is None
    g.close()  # a second close does nothing
    assert len(drv.calls) == made + len(freed)


def test_close_after_a_sticky_error_still_releases_the_context_and_raises_the_first_error(drv) -> None:
    g = _busy_gpu(own_context=True)
    made = len(drv.calls)
    for call in ("cuStreamSynchronize", "cuEventDestroy", "cuMemFree"):
        drv.fail[call] = ILLEGAL_ADDRESS
    with pytest.raises(CudaError) as exc:
        g.close()
    assert exc.value.call == "cuStreamSynchronize" and exc.value.code == ILLEGAL_ADDRESS
    assert drv.names()[made:][-1] == "cuCtxDestroy" and g.context is None
    g.close()  # closed: nothing more to try
    assert drv.names()[-1] == "cuCtxDestroy"


@pytest.mark.parametrize("failure", [999, KeyboardInterrupt])
def test_a_gpu_that_fails_to_open_releases_its_context(drv, failure) -> None:
    drv.fail["cuStreamCreate"] = failure
    with pytest.raises(CudaError if failure == 999 else KeyboardInterrupt):
        cuda.Gpu(0, own_context=True)
    assert drv.names().count("cuCtxCreate") == drv.names().count("cuCtxDestroy") == 1
    assert "cuStreamDestroy" not in drv.names()  # (the stream was never made)


def test_a_backend_that_fails_to_open_releases_its_gpu(drv) -> None:
    from pcietrace.device.backend import CudaBackend

    drv.fail["cuMemAlloc"] = 2  # CUDA_ERROR_OUT_OF_MEMORY, after the module was loaded
    with pytest.raises(CudaError):
        CudaBackend(0, own_context=True)
    n = drv.names()
    assert n.count("cuModuleLoadData") == n.count("cuModuleUnload") == 1 and n.count("cuCtxDestroy") == 1


@pytest.mark.parametrize("failing", ["cuGraphInstantiate", "cuGraphUpload"])
def test_a_graph_that_fails_to_instantiate_or_upload_is_still_released(drv, failing) -> None:
    g = cuda.Gpu(0)
    drv.fail[failing] = 999
    with pytest.raises(CudaError):
        g.capture_graph(lambda: (0,), 2)
    g.close()
    n = drv.names()
    assert n.count("cuGraphDestroy") == 1  # the captured graph
    assert n.count("cuGraphExecDestroy") == (1 if failing == "cuGraphUpload" else 0)  # and its executable, if made


def test_memory_is_freed_once_and_only_by_its_owner(drv) -> None:
    g, other = cuda.Gpu(0), cuda.Gpu(0)
    mine, theirs = g.alloc_device(64), other.alloc_device(64)
    with pytest.raises(ValueError):
        g.free_device(theirs)  # refused before freeing: `other.close()` frees it
    with pytest.raises(ValueError):
        g.free_pinned(mine)  # device memory is not pinned memory
    assert "cuMemFree" not in drv.names() and "cuMemFreeHost" not in drv.names()
    g.free_device(mine)
    with pytest.raises(ValueError):
        g.free_device(mine)  # a second free would be a double free
    g.close()
    other.close()
    assert [a for n, a in drv.calls if n == "cuMemFree"] == [(mine,), (theirs,)]


def test_a_closed_gpu_refuses_use(drv) -> None:
    g = cuda.Gpu(0)
    g.close()
    for use in (g.make_current, g.event, lambda: g.alloc_device(8), lambda: g.compile("src", "k")):
        with pytest.raises(RuntimeError, match="closed"):
            use()
    assert "cuEventCreate" not in drv.names() and "cuMemAlloc" not in drv.names()


# -- fresh-context steps under record(), on the SIMULATED device ------------------------------------------
class WatchedSim(SimBackend):
    """The SIMULATED backend, logging which context it makes current and which it closes: ``log`` gets
    ("activate", name) and ("close", name); ``trip(name, what)`` may raise (Ctrl-C, a CUDA error) at
    "open" (making a context) or "burst" (a context's first burst)."""

    def __init__(self, device: SimDevice, log: list[tuple[str, str]], trip: Any, name: str = "own",
                 eager_gap_scale: float = 1.0) -> None:
        super().__init__(device, eager_gap_scale)
        self.log, self.trip, self.name, self._fresh = log, trip, name, 0

    def activate(self) -> None:
        self.log.append(("activate", self.name))

    def in_new_context(self) -> "WatchedSim":
        self._fresh += 1
        name = f"fresh{self._fresh}"
        self.log.append(("activate", name))  # (cuCtxCreate makes the new context current)
        self.trip(name, "open")  # opening fails after that (CudaBackend releases its half-made context itself)
        return WatchedSim(self.d, self.log, self.trip, name, super().in_new_context().eager_gap_scale)

    def event(self) -> Any:
        self.trip(self.name, "burst")
        return super().event()

    def close(self) -> None:
        self.log.append(("close", self.name))


def _record(trip: Any, contexts: int = 4) -> tuple[Session, list[tuple[str, str]]]:
    params = SimParams.default()
    device = SimDevice(params, seed=3)
    log: list[tuple[str, str]] = []
    plan = RunPlan(durations_us=(0,), graph_ks=(1,), idle_windows=1, rate_fractions=(1.0,), window_s=0.02,
                   e2e_repeats=1, language_repeats=0, gpu_time_contexts=contexts)
    session = Session(meta=base_meta(plan, True))
    gpu, = gpu_records(params, 1)
    session.meta["gpus"] = [gpu.meta()]
    try:
        record(session, plan, [(gpu, WatchedSim(device, log, trip))], SimSampler({0: device}))
    except BaseException as exc:  # noqa: BLE001 - the test looks at what was kept
        session.meta["raised"] = type(exc).__name__
    return session, log


def _trip_at(where: str, when: str, exc: Any) -> Any:
    def trip(name: str, what: str) -> None:
        if (name, what) == (where, when):
            raise exc
    return trip


def _contexts_left_clean(log: list[tuple[str, str]]) -> None:
    fresh = {n for _, n in log if n != "own"}
    assert fresh, log
    for n in fresh:  # every fresh context closed after it was made current, and the own context made current after
        first = log.index(("activate", n))
        closes = [i for i, e in enumerate(log) if e == ("close", n)]
        assert len(closes) == 1 and closes[0] > first, (n, log)
        assert ("activate", "own") in log[closes[0]:], (n, log)
    assert log[-1] == ("activate", "own"), log


def test_a_clean_run_closes_every_fresh_context_and_comes_back() -> None:
    session, log = _record(lambda name, what: None)
    assert session.meta["status"] == "complete"
    assert sorted(session.contexts["context"].unique()) == [1, 2, 3]
    assert (session.contexts.groupby("context").size() == CONTEXT_BURSTS).all()
    _contexts_left_clean(log)


def test_ctrl_c_in_a_fresh_context_releases_it_those_made_ahead_and_keeps_the_contexts_before() -> None:
    session, log = _record(_trip_at("fresh2", "burst", KeyboardInterrupt))
    assert session.meta["status"] == "interrupted" and session.meta["raised"] == "KeyboardInterrupt"
    assert sorted(session.contexts["context"].unique()) == [1]  # context 2's bursts never finished: none kept
    assert ("activate", "fresh3") in log  # made ahead of the turn, never used: closed all the same
    _contexts_left_clean(log)
    assert (session.contexts.groupby("context").size() == CONTEXT_BURSTS).all()


def test_ctrl_c_while_making_the_contexts_ahead_closes_those_made() -> None:
    session, log = _record(_trip_at("fresh2", "open", KeyboardInterrupt))
    assert session.meta["status"] == "interrupted" and session.meta["raised"] == "KeyboardInterrupt"
    assert session.contexts.empty  # before the turn: no context had its bursts yet
    assert ("close", "fresh1") in log and ("close", "fresh2") not in log  # fresh2 never returned: nothing to close
    assert log[-1] == ("activate", "own"), log


def test_contexts_are_made_before_the_timed_turn_and_their_bursts_open_it() -> None:
    """Making a context (~130 ms, H100) is no timing: it happens before the GPU's turn (``before_timing``),
    so a box of N GPUs does not wait N times for it."""
    params = SimParams.default()
    device = SimDevice(params, seed=3)
    log: list[tuple[str, str]] = []
    plan = RunPlan(durations_us=(0,), graph_ks=(1,), idle_windows=1, rate_fractions=(1.0,), window_s=0.02,
                   e2e_repeats=1, language_repeats=0, gpu_time_contexts=3)
    session = Session(meta=base_meta(plan, True))
    gpu, = gpu_records(params, 1)
    session.meta["gpus"] = [gpu.meta()]
    labels: list[str] = []
    record(session, plan, [(gpu, WatchedSim(device, log, lambda *_: None))], SimSampler({0: device}),
           progress=labels.append, before_timing=lambda g: (labels.append("TURN"), log.append(("turn", "own"))))
    turn = log.index(("turn", "own"))
    assert [e for e in log[:turn] if e[0] == "activate" and e[1] != "own"] == [("activate", "fresh1"), ("activate", "fresh2")]
    assert not [e for e in log[:turn] if e[0] == "close"]  # made ahead, still open when the turn comes
    assert labels[labels.index("TURN") + 1].endswith("GPU time: context 2 of 3")  # their bursts open the turn
    assert sorted(session.contexts["context"].unique()) == [1, 2]
    _contexts_left_clean(log)


def test_a_failed_release_after_a_failed_burst_reports_the_burst() -> None:
    boom = CudaError("cuEventCreate", ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS")

    class CloseFails(WatchedSim):
        def close(self) -> None:
            super().close()
            raise CudaError("cuCtxDestroy", ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS")

    params = SimParams.default()
    device = SimDevice(params, seed=3)
    log: list[tuple[str, str]] = []
    trip = _trip_at("fresh1", "burst", boom)
    own = WatchedSim(device, log, trip)
    own.in_new_context = lambda: (log.append(("activate", "fresh1")),  # type: ignore[method-assign]
                                  CloseFails(device, log, trip, "fresh1"))[1]
    from pcietrace.record.generate import LaunchGenerator
    from pcietrace.record.run import _context_bursts, _new_context

    gen = LaunchGenerator(own)
    with pytest.raises(CudaError) as exc:
        _context_bursts(gen, 1, 0.0, RunPlan(), _new_context(gen))
    assert exc.value is boom  # not the release's error
    _contexts_left_clean(log)


# -- on a GPU (the lead runs these: `python3 -m pytest -q -m gpu tests/test_gpu_close.py`) ------------------
@pytest.mark.gpu
def test_ctrl_c_in_a_fresh_context_leaves_the_runs_context_current(monkeypatch) -> None:
    from pcietrace.device.backend import CudaBackend
    from pcietrace.record.generate import LaunchGenerator
    from pcietrace.record.run import _context_bursts, _new_context

    drv, _ = cuda._bindings()
    be = CudaBackend(0)
    made: list[CudaBackend] = []
    new_context, burst = CudaBackend.in_new_context, LaunchGenerator.burst
    monkeypatch.setattr(CudaBackend, "in_new_context", lambda self: made.append(new_context(self)) or made[-1])

    def interrupted(self: LaunchGenerator, *args: Any, **kw: Any) -> dict[str, Any]:
        if self.b is not be:
            raise KeyboardInterrupt  # Ctrl-C inside the fresh context's burst
        return burst(self, *args, **kw)

    monkeypatch.setattr(LaunchGenerator, "burst", interrupted)
    gen = LaunchGenerator(be)
    with pytest.raises(KeyboardInterrupt):
        _context_bursts(gen, 1, 0.0, RunPlan(), _new_context(gen))
    assert len(made) == 1 and made[0].gpu.context is None  # the fresh context was destroyed
    assert int(cuda.handle_return(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")) == int(be.gpu.context)
    r = LaunchGenerator(be).burst("eager", 0.0, 1, 200)  # the run goes on in its own context
    assert r["gpu_ns"] > 0, r
    be.close()


@pytest.mark.gpu
def test_closing_a_backend_hands_torch_its_stream_back() -> None:
    torch = pytest.importorskip("torch")
    from pcietrace.device.backend import CudaBackend

    be = CudaBackend(0)
    before = torch.cuda.current_stream(0).cuda_stream
    if be.torch_loops() is None:
        pytest.skip("torch sees no GPU")
    assert torch.cuda.current_stream(0).cuda_stream == int(be.gpu.stream)
    be.close()
    assert torch.cuda.current_stream(0).cuda_stream == before  # not the destroyed stream
    x = torch.ones(4, device="cuda:0")
    assert float((x + 1).sum().item()) == 8.0  # torch still works in the primary context after our release


def test_a_worker_sends_its_figures_before_releasing_its_gpu() -> None:
    # SIMULATED worker whose release is interrupted (a Ctrl-C during close): the parent still gets the session
    from pcietrace.record.parallel import _work, open_sim

    events: list[str] = []
    w = open_sim(0)

    def close() -> None:
        events.append("close")
        raise KeyboardInterrupt

    w.backend.close = close  # type: ignore[method-assign]
    sent: list[tuple[Any, ...]] = []

    def send(msg: tuple[Any, ...]) -> None:
        sent.append(msg)
        if msg[0] == "done":
            events.append("done")

    plan = RunPlan(durations_us=(0,), graph_ks=(1,), idle_windows=1, rate_fractions=(1.0,), window_s=0.02,
                   e2e_repeats=1, language_repeats=0, gpu_time_contexts=2)
    _work(lambda: w, 0, plan, None, [0], send, None)
    assert events == ["done", "close"]
    session = sent[-1][2]
    assert session.meta["status"] == "complete" and sorted(session.contexts["context"].unique()) == [1]


def test_a_latency_probe_forgets_a_closed_peers_chains() -> None:
    from pcietrace.record.latency import LatencyProbe

    peer, own = object(), object()
    pr = LatencyProbe.__new__(LatencyProbe)  # (its constructor needs a GPU; forget() touches the caches only)
    pr._bufs = {(id(peer), 2 << 20): 0x1000, (id(own), 2 << 20): 0x2000, ("host", 64): 0x3000, "flag": (0, 0)}
    pr._pos = {0x1000: 0x1080, 0x2000: 0x2080}
    pr.forget(peer)
    assert (id(peer), 2 << 20) not in pr._bufs and 0x1000 not in pr._pos
    assert len(pr._bufs) == 3 and pr._pos == {0x2000: 0x2080}


def test_a_context_that_cannot_be_made_is_skipped_and_the_run_goes_on() -> None:
    # SIMULATED: the second fresh context fails to open (as cuCtxCreate does when the GPU has no memory left for
    # one); the run completes, its figure rests on the contexts it had and says how many
    from pcietrace.analysis import analyze
    from pcietrace.errors import CudaError

    session, log = _record(_trip_at("fresh2", "open", CudaError("cuCtxCreate", 2, "CUDA_ERROR_OUT_OF_MEMORY")))
    assert session.meta["status"] == "complete" and "raised" not in session.meta
    assert sorted(session.contexts["context"].unique()) == [1, 3]
    assert log[-1] == ("activate", "own")
    gt = analyze(session)["gpu_time"]
    assert gt["eager_contexts"].iloc[0] == 3 and len(session.e2e)  # own + 2 fresh; later steps still ran


# -- `pcietrace graphs`: one kernel load, the GPU closed on every exit path --------------------------------
@pytest.fixture
def graphs_gpu(drv, monkeypatch) -> FakeDriver:
    """open_device() on the FAKE driver, NVML and the counter readers stubbed (nothing here touches them)."""
    from pcietrace import collectors
    from pcietrace.collectors import nvml

    try:
        from pcietrace.device.graphs import _lib

        _lib()
    except Exception as exc:  # noqa: BLE001 - any reason the native library is not there
        pytest.skip(f"native library not built: {exc}")
    monkeypatch.setattr(nvml, "index_for_bus_id", lambda bus_id: 0)
    monkeypatch.setattr(nvml, "gpu_info", lambda i: nvml.GpuInfo(i, "FAKE", "GPU-fake", "00000000:01:00.0",
                                                                   5, 5, 16, 16, 0))
    monkeypatch.setattr(nvml, "driver_version", lambda: "fake")
    monkeypatch.setattr(collectors, "CounterSampler", lambda *a, **k: object())
    monkeypatch.setattr(collectors, "BoundaryProbe", lambda *a, **k: object())
    return drv


def test_the_graphs_device_loads_the_kernel_once_and_closes_its_gpu(graphs_gpu) -> None:
    from pcietrace.record.graphs import open_device

    _, device, _, _, _ = open_device(False, 0)
    n = graphs_gpu.names()
    assert n.count("cuModuleLoadData") == 1  # the backend's spin kernel, not a second copy
    assert device.func is device.backend.spin_function
    device.close()
    n = graphs_gpu.names()
    assert n.count("cuModuleUnload") == 1 and n.count("cuDevicePrimaryCtxRelease") == 1
    device.close()  # idempotent
    assert graphs_gpu.names().count("cuDevicePrimaryCtxRelease") == 1


def test_a_graphs_device_that_fails_to_open_releases_its_gpu(graphs_gpu, monkeypatch) -> None:
    from pcietrace import collectors
    from pcietrace.record.graphs import open_device

    def no_nvml(*a: Any, **k: Any) -> Any:
        raise KeyboardInterrupt  # (Ctrl-C while the boundary probe opens NVML)

    monkeypatch.setattr(collectors, "BoundaryProbe", no_nvml)
    with pytest.raises(KeyboardInterrupt):
        open_device(False, 0)
    n = graphs_gpu.names()
    assert n.count("cuModuleLoadData") == n.count("cuModuleUnload") == 1
    assert n.count("cuDevicePrimaryCtxRetain") == n.count("cuDevicePrimaryCtxRelease") == 1


def test_open_gpus_releases_the_gpus_opened_before_a_failure(drv, monkeypatch) -> None:
    """Ctrl-C while the second GPU opens: the first, already open, is released."""
    from pcietrace.device import backend
    from pcietrace.device.gpus import GpuRecord

    opened: list = []
    real = backend.CudaBackend

    def second_interrupted(ordinal: int) -> Any:
        if opened:
            raise KeyboardInterrupt
        opened.append(real(ordinal))
        return opened[-1]

    monkeypatch.setattr(backend, "CudaBackend", second_interrupted)
    gpu = GpuRecord(nvml_index=0, cuda_ordinal=0, bus_id="0000:01:00.0", name="FAKE")
    with pytest.raises(KeyboardInterrupt):
        backend.open_gpus([gpu, gpu])
    n = drv.names()
    assert len(opened) == 1 and n.count("cuDevicePrimaryCtxRetain") == n.count("cuDevicePrimaryCtxRelease") == 1


class ClosedSim:
    """SIMULATED: the graphs device `graphs --simulate` uses, counting close() calls; ``fail`` raises in its
    first runner (Ctrl-C, as a user would)."""

    def __init__(self, fail: BaseException | None = None) -> None:
        from pcietrace.record.graphs import open_device

        self.opened = open_device(True, 0)
        self.dev, self.fail, self.closed = self.opened[1], fail, 0
        self.simulated, self.timing, self.clock, self.idle = True, self.dev.timing, self.dev.clock, self.dev.idle

    def runner(self, *a: Any) -> Any:
        if self.fail is not None:
            raise self.fail
        return self.dev.runner(*a)

    def close(self) -> None:
        self.closed += 1


@pytest.mark.parametrize("case", ["complete", "ctrl-c", "taken -o"])
def test_the_graphs_command_closes_its_device_on_every_exit_path(case, tmp_path, monkeypatch) -> None:
    from pcietrace.cli import main
    from pcietrace.record import graphs

    dev = ClosedSim(KeyboardInterrupt() if case == "ctrl-c" else None)
    gpu, _, sampler, probe, extra = dev.opened
    monkeypatch.setattr(graphs, "open_device", lambda *a: graphs.OpenedDevice(gpu, dev, sampler, probe, extra))
    out = tmp_path / "g"
    if case == "taken -o":
        out.mkdir()
        (out / "notes.txt").write_text("not a run")  # refused before measuring
    rc = main(["graphs", "--simulate", "--kernels", "20", "--iterations", "2", "--rounds", "1", "-o", str(out),
               "--format", "json"])
    assert rc == {"complete": 0, "ctrl-c": 130, "taken -o": 2}[case]
    assert dev.closed == 1


def test_a_worker_whose_counters_fail_to_open_releases_its_gpu(graphs_gpu, monkeypatch) -> None:
    from pcietrace import collectors
    from pcietrace.device.gpus import GpuRecord
    from pcietrace.errors import NvmlError
    from pcietrace.record.parallel import open_cuda

    def no_counters(*a: Any, **k: Any) -> Any:
        raise NvmlError("PCIe counters: not supported")

    monkeypatch.setattr(collectors, "BoundaryProbe", no_counters)
    with pytest.raises(NvmlError):
        open_cuda(GpuRecord(nvml_index=0, cuda_ordinal=0, bus_id="00000000:01:00.0", name="FAKE"))
    n = graphs_gpu.names()
    assert n.count("cuDevicePrimaryCtxRetain") == n.count("cuDevicePrimaryCtxRelease") == 1


def test_torch_gets_its_stream_back_when_setting_up_its_loops_fails(monkeypatch) -> None:
    """A FAKE torch (no GPU here): its first fill_ is interrupted (Ctrl-C) after torch's current stream was
    set to the backend's; torch must get its own stream back, as the loops' restore() would have given it."""
    from pcietrace.device.torch_launch import torch_loops

    current: list[Any] = ["torch's own stream"]

    class Tensor:
        def fill_(self, value: float) -> None:
            raise KeyboardInterrupt

    fake_cuda = types.SimpleNamespace(
        is_available=lambda: True, device_count=lambda: 1, set_device=lambda dev: None,
        current_stream=lambda dev=None: current[0], set_stream=lambda s: current.__setitem__(0, s),
        ExternalStream=lambda handle, device=None: f"ExternalStream({handle})")
    fake = types.SimpleNamespace(cuda=fake_cuda, device=lambda kind, i: (kind, i), zeros=lambda n, device=None: Tensor())
    monkeypatch.setitem(__import__("sys").modules, "torch", fake)
    with pytest.raises(KeyboardInterrupt):
        torch_loops(None, 0, 1234)  # type: ignore[arg-type]
    assert current == ["torch's own stream"]


def test_runners_made_before_one_that_fails_are_closed() -> None:
    """SIMULATED graphs device whose third strategy's runner cannot be made (as a failed capture would): the two
    made before it are closed, as every runner is on the way out."""
    from pcietrace.record import graphs

    gpu, dev, sampler, probe, _ = graphs.open_device(True, 0)
    made: list[Any] = []
    real_runner = dev.runner

    def runner(strategy: str, durations: Any, sync: bool) -> Any:
        if len(made) == 3:  # (the warm-up's eager runner, then two strategies)
            raise CudaError("cuGraphInstantiate", 999, "FAKE")
        r = real_runner(strategy, durations, sync)
        r.closed = 0
        close = r.close

        def counted() -> None:
            r.closed += 1
            close()
        r.close = counted
        made.append(r)
        return r

    dev.runner = runner
    session = Session(meta={"gpus": [gpu.meta()]})
    with pytest.raises(CudaError):
        graphs.record(session, graphs.GraphsPlan(kernels=(20,), iterations=2, rounds=1), dev, 0, sampler, probe)
    assert [r.closed for r in made] == [1, 1, 1] and session.meta["status"].startswith("failed")


def test_the_latency_command_releases_its_gpus_when_its_output_folder_is_refused(tmp_path, monkeypatch) -> None:
    """`pcietrace latency -o DIR` with DIR holding something else: refused in one line (exit 2) before
    measuring, and the GPUs it had opened are released (SIMULATED: stand-in backends that count closes)."""
    from pcietrace.cli import main
    from pcietrace.collectors import topology
    from pcietrace.device import backend
    from pcietrace.device import gpus as device_gpus
    from pcietrace.device.gpus import GpuRecord

    class Backend:
        closed = 0

        def close(self) -> None:
            Backend.closed += 1

    gpus = [(GpuRecord(nvml_index=i, cuda_ordinal=i, name="SIMULATED", bus_id=f"0000:00:0{6 + i}.0"), Backend())
            for i in range(2)]
    monkeypatch.setattr(device_gpus, "select", lambda spec: [g for g, _ in gpus])
    monkeypatch.setattr(backend, "open_gpus", lambda selected: gpus)
    monkeypatch.setattr(backend, "driver_version", lambda: "simulated")
    monkeypatch.setattr(topology, "collect", lambda g: {})
    out = tmp_path / "lat"
    out.mkdir()
    (out / "notes.txt").write_text("not a run")
    assert main(["latency", "-o", str(out)]) == 2
    assert Backend.closed == 2 and (out / "notes.txt").exists()


def test_a_signal_while_the_latency_command_releases_its_gpus_saves_the_measured_suite(tmp_path, monkeypatch,
                                                                                         capsys, data_dir) -> None:
    """SIGTERM while `pcietrace latency` releases its GPUs after the suite: the figures measured
    are saved, one line says so, exit 143, no staging folder (was: the signal escaped the release, the hidden
    staging folder stayed and the suite was lost). SIMULATED backends; the suite is the real H100's."""
    from pcietrace.cli import main
    from pcietrace.collectors import topology
    from pcietrace.device import backend
    from pcietrace.device import gpus as device_gpus
    from pcietrace.device.gpus import GpuRecord
    from pcietrace.record import latency
    from pcietrace.session import Session
    import os
    import signal

    real = Session.load(data_dir / "h100_run_latency")

    class Backend:
        closed = 0

        def close(self) -> None:
            Backend.closed += 1
            if Backend.closed == 1:
                os.kill(os.getpid(), signal.SIGTERM)

    gpus = [(GpuRecord.from_meta(g), Backend()) for g in real.meta["gpus"]]
    monkeypatch.setattr(device_gpus, "select", lambda spec: [g for g, _ in gpus])
    monkeypatch.setattr(backend, "open_gpus", lambda selected: gpus)
    monkeypatch.setattr(backend, "driver_version", lambda: "simulated")
    monkeypatch.setattr(topology, "collect", lambda g: real.meta["topology"])
    monkeypatch.setattr(latency, "LatencyProbe", lambda be: be)
    monkeypatch.setattr(latency, "measure", lambda probes, repeats, progress: real.latency)
    out = tmp_path / "lat"
    assert main(["latency", "-o", str(out)]) == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("pcietrace: interrupted: saved the whole run "), err
    assert Backend.closed == len(gpus) and list(tmp_path.iterdir()) == [out]
    assert len(Session.load(out).latency) == len(real.latency)
