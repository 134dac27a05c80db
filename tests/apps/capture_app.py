"""An app of known launches for `pcietrace attach` (tests/test_capture.py, GPU): M empty kernels launched eagerly
in range "eager", K captured into a graph (cuStreamBeginCapture ... cuStreamEndCapture) in range "capture", and
that graph launched once in range "replay" (domain "capture"), through cuda.bindings.

    python3 capture_app.py M K
"""

from __future__ import annotations

import sys

import nvtx
from cuda.bindings import driver as drv, nvrtc


def ok(r):
    assert int(r[0]) == 0, r
    return r[1] if len(r) == 2 else r[1:]


def main() -> None:
    m, k = int(sys.argv[1]), int(sys.argv[2])
    ok(drv.cuInit(0))
    cu = ok(drv.cuDeviceGet(0))
    ok(drv.cuCtxSetCurrent(ok(drv.cuDevicePrimaryCtxRetain(cu))))
    attr = drv.CUdevice_attribute
    major = ok(drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, cu))
    minor = ok(drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, cu))
    prog = ok(nvrtc.nvrtcCreateProgram(b'extern "C" __global__ void k(){}', b"k.cu", 0, [], []))
    ok(nvrtc.nvrtcCompileProgram(prog, 1, [f"--gpu-architecture=sm_{major}{minor}".encode()]))
    cubin = b" " * ok(nvrtc.nvrtcGetCUBINSize(prog))
    ok(nvrtc.nvrtcGetCUBIN(prog, cubin))
    fn = ok(drv.cuModuleGetFunction(ok(drv.cuModuleLoadData(cubin)), b"k"))
    st = ok(drv.cuStreamCreate(0))
    launch = lambda: ok((drv.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, st, 0, 0)[0], None))
    with nvtx.annotate("eager", domain="capture"):
        for _ in range(m):
            launch()
        ok(drv.cuStreamSynchronize(st))
    with nvtx.annotate("capture", domain="capture"):
        ok(drv.cuStreamBeginCapture(st, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        for _ in range(k):
            launch()
        exe = ok(drv.cuGraphInstantiate(ok(drv.cuStreamEndCapture(st)), 0))
    with nvtx.annotate("replay", domain="capture"):
        ok(drv.cuGraphLaunch(exe, st))
        ok(drv.cuStreamSynchronize(st))


if __name__ == "__main__":
    main()
