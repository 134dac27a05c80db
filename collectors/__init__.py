"""Collect layer: PCIe byte counters sampled in the background (imported as ``pcietrace.collectors``)."""

from pcietrace.collectors.sampler import SAMPLE_COLUMNS, BoundaryProbe, CounterSampler, empty_samples, merge_samples

__all__ = ["BoundaryProbe", "CounterSampler", "SAMPLE_COLUMNS", "empty_samples", "merge_samples"]
