"""The console tables of every committed recording at 80 and 200 columns: no word split across lines (wrapping
only at spaces), nothing cut, no line past the width, and a blank line between a table and what follows."""

from __future__ import annotations

import functools
import io
from pathlib import Path

import pytest
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from pcietrace.analysis import analyze
from pcietrace.analysis.summary import summarize
from pcietrace.report import console
from pcietrace.session import Session

DATA = Path(__file__).parent / "data"
RECORDINGS = sorted(p.parent for p in DATA.glob("**/report.json"))
BOX = set("─━│┃┏┓┗┛┡┩└┘┌┐├┤┬┴┼╇╈╋ ")


@functools.lru_cache(maxsize=None)
def _parts(rec: Path) -> tuple:
    s = Session.load(rec)
    res = analyze(s)
    return tuple(console.parts(s.meta, res, summarize(s.meta, res), detail=True))


def _plain(x: object) -> str:
    if x is None:
        return ""
    return Text.from_markup(x).plain if isinstance(x, str) else getattr(x, "plain", str(x))


def _source_words(part: object) -> set[str]:
    """Every word the part was given to print (cells, headers, title, caption, text)."""
    if isinstance(part, Table):
        texts = [part.title, part.caption] + [c.header for c in part.columns] \
            + [cell for c in part.columns for cell in c._cells]
    elif isinstance(part, Panel):
        texts = [part.renderable]
    else:
        texts = [part]
    return {w for t in texts for w in _plain(t).split()}


def _render(part: object, width: int) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width, force_terminal=False, color_system=None).print(part)
    return buf.getvalue()


@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize("rec", RECORDINGS, ids=lambda p: str(p.relative_to(DATA)))
def test_no_word_is_split_or_cut(rec: Path, width: int) -> None:
    # was: at 80 columns rich folded words inside narrow text columns ('ncclCommIn' / 'itRankConf', 'GP' / 'U')
    # and wrapped captions and titles to the table's width
    for part in _parts(rec):
        out = _render(part, width)
        lines = out.splitlines()
        assert "…" not in out and max(map(len, lines), default=0) <= width
        words = _source_words(part)
        rendered = {w for line in lines for w in line.split() if not set(w) <= BOX}
        split = rendered - words
        assert not split, f"{getattr(part, 'title', part)!r}: {sorted(split)[:8]} are pieces of words"


def test_a_table_ends_with_a_blank_line_so_piped_tables_stay_apart() -> None:
    # was: piped, a table's caption ran straight into the next table's title
    t = console._table("First", [("GPU", "right")], caption="the caption")
    t.add_row("GPU0")
    lines = _render(t, 80).splitlines()
    assert lines[0] == "First" and lines[-2].strip() == "the caption" and lines[-1] == ""


def test_a_narrow_table_keeps_its_caption_on_the_terminal_width() -> None:
    # was: the caption wrapped to a narrow table's width, one short line after another
    caption = "a caption far longer than the table is wide, which should use the terminal's width instead"
    t = console._table("T", [("GPU", "right")], caption=caption)
    t.add_row("GPU0")
    assert caption in _render(t, 120)


def test_a_long_name_wraps_at_spaces_and_is_never_folded() -> None:
    t = console._table("T", [("range", "left"), ("a", "right"), ("b", "right"), ("c", "right")])
    t.add_row("ncclCommInitRankConfig (NCCL) (1344 stalls)", "1" * 15, "2" * 15, "3" * 15)
    out = _render(t, 80)  # the name column must shrink to its longest word, no further
    assert "ncclCommInitRankConfig" in out and "1" * 15 in out and "3" * 15 in out
