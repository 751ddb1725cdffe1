"""A node whose audit log latched could not do the work (rules/readiness.latch_reason;
DESIGN.md section 11: readiness is "that it could do the work"), named after the failure it
kills: the standby drill's audit_full round saw the latched node take the lease back itself,
its row saying ready again once the other node held the lease."""

from __future__ import annotations

import pytest

from ntfy_intake.rules import readiness
from ntfy_intake.rules.readiness import WorkState


@pytest.mark.parametrize(
    ("intake", "last_term_latched", "not_ready"),
    [
        # A leader: its current daemon's latch decides, never an older term's.
        ("latched", False, True),
        ("latched", True, True),
        ("live", True, False),
        ("dead", True, False),
        ("live", False, False),
        # A standby: its last term in this process decides.
        ("standby", True, True),
        ("standby", False, False),
    ],
)
def test_a_node_whose_last_term_ended_latched_is_not_ready_until_it_restarts(
    intake: str, last_term_latched: bool, not_ready: bool
) -> None:
    reason = readiness.latch_reason(WorkState(intake, 10.0), last_term_latched=last_term_latched)
    assert (reason is not None) is not_ready, (intake, last_term_latched, reason)
    if not_ready:
        assert reason == readiness.LATCHED
        assert "audit log could not be written" in reason and "restarts" in reason
