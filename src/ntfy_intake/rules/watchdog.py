"""Liveness policy: when to ping the systemd watchdog, and when intake counts as dead.

Pure: no I/O and no clock. Every function takes `now`, a monotonic time in seconds (the caller's
`time.monotonic()`), and every recorded time is on the same clock.

Two questions, two different answers (docs/design.md section 6):

- `should_ping` answers "is this process making progress?". A wedged process is the one thing a
  restart fixes, so only it stops the WATCHDOG=1 pings. A remote outage (ntfy down, the loop
  reconnecting with backoff) keeps them going, because restarting cannot bring ntfy back.
- `LivenessTracker` answers "is ntfy reaching us?". It classifies intake as live / reconnecting /
  dead for `status`, and emits `became_dead` and `recovered` exactly once per dead episode, so
  the owner hears about an outage once and about its end once.

Invariants owned here: a ping is only ever justified by recent evidence (a fresh frame, or a
reconnect schedule that is being kept) *and* a recent loop heartbeat; a tracker emits at most one
`became_dead` per episode, and a `recovered` only after a `became_dead`.

How the daemon uses it: the task that sends WATCHDOG=1 must be a separate task from the intake
loop (it wakes every `sdnotify.watchdog_interval`, builds a `Progress` snapshot and asks
`should_ping`), so a stuck intake loop shows up as a stale heartbeat instead of silencing the
question along with the answer. If the whole event loop is blocked, the ping task does not run
either, which stops the pings just the same.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True, slots=True)
class Progress:
    """What the intake loop has shown recently. All times are monotonic seconds.

    heartbeat_at:      the intake/writer loop last completed an iteration. The loop waits on
                       "work, poll interval or stop", so it ticks at least once per poll interval
                       even when ntfy is silent; a loop stuck in a read or a lock stops ticking.
    last_frame_at:     the last frame of any kind (open, keepalive, message) arrived; None before
                       the first one.
    next_attempt_due:  set whenever the stream is not delivering frames: the time by which the
                       loop promised to do something observable, that is, start the next
                       (re)connect attempt (end of the backoff sleep) or, while an attempt is in
                       flight, give it up (connect/read timeout). None while connected.
    last_attempt_at:   the last (re)connect attempt started; for the reason text only.
    """

    heartbeat_at: float
    last_frame_at: float | None = None
    next_attempt_due: float | None = None
    last_attempt_at: float | None = None


class PingDecision(NamedTuple):
    """`ping` says whether to send WATCHDOG=1; `reason` is one line for STATUS= and the log."""

    ping: bool
    reason: str


def should_ping(
    progress: Progress,
    now: float,
    *,
    keepalive_timeout: float,
    slack: float,
    heartbeat_timeout: float,
) -> PingDecision:
    """Decide whether the process is making progress.

    Ping when the loop heartbeat is at most `heartbeat_timeout` old and either
    - frames are fresh: the last one is at most `keepalive_timeout` old, or
    - reconnects are on schedule: `now <= next_attempt_due + slack`.
    Otherwise do not ping, and say why: a stale heartbeat (the loop is wedged), a reconnect that
    is overdue (the connect/backoff code is stuck), or silence with no reconnect scheduled (a read
    that should have timed out and did not).
    """
    heartbeat_age = max(0.0, now - progress.heartbeat_at)
    if heartbeat_age > heartbeat_timeout:
        return PingDecision(False, f"intake loop stalled: no heartbeat for {heartbeat_age:.0f}s")
    if progress.last_frame_at is not None:
        frame_age = max(0.0, now - progress.last_frame_at)
        if frame_age <= keepalive_timeout:
            return PingDecision(True, f"intake live: last frame {frame_age:.0f}s ago")
        silence = f"no frame for {frame_age:.0f}s"
    else:
        silence = "no frame yet"
    due = progress.next_attempt_due
    if due is None:
        return PingDecision(False, f"intake stuck: {silence} and no reconnect scheduled")
    if now <= due + slack:
        attempt = ""
        if progress.last_attempt_at is not None:
            attempt = f", last attempt {max(0.0, now - progress.last_attempt_at):.0f}s ago"
        return PingDecision(True, f"intake reconnecting on schedule: {silence}{attempt}")
    return PingDecision(False, f"intake stuck: {silence}, reconnect overdue by {now - due:.0f}s")


class IntakeState(enum.StrEnum):
    """`status --json` field `intake.state`."""

    LIVE = "live"  # a frame arrived within keepalive_timeout
    RECONNECTING = "reconnecting"  # silent longer than keepalive_timeout, not yet dead_after
    DEAD = "dead"  # silent longer than dead_after


class Transition(enum.StrEnum):
    """An edge worth one owner notice."""

    BECAME_DEAD = "became_dead"
    RECOVERED = "recovered"


class LivenessTracker:
    """Classifies intake from frame arrivals and reports dead/recovered edges once each.

    Silence is measured from the last frame, or from `started_at` before the first frame, so a
    daemon that starts while ntfy is down also reports it. A dead episode starts when silence
    exceeds `dead_after` (one `BECAME_DEAD`) and ends when intake has been live again for
    `recover_after` seconds without a gap (one `RECOVERED`). With `recover_after` > 0 a server
    that flaps (answers, then drops again) stays inside a single episode and costs no notices.

    Call `frame(now)` for every frame and `observe(now)` from a periodic tick; both return the
    transition that happened, if any. `dead_episode_open=True` resumes an episode whose
    `became_dead` notice an earlier process already sent (read back from the audit log), so a
    restart during an outage neither repeats that notice nor forgets the recovery one.
    """

    def __init__(
        self,
        *,
        started_at: float,
        keepalive_timeout: float,
        dead_after: float,
        recover_after: float = 0.0,
        dead_episode_open: bool = False,
    ) -> None:
        if keepalive_timeout <= 0:
            raise ValueError("keepalive_timeout must be positive")
        if dead_after < keepalive_timeout:
            raise ValueError("dead_after must be at least keepalive_timeout")
        if recover_after < 0:
            raise ValueError("recover_after must not be negative")
        self.keepalive_timeout = keepalive_timeout
        self.dead_after = dead_after
        self.recover_after = recover_after
        self.started_at = started_at
        self.last_frame_at: float | None = None
        self.live_since: float | None = None  # first frame after the last gap
        self.dead_episode_open = dead_episode_open

    def _silence(self, now: float) -> float:
        since = self.started_at if self.last_frame_at is None else self.last_frame_at
        return max(0.0, now - since)

    def state(self, now: float) -> IntakeState:
        silence = self._silence(now)
        if self.last_frame_at is not None and silence <= self.keepalive_timeout:
            return IntakeState.LIVE
        if silence <= self.dead_after:
            return IntakeState.RECONNECTING
        return IntakeState.DEAD

    def last_frame_age(self, now: float) -> float | None:
        """`intake.last_frame_age_s`: None before the first frame."""
        return None if self.last_frame_at is None else max(0.0, now - self.last_frame_at)

    def frame(self, now: float) -> Transition | None:
        """Record a frame (open, keepalive or message) that arrived at `now`."""
        if self.state(now) is not IntakeState.LIVE:
            self.live_since = now  # a gap ended: the live streak restarts here
        if self.last_frame_at is None or now > self.last_frame_at:
            self.last_frame_at = now
        return self.observe(now)

    def observe(self, now: float) -> Transition | None:
        """Check the clock against the frames seen so far; call it on every tick."""
        state = self.state(now)
        if not self.dead_episode_open:
            if state is IntakeState.DEAD:
                self.dead_episode_open = True
                return Transition.BECAME_DEAD
            return None
        if (
            state is IntakeState.LIVE
            and self.live_since is not None
            and now - self.live_since >= self.recover_after
        ):
            self.dead_episode_open = False
            return Transition.RECOVERED
        return None
