"""Builds pcietrace's two C libraries (plain shared objects, no CUDA or NVTX headers needed; a C compiler is).

They are packaged as extension modules only so that pip builds and installs them with the package; neither
is imported as a Python module:
- ``pcietrace._pt_inject`` (pcietrace/native/pt_inject*.c, units behind pt_inject.h) is loaded by NVTX and the
  CUDA driver through NVTX_INJECTION64_PATH / CUDA_INJECTION64_PATH / LD_PRELOAD (``pcietrace attach``); its
  contract with the Python side is pt_abi.h;
- ``pcietrace._pt_native`` (every other pcietrace/native/pt_*.c) holds the native timing loops, loaded with
  ctypes by :mod:`pcietrace.device.native`.
"""

from pathlib import Path

from setuptools import Extension, setup

INJECT = sorted(str(p) for p in Path("pcietrace/native").glob("pt_inject*.c"))
NATIVE = sorted(str(p) for p in Path("pcietrace/native").glob("pt_*.c") if str(p) not in INJECT)
FLAGS = ["-O2", "-fvisibility=hidden", "-std=gnu11"]

setup(ext_modules=[
    Extension("pcietrace._pt_inject", sources=INJECT, extra_compile_args=FLAGS, libraries=["dl", "pthread"],
              depends=["pcietrace/native/pt_inject.h", "pcietrace/native/pt_abi.h"]),
    Extension("pcietrace._pt_native", sources=NATIVE, depends=["pcietrace/native/pt_cuda.h"],
              extra_compile_args=FLAGS, libraries=["dl", "pthread"]),
])
