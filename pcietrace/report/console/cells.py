"""What every console table is made of: number cells that never wrap, the table itself (:class:`WordTable`,
:func:`new_table`), outside text escaped for rich markup (:func:`esc`, the one place that escapes), and the
status line on stderr (:func:`tell`)."""

from __future__ import annotations

import copy
import math
from typing import Any, Callable

import numpy as np
import pandas as pd
from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from pcietrace.analysis.summary import gpu_label
from pcietrace.text import clean, shortened


DIR_LABEL = {"h2d": "H2D", "d2h": "D2H"}


def esc(x: Any) -> str:
    """Outside text made safe for rich markup (the one place that escapes)."""
    return escape(str(x))


def num(x: Any, fmt: str = ",.0f", unit: str = "") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)) or x is pd.NA:
        return "–"
    return f"{x:{fmt}}{unit}"


def ms_cell(x: Any) -> str:
    """Milliseconds to 0.01 ms, to 0.1 ms from a second up (the column stays narrow at 80)."""
    return num(x, ",.1f" if x is not None and not pd.isna(x) and abs(x) >= 1e3 else ",.2f")


def stated_err(r: Any, d: str) -> float:
    """A range's stated error in bytes: its edges' worst case plus the floor's 95 % half-width (the edges
    alone where the floor has no error estimate)."""
    floor_err = getattr(r, f"{d}_floor_err_bytes", math.nan)
    return getattr(r, f"{d}_edge_bytes") + (0.0 if pd.isna(floor_err) else floor_err)


def pm(x: Any, ci: Any, fmt: str = ",.0f") -> str:
    if ci is None or (isinstance(ci, float) and math.isnan(ci)):
        return num(x, fmt)
    return f"{x:{fmt}} ± {ci:{fmt}}"


def pm_lines(x: Any, ci: Any, fmt: str = ",.0f") -> str:
    """:func:`_pm` with the interval on a second line (narrow columns)."""
    return pm(x, ci, fmt).replace(" ± ", "\n± ")


class WordTable(Table):
    """A rich table that never splits a word while the words fit the terminal.

    rich narrows text columns below their longest word and then folds the word (``ncclCommIn`` / ``itRankConf``);
    here a text column shrinks only to its longest word (header included), so text wraps at spaces alone.
    Only where even those widths overflow does rich's own (folding) layout apply. The title and caption span the
    terminal, not the table (a narrow table no longer wraps its caption into a column), and a blank line
    follows, so that piped output never runs one table's caption into the next one's title."""

    def _calculate_column_widths(self, console: Console, options: ConsoleOptions) -> list[int]:
        ranges = [self._measure_column(console, options, c) for c in self.columns]
        widest = np.array([r.maximum or 1 for r in ranges])
        least = np.array([r.maximum if c.no_wrap else max(r.minimum, 1) for r, c in zip(ranges, self.columns)])
        if widest.sum() <= options.max_width:
            return widest.tolist()
        if least.sum() > options.max_width:
            return super()._calculate_column_widths(console, options)
        # water-fill: the highest common cap on the wide columns that still fits, each column held at its least
        caps = np.arange(int(widest.max()) + 1)
        totals = np.maximum(least[None, :], np.minimum(widest[None, :], caps[:, None])).sum(axis=1)
        cap = caps[totals <= options.max_width].max()
        return np.maximum(least, np.minimum(widest, cap)).tolist()

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        bare = copy.copy(self)
        bare.title = bare.caption = None
        if self.title:
            yield console.render_str(self.title, style=self.title_style or "table.title", highlight=False) \
                if isinstance(self.title, str) else self.title
        yield from Table.__rich_console__(bare, console, options)
        if self.caption:
            yield console.render_str(self.caption, style=self.caption_style or "table.caption", highlight=False) \
                if isinstance(self.caption, str) else self.caption
        yield Text("")


def new_table(title: str, columns: list[tuple[str, str]], caption: str | None = None) -> Table:
    """Right-justified columns hold numbers: they never wrap (the text columns wrap instead, at spaces: see
    :class:`WordTable`)."""
    t = WordTable(title=title, caption=caption, box=box.SIMPLE_HEAD, title_justify="left", caption_justify="left",
              title_style="bold", caption_style="dim", pad_edge=False, collapse_padding=True)
    for name, justify in columns:
        t.add_column(name, justify=justify, no_wrap=justify != "left",  # type: ignore[arg-type]
                     overflow="fold" if justify == "left" else "ellipsis")
    return t


def domain_mark(domain: Any, one_domain: bool) -> str:
    """A range name's domain beside it where ranges of several domains share a table; NVTX's default domain
    (no domain: torch.cuda.nvtx, nvtxRangePushA) goes unsaid."""
    return "" if one_domain or str(domain) == "default" else f" [dim]({esc(shortened(domain))})[/]"


def unknown(v: Any) -> str:
    """A sysfs value for display, '?' where it is unknown."""
    return "?" if v is None else str(v)


def pci_id(v: Any) -> str:
    """A PCI id ("0x10de") without its "0x", '?' where it is unknown."""
    return v[2:] if isinstance(v, str) and v.startswith("0x") else "?"


def node_gpu(row: Any) -> str:
    """A GPU's name in a table: "GPU3", or "node1 GPU3" in a merged report (whose rows and GPUs name their node)."""
    node = row.get("node")
    return esc(f"{node} " if node is not None and node == node else "") + gpu_label(row["nvml_index"])


def gpu_list(text: Any) -> str:
    """[0, 1, 2, 3, 5] (or "0,1,2,3,5") -> "0-3,5": runs of NVML indices shortened, so the column stays narrow
    on big boxes. A merged report's "node:index" items -> "node0:0,1 node1:0,1"."""
    items = list(text) if isinstance(text, (list, tuple)) or hasattr(text, "tolist") else None
    if items and any(":" in str(x) for x in items):
        by_node: dict[str, list[str]] = {}
        for x in items:
            node, _, idx = str(x).rpartition(":")
            by_node.setdefault(node, []).append(idx)
        return " ".join(f"{esc(n)}:{gpu_list(ix)}" for n, ix in by_node.items())
    try:
        items = text if isinstance(text, (list, tuple)) else str(text).split(",")
        idx = sorted({int(x) for x in items if str(x).strip()})
    except ValueError:
        return esc(text)
    runs: list[list[int]] = []
    for i in idx:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ",".join(map(str, r)) for r in runs)


def _cell(x: Any, col: str) -> str:
    if col == "nvml_index" and isinstance(x, (int, float)) and not pd.isna(x):
        return gpu_label(int(x))
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return esc(x)
    if isinstance(x, int):
        return f"{x:,}"
    return num(x, ",.3f" if abs(x) < 1000 else ",.0f")


def generic_table(name: str, df: pd.DataFrame) -> Table:
    """Any result table without a dedicated renderer: its columns as they are (numbers right-aligned)."""
    cols = [(("GPU" if c == "nvml_index" else esc(c)), "right" if pd.api.types.is_numeric_dtype(df[c]) else "left")
            for c in df.columns]
    t = new_table(esc(name.replace("_", " ")), cols)
    for rec in df.itertuples(index=False):
        t.add_row(*(_cell(x, c) for x, c in zip(rec, df.columns)))
    return t


def dedicated_or_generic(key: str, fn: Callable[[pd.DataFrame], Table], df: pd.DataFrame) -> Table:
    """A table whose columns are not what its renderer expects (an older or damaged report) still prints."""
    try:
        return fn(df)
    except (KeyError, AttributeError, TypeError, ValueError):
        return generic_table(key, df)


def summary_lines(summary: dict[str, Any]) -> list[Any]:
    return [Text(line, style="bold") for line in summary.get("lines", [])]


def tell(line: str) -> None:
    """A status line on stderr as rich prints it (no markup, not wrapped off a terminal): what a measuring
    command says about its run (``saved to DIR``, attach's ``running CMD``), passed to record/ by the command."""
    Console(stderr=True).print(clean(line), markup=False, soft_wrap=True)
