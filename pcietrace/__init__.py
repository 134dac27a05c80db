"""pcietrace: what one kernel launch costs in PCIe bytes and CPU time, and what CUDA graphs save.

Data flow: ``pcietrace.collectors`` (NVML counters) -> ``pcietrace.generate`` (launch windows) ->
``pcietrace.analysis`` (DataFrames in, DataFrames out) -> ``pcietrace.report`` (rich / JSON) ->
``pcietrace.cli``. Importing the package needs no GPU or driver.
"""

__version__ = "0.1.0"
