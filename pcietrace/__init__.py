"""pcietrace: what one kernel launch costs in PCIe bytes and CPU time, and what CUDA graphs save.

Data flow: ``pcietrace.collectors`` (NVML counters) -> ``pcietrace.device`` (the GPU, kernels, the
simulated device) -> ``pcietrace.record`` (generator, run, latency, attach) -> ``pcietrace.session`` ->
``pcietrace.analysis`` (DataFrames in, DataFrames out) -> ``pcietrace.report`` (one renderer per format)
-> ``pcietrace.cli`` + ``pcietrace.commands``. Importing the package needs no GPU or driver.
"""

__version__ = "0.1.0"
