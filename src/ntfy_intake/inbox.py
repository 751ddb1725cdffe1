"""The inbox transaction: every frame of a batch is recorded in ONE `BEGIN IMMEDIATE` transaction.

Per message: inbox row (PK = ntfy id; identical body = duplicate, different body = conflict,
which goes to the quarantine), incident merge, cadence decision, outbox row, feed entry on release,
and the audit journal record. Junk frames go to the quarantine with their reason (stored once per
distinct raw line however often ntfy replays it). Any exception rolls every table back.

Cadence decisions are made on a fork of the live cadence state; the caller folds the returned
records into the live state only after COMMIT (`OwnerQueue.commit`), so a rollback changes nothing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field

from ntfy_intake import audit, cadence, db, incidents, outbox
from ntfy_intake.frames import Junk, Message
from ntfy_intake.owner_queue import Notice, OwnerQueue, Record


@dataclass(frozen=True, slots=True)
class Candidate:
    """An event whose outcome is now durable in SQLite: a possible resume point once audited."""

    index: int  # position of the frame in the batch
    event_id: str
    message_time: int
    cached: bool


@dataclass(slots=True)
class BatchResult:
    candidates: list[Candidate] = field(default_factory=list)
    recorded: int = 0
    duplicates: int = 0
    conflicts: int = 0
    quarantined: int = 0
    released: list[str] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)  # cadence records to fold after COMMIT


def record_batch(
    conn: sqlite3.Connection,
    frames: Sequence[Message | Junk | Notice],
    now: float,
    *,
    queue: OwnerQueue,
    relay_enabled: bool,
    feed_append: outbox.FeedAppend | None = None,
    before_commit: db.BeforeCommit | None = None,
) -> BatchResult:
    result = BatchResult()
    work = queue.state.fork()  # decisions see earlier events of this batch; live state untouched
    with db.write_txn(conn, before_commit=before_commit):
        for index, frame in enumerate(frames):
            if isinstance(frame, Message):
                _record_message(conn, index, frame, now, queue.policy, work, result)
            elif isinstance(frame, Junk):
                _quarantine(conn, frame, frame.reason, now, result)
            else:
                records = queue.notice(conn, frame, now, state=work)
                for record in records:
                    work.apply(record)
                result.records.extend(records)
        result.released = outbox.release_due(
            conn, now, relay_enabled=relay_enabled, feed_append=feed_append
        )
    return result


def _record_message(
    conn: sqlite3.Connection,
    index: int,
    message: Message,
    now: float,
    policy: cadence.Policy,
    work: cadence.CadenceState,
    result: BatchResult,
) -> None:
    existing = conn.execute(
        "SELECT raw_sha256 FROM inbox WHERE event_id = ?", (message.id,)
    ).fetchone()
    if existing is not None:
        if existing[0] == message.raw_sha256:
            result.duplicates += 1
            result.candidates.append(Candidate(index, message.id, message.time, message.cached))
        else:
            result.conflicts += 1
            reason = "conflict: id already recorded with a different body"
            _quarantine(conn, Junk(message.raw, reason, message.id), reason, now, result)
        return

    signal = incidents.signal_of(message)
    before = _load_incident(conn, signal.key)
    after = incidents.merge(before, signal, message)
    view = cadence.IncidentView(after.key, after.severity, after.status, is_new=before is None)
    decision = work.decide_event(policy, view, message.id, now)
    if decision.outcome == "joined" and not _still_collecting(conn, decision.delivery_key):
        # Only a wall clock stepping backwards can close a window early; never join a request
        # whose payload is already frozen: open a fresh one instead.
        decision = cadence.Decision(
            "triage_requested",
            "window_closed",
            cadence.delivery_key_for(message.id),
            now + policy.debounce,
        )
    if decision.outcome == "triage_requested":
        assert decision.delivery_key is not None and decision.due_at is not None
        outbox.create(
            conn, decision.delivery_key, signal.key, decision.reason, decision.due_at, now
        )
    if decision.delivery_key is not None:
        outbox.attach(conn, decision.delivery_key, message.id)
    _save_incident(conn, after)
    conn.execute(
        "INSERT INTO inbox(event_id, topic, time, expires, raw, raw_sha256, incident_key,"
        " severity, outcome, reason, delivery_key, received_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            message.id,
            message.topic,
            message.time,
            message.expires,
            message.raw,
            message.raw_sha256,
            signal.key,
            signal.severity,
            decision.outcome,
            decision.reason,
            decision.delivery_key,
            now,
        ),
    )
    record = cadence.event_record(
        decision, view, message.id, now, topic=message.topic, time=message.time
    )
    audit.stage(conn, "event", now, **{k: v for k, v in record.items() if k not in ("ts", "kind")})
    work.apply(record)
    result.records.append(record)
    result.recorded += 1
    result.candidates.append(Candidate(index, message.id, message.time, message.cached))


def _load_incident(conn: sqlite3.Connection, key: str) -> incidents.IncidentState | None:
    row = conn.execute(
        "SELECT key, severity, status, status_time, status_event, first_seen, last_seen, events,"
        " version FROM incidents WHERE key = ?",
        (key,),
    ).fetchone()
    if row is None:
        return None
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


def _still_collecting(conn: sqlite3.Connection, key: str | None) -> bool:
    row = conn.execute("SELECT state FROM outbox WHERE delivery_key = ?", (key,)).fetchone()
    return row is not None and row[0] == "collecting"


def _save_incident(conn: sqlite3.Connection, state: incidents.IncidentState) -> None:
    conn.execute(
        "INSERT INTO incidents(key, severity, status, status_time, status_event, first_seen,"
        " last_seen, events, version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT(key) DO UPDATE SET severity = excluded.severity, status = excluded.status,"
        " status_time = excluded.status_time, status_event = excluded.status_event,"
        " first_seen = excluded.first_seen, last_seen = excluded.last_seen,"
        " events = excluded.events, version = excluded.version",
        (
            state.key,
            state.severity,
            state.status,
            state.status_at[0],
            state.status_at[1],
            state.first_seen,
            state.last_seen,
            state.events,
            state.version,
        ),
    )


def _quarantine(
    conn: sqlite3.Connection, junk: Junk, reason: str, now: float, result: BatchResult
) -> None:
    cursor = conn.execute(
        "INSERT INTO quarantine(raw_sha256, raw, reason, event_id, first_seen, last_seen, count)"
        " VALUES (?, ?, ?, ?, ?, ?, 1)"
        " ON CONFLICT(raw_sha256) DO UPDATE SET last_seen = excluded.last_seen,"
        " count = count + 1 RETURNING count",
        (junk.raw_sha256, junk.raw, reason, junk.event_id, now, now),
    )
    first_time = cursor.fetchone()[0] == 1
    if first_time:
        # One audit record per distinct bad frame, not per replay of it.
        audit.stage(
            conn, "quarantine", now, event_id=junk.event_id, reason=reason, sha256=junk.raw_sha256
        )
        result.quarantined += 1
