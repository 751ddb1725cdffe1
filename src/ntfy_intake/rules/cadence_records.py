"""The audit records cadence decisions are written as: `event` and `owner_message`.

Pure. `CadenceState.apply` folds exactly these fields back (rules/cadence.py); docs/cadence.md
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
    }
)
_OWNER_FIELDS = frozenset({"ts", "kind", "key", "message_kind", "notice", "result", "reason"})


def event_record(
    decision: Decision, incident: IncidentView, event_id: str, now: float, **extra: Any
) -> dict[str, Any]:
    """The `event` audit record of a decision: `ts` and `kind` first, None values dropped.

    Stage it with `audit.stage(conn, record["kind"], now, **fields)` where `fields` is the record
    without `ts` and `kind`, and `apply` the same dict to the state.
    """
    record: dict[str, Any] = {
        "ts": rfc3339(now),
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
    return _with_extra(record, extra, _EVENT_FIELDS)


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
