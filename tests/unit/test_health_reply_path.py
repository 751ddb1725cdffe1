"""health.assess and the reply path from the owner's phone (DESIGN.md section 13: "the reply path
has health"): receiving failing past `owner.receive_dead_after` makes the one verdict `check`,
`/healthz`, `/metrics` and STATUS= read degraded, with its reason. Time injected.

Each test is named after the failure it kills.
"""

from __future__ import annotations

from typing import Any

from ntfy_intake.rules import health
from ntfy_intake.rules.health import State

LIMITS = health.Limits(keepalive_timeout=112.5, dead_after=600.0)
NOW = 1_764_470_000.0


def snap(failing_for: float | None, **receive: Any) -> dict[str, Any]:
    path = {
        "mode": "poll",
        "last_ok": NOW - 4000,
        "failures": 12,
        "last_error": "ValueError: HTTP 503",
        "failing_since": None if failing_for is None else NOW - failing_for,
        "dead_after": 600.0,
        **receive,
    }
    return {
        "state": "live",
        "started_at": NOW - 3600,
        "last_frame_wall": NOW - 5,
        "owner_receive": path,
    }


def test_reply_path_dead_past_its_limit_makes_the_verdict_degraded() -> None:
    """Failure mode: the owner's acks go unread for hours while check, /healthz and /metrics
    say healthy; only one notice (to a phone that may be the problem) says otherwise."""
    verdict = health.assess(snap(601.0), NOW, LIMITS)
    assert verdict.state is State.DEGRADED and not verdict.healthy
    assert verdict.intake is State.LIVE  # intake goes on recording
    [reason] = verdict.reasons
    assert reason.startswith("owner replies over Signal not received for 10.0 min")
    assert "owner.receive_dead_after, 600 s" in reason and "HTTP 503" in reason


def test_a_short_receive_failure_leaves_the_verdict_live() -> None:
    """signal-cli-rest-api restarting for a minute is no news: the verdict changes when the
    owner's notice is due, not at the first failed poll."""
    assert health.assess(snap(599.0), NOW, LIMITS).state is State.LIVE
    assert health.assess(snap(None), NOW, LIMITS).state is State.LIVE
    assert health.assess(snap(9999.0, dead_after=None), NOW, LIMITS).state is State.LIVE
    off = {"state": "live", "started_at": NOW - 3600, "last_frame_wall": NOW - 5}
    assert health.assess({**off, "owner_receive": None}, NOW, LIMITS).state is State.LIVE


def test_a_dead_intake_outranks_a_dead_reply_path_and_both_are_named() -> None:
    dead = {**snap(9999.0), "last_frame_wall": NOW - 900, "state": "backoff"}
    verdict = health.assess(dead, NOW, LIMITS)
    assert verdict.state is State.DEAD
    assert any(r.startswith("owner replies over Signal") for r in verdict.reasons)
