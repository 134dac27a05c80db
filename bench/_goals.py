"""Issue 7's goal for one direction of one range, shared by bench/attach_truth.py and bench/blind_attach.py.

A direction that moves at least BIG_BYTES per call in a range of at least GOAL_MIN_MS is checked in % (within
GOAL_PCT of its truth); any other is checked against attach's stated error (edges + the floor's interval). Small
directions are mostly the instruments' own traffic (a counter read is ~15 kB H2D), so a % of them says nothing
(docs/accuracy.md: "Small directions of short ranges").
"""

from __future__ import annotations

import math

BIG_BYTES = 1_000_000  # bytes per call
GOAL_PCT = 5.0
GOAL_MIN_MS = 2.0


def checked_in_pct(truth_bytes: float, ms: float) -> bool:
    """Whether a direction moving ``truth_bytes`` per call in a range of ``ms`` milliseconds is held to GOAL_PCT
    (else to attach's stated error)."""
    return math.isfinite(truth_bytes) and abs(truth_bytes) >= BIG_BYTES and ms >= GOAL_MIN_MS


def meets_goal(truth_bytes: float, ours_bytes: float, stated_bytes: float, ms: float) -> bool:
    """Whether attach's ``ours_bytes`` per call meets the goal against ``truth_bytes`` per call: within GOAL_PCT
    where :func:`checked_in_pct`, else within ``stated_bytes`` (attach's stated error) of the truth."""
    err = abs(ours_bytes - truth_bytes)
    return err <= GOAL_PCT / 100 * abs(truth_bytes) if checked_in_pct(truth_bytes, ms) else err <= stated_bytes


GOAL_TEXT = (f">= {GOAL_MIN_MS:g} ms and >= {BIG_BYTES / 1e6:g} MB per call: within {GOAL_PCT:g} %; "
             "else within attach's stated error")
