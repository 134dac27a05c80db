"""Every committed recording gives the figures it gave when its golden file was written (tests/golden.py;
``python3 tests/golden.py --update`` after a change meant to move them)."""

from __future__ import annotations

import json

import pytest

import golden


@pytest.mark.parametrize("folder", golden.recordings(), ids=lambda p: str(p.relative_to(golden.DATA)))
def test_same_figures(folder):
    file = golden.GOLDEN / f"{golden._name(folder)}.json"
    assert file.is_file(), f"no golden figures for {folder}: run python3 tests/golden.py --update"
    diff = golden.differences(json.loads(file.read_text()), golden.figures(folder))
    assert not diff, "\n".join(diff[:20])


def test_a_change_is_named():
    """A moved figure is reported by table and column."""
    folder = golden.DATA / "attach_h100_blind"
    now = golden.figures(folder)
    moved = json.loads(json.dumps(now))
    moved["tables"]["ranges"]["values"]["h2d_bytes"][0] = 1.5 * (now["tables"]["ranges"]["values"]["h2d_bytes"][0] or 1)
    diff = golden.differences(moved, now)
    assert diff and diff[0].startswith("table ranges column h2d_bytes: row[0]")
