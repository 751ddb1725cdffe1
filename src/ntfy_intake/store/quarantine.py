"""Quarantine of a value that broke processing: the event gets its one outcome, intake goes on.

The boundary rule (sanitize.valid_utf8 at decode) keeps known hostile values out; this is the
backstop for the ones nobody foresaw. Who is to blame decides what happens:
- a value (a string no writer accepts, a number the engine cannot store, a constraint it breaks):
  the event is recorded with outcome `quarantined` and the error, and is a known id from then on,
  so a replay is a duplicate rather than the same failure again;
- the environment (disk full, database locked, I/O error): nothing is the event's fault; the
  error propagates to the daemon, which waits, latches or exits as DESIGN.md section 2 says.
"""

from __future__ import annotations

import hashlib
import sqlite3

from ntfy_intake.errors import IntakeError
from ntfy_intake.rules import sanitize
from ntfy_intake.store import audit, postgres
from ntfy_intake.store.transaction import Connection
from ntfy_intake.wire.frames import Event, Junk, Message

OUTCOME = "quarantined"
_ERROR_LIMIT = 300


def blames_the_value(exc: BaseException) -> bool:
    """True when `exc` comes from the data being processed, not from storage or the host."""
    if postgres.DRIVER_ERRORS and isinstance(exc, postgres.DRIVER_ERRORS):
        return _pg_blames_the_value(exc)
    if isinstance(exc, sqlite3.IntegrityError | sqlite3.DataError | sqlite3.InterfaceError):
        return True
    if isinstance(exc, sqlite3.ProgrammingError):
        return "closed" not in str(exc)  # binding a value SQLite refuses; a closed conn is ours
    if isinstance(exc, sqlite3.Error | OSError | IntakeError | MemoryError):
        return False
    return isinstance(exc, Exception)


def _pg_blames_the_value(exc: BaseException) -> bool:
    """PostgreSQL: a data exception (SQLSTATE class 22), a broken constraint (23), a program
    limit (54: a key too long for its index) or a value the driver cannot adapt is the value's;
    everything else the driver raises (a lock timeout, a server restart, a lost or terminated
    connection, a full disk, a read-only server) is the environment's, waited out: a value
    blamed for it would be quarantined and lost."""
    import psycopg  # noqa: PLC0415 - DRIVER_ERRORS is empty without it

    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate is not None:
        return str(sqlstate)[:2] in ("22", "23", "54")
    # No SQLSTATE: the driver's own refusal to adapt a value, or a connection that failed.
    return isinstance(exc, psycopg.ProgrammingError | psycopg.DataError)


def describe(exc: BaseException) -> str:
    """One safe line: the error's type and text, controls and surrogates stripped, cut short."""
    return sanitize.one_line(f"{type(exc).__name__}: {exc}", _ERROR_LIMIT)


def record_failed_event(conn: Connection, message: Event, error: str, now: float) -> None:
    """Inside the caller's write transaction: the inbox row, a quarantine row, one `event` record
    (for a message, a delete/clear or an event kind we do not know alike)."""
    reason = f"processing failed: {error}"
    conn.execute(
        "INSERT INTO inbox(event_id, topic, time, expires, raw, raw_sha256, incident_key,"
        " severity, outcome, reason, delivery_key, received_at)"
        " VALUES (?, ?, ?, ?, ?, ?, '', ?, ?, ?, NULL, ?)",
        (
            message.id,
            message.topic,
            message.time or 0,
            message.expires,
            message.raw,
            message.raw_sha256,
            message.effective_priority if isinstance(message, Message) else 0,
            OUTCOME,
            reason,
            now,
        ),
    )
    _quarantine_row(conn, message.raw, message.raw_sha256, reason, message.id, now)
    audit.stage(
        conn,
        "event",
        now,
        event_id=message.id,
        topic=message.topic,
        time=message.time,
        expires=message.expires,
        outcome=OUTCOME,
        reason=reason,
    )


def record_failed_junk(conn: Connection, junk: Junk, error: str, now: float) -> None:
    """A junk frame whose quarantine itself failed: store it again, made safe to store."""
    raw = sanitize.valid_utf8(junk.raw)
    reason = sanitize.one_line(f"{junk.reason}; {error}", _ERROR_LIMIT)
    digest = hashlib.sha256(raw.encode()).hexdigest()
    if _quarantine_row(conn, raw, digest, reason, junk.event_id, now):
        audit.stage(conn, "quarantine", now, event_id=junk.event_id, reason=reason, sha256=digest)


def _quarantine_row(
    conn: Connection,
    raw: str,
    digest: str,
    reason: str,
    event_id: str | None,
    now: float,
) -> bool:
    """Insert or count a quarantine row; True the first time this raw is seen."""
    row = conn.execute(
        "INSERT INTO quarantine(raw_sha256, raw, reason, event_id, first_seen, last_seen, count)"
        " VALUES (?, ?, ?, ?, ?, ?, 1)"
        " ON CONFLICT(raw_sha256) DO UPDATE SET last_seen = excluded.last_seen,"
        " count = quarantine.count + 1 RETURNING count",
        (digest, raw, reason, event_id, now, now),
    ).fetchone()
    return bool(row[0] == 1)
