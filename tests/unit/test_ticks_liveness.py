"""rules/ticks.liveness_due: the ticker sleeps past no liveness transition (issue 36)."""

from __future__ import annotations

from ntfy_intake.rules import ticks
from ntfy_intake.rules.watchdog import LivenessTracker, Transition

KEEPALIVE_TIMEOUT, DEAD_AFTER, RECOVER_AFTER = 60.0, 300.0, 45.0


def due(tracker: LivenessTracker) -> float | None:
    return ticks.liveness_due(
        started_at=tracker.started_at,
        last_frame_at=tracker.last_frame_at,
        live_since=tracker.live_since,
        dead_episode_open=tracker.dead_episode_open,
        dead_after=tracker.dead_after,
        recover_after=tracker.recover_after,
    )


def tracker() -> LivenessTracker:
    return LivenessTracker(
        started_at=0.0,
        keepalive_timeout=KEEPALIVE_TIMEOUT,
        dead_after=DEAD_AFTER,
        recover_after=RECOVER_AFTER,
    )


def test_the_dead_transition_falls_due_exactly_when_the_tracker_reports_it() -> None:
    t = tracker()
    t.frame(10.0)
    at = due(t)
    assert at is not None
    assert t.observe(at - 0.001) is None
    assert t.observe(at + 0.001) is Transition.BECAME_DEAD


def test_before_any_frame_the_silence_counts_from_the_start() -> None:
    t = tracker()
    at = due(t)
    assert at == DEAD_AFTER
    assert t.observe(at + 0.001) is Transition.BECAME_DEAD


def test_the_recovered_transition_falls_due_after_a_live_streak_and_not_before_a_frame() -> None:
    t = tracker()
    assert t.observe(DEAD_AFTER + 1) is Transition.BECAME_DEAD
    assert due(t) is None  # dead: only a frame can end it, and a frame wakes nobody early
    t.frame(400.0)
    at = due(t)
    assert at == 400.0 + RECOVER_AFTER
    t.frame(430.0)  # keepalives keep the streak going
    assert t.observe(at - 0.001) is None
    assert t.observe(at + 0.001) is Transition.RECOVERED
    assert due(t) == 430.0 + DEAD_AFTER


def test_the_ticker_looks_for_the_next_keepalive_just_after_it_is_expected() -> None:
    assert ticks.frame_due(None, 100.0, 45.0, 0.5) is None  # no frame yet: liveness's due
    assert ticks.frame_due(100.0, 100.0, 45.0, 0.5) == 145.5
    assert ticks.frame_due(100.0, 130.0, 45.0, 0.5) == 145.5


def test_a_silent_stream_is_looked_at_once_an_interval_never_in_a_busy_loop() -> None:
    for now in (145.5, 146.0, 189.0, 190.4, 1000.0):
        at = ticks.frame_due(100.0, now, 45.0, 0.5)
        assert at is not None and now < at <= now + 45.0, (now, at)
        assert (at - 100.5) % 45.0 == 0
