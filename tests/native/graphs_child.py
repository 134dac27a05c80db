"""Child process of tests/test_graphs.py::test_native_loops_on_a_fake_driver: loads the FAKE libcuda.so.1
given as argv[1] (so pt_graphs.c resolves its entry points there), runs every strategy through the real
native loops (argv[2] "loops"), or one strategy argv[3] with a failure injected ("fail"), and prints what
happened as JSON. A separate process because the fake stays loaded."""

import ctypes
import json
import sys

import numpy as np

fake = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
fake.fake_log.restype = ctypes.c_long
for f in (fake.fake_live_graphs, fake.fake_live_execs, fake.fake_calls):
    f.restype = ctypes.c_long

from pcietrace.device.graphs import COUNT_COLUMNS, STRATEGIES, NativeRunner, _lib  # noqa: E402
from pcietrace.errors import CudaError  # noqa: E402

lib = _lib()
kernels, sets = 7, 3
rng = np.random.default_rng(1)
durations = rng.integers(2000, 8000, (sets, kernels)).astype(np.uint64)
durations[2, :4] = durations[1, :4]  # sets 1 and 2 share 4 nodes: node_update must touch only 3
order = np.array([0, 1, 2, 0, 2, 1, 1, 0], np.int32)
out = {}
if sys.argv[2] == "record":  # the real device class and the recording loop, on a stub GPU object
    import time
    import types

    import pandas as pd

    from pcietrace.device.graphs import CudaGraphsDevice
    from pcietrace.record.graphs import GraphsPlan, record
    from pcietrace.session import Session

    class StubBackend:  # a CudaBackend as far as CudaGraphsDevice uses it: its GPU and loaded spin kernel
        gpu = types.SimpleNamespace(stream=2, make_current=lambda: None)
        spin_function = 1
        closed = 0

        def close(self) -> None:
            self.closed += 1

    class Sampler:
        modes: dict = {}
        def start(self) -> None: ...
        def stop(self) -> pd.DataFrame: return pd.DataFrame(columns=["nvml_index", "t_ns", "read_ns", "tx_raw", "rx_raw"])

    session = Session(meta={"gpus": [{"nvml_index": 0}]})
    plan = GraphsPlan(kernels=(5, 9), iterations=4, rounds=2, idle_s=0.01)
    with CudaGraphsDevice(StubBackend()) as device:
        record(session, plan, device, 0, Sampler(), time.monotonic_ns)
    g = session.graphs.groupby(["kernels", "strategy"])[["instantiations", "cache_hits", "graph_launches",
                                                         "eager_launches"]].sum()
    out = {"status": session.meta["status"], "windows": len(session.windows),
           "counts": {f"{k}/{s}": v for (k, s), v in g.to_dict("index").items()},
           "executed": int(fake.fake_log(np.zeros(100_000, np.uint64).ctypes.data_as(ctypes.c_void_p), 100_000)),
           "live_graphs": fake.fake_live_graphs(), "live_execs": fake.fake_live_execs(),
           "backend_closed": device.backend.closed}
    print(json.dumps(out))
    sys.exit(0)
if sys.argv[2] == "fail":  # FAKE_CUDA_FAIL is set: the failure names the call and leaves no capture open
    r = NativeRunner(lib, sys.argv[3], 1, 2, durations, True)
    try:
        recs = r.run(order)
        out["counts"] = {c: int(recs[c].sum()) for c in COUNT_COLUMNS}
    except CudaError as exc:
        out["error"] = {"call": exc.call, "code": exc.code, "name": exc.name}
    r.close()
    again = NativeRunner(lib, "recapture", 1, 2, durations, True)
    out["after"] = int(again.run(order[:2])["captures"].sum())
    again.close()
    out["live_graphs"], out["live_execs"] = fake.fake_live_graphs(), fake.fake_live_execs()
    print(json.dumps(out))
    sys.exit(0)
for sync in (True, False):
    for s in STRATEGIES:
        r = NativeRunner(lib, s, 1, 2, durations, sync)
        recs = np.concatenate([r.run(order[:5]), r.run(order[5:])])  # state survives across calls
        buf = np.zeros(10_000, np.uint64)
        n = fake.fake_log(buf.ctypes.data_as(ctypes.c_void_p), buf.size)
        r.close()
        out[f"{s}/{'sync' if sync else 'pipelined'}"] = {
            "executed_ok": bool(np.array_equal(buf[:n], durations[order].ravel())),
            "counts": {c: int(recs[c].sum()) for c in COUNT_COLUMNS},
            "walls_positive": bool((recs["wall_ns"] > 0).all()), "param_sets": recs["param_set"].tolist(),
            "live_graphs": fake.fake_live_graphs(), "live_execs": fake.fake_live_execs()}
print(json.dumps(out))
