"""health.assess: one verdict for status, check, /healthz, /metrics and STATUS=, each state."""

from __future__ import annotations

from typing import Any

from ntfy_intake.rules import health
from ntfy_intake.rules.health import State

LIMITS = health.Limits(keepalive_timeout=112.5, dead_after=600.0)
NOW = 1_764_470_000.0


def snap(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"state": "live", "started_at": NOW - 3600, "last_frame_wall": NOW - 5}
    base.update(fields)
    return base


def test_fresh_frames_on_an_open_subscription_are_live() -> None:
    verdict = health.assess(snap(), NOW, LIMITS)
    assert verdict.state is State.LIVE and verdict.intake is State.LIVE
    assert verdict.healthy and verdict.reasons == () and verdict.line() == "live"


def test_ntfy_unreachable_after_the_first_failed_attempt_is_reconnecting_though_the_frame_is_fresh() -> (
    None
):
    # The connection dropped 5 s ago, a reconnect failed 2 s ago: the last frame is still
    # younger than keepalive_timeout, which used to read "healthy (frames fresh)".
    verdict = health.assess(
        snap(state="backoff", last_error="ConnectError: refused", last_error_wall=NOW - 2),
        NOW,
        LIMITS,
    )
    assert verdict.state is State.RECONNECTING and not verdict.healthy
    assert any("ConnectError: refused (2.0 s ago)" in reason for reason in verdict.reasons)


def test_a_second_connect_attempt_after_a_failure_is_not_live() -> None:
    verdict = health.assess(
        snap(state="connecting", last_error="HTTP 503", last_error_wall=NOW - 1), NOW, LIMITS
    )
    assert verdict.state is State.RECONNECTING


def test_the_first_reconnect_after_a_clean_drop_stays_live() -> None:
    assert health.assess(snap(state="connecting"), NOW, LIMITS).state is State.LIVE


def test_silent_stream_is_reconnecting_then_dead_after_dead_after() -> None:
    assert health.assess(snap(last_frame_wall=NOW - 200), NOW, LIMITS).state is State.RECONNECTING
    verdict = health.assess(snap(last_frame_wall=NOW - 700), NOW, LIMITS)
    assert verdict.state is State.DEAD and verdict.intake is State.DEAD
    assert verdict.reasons == (
        "ntfy stream silent: last frame 11.7 min ago (longer than ntfy.dead_after, 600 s)",
    )


def test_never_a_frame_reads_never_not_none() -> None:
    verdict = health.assess(
        snap(state="backoff", last_frame_wall=None, started_at=NOW - 30), NOW, LIMITS
    )
    assert verdict.state is State.RECONNECTING
    assert verdict.last_frame_age_s is None
    assert "None" not in verdict.line()
    assert "no frame since start 30.0 s ago" in verdict.line()
    dead = health.assess(
        snap(state="backoff", last_frame_wall=None, started_at=NOW - 900), NOW, LIMITS
    )
    assert dead.state is State.DEAD


def test_http_port_in_use_is_degraded_while_intake_stays_live() -> None:
    verdict = health.assess(snap(http_error="[Errno 98] address in use"), NOW, LIMITS)
    assert verdict.state is State.DEGRADED and verdict.intake is State.LIVE
    assert not verdict.healthy
    assert "HTTP surface down ([Errno 98] address in use)" in verdict.line()


def test_other_degradations_are_reported_by_name() -> None:
    verdict = health.assess(snap(degraded=["database locked by another process"]), NOW, LIMITS)
    assert verdict.state is State.DEGRADED
    assert verdict.reasons == ("database locked by another process",)


def test_latch_outranks_everything() -> None:
    verdict = health.assess(
        snap(latch=True, http_error="x", last_frame_wall=NOW - 900), NOW, LIMITS
    )
    assert verdict.state is State.LATCHED
    assert verdict.reasons[0] == "audit latch is set: restart advised"


def test_a_daemon_that_is_not_running_is_dead() -> None:
    verdict = health.assess(snap(latch=True), NOW, LIMITS, running=False)
    assert verdict.state is State.DEAD and verdict.intake is State.DEAD
    assert verdict.reasons == ("daemon is not running (no fresh health snapshot)",)


def test_an_error_older_than_the_last_frame_is_history_with_its_age() -> None:
    verdict = health.assess(
        snap(last_error="ConnectError", last_error_wall=NOW - 3 * 3600), NOW, LIMITS
    )
    assert verdict.state is State.LIVE and verdict.reasons == ()
    assert not verdict.error_current
    assert verdict.last_error_age_s == 10800.0


def test_every_state_name_is_one_of_the_documented_five() -> None:
    assert [str(s) for s in health.STATES] == [
        "live",
        "degraded",
        "reconnecting",
        "dead",
        "latched",
    ]
    assert [str(s) for s in health.INTAKE_STATES] == ["live", "reconnecting", "dead"]


def test_a_snapshot_from_a_clock_stepped_back_earns_no_grace() -> None:
    # Written "in the future" (now stepped back 30 s): a negative age is no reason to forgive.
    limits = health.Limits(keepalive_timeout=1.5, dead_after=3.0)
    stale = snap(last_frame_wall=NOW - 2.0)
    assert health.assess(stale, NOW, limits, snapshot_age=-30.0).intake is State.RECONNECTING
    assert health.assess(stale, NOW, limits, snapshot_age=1.0).intake is State.LIVE
