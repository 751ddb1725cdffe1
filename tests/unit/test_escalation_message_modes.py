"""The escalation message says what was waited for (rules/escalation.message): a relay's 2xx,
or, with the agent feed alone (`relay.escalate_handle`, no `relay.url`), the handle's ack.
Pure, the clock injected.

Each test is named after the failure it kills.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from ntfy_intake.rules import escalation

T0 = 1_764_470_000.0  # 2025-11-30T02:33:20Z

REQUEST = escalation.Pending(
    delivery_key="tri_a",
    released_at=T0,
    incident_key="nas:disk",
    topic="alerts",
    title="Disk full on nas",
    severity=5,
    first_seen=T0 - 300,
    last_seen=T0,
    events=3,
    delivered=False,
    escalated=False,
)
FACTS = " First seen 2025-11-30 02:28 UTC, last 2025-11-30 02:33 UTC, 3 events."


@pytest.mark.parametrize(
    ("feed_handle", "waited", "said"),
    [
        (None, 720, "[alerts] Disk full on nas (severity 5) - triage agent silent for 12m."),
        (
            "triager",
            720,
            "[alerts] Disk full on nas (severity 5) - triage agent has not taken it from the"
            " feed for 12m.",
        ),
        (
            "triager",
            5,
            "[alerts] Disk full on nas (severity 5) - triage agent has not taken it from the"
            " feed for 5s.",
        ),
    ],
)
def test_feed_only_escalation_does_not_call_an_agent_that_was_never_pushed_silent(
    feed_handle: str | None, waited: int, said: str
) -> None:
    """Failure mode: with the feed alone no request is pushed, yet the owner read "triage
    agent silent" and went looking for a relay error that cannot exist; the agent has not
    taken (acked) the entry from the feed."""
    assert escalation.message(REQUEST, T0 + waited, feed_handle=feed_handle) == said + FACTS


def test_feed_only_message_stays_within_the_limit_whatever_the_title() -> None:
    text = escalation.message(replace(REQUEST, title="x" * 5000), T0 + 600, feed_handle="t")
    assert len(text) <= escalation.MESSAGE_LIMIT
    assert "(severity 5) - triage agent has not taken it from the feed for 10m." in text
