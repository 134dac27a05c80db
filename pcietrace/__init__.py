"""pcietrace: what one kernel launch costs in PCIe bytes and CPU time, and what CUDA graphs save.

Data flow: ``pcietrace.collectors`` (NVML counters) -> ``pcietrace.device`` (the GPU, kernels, the
simulated device) -> ``pcietrace.record`` (generator, run, latency, attach) -> ``pcietrace.session`` ->
``pcietrace.analysis`` (DataFrames in, DataFrames out) -> ``pcietrace.report`` (one renderer per format)
-> ``pcietrace.cli`` + ``pcietrace.commands``. Importing the package needs no GPU or driver.
"""

__version__ = "0.1.0"

# collectors/ sits beside this folder in a source checkout and installs as pcietrace.collectors
# (pyproject's package-dir). Imported straight from a checkout (`python3 -m pytest` in its root puts the
# checkout first on sys.path), the same name must resolve to that checkout's collectors/ too.
import os as _os

_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_checkout, "collectors", "sampler.py")):
    __path__.append(_checkout)  # type: ignore[name-defined]  # noqa: F821
del _os, _checkout
