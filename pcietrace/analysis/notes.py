"""What a report must say beside its figures, as coded records: a :class:`Note` names its case (``code``) and
the figures it is about (``params``); the sentences live with the renderers (:mod:`pcietrace.report.notes`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, init=False)
class Note:
    """One thing the report says beside its figures: ``Note("no_floor", gpu=0)``."""

    code: str
    params: dict[str, Any] = field(default_factory=dict)

    def __init__(self, code: str, /, **params: Any) -> None:
        object.__setattr__(self, "code", code)
        object.__setattr__(self, "params", params)
