"""Pure triage decisions: does this event open a triage request, join one, or get suppressed?

Takes plain values and `now`, does no I/O. The inbox transaction calls `decide()` for every new
event and writes what it returns; swapping this function is how cadence rules change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ntfy_intake.incidents import IncidentState

Outcome = Literal["triage_requested", "joined", "suppressed"]


@dataclass(frozen=True, slots=True)
class OpenRequest:
    """A triage request for the incident that is still collecting events (not yet released)."""

    delivery_key: str
    due_at: float


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: Outcome
    reason: str
    delivery_key: str | None = None
    due_at: float | None = None


@dataclass(frozen=True, slots=True)
class Policy:
    debounce: float = 0.0  # seconds a new request collects further events before release


def delivery_key_for(event_id: str) -> str:
    """Stable and deterministic: the event that opened the request names it, forever."""
    return f"tri_{event_id}"


def decide(
    policy: Policy,
    before: IncidentState | None,
    after: IncidentState,
    requested_severity: int | None,
    open_request: OpenRequest | None,
    event_id: str,
    now: float,
) -> Decision:
    if open_request is not None:
        return Decision("joined", "pending_request", open_request.delivery_key, open_request.due_at)
    due = now + policy.debounce
    if before is None:
        return Decision("triage_requested", "new_incident", delivery_key_for(event_id), due)
    if after.status == "firing" and before.status == "resolved":
        return Decision("triage_requested", "reopened", delivery_key_for(event_id), due)
    if after.status == "resolved" and before.status == "firing":
        return Decision("triage_requested", "resolved", delivery_key_for(event_id), due)
    if after.status == "firing" and after.severity > (requested_severity or 0):
        return Decision("triage_requested", "escalation", delivery_key_for(event_id), due)
    return Decision("suppressed", "no_escalation")
