"""pcietrace: what one kernel launch costs in PCIe bytes and CPU time, and what CUDA graphs save.

Data flow: ``pcietrace.collectors`` (NVML counters) -> ``pcietrace.device`` (the GPU, kernels, the
simulated device) -> ``pcietrace.record`` (generator, run, latency, attach) -> ``pcietrace.session`` ->
``pcietrace.analysis`` (DataFrames in, DataFrames out) -> ``pcietrace.report`` (one renderer per format).
``pcietrace.config`` (one validated config per command) and ``pcietrace.workflow`` (one recording function
per command) are what ``pcietrace.api`` and the CLI (``pcietrace.cli`` + ``pcietrace.commands``) both call.
Importing the package needs no GPU or driver.
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


def load(path, us_per_level: float | None = None):  # type: ignore[no-untyped-def]
    """A saved run as named result tables, summary and metadata: see :func:`pcietrace.api.load` (whose
    default ``us_per_level`` applies when None; it lives with the analysis, not imported here)."""
    from pcietrace.api import load as _load

    return _load(path) if us_per_level is None else _load(path, us_per_level)


def measure(gpu="all", **options):  # type: ignore[no-untyped-def]
    """``pcietrace run`` from Python: see :func:`pcietrace.api.measure`."""
    from pcietrace.api import measure as _measure

    return _measure(gpu, **options)


def latency(gpu="all", **options):  # type: ignore[no-untyped-def]
    """``pcietrace latency`` from Python: see :func:`pcietrace.api.latency`."""
    from pcietrace.api import latency as _latency

    return _latency(gpu, **options)


def graphs(gpu=0, **options):  # type: ignore[no-untyped-def]
    """``pcietrace graphs`` from Python: see :func:`pcietrace.api.graphs`."""
    from pcietrace.api import graphs as _graphs

    return _graphs(gpu, **options)


def attach(command, gpu="all", **options):  # type: ignore[no-untyped-def]
    """``pcietrace attach`` from Python: see :func:`pcietrace.api.attach`."""
    from pcietrace.api import attach as _attach

    return _attach(command, gpu, **options)


def merge(paths, output, **options):  # type: ignore[no-untyped-def]
    """``pcietrace merge`` from Python: see :func:`pcietrace.api.merge`."""
    from pcietrace.api import merge as _merge

    return _merge(paths, output, **options)
