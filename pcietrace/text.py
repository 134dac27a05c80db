"""Outside text made safe for a terminal: :func:`clean` (the sanitiser; its use on every result is
:mod:`pcietrace.report.text`). Here, below every layer, so that what record/ says on stderr (paths, commands)
goes through it too. No imports beyond the standard library."""

from __future__ import annotations

import re
from typing import Any

#: What cannot reach a terminal or a text format as it is.
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _visible(m: re.Match[str]) -> str:
    c = m.group()
    if "\ud800" <= c <= "\udfff":
        return "\ufffd"
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def clean(s: Any) -> Any:
    """``s`` with every character of :data:`UNSAFE` made visible (surrogates: U+FFFD); non-strings unchanged."""
    return UNSAFE.sub(_visible, s) if isinstance(s, str) else s


#: A name in prose or on the console at most this long (the rest as "…"; JSON, CSV and Parquet hold it whole): a
#: 1,000-character range name wrapped to ~29 lines in each table, and a report of six ranges took 355 lines.
NAME_CHARS = 120


def shortened(name: Any, chars: int = NAME_CHARS) -> str:
    """``name`` as text of at most ``chars`` characters, cut with "…" where longer."""
    text = str(name)
    return text if len(text) <= chars else text[:chars - 1] + "…"
