"""The escalator's reads (flow/escalator.py): triage requests the agent has not answered yet,
with what the owner message about one says.

A candidate is a request still collecting, pending, leased or dead (never `delivered`: the
agent answered 2xx; never `skipped`: no relay), of an incident at or above the minimum
severity, created within `since`, with no `escalate:<delivery_key>` row in the owner outbox.
That row (inserted with its audit record in one transaction by OwnerQueue.escalation) is what
makes an escalation once per request: the outbox key is unique, and a rebuild restores it from
the audit log.
"""

from __future__ import annotations

import json
from typing import Any

from ntfy_intake.rules import escalation
from ntfy_intake.rules.cadence import debounce_end
from ntfy_intake.store.db import Connection

_CANDIDATES = (
    "SELECT o.delivery_key, o.state, o.created_at, o.due_at, i.key, i.severity,"
    " i.first_seen, i.last_seen, i.events,"
    " (SELECT n.raw FROM outbox_events e JOIN inbox n ON n.event_id = e.event_id"
    "   WHERE e.delivery_key = o.delivery_key ORDER BY n.time DESC, n.seq DESC LIMIT 1)"
    " FROM outbox o JOIN incidents i ON i.key = o.incident_key"
    " WHERE o.state IN ('collecting', 'pending', 'leased', 'dead')"
    " AND o.created_at >= ? AND i.severity >= ?"
    " AND NOT EXISTS (SELECT 1 FROM owner_outbox w WHERE w.key = ? || o.delivery_key)"
    " ORDER BY o.created_at, o.delivery_key"
)
# The request's key is the escalation's after its prefix: joined by the outbox's primary key.
_RECORDED = (
    "SELECT w.key, w.state, w.created_at, w.last_error, o.incident_key FROM owner_outbox w"
    f" LEFT JOIN outbox o ON o.delivery_key = substr(w.key, {len(escalation.KEY_PREFIX) + 1})"
    " WHERE w.key LIKE ? AND w.created_at >= ? ORDER BY w.created_at DESC, w.key DESC LIMIT ?"
)
# The agent feed alone: a released request (`skipped`: no relay) whose `triage` entry the
# handle has not acked (its cursor below the entry's seq, or no cursor: it never came), and one
# still collecting (its entry comes at release). The entry is found by its idempotency key (the
# delivery key: flow/pipeline.py), the unique index's.
_FEED_CANDIDATES = (
    "SELECT o.delivery_key, o.state, o.created_at, o.due_at, i.key, i.severity,"
    " i.first_seen, i.last_seen, i.events,"
    " (SELECT n.raw FROM outbox_events e JOIN inbox n ON n.event_id = e.event_id"
    "   WHERE e.delivery_key = o.delivery_key ORDER BY n.time DESC, n.seq DESC LIMIT 1),"
    " f.created_at"
    " FROM outbox o JOIN incidents i ON i.key = o.incident_key"
    " LEFT JOIN feed_entries f ON f.channel = 'triage' AND f.idempotency_key = o.delivery_key"
    " WHERE o.state IN ('collecting', 'skipped') AND o.created_at >= ? AND i.severity >= ?"
    " AND (o.state = 'collecting' OR f.seq > COALESCE((SELECT c.acked_seq FROM feed_cursors c"
    "   WHERE c.handle = ? AND c.channel = 'triage'), 0))"
    " AND NOT EXISTS (SELECT 1 FROM owner_outbox w WHERE w.key = ? || o.delivery_key)"
    " ORDER BY o.created_at, o.delivery_key"
)
_TOPICS = (
    "SELECT DISTINCT n.topic FROM outbox_events e JOIN inbox n ON n.event_id = e.event_id"
    " WHERE e.delivery_key = ? ORDER BY n.topic"
)


def candidates(
    conn: Connection,
    *,
    since: float,
    min_severity: int,
    debounce: float,
    feed_handle: str | None = None,
) -> list[escalation.Pending]:
    """Requests that may still escalate (module doc; with `feed_handle`, the feed's: see
    `_FEED_CANDIDATES`). A request's release is when its debounce window closed (a collecting
    one's `due_at`, else its feed entry's creation, else `debounce_end(created_at)`): the outbox
    keeps no release time, and the window's end is when the agent could first have been asked."""
    if feed_handle is None:
        rows = conn.execute(_CANDIDATES, (since, min_severity, escalation.KEY_PREFIX)).fetchall()
    else:
        found = (since, min_severity, feed_handle, escalation.KEY_PREFIX)
        rows = conn.execute(_FEED_CANDIDATES, found).fetchall()
    out: list[escalation.Pending] = []
    for row in rows:
        key, state, created_at, due_at, incident, severity, first, last, events, raw = row[:10]
        frame = _frame(raw)
        if state == "collecting":
            released = float(due_at)
        elif len(row) > 10 and row[10] is not None:
            released = float(row[10])
        else:
            released = debounce_end(float(created_at), debounce)
        title = frame.get("title") or frame.get("message") or incident
        out.append(
            escalation.Pending(
                delivery_key=str(key),
                released_at=released,
                incident_key=str(incident),
                topic=str(frame.get("topic") or ""),
                title=title if isinstance(title, str) else str(incident),
                severity=int(severity),
                first_seen=float(first),
                last_seen=float(last),
                events=int(events),
                delivered=False,
                escalated=False,
            )
        )
    return out


def topics(conn: Connection, delivery_key: str) -> tuple[str, ...]:
    """The topics of a request's events: what a silence or a maintenance window matches."""
    return tuple(str(t[0]) for t in conn.execute(_TOPICS, (delivery_key,)).fetchall())


def _frame(raw: Any) -> dict[str, Any]:
    try:
        frame = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return {}
    return frame if isinstance(frame, dict) else {}


def recorded(conn: Connection, *, since: float, limit: int = 1000) -> list[escalation.Recorded]:
    """Escalations decided at or after `since`, newest first (what `status` counts and shows);
    at most `limit` (the daily cap keeps a day's far below it)."""
    rows = conn.execute(_RECORDED, (escalation.KEY_PREFIX + "%", since, limit)).fetchall()
    return [
        escalation.Recorded(
            key=str(key),
            state=str(state),
            created_at=float(created),
            reason=None if state != "suppressed" or error is None else str(error),
            incident=None if incident is None else str(incident),
        )
        for key, state, created, error, incident in rows
    ]
