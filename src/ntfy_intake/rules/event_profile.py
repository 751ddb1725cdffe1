"""The publisher profile that keyed a recorded event, for the triage payload's `events[].profile`
(DESIGN.md section 12; docs/triage-contract.md). Pure.

Recomputed from the stored message rather than stored per inbox row (no column, no migration; a
few microseconds per event of a release, nothing for an event no profile could have keyed). The
profiles' answer counts only when its key is the one the event was recorded under, so the answer
is what keyed it then, whatever `ntfy.profiles` says now: a message recorded under "off" (keyed
by its title) names none, and neither does an update that joined its sequence's incident under
another key, nor an event rebuilt from the audit log (store/rebuild.py keeps no title or body).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ntfy_intake.rules import incidents, profiles

DEFAULT_PRIORITY = 3  # ntfy's, for a message published without one


class _Stored(NamedTuple):
    """A recorded message as the incident rules read it (incidents.Alert)."""

    id: str
    time: int
    topic: str
    title: str | None
    message: str
    effective_priority: int
    tags: tuple[str, ...]


def recorded(
    *,
    event_id: str,
    time: int,
    topic: str,
    title: str | None,
    message: str,
    priority: int | None,
    tags: Sequence[str],
    incident_key: str,
) -> str | None:
    """The profile's name, or None (module docstring). `message`: the body as the batch read it
    (a base64 body decoded)."""
    if incident_key.partition(":")[0] not in profiles.NAMES:
        return None  # every profile's key starts with its name: no profile keyed this one
    alert = _Stored(
        event_id,
        time,
        topic,
        title,
        message,
        DEFAULT_PRIORITY if priority is None else priority,
        tuple(tags),
    )
    signal = incidents.signal_of(alert, profiles=True)
    return signal.profile if signal.key == incident_key else None
