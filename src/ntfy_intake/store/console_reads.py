"""What the owner console's pages read: bounded, indexed, read-only queries.

Every function takes a `db.Connection` (the console keeps its own, read-only, in the thread pool:
the daemon's writer never waits for a page) and returns plain rows for the templates. Each read is
bounded (`limit`) and served by an index (migration 0005), so a page costs the same with 100,000
events in the inbox as with ten. Text read here is whatever ntfy sent: the templates escape it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ntfy_intake.store import audit
from ntfy_intake.store.db import Connection

PAGE = 50
EVENTS_PER_INCIDENT = 5
_TAIL_BYTES = 512 * 1024
_AUDIT_SCAN = 8 * 1024 * 1024  # how far back the audit page searches for a filter


@dataclass(frozen=True, slots=True)
class EventRow:
    event_id: str
    topic: str
    time: int
    outcome: str
    reason: str
    title: str
    message: str


@dataclass(frozen=True, slots=True)
class RequestRow:
    delivery_key: str
    incident_key: str
    reason: str
    state: str
    attempts: int
    due_at: float
    last_error: str | None
    created_at: float


@dataclass(frozen=True, slots=True)
class IncidentRow:
    key: str
    severity: int
    status: str
    first_seen: int
    last_seen: int
    events: int
    recent: list[EventRow]
    requests: list[RequestRow]


@dataclass(frozen=True, slots=True)
class OwnerRow:
    key: str
    kind: str
    topic: str
    text: str
    state: str
    attempts: int
    channel: str | None
    last_error: str | None
    created_at: float


@dataclass(frozen=True, slots=True)
class QuarantineRow:
    id: int
    reason: str
    event_id: str | None
    raw: str
    count: int
    last_seen: float


def _title_message(raw: str) -> tuple[str, str]:
    try:
        frame = json.loads(raw)
    except ValueError:
        return "", raw[:300]
    if not isinstance(frame, dict):
        return "", ""
    title, message = frame.get("title", ""), frame.get("message", "")
    return (
        title if isinstance(title, str) else "",
        message[:300] if isinstance(message, str) else "",
    )


def _requests(
    conn: Connection, where: str, params: tuple[Any, ...], limit: int
) -> list[RequestRow]:
    return [
        RequestRow(str(r[0]), str(r[1]), str(r[2]), str(r[3]), int(r[4]), float(r[5]), r[6], r[7])
        for r in conn.execute(
            "SELECT delivery_key, incident_key, reason, state, attempts, due_at, last_error,"
            f" created_at FROM outbox WHERE {where} ORDER BY created_at DESC LIMIT ?",
            (*params, limit),
        )
    ]


def incidents(conn: Connection, *, limit: int = PAGE) -> list[IncidentRow]:
    """The most recently seen incidents, each with its newest events and its triage requests."""
    found = conn.execute(
        "SELECT key, severity, status, first_seen, last_seen, events FROM incidents"
        " ORDER BY last_seen DESC LIMIT ?",
        (limit,),
    ).fetchall()
    rows = []
    for key, severity, status, first_seen, last_seen, events in found:
        recent = [
            EventRow(str(r[0]), str(r[1]), int(r[2]), str(r[3]), str(r[4]), *_title_message(r[5]))
            for r in conn.execute(
                "SELECT event_id, topic, time, outcome, reason, raw FROM inbox"
                " WHERE incident_key = ? ORDER BY time DESC LIMIT ?",
                (key, EVENTS_PER_INCIDENT),
            )
        ]
        requests = _requests(conn, "incident_key = ?", (key,), EVENTS_PER_INCIDENT)
        rows.append(
            IncidentRow(
                str(key),
                int(severity),
                str(status),
                int(first_seen),
                int(last_seen),
                int(events),
                recent,
                requests,
            )
        )
    return rows


def deliveries(conn: Connection, state: str, *, limit: int = PAGE) -> list[RequestRow]:
    """Triage requests in `state` ('pending' counts leased and collecting rows too), newest first."""
    states = ("pending", "leased", "collecting") if state == "pending" else (state,)
    marks = ", ".join("?" for _ in states)
    return _requests(conn, f"state IN ({marks})", states, limit)


def owner_messages(conn: Connection, *, limit: int = PAGE) -> list[OwnerRow]:
    """Owner messages, newest first: sent, pending, dead and suppressed (with the reason)."""
    return [
        OwnerRow(str(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]), int(r[5]), r[6], r[7], r[8])
        for r in conn.execute(
            "SELECT key, kind, topic, text, state, attempts, channel, last_error, created_at"
            " FROM owner_outbox ORDER BY created_at DESC LIMIT ?",
            (limit,),
        )
    ]


def quarantine(conn: Connection, *, limit: int = PAGE) -> list[QuarantineRow]:
    return [
        QuarantineRow(int(r[0]), str(r[1]), r[2], str(r[3])[:4000], int(r[4]), float(r[5]))
        for r in conn.execute(
            "SELECT id, reason, event_id, raw, count, last_seen FROM quarantine"
            " ORDER BY last_seen DESC LIMIT ?",
            (limit,),
        )
    ]


def _tail_lines(path: Path, budget: int) -> Iterator[bytes]:
    """The file's complete lines, newest first, reading at most `budget` bytes from its end."""
    with path.open("rb") as handle:
        end = handle.seek(0, os.SEEK_END)
        start = max(0, end - budget)
        handle.seek(start)
        data = handle.read(end - start)
    lines = data.split(b"\n")
    if start > 0:
        lines = lines[1:]  # the first one is cut
    for line in reversed(lines):
        if line.strip():
            yield line


def audit_tail(
    directory: Path, *, kind: str | None = None, needle: str | None = None, limit: int = PAGE
) -> list[dict[str, Any]]:
    """The newest audit records, newest first, optionally only one `kind` or those whose line
    contains `needle` (an event id, a delivery key, a silence id). Searches a bounded tail."""
    found: list[dict[str, Any]] = []
    budget = _AUDIT_SCAN if (kind or needle) else _TAIL_BYTES
    for path in reversed(audit.log_files(directory)):
        for line in _tail_lines(path, budget):
            if needle and needle.encode("utf-8", "replace") not in line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a torn last line
            if not isinstance(record, dict) or (kind and record.get("kind") != kind):
                continue
            found.append(record)
            if len(found) >= limit:
                return found
        budget -= min(budget, path.stat().st_size)
        if budget <= 0:
            break
    return found
