"""The inbox transaction: every frame of a batch is recorded in ONE `BEGIN IMMEDIATE` transaction.

Per message: inbox row (PK = ntfy id; identical body = duplicate, different body = conflict,
which goes to the quarantine), incident merge, cadence decision, outbox row, feed entry on release,
and the audit journal record. Junk frames go to the quarantine with their reason (stored once per
distinct raw line however often ntfy replays it). Any exception rolls every table back.

Cadence decisions are made on a fork of the live cadence state, which the caller adopts only
after COMMIT (`OwnerQueue.adopt`), so a rollback changes nothing.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import structlog

from ntfy_intake import audit, cadence, db, incidents, outbox, quarantine
from ntfy_intake.frames import Junk, Message
from ntfy_intake.owner_queue import Notice, OwnerQueue, Record

log = structlog.get_logger("ntfy_intake.inbox")

# An id rebuilt from an audit line that predates `sha256`: its body is unknown, so a replay of
# it counts as a duplicate (the safe direction: it already has its one outcome).
REBUILT_UNKNOWN_SHA256 = "unknown"


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
    records: list[Record] = field(default_factory=list)  # cadence records written this batch
    state: cadence.CadenceState | None = None  # the cadence state with them folded in


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
    """Record a batch in one transaction. When a value in it breaks processing (the transaction
    rolled back, nothing recorded), the frames are recorded one transaction each instead, and
    the frame that still fails alone gets outcome `quarantined` with the error: no value read
    from ntfy can stop intake. Storage failures are not blamed on a value and propagate."""
    record = functools.partial(
        _record_batch,
        conn,
        now=now,
        queue=queue,
        relay_enabled=relay_enabled,
        feed_append=feed_append,
        before_commit=before_commit,
    )
    try:
        return record(frames, queue.state)
    except Exception as exc:
        if not quarantine.blames_the_value(exc):
            raise
        log.warning("inbox.batch_failed_one_by_one", frames=len(frames), error=repr(exc))
    return _one_by_one(conn, frames, now, queue.state, record)


def _record_batch(
    conn: sqlite3.Connection,
    frames: Sequence[Message | Junk | Notice],
    state: cadence.CadenceState,
    *,
    now: float,
    queue: OwnerQueue,
    relay_enabled: bool,
    feed_append: outbox.FeedAppend | None = None,
    before_commit: db.BeforeCommit | None = None,
) -> BatchResult:
    batch = _Batch(conn, now, queue.policy, state.fork())
    with db.write_txn(conn, before_commit=before_commit):
        batch.prefetch([f.id for f in frames if isinstance(f, Message)])
        for index, frame in enumerate(frames):
            if isinstance(frame, Message):
                batch.message(index, frame)
            elif isinstance(frame, Junk):
                _quarantine(conn, frame, frame.reason, now, batch.result)
            else:
                records = queue.notice(conn, frame, now, state=batch.work)
                for record in records:
                    batch.work.apply(record)
                batch.result.records.extend(records)
        batch.write()
        batch.result.released = outbox.release_due(
            conn, now, relay_enabled=relay_enabled, feed_append=feed_append
        )
    batch.result.state = batch.work
    return batch.result


def _one_by_one(
    conn: sqlite3.Connection,
    frames: Sequence[Message | Junk | Notice],
    now: float,
    state: cadence.CadenceState,
    record: Callable[[Sequence[Message | Junk | Notice], cadence.CadenceState], BatchResult],
) -> BatchResult:
    total = BatchResult(state=state)
    for index, frame in enumerate(frames):
        try:
            result = record([frame], state)
        except Exception as exc:
            if not quarantine.blames_the_value(exc):
                raise
            _quarantine_failed(conn, frame, exc, now, total, index)
            continue
        state = result.state or state
        total.state = state
        total.candidates.extend(replace(c, index=index) for c in result.candidates)
        total.recorded += result.recorded
        total.duplicates += result.duplicates
        total.conflicts += result.conflicts
        total.quarantined += result.quarantined
        total.released.extend(result.released)
        total.records.extend(result.records)
    return total


def _quarantine_failed(
    conn: sqlite3.Connection,
    frame: Message | Junk | Notice,
    exc: Exception,
    now: float,
    total: BatchResult,
    index: int,
) -> None:
    """The frame failed on its own: record that, in its own small transaction."""
    error = quarantine.describe(exc)
    log.error("inbox.event_quarantined", error=error, event_id=getattr(frame, "id", None))
    try:
        with db.write_txn(conn):
            if isinstance(frame, Message):
                quarantine.record_failed_event(conn, frame, error, now)
            elif isinstance(frame, Junk):
                quarantine.record_failed_junk(conn, frame, error, now)
            else:
                return  # a notice is ours, not read from anyone: logged above, never retried
    except Exception as again:
        if not quarantine.blames_the_value(again):
            raise
        log.error("inbox.quarantine_failed", error=quarantine.describe(again))
        return
    total.quarantined += 1
    if isinstance(frame, Message):
        total.candidates.append(Candidate(index, frame.id, frame.time, frame.cached))


_INSERT_INBOX = (
    "INSERT INTO inbox(event_id, topic, time, expires, raw, raw_sha256, incident_key, severity,"
    " outcome, reason, delivery_key, received_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


class _Batch:
    """One batch's working set. A backlog repeats a few incidents many times, so each incident
    is read once and written once per batch, and known ids are fetched in one query."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        now: float,
        policy: cadence.Policy,
        work: cadence.CadenceState,
    ) -> None:
        self.conn = conn
        self.now = now
        self.policy = policy
        self.work = work  # decisions see earlier events of this batch; live state untouched
        self.result = BatchResult()
        self.known: dict[str, str] = {}  # event id -> body hash, of recorded events
        self.touched: dict[str, incidents.IncidentState] = {}
        self.collecting: dict[str, bool] = {}
        self.inbox_rows: list[tuple[object, ...]] = []
        self.attach_rows: list[tuple[str, str]] = []
        self.journal: list[str] = []  # event records, staged together at the end

    def prefetch(self, ids: list[str]) -> None:
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            self.known.update(
                self.conn.execute(
                    f"SELECT event_id, raw_sha256 FROM inbox WHERE event_id IN ({marks})", chunk
                ).fetchall()
            )

    def message(self, index: int, message: Message) -> None:
        result = self.result
        known = self.known.get(message.id)
        if known is not None:
            if known in (message.raw_sha256, REBUILT_UNKNOWN_SHA256):
                result.duplicates += 1
                result.candidates.append(Candidate(index, message.id, message.time, message.cached))
            else:
                result.conflicts += 1
                reason = "conflict: id already recorded with a different body"
                _quarantine(
                    self.conn, Junk(message.raw, reason, message.id), reason, self.now, result
                )
            return
        self.known[message.id] = message.raw_sha256

        signal = incidents.signal_of(message)
        before = self.touched.get(signal.key) or _load_incident(self.conn, signal.key)
        after = incidents.merge(before, signal, message)
        self.touched[signal.key] = after
        view = cadence.IncidentView(after.key, after.severity, after.status, is_new=before is None)
        decision = self.work.decide_event(self.policy, view, message.id, self.now)
        if decision.outcome == "joined" and not self._still_collecting(decision.delivery_key):
            # Only a wall clock stepping backwards can close a window early; never join a
            # request whose payload is already frozen: open a fresh one instead.
            decision = cadence.Decision(
                "triage_requested",
                "window_closed",
                cadence.delivery_key_for(message.id),
                self.now + self.policy.debounce,
            )
        if decision.outcome == "triage_requested":
            assert decision.delivery_key is not None and decision.due_at is not None
            outbox.create(
                self.conn,
                decision.delivery_key,
                signal.key,
                decision.reason,
                decision.due_at,
                self.now,
            )
            self.collecting[decision.delivery_key] = True
        if decision.delivery_key is not None:
            self.attach_rows.append((decision.delivery_key, message.id))
        self.inbox_rows.append(
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
                self.now,
            )
        )
        record = cadence.event_record(
            decision,
            view,
            message.id,
            self.now,
            topic=message.topic,
            time=message.time,
            expires=message.expires,
            sha256=message.raw_sha256,
        )
        self.journal.append(audit.encode(record))
        self.work.apply(record)
        result.records.append(record)
        result.recorded += 1
        result.candidates.append(Candidate(index, message.id, message.time, message.cached))

    def _still_collecting(self, key: str | None) -> bool:
        if key is None:
            return False
        if key not in self.collecting:
            row = self.conn.execute(
                "SELECT state FROM outbox WHERE delivery_key = ?", (key,)
            ).fetchone()
            self.collecting[key] = row is not None and row[0] == "collecting"
        return self.collecting[key]

    def write(self) -> None:
        """The rows gathered in memory, before anything reads them back (release_due does)."""
        self.conn.executemany(_INSERT_INBOX, self.inbox_rows)
        self.conn.executemany(
            "INSERT OR IGNORE INTO outbox_events(delivery_key, event_id) VALUES (?, ?)",
            self.attach_rows,
        )
        for state in self.touched.values():
            _save_incident(self.conn, state)
        audit.stage_encoded(self.conn, self.journal)


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
