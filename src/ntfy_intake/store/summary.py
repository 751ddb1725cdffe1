"""What `status` and `check` read: the daemon's last health snapshot and the store's counts, in
one read-only pass over any connection (the CLI opens the file read-only; the daemon need not run).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ntfy_intake.store import audit, db
from ntfy_intake.store.db import Connection

__all__ = ["Cursor", "Outbox", "OwnerOutbox", "Summary", "collecting", "collecting_in", "read"]

HEALTH_KEY = "health"  # the kv row the daemon's vitals write every few seconds
DEAD_KEYS_SHOWN = 50


@dataclass(frozen=True, slots=True)
class Cursor:
    kind: str
    value: str
    updated_at: float


@dataclass(frozen=True, slots=True)
class Outbox:
    """The triage outbox by state; `pending` counts leased rows too (in flight is not done)."""

    collecting: int
    pending: int
    delivered: int
    dead: int
    next_release_at: float | None  # the earliest debounce window to close
    dead_keys: list[str]  # the oldest dead rows' keys, at most DEAD_KEYS_SHOWN


@dataclass(frozen=True, slots=True)
class OwnerOutbox:
    pending: int  # leased rows too
    sent: int
    suppressed: int
    dead: int


@dataclass(frozen=True, slots=True)
class Summary:
    snapshot: dict[str, Any]  # the daemon's last health snapshot; {} when it never wrote one
    cursor: Cursor | None
    last_received_at: float | None  # when the newest inbox row was recorded
    events: int
    incidents: int
    quarantined: int
    unflushed: int  # audit journal rows not yet in the JSONL log
    outbox: Outbox
    owner: OwnerOutbox


def read(conn: Connection) -> Summary:
    row = conn.execute("SELECT value FROM kv WHERE name = ?", (HEALTH_KEY,)).fetchone()
    snapshot: dict[str, Any] = json.loads(row[0]) if row else {}
    found = conn.execute("SELECT kind, value, updated_at FROM cursor WHERE id = 1").fetchone()
    cursor = None if found is None else Cursor(found[0], found[1], float(found[2]))
    last = _scalar(conn, "SELECT (SELECT received_at FROM inbox ORDER BY seq DESC LIMIT 1)")
    return Summary(
        snapshot=snapshot,
        cursor=cursor,
        last_received_at=None if last is None else float(last),
        events=_scalar(conn, "SELECT count(*) FROM inbox"),
        incidents=_scalar(conn, "SELECT count(*) FROM incidents"),
        quarantined=_scalar(conn, "SELECT count(*) FROM quarantine"),
        unflushed=_scalar(
            conn, "SELECT count(*) FROM audit_journal WHERE seq > ?", audit.flushed_seq(conn)
        ),
        outbox=_outbox(conn),
        owner=_owner(conn),
    )


def _outbox(conn: Connection) -> Outbox:
    states = _by_state(conn, "SELECT state, count(*) FROM outbox GROUP BY state")
    release = _scalar(conn, "SELECT min(due_at) FROM outbox WHERE state = 'collecting'")
    dead_keys = [
        row[0]
        for row in conn.execute(
            "SELECT delivery_key FROM outbox WHERE state = 'dead' ORDER BY created_at LIMIT ?",
            (DEAD_KEYS_SHOWN,),
        )
    ]
    return Outbox(
        collecting=states.get("collecting", 0),
        pending=states.get("pending", 0) + states.get("leased", 0),
        delivered=states.get("delivered", 0),
        dead=states.get("dead", 0),
        next_release_at=None if release is None else float(release),
        dead_keys=dead_keys,
    )


def _owner(conn: Connection) -> OwnerOutbox:
    states = _by_state(conn, "SELECT state, count(*) FROM owner_outbox GROUP BY state")
    return OwnerOutbox(
        pending=states.get("pending", 0) + states.get("leased", 0),
        sent=states.get("sent", 0),
        suppressed=states.get("suppressed", 0),
        dead=states.get("dead", 0),
    )


def _by_state(conn: Connection, sql: str) -> dict[str, int]:
    return {str(row[0]): int(row[1]) for row in conn.execute(sql)}


def _scalar(conn: Connection, sql: str, *params: object) -> Any:
    return conn.execute(sql, params).fetchone()[0]


def collecting(conn: Connection) -> tuple[int, float | None]:
    """How many triage requests wait in their debounce window, and when the first is released."""
    count, due = conn.execute(
        "SELECT count(*), min(due_at) FROM outbox WHERE state = 'collecting'"
    ).fetchone()
    return int(count), None if due is None else float(due)


def collecting_in(path: db.Target | str) -> tuple[int, float | None] | None:
    """`collecting` of the store at `path`, opened read-only for this one read (waiting at most
    a second for a lock); None when it cannot be read: no such file, no outbox yet."""
    target = db.target_of(path)
    try:
        if isinstance(target, Path):
            conn: Connection = sqlite3.connect(f"file:{target}?mode=ro", uri=True, timeout=1.0)
        else:
            conn = db.connect(target, readonly=True)
        try:
            return collecting(conn)
        finally:
            conn.close()
    except db.ERRORS:
        return None
