"""The watchdog ping policy and the live/reconnecting/dead tracker, as tables (no clock, no sleep)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from ntfy_intake.rules.watchdog import (
    IntakeState,
    LivenessTracker,
    PingDecision,
    Progress,
    Transition,
    should_ping,
)

KEEPALIVE_TIMEOUT = 112.5  # 2.5 x ntfy's 45 s keepalive interval
SLACK = 15.0
HEARTBEAT_TIMEOUT = 60.0
DEAD_AFTER = 300.0
NOW = 10_000.0


def decide(progress: Progress, now: float = NOW) -> PingDecision:
    return should_ping(
        progress,
        now,
        keepalive_timeout=KEEPALIVE_TIMEOUT,
        slack=SLACK,
        heartbeat_timeout=HEARTBEAT_TIMEOUT,
    )


@pytest.mark.parametrize(
    ("progress", "ping", "reason_part"),
    [
        # Connected and hearing keepalives: ping.
        (Progress(heartbeat_at=NOW - 1, last_frame_at=NOW - 30), True, "intake live"),
        (Progress(heartbeat_at=NOW, last_frame_at=NOW - KEEPALIVE_TIMEOUT), True, "live"),
        # ntfy down, loop sleeping in backoff with the next attempt ahead: ping (restart can't help).
        (
            Progress(heartbeat_at=NOW - 2, last_frame_at=NOW - 900, next_attempt_due=NOW + 40),
            True,
            "reconnecting on schedule",
        ),
        # Never connected yet (ntfy down at boot), attempts on schedule: ping.
        (Progress(heartbeat_at=NOW, next_attempt_due=NOW + 5), True, "no frame yet"),
        # An attempt slightly late, within slack: ping.
        (
            Progress(heartbeat_at=NOW, next_attempt_due=NOW - SLACK, last_attempt_at=NOW - 70),
            True,
            "last attempt 70s ago",
        ),
        # Reconnect overdue beyond slack: the connect/backoff code is stuck.
        (
            Progress(heartbeat_at=NOW, last_frame_at=NOW - 900, next_attempt_due=NOW - 16),
            False,
            "reconnect overdue by 16s",
        ),
        # Frames stopped and no reconnect was ever scheduled: a read that never timed out.
        (
            Progress(heartbeat_at=NOW, last_frame_at=NOW - KEEPALIVE_TIMEOUT - 1),
            False,
            "no reconnect scheduled",
        ),
        (Progress(heartbeat_at=NOW), False, "no frame yet and no reconnect scheduled"),
        # Loop wedged: frames look fresh (reader still running) but the writer stopped ticking.
        (
            Progress(heartbeat_at=NOW - HEARTBEAT_TIMEOUT - 1, last_frame_at=NOW - 1),
            False,
            "no heartbeat for 61s",
        ),
        # Loop wedged while reconnecting on schedule: still no ping.
        (
            Progress(heartbeat_at=NOW - 500, next_attempt_due=NOW + 30),
            False,
            "stalled",
        ),
        # Heartbeat exactly at the limit still counts.
        (Progress(heartbeat_at=NOW - HEARTBEAT_TIMEOUT, last_frame_at=NOW), True, "live"),
        # Times slightly in the future (caller raced the clock) read as age 0.
        (Progress(heartbeat_at=NOW + 1, last_frame_at=NOW + 1), True, "last frame 0s ago"),
    ],
)
def test_should_ping(progress: Progress, ping: bool, reason_part: str) -> None:
    decision = decide(progress)
    assert decision.ping is ping
    assert reason_part in decision.reason
    assert "\n" not in decision.reason


def test_decision_unpacks_as_a_pair() -> None:
    ping, reason = decide(Progress(heartbeat_at=NOW, last_frame_at=NOW))
    assert ping is True
    assert reason.startswith("intake live")


def test_remote_outage_never_stops_pings_but_a_wedge_does() -> None:
    """Simulate ten minutes of ntfy outage with capped backoff, pinging every 45 s."""
    last_frame = 0.0
    due = KEEPALIVE_TIMEOUT + 5  # the read timed out, first retry scheduled
    for now in range(45, 600, 45):
        if now >= due:  # the loop keeps its promise: attempt, fail, schedule the next one
            due = now + min(60.0, 2.0 * (now - last_frame) / 10)
        progress = Progress(heartbeat_at=now - 1, last_frame_at=last_frame, next_attempt_due=due)
        assert decide(progress, now).ping, now
    # The same outage with the loop wedged from t=300 on: pings stop within one heartbeat timeout.
    wedged = Progress(heartbeat_at=300, last_frame_at=last_frame, next_attempt_due=due)
    assert not decide(wedged, 300 + HEARTBEAT_TIMEOUT + 1).ping


# ---------------------------------------------------------------- LivenessTracker


def tracker(
    *,
    keepalive_timeout: float = KEEPALIVE_TIMEOUT,
    dead_after: float = DEAD_AFTER,
    recover_after: float = 0.0,
    dead_episode_open: bool = False,
) -> LivenessTracker:
    return LivenessTracker(
        started_at=0.0,
        keepalive_timeout=keepalive_timeout,
        dead_after=dead_after,
        recover_after=recover_after,
        dead_episode_open=dead_episode_open,
    )


def run(
    t: LivenessTracker, frames: Iterable[float], until: float, tick: float = 5.0
) -> list[tuple[float, Transition]]:
    """Feed frames at the given times and tick every `tick` seconds; return the transitions."""
    pending = sorted(frames)
    out: list[tuple[float, Transition]] = []
    now = 0.0
    while now <= until:
        while pending and pending[0] <= now:
            at = pending.pop(0)
            if (tr := t.frame(at)) is not None:
                out.append((at, tr))
        if (tr := t.observe(now)) is not None:
            out.append((now, tr))
        now += tick
    return out


def keepalives(start: float, stop: float, every: float = 45.0) -> list[float]:
    times: list[float] = []
    at = start
    while at < stop:
        times.append(at)
        at += every
    return times


@pytest.mark.parametrize(
    ("name", "frames", "until", "kw", "expected"),
    [
        ("healthy stream", keepalives(0, 3600), 3600, {}, []),
        # Silent for ten minutes after one hour of keepalives: exactly one dead transition.
        (
            "silent 10 min",
            keepalives(0, 1800),
            1800 + 600,
            {},
            [(1800 - 45 + 305, Transition.BECAME_DEAD)],
        ),
        # ntfy down from boot: dead once, counted from start.
        ("down at boot", [], 1200, {}, [(305.0, Transition.BECAME_DEAD)]),
        # Outage, then frames again: dead once, recovered once on the first frame.
        (
            "outage then recovery",
            [0, *keepalives(1000, 2000)],
            2000,
            {},
            [(305.0, Transition.BECAME_DEAD), (1000.0, Transition.RECOVERED)],
        ),
        # Flapping shorter than dead_after (gaps of 200 s): reconnecting, never dead, no notice.
        ("flap below dead_after", keepalives(0, 3600, every=200), 3600, {}, []),
        # Dead, then the server flaps (one open frame every 400 s); with recover_after, a flap
        # is not a recovery: one notice for the whole episode, one recovered when it is stable.
        (
            "flap while dead",
            [0, 700, 1100, 1500, *keepalives(2000, 2400)],
            2400,
            {"recover_after": 120.0},
            [(305.0, Transition.BECAME_DEAD), (2120.0, Transition.RECOVERED)],
        ),
        # The same flapping without recover_after: each flap is a real recovery and a new death,
        # still at most one pair per dead_after of silence (never per reconnect attempt).
        (
            "flap while dead, no hysteresis",
            [0, 700, 1100],
            1500,
            {},
            [
                (305.0, Transition.BECAME_DEAD),
                (700.0, Transition.RECOVERED),
                (1005.0, Transition.BECAME_DEAD),
                (1100.0, Transition.RECOVERED),
                (1405.0, Transition.BECAME_DEAD),
            ],
        ),
        # Restarted during an outage whose notice was already sent: no second dead notice,
        # and the recovery is still reported.
        (
            "resume open episode",
            keepalives(500, 700),
            700,
            {"dead_episode_open": True},
            [(500.0, Transition.RECOVERED)],
        ),
    ],
)
def test_liveness_transitions(
    name: str,
    frames: list[float],
    until: float,
    kw: dict[str, Any],
    expected: list[tuple[float, Transition]],
) -> None:
    assert run(tracker(**kw), frames, until) == expected, name


@pytest.mark.parametrize(
    ("frames", "now", "state", "age"),
    [
        ([], 10.0, IntakeState.RECONNECTING, None),  # no frame yet: connecting
        ([0.0], 10.0, IntakeState.LIVE, 10.0),
        ([0.0], KEEPALIVE_TIMEOUT, IntakeState.LIVE, KEEPALIVE_TIMEOUT),
        ([0.0], KEEPALIVE_TIMEOUT + 1, IntakeState.RECONNECTING, KEEPALIVE_TIMEOUT + 1),
        ([0.0], DEAD_AFTER, IntakeState.RECONNECTING, DEAD_AFTER),
        ([0.0], DEAD_AFTER + 1, IntakeState.DEAD, DEAD_AFTER + 1),
        ([], DEAD_AFTER + 1, IntakeState.DEAD, None),
        ([50.0, 20.0], 60.0, IntakeState.LIVE, 10.0),  # a late, older timestamp never rewinds
    ],
)
def test_state_and_frame_age(
    frames: list[float], now: float, state: IntakeState, age: float | None
) -> None:
    t = tracker()
    for at in frames:
        t.frame(at)
    assert t.state(now) is state
    assert t.last_frame_age(now) == age
    assert str(state) in {"live", "reconnecting", "dead"}


def test_observe_is_idempotent() -> None:
    t = tracker()
    assert t.observe(DEAD_AFTER + 1) is Transition.BECAME_DEAD
    assert [t.observe(DEAD_AFTER + 1 + s) for s in range(0, 3600, 7)] == [None] * 515
    assert t.frame(5000) is Transition.RECOVERED
    assert t.frame(5001) is None
    assert t.observe(5002) is None


@pytest.mark.parametrize(
    "kw",
    [
        {"keepalive_timeout": 0.0},
        {"dead_after": KEEPALIVE_TIMEOUT - 1},
        {"recover_after": -1.0},
    ],
)
def test_invalid_settings_are_refused(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must"):
        tracker(**kw)
