"""Pure incident logic: which incident an event belongs to, and how incident state merges.

Incident key: the `incident` field of a JSON envelope in the message body when present, else
`<topic>:<title>` with the title lower-cased and whitespace collapsed (the message text when there
is no title). Severity: the envelope's, else the ntfy priority (default 3).

Merging is order-independent: severity is the maximum seen while firing, and the status follows
the event with the greatest (time, id), so two events applied in either order give one state.
The price: ntfy's `time` has one-second resolution and ids are random, so between a "firing"
and a "resolved" published within the same second, which one wins is arbitrary (but the same on
every replay). Publishers that flip status faster than once a second should leave a second
between the two events.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from ntfy_intake import sanitize
from ntfy_intake.frames import Message

Status = Literal["firing", "resolved"]
KEY_LIMIT = 200
_WHITESPACE = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class Signal:
    """What one event says about its incident."""

    key: str
    severity: int
    status: Status
    envelope: bool  # the key came from a JSON envelope


@dataclass(frozen=True, slots=True)
class IncidentState:
    key: str
    severity: int
    status: Status
    status_at: tuple[int, str]  # (time, event id) of the event that set the status
    first_seen: int
    last_seen: int
    events: int
    version: int


def normalise_title(text: str) -> str:
    return _WHITESPACE.sub(" ", text).strip().lower()[:KEY_LIMIT]


def signal_of(message: Message) -> Signal:
    envelope = _envelope(message.message)
    severity = message.effective_priority
    status: Status = "firing"
    if envelope is not None:
        key = envelope.get("incident")
        if isinstance(key, str) and key.strip():
            env_severity = envelope.get("severity")
            if isinstance(env_severity, int) and not isinstance(env_severity, bool):
                severity = min(5, max(1, env_severity))
            env_status = envelope.get("status")
            if env_status in ("firing", "resolved"):
                status = env_status
            return Signal(normalise_title(key), severity, status, envelope=True)
    title = (
        message.title if message.title is not None and message.title.strip() else message.message
    )
    return Signal(f"{message.topic}:{normalise_title(title)}", severity, status, envelope=False)


def _envelope(body: str) -> dict[str, Any] | None:
    stripped = body.strip()
    if not stripped.startswith("{"):
        return None
    try:
        obj = json.loads(stripped)
    except (ValueError, RecursionError):
        return None
    # The envelope is a decode boundary too: its strings are made valid UTF-8 here.
    return sanitize.valid_utf8(obj) if isinstance(obj, dict) else None


def merge(before: IncidentState | None, signal: Signal, message: Message) -> IncidentState:
    """Fold one event into its incident. Commutative for events of one firing episode."""
    stamp = (message.time, message.id)
    if before is None:
        return IncidentState(
            key=signal.key,
            severity=signal.severity,
            status=signal.status,
            status_at=stamp,
            first_seen=message.time,
            last_seen=message.time,
            events=1,
            version=1,
        )
    newer = stamp > before.status_at
    status = signal.status if newer else before.status
    severity = max(before.severity, signal.severity)
    changed = (severity, status) != (before.severity, before.status)
    return IncidentState(
        key=before.key,
        severity=severity,
        status=status,
        status_at=stamp if newer else before.status_at,
        first_seen=min(before.first_seen, message.time),
        last_seen=max(before.last_seen, message.time),
        events=before.events + 1,
        version=before.version + 1 if changed else before.version,
    )
