"""One health model for `status`, `check`, `/healthz`, `/metrics` and the systemd STATUS line.

Pure: it reads a health snapshot (the plain mapping the daemon writes every couple of seconds,
wall-clock times) and `now`, and does no I/O. The daemon asks it about its live snapshot; the
CLI asks it about the snapshot stored in the database. Same input, same words everywhere.

States, worst first (the overall state is the worst that applies):

- `latched`: an audit write failed; the cursor is frozen until a restart (docs/design.md section 4).
- `dead`: no frame from ntfy for longer than `dead_after`, or the daemon is not running.
- `reconnecting`: the subscription is down or silent, not yet for `dead_after`. A connection
  that failed since the last frame counts as down at once, even while that frame is younger than
  `keepalive_timeout`: ntfy unreachable is never "healthy" beyond the first attempt.
- `degraded`: intake is live but something around it is not (the HTTP surface could not bind,
  the database is locked by another process, the owner's replies over Signal have not been read
  for `owner.receive_dead_after`, ...). Intake goes on recording, and the owner is still told:
  what fails needs a person, but nothing is lost while it does.
- `live`: frames are fresh and the subscription is up. The only healthy state.

`intake.state` (live / reconnecting / dead) is the subscription alone, as `status --json` has
always reported it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class State(enum.StrEnum):
    LIVE = "live"
    DEGRADED = "degraded"
    RECONNECTING = "reconnecting"
    DEAD = "dead"
    LATCHED = "latched"


# The daemon stores its snapshot this often. A stored snapshot may trail the daemon by up to one
# period, so a reader grants its frame that much (at most two periods) before calling it silent.
SNAPSHOT_EVERY = 2.0
SNAPSHOT_GRACE_MAX = 2 * SNAPSHOT_EVERY

INTAKE_STATES = (State.LIVE, State.RECONNECTING, State.DEAD)
STATES = (State.LIVE, State.DEGRADED, State.RECONNECTING, State.DEAD, State.LATCHED)


@dataclass(frozen=True, slots=True)
class Limits:
    keepalive_timeout: float
    dead_after: float


@dataclass(frozen=True, slots=True)
class Health:
    state: State
    intake: State
    reasons: tuple[str, ...]
    last_frame_age_s: float | None
    last_error: str | None
    last_error_age_s: float | None
    error_current: bool  # the last error happened after the last frame: it is still the news

    @property
    def healthy(self) -> bool:
        return self.state is State.LIVE

    def line(self) -> str:
        """`live` or `reconnecting: <why>; <why>`: one line, for check, STATUS= and logs."""
        return str(self.state) if not self.reasons else f"{self.state}: {'; '.join(self.reasons)}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": str(self.state),
            "healthy": self.healthy,
            "reasons": list(self.reasons),
        }


def assess(
    snapshot: Mapping[str, Any],
    now: float,
    limits: Limits,
    *,
    running: bool = True,
    snapshot_age: float = 0.0,
) -> Health:
    """Classify a health snapshot at wall-clock time `now`.

    `snapshot_age` is how long ago a stored snapshot was written (0 for the daemon's own, live
    one). Frames after the write are not in it, so its frame is judged fresh or dead that much
    more leniently, never more than SNAPSHOT_GRACE_MAX (a stalled writer) nor less than 0 (a
    clock stepped back). The reported ages stay the true ones.

    Snapshot keys read (all optional): `state` (the connection: starting / connecting / live /
    backoff / stopped), `started_at`, `last_frame_wall`, `last_error`, `last_error_wall`,
    `latch`, `http_error`, `degraded` (a list of one-line reasons), `owner_receive` (the reply
    path: `failing_since`, wall clock, and its limit `dead_after`).
    """
    frame_at = _number(snapshot.get("last_frame_wall"))
    frame_age = None if frame_at is None else max(0.0, now - frame_at)
    error = snapshot.get("last_error")
    error_at = _number(snapshot.get("last_error_wall"))
    error_age = None if error_at is None else max(0.0, now - error_at)
    error_current = error is not None and (
        frame_at is None or error_at is None or error_at >= frame_at
    )
    grace = min(max(0.0, snapshot_age), SNAPSHOT_GRACE_MAX)
    judged_age = None if frame_age is None else max(0.0, frame_age - grace)
    intake = _intake_state(snapshot, now, limits, judged_age, error_current) if running else None

    reasons: list[str] = []
    if not running:
        reasons.append("daemon is not running (no fresh health snapshot)")
        intake = State.DEAD
    assert intake is not None
    latched = running and bool(snapshot.get("latch"))
    if latched:
        reasons.append("audit latch is set: restart advised")
    if running and intake is not State.LIVE:
        reasons.append(_intake_reason(intake, snapshot, frame_age, error_current, now, limits))
        if error_current and error is not None:
            reasons.append(f"last error {error} ({ago(error_age)})")
    degraded = _degradations(snapshot, now) if running else []
    reasons.extend(degraded)

    if latched:
        state = State.LATCHED
    elif intake is not State.LIVE:
        state = intake
    elif degraded:
        state = State.DEGRADED
    else:
        state = State.LIVE
    return Health(
        state=state,
        intake=intake,
        reasons=tuple(reasons),
        last_frame_age_s=None if frame_age is None else round(frame_age, 1),
        last_error=None if error is None else str(error),
        last_error_age_s=None if error_age is None else round(error_age, 1),
        error_current=error_current,
    )


def _intake_state(
    snapshot: Mapping[str, Any],
    now: float,
    limits: Limits,
    frame_age: float | None,
    error_current: bool,
) -> State:
    connection = snapshot.get("state")
    fresh = frame_age is not None and frame_age <= limits.keepalive_timeout
    # The first (re)connect attempt after a clean drop keeps `live`; a failed one does not.
    up = connection == "live" or (connection == "connecting" and not error_current)
    if fresh and up:
        return State.LIVE
    if frame_age is not None:
        silence = frame_age
    else:
        started = _number(snapshot.get("started_at"))
        silence = 0.0 if started is None else max(0.0, now - started)
    return State.DEAD if silence > limits.dead_after else State.RECONNECTING


def _degradations(snapshot: Mapping[str, Any], now: float) -> list[str]:
    found: list[str] = []
    http_error = snapshot.get("http_error")
    if http_error:
        found.append(f"HTTP surface down ({http_error}): no feed, notify, /healthz or /metrics")
    extra = snapshot.get("degraded")
    if isinstance(extra, list):
        found.extend(str(item) for item in extra if item)
    reply_path = _reply_path(snapshot.get("owner_receive"), now)
    if reply_path is not None:
        found.append(reply_path)
    return found


def _reply_path(seen: object, now: float) -> str | None:
    """The owner's replies unread past `owner.receive_dead_after`: from the moment the owner
    is sent the `reply_path_dead` notice, not before (a receive that fails for a minute while
    signal-cli-rest-api restarts is no news), and until a receive succeeds again."""
    if not isinstance(seen, Mapping):
        return None
    since, limit = _number(seen.get("failing_since")), _number(seen.get("dead_after"))
    if since is None or limit is None or now - since < limit:
        return None
    error = seen.get("last_error")
    detail = f" (last error {error})" if error else ""
    return (
        f"owner replies over Signal not received for {ago(max(0.0, now - since))}"
        f" (longer than owner.receive_dead_after, {limit:g} s){detail}:"
        " an ack or silence from the phone is not read"
    )


def _intake_reason(
    intake: State,
    snapshot: Mapping[str, Any],
    frame_age: float | None,
    error_current: bool,
    now: float,
    limits: Limits,
) -> str:
    down = error_current or snapshot.get("state") != "live"
    subject = "ntfy subscription down" if down else "ntfy stream silent"
    text = f"{subject}: {_silence(frame_age, snapshot, now)}"
    if intake is State.DEAD:
        text += f" (longer than ntfy.dead_after, {limits.dead_after:g} s)"
    return text


def _silence(frame_age: float | None, snapshot: Mapping[str, Any], now: float) -> str:
    if frame_age is not None:
        return f"last frame {ago(frame_age)}"
    started = _number(snapshot.get("started_at"))
    if started is None:
        return "no frame yet"
    return f"no frame since start {ago(max(0.0, now - started))}"


def ago(seconds: float | None) -> str:
    """`never`, `12.0 s ago`, `3.5 min ago`, `2.1 h ago`."""
    if seconds is None:
        return "never"
    if seconds < 120:
        return f"{seconds:.1f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
