"""Outside text made safe for a terminal or a text format: the one sanitiser every renderer's input goes through.

Strings in a report come from outside (GPU names, NVTX range and domain names, the command line, sysfs, paths);
written raw they could drive the terminal (ANSI/OSC escape sequences: colours, titles, hyperlinks, clearing the
screen), start a new line in a CSV or Markdown file (a fake ``# table:`` block, a broken pipe table), reorder
what is shown (bidi overrides), or make every renderer fail (a lone surrogate cannot be encoded).
:func:`clean` shows C0/C1 control characters, DEL, line separators and bidi controls as escapes (``\\x1b``,
``\\n``, ``\\u202e``) and replaces lone surrogates with U+FFFD; :func:`clean_all` applies it to every string of a
result (metadata, tables, summary) at the boundary where results enter the renderers
(:mod:`pcietrace.report.output`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

from pcietrace.text import UNSAFE, clean

__all__ = ["UNSAFE", "clean", "clean_all", "clean_frame"]


def clean_frame(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its text cells and column names cleaned (a copy only where something changed)."""
    import pandas as pd

    from pcietrace.schema import by_object
    out = df
    for c in df.columns:
        col = df[c]
        # each distinct value read once (millions of range instances hold a few thousand names): the categories
        # of a categorical column, the distinct strings of a string column, the distinct objects of an object one
        if isinstance(col.dtype, pd.CategoricalDtype):
            distinct = col.cat.categories.to_numpy(object)
        elif isinstance(col.dtype, pd.StringDtype):
            distinct = pd.unique(col.dropna()).astype(object)
        elif col.dtype == object:
            distinct = by_object(col.to_numpy(object))[1]
        else:
            continue
        if any(isinstance(v, str) and UNSAFE.search(v) is not None for v in distinct):
            out = out.copy() if out is df else out
            out[c] = col.map(clean, na_action="ignore")
    if any(isinstance(c, str) and UNSAFE.search(c) for c in df.columns):
        out = out.rename(columns=clean)
    return out


def clean_all(o: Any) -> Any:
    """``o`` (nested dicts, lists, DataFrames, strings) with every string :func:`clean` ed, keys included."""
    import pandas as pd  # (pcietrace.cli cleans its error lines with clean alone: --help stays light)

    if isinstance(o, str):
        return clean(o)
    if isinstance(o, pd.DataFrame):
        return clean_frame(o)
    if isinstance(o, dict):
        return {clean(k): clean_all(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return type(o)(clean_all(v) for v in o)
    return o
