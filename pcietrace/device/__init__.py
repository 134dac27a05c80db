"""Device layer: the GPU record and selection (``gpus.py``), the GPU object (``cuda.py``, the only module
importing cuda.bindings), the real-GPU backend of the launch generator, the kernels' CUDA sources, and the
SIMULATED device."""
