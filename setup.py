"""Builds pcietrace's two C libraries (plain shared objects, no CUDA or NVTX headers needed; a C compiler is).

They are packaged as extension modules only so that pip builds and installs them with the package; neither
is imported as a Python module:
- ``pcietrace._pt_inject`` (pcietrace/native/pt_inject*.c, units behind pt_inject.h) is loaded by NVTX and the
  CUDA driver through NVTX_INJECTION64_PATH / CUDA_INJECTION64_PATH / LD_PRELOAD (``pcietrace attach``); its
  contract with the Python side is pt_abi.h;
- ``pcietrace._pt_native`` (every other pcietrace/native/pt_*.c) holds the native timing loops, loaded with
  ctypes by :mod:`pcietrace.device.native`.
"""

import platform
from pathlib import Path

from setuptools import Extension, setup

INJECT = sorted(str(p) for p in Path("pcietrace/native").glob("pt_inject*.c"))
NATIVE = sorted(str(p) for p in Path("pcietrace/native").glob("pt_*.c") if str(p) not in INJECT)
FLAGS = ["-O2", "-fvisibility=hidden", "-std=gnu11"]
# thread-locals through TLS descriptors: the injection library reads ~10 of them at every NVTX edge, and the
# default dialect of a shared object calls __tls_get_addr for each (aarch64 uses descriptors already)
INJECT_FLAGS = FLAGS + (["-mtls-dialect=gnu2"] if platform.machine() in ("x86_64", "AMD64") else [])

setup(ext_modules=[
    Extension("pcietrace._pt_inject", sources=INJECT, extra_compile_args=INJECT_FLAGS, libraries=["dl", "pthread"],
              depends=["pcietrace/native/pt_inject.h", "pcietrace/native/pt_abi.h"]),
    Extension("pcietrace._pt_native", sources=NATIVE, depends=["pcietrace/native/pt_cuda.h"],
              extra_compile_args=FLAGS, libraries=["dl", "pthread"]),
])
