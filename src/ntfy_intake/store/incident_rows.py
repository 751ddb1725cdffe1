"""An incident's row: how the inbox transaction reads and writes the `incidents` table.

The state itself (what a merge does) is the pure `rules/incidents.py`; this is its storage."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ntfy_intake.rules import incidents
from ntfy_intake.store.transaction import Connection

SELECT = (
    "SELECT key, severity, status, status_time, status_event, first_seen, last_seen, events,"
    " version FROM incidents"
)
SAVE = (
    "INSERT INTO incidents(key, severity, status, status_time, status_event, first_seen,"
    " last_seen, events, version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT(key) DO UPDATE SET severity = excluded.severity, status = excluded.status,"
    " status_time = excluded.status_time, status_event = excluded.status_event,"
    " first_seen = excluded.first_seen, last_seen = excluded.last_seen,"
    " events = excluded.events, version = excluded.version"
)


def load(conn: Connection, key: str) -> incidents.IncidentState | None:
    row = conn.execute(f"{SELECT} WHERE key = ?", (key,)).fetchone()
    return None if row is None else from_row(row)


def from_row(row: Sequence[Any]) -> incidents.IncidentState:
    return incidents.IncidentState(
        key=row[0],
        severity=row[1],
        status=row[2],
        status_at=(row[3], row[4]),
        first_seen=row[5],
        last_seen=row[6],
        events=row[7],
        version=row[8],
    )


def to_row(state: incidents.IncidentState) -> tuple[object, ...]:
    return (
        state.key,
        state.severity,
        state.status,
        state.status_at[0],
        state.status_at[1],
        state.first_seen,
        state.last_seen,
        state.events,
        state.version,
    )
