"""The audit records cadence decisions are written as: `event` and `owner_message`.

Pure. One shape: a dict with `ts` and `kind` first and no None values, encoded by `audit.encode`
alone. `CadenceState.apply` folds exactly these fields back (rules/cadence.py); docs/cadence.md
has the record shapes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ntfy_intake.rules.cadence import Decision, IncidentView, MessageKind
from ntfy_intake.rules.timestamps import rfc3339

_EVENT_FIELDS = frozenset(
    {
        "ts",
        "kind",
        "event_id",
        "incident",
        "severity",
        "status",
        "outcome",
        "reason",
        "delivery_key",
        "profile",
    }
)
_OWNER_FIELDS = frozenset({"ts", "kind", "key", "message_kind", "notice", "result", "reason"})


def event_record(
    decision: Decision,
    incident: IncidentView,
    event_id: str,
    now: float,
    *,
    ts: str | None = None,
    profile: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The `event` audit record of a decision: `ts` and `kind` first, None values dropped.
    `ts`: `rfc3339(now)` when the caller has it already (every record of a batch shares it).
    `profile`: the publisher profile that keyed the message (`Signal.profile`); absent when
    none did, so a line of a message no profile knows is what it always was.

    Stage it with `audit.encode`, and `apply` the same dict to the state.
    """
    record: dict[str, Any] = {
        "ts": rfc3339(now) if ts is None else ts,
        "kind": "event",
        "event_id": event_id,
        "incident": incident.key,
        "severity": incident.severity,
        "status": incident.status,
        "outcome": decision.outcome,
        "reason": decision.reason,
    }
    if decision.delivery_key is not None:
        record["delivery_key"] = decision.delivery_key
    if profile is not None:
        record["profile"] = profile
    return _with_extra(record, extra, _EVENT_FIELDS)


def action_record(
    ts: str,
    event_id: str,
    event: str,
    *,
    incident: str,
    sequence_id: str | None,
    outcome: str,
    reason: str,
    topic: str,
    time: int | None,
    expires: int | None,
) -> dict[str, Any]:
    """The `event` record of a frame that decides nothing (a delete/clear: outcome `noted`; an
    unknown kind: `ignored`): no severity or status, so the fold passes it by. An empty
    `incident` or `topic` (not linked yet, not known) is left out like a None."""
    record: dict[str, Any] = {
        "ts": ts,
        "kind": "event",
        "event_id": event_id,
        "event": event,
        "incident": incident or None,
        "sequence_id": sequence_id,
        "outcome": outcome,
        "reason": reason,
        "topic": topic or None,
        "time": time,
        "expires": expires,
    }
    return {k: v for k, v in record.items() if v is not None}


def owner_record(
    key: str,
    now: float,
    *,
    message_kind: MessageKind,
    result: str,
    notice: str | None = None,
    reason: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The `owner_message` audit record; `result` is `OwnerDecision.result` when it audits one."""
    record: dict[str, Any] = {
        "ts": rfc3339(now),
        "kind": "owner_message",
        "key": key,
        "message_kind": message_kind,
        "notice": notice,
        "result": result,
        "reason": reason,
    }
    return _with_extra(record, extra, _OWNER_FIELDS)


def _with_extra(
    record: dict[str, Any], extra: Mapping[str, Any], reserved: frozenset[str]
) -> dict[str, Any]:
    if extra:
        if not reserved.isdisjoint(extra):
            clash = sorted(reserved.intersection(extra))
            raise ValueError(f"extra fields would overwrite the record's own: {', '.join(clash)}")
        for name, value in extra.items():
            if value is not None:
                record[name] = value
    if None in record.values():
        return {k: v for k, v in record.items() if v is not None}
    return record
