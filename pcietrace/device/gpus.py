"""Which GPUs a command measures: the user's selection resolved to CUDA ordinals."""

from __future__ import annotations

from typing import Any, Sequence, Union

from pcietrace.errors import ConfigError

#: A GPU selection: "all", comma-separated CUDA ordinals ("0,1"), one ordinal, or a list of them.
GpuSpec = Union[str, int, Sequence[int]]


def ordinals(spec: GpuSpec, count: int) -> list[int]:
    """``spec`` ("all", "0,1", 2 or [0, 1]: CUDA ordinals, as CUDA_VISIBLE_DEVICES presents them) among ``count``
    visible devices -> the sorted ordinals, each named once."""
    if spec == "all":
        return list(range(count))
    try:
        ords = _as_ints(spec)
    except (TypeError, ValueError):
        raise ConfigError("gpu", f"takes 'all' or CUDA device numbers like 0,1 (got {spec!r})") from None
    text = ",".join(map(str, ords)) if not isinstance(spec, str) else spec
    twice = [o for o in ords if ords.count(o) > 1]
    if twice:  # `--gpu 0,0` is a typo for 0,1 more often than a wish to measure GPU 0 once
        raise ConfigError("gpu", f"{text}: GPU {twice[0]} given twice")
    bad = [o for o in ords if not 0 <= o < count]
    if bad:
        raise ConfigError("gpu", f"{text}: no CUDA device {bad[0]} ({count} visible)")
    return sorted(ords)


def _as_ints(spec: Any) -> list[int]:
    if isinstance(spec, bool):
        raise TypeError(spec)
    if isinstance(spec, int):
        return [spec]
    if isinstance(spec, str):
        return [int(x) for x in spec.split(",")]
    if any(isinstance(x, bool) or not isinstance(x, int) for x in spec):
        raise TypeError(spec)
    return list(spec)
