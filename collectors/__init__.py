"""Collect layer: PCIe byte counters sampled in the background (imported as ``pcietrace.collectors``)."""

from pcietrace.collectors.sampler import CounterSampler, SAMPLE_COLUMNS

__all__ = ["CounterSampler", "SAMPLE_COLUMNS"]
