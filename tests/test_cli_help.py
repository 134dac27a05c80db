"""``--help`` of every command: wrapped to the terminal and never wider than 100 columns, no lab figures, and one
time estimate for ``run`` (the README's)."""

from __future__ import annotations

import re

import pytest

from pcietrace.cli import HELP_WIDTH, build_parser

COMMANDS = [None, "run", "report", "topo", "latency", "attach", "compare", "graphs"]


def _help(command: str | None, columns: int, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    parser = build_parser()
    if command is None:
        return parser.format_help()
    sub = next(a for a in parser._subparsers._group_actions).choices[command]  # type: ignore[union-attr]
    return sub.format_help()


@pytest.mark.parametrize("columns", [80, 200])
@pytest.mark.parametrize("command", COMMANDS)
def test_help_is_wrapped_to_the_terminal(command: str | None, columns: int, monkeypatch) -> None:
    # was: each description one unwrapped line (run 143, attach 496, graphs 506 characters)
    text = _help(command, columns, monkeypatch)
    assert max(map(len, text.splitlines())) <= min(columns, HELP_WIDTH)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_carries_no_lab_figures(command: str | None, monkeypatch) -> None:
    # was: '~35 kB', '(H100: 1.65-1.89 us)', 'measured on 4x H200', 'on the lent VMs' in option help
    text = " ".join(_help(command, 200, monkeypatch).split())
    assert not re.search(r"~\d|\b\d+x H[12]00\b|\(H100[:)]|on an H100|lent VMs|measured on", text), text


def test_one_time_estimate_for_run(monkeypatch) -> None:
    # was: the main help said about a minute, the README ~30 s
    assert "(about 30 s)" in _help(None, 200, monkeypatch)
