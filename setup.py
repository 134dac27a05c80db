"""Builds the NVTX/CUPTI injection library (a plain C shared object; see pcietrace/native/pt_inject.c).

It is packaged as an extension module only so that pip builds and installs it with the package; it
is never imported, only loaded by NVTX and the CUDA driver through NVTX_INJECTION64_PATH and
CUDA_INJECTION64_PATH. It needs a C compiler but no CUDA or NVTX headers.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("pcietrace._pt_inject", sources=["pcietrace/native/pt_inject.c"],
                             extra_compile_args=["-O2", "-fvisibility=hidden"], libraries=["dl", "pthread"])])
