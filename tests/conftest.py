"""Shared fixtures. Tests marked ``gpu`` skip cleanly unless a CUDA GPU and driver are present."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


@functools.lru_cache(maxsize=1)
def _gpu_reason() -> str | None:
    from pcietrace.device import cuda
    from pcietrace.errors import PcietraceError

    try:
        return None if cuda.device_count() > 0 else "no CUDA device"
    except PcietraceError as exc:
        return str(exc)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    reason = _gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: {reason}")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


@pytest.fixture(scope="session")
def h100():
    """The real run recorded on the lent H100 (see tests/data/README.md)."""
    from pcietrace.session import Session

    return Session.load(DATA / "h100_run")
