"""Rebuild the database from the audit log: a missing or empty database beside an audit log is not
a first start (DESIGN.md section 4).

The audit log is the system of record. From it, before subscribing, come back:
- known ids (an inbox row per `event` line, with the body's hash, so a replay is a duplicate),
- the cursor: the last audited *cached* event (an `event` line with `expires`); with none, the
  time of the last event, inclusive (over-replay, absorbed by the known ids),
- `seq`: journal numbering continues above the highest line, everything in the files is flushed
  (lines may carry `term`, the leadership term they were written under: not needed here),
- incidents, as the last `event` line of each says they stood,
- triage requests with their state: audited `delivered` stays delivered; released (a `release`
  line carries the frozen payload) but not delivered is pending again under the same key, so
  receivers deduplicate; never released is collecting again, its window from its first event,
- feed entries of released requests, in release order (feed cursors cannot be known: they
  restart at each channel's head),
- owner messages with their text: audited `sent` or `suppressed` stay so, anything else is
  pending again under the same key,
- the owner's acks (`owner_reply` lines with result `acknowledged`): the newest per incident,
  at the incident's version as the lines before it fold it (the same count as the rebuilt
  incident's, so an ack that ended before the loss is ended after it too). Silences need
  nothing here: they are audit records only, folded into the cadence state at every start.
- the feed's `incident_info` channel, entry by entry in audit order, so each keeps its seq: the
  owner's acks (from those `owner_reply` lines) and the deletes/clears that came after their
  request went out (their `event` lines carry `info_for`, the request's key; lines written
  before that field restore no entry: `_DeviceNote`),
- the Signal timestamps of sent owner messages (`signal_ts` on their `owner_message` lines), so
  a reply quoting a message sent before the loss still finds it, each with its incident's
  version as the lines before it fold it (the firing the message showed, counted as the
  rebuilt incident's: a quoted ack of a message whose firing ended is refused after it too).
One `rebuilt_from_audit` record is staged; the caller adds the one owner notice.

Known limit: a request still collecting when the database was lost is rebuilt from its event
lines, which carry ids, topic and time but not the message text.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ntfy_intake.rules import cadence, timestamps
from ntfy_intake.rules.batch_plan import REBUILT_UNKNOWN_SHA256, device_note
from ntfy_intake.store import audit, audit_mirror, db, dialect, feed
from ntfy_intake.store.cursor import Cursor
from ntfy_intake.store.cursor import save as save_cursor
from ntfy_intake.store.transaction import Connection

_STATUSES = ("firing", "resolved")
FeedAppend = Callable[[Connection, str, dict[str, Any], str, float], None]
Record = Mapping[str, Any]


def remove_orphan_wal(database: Path) -> None:
    """A WAL or shared-memory file left beside a deleted database belongs to that database:
    SQLite would replay its pages into the new, empty file."""
    if database.exists():
        return
    for suffix in ("-wal", "-shm", "-journal"):
        orphan = database.with_name(database.name + suffix)
        if orphan.exists():
            orphan.unlink()


def is_empty(conn: Connection) -> bool:
    """Nothing was ever recorded in this (migrated) database."""
    for table in ("cursor", "inbox", "audit_journal", "owner_outbox"):
        if conn.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchone() is not None:
            return False
    return audit.flushed_seq(conn) == 0


@dataclass(slots=True)
class _Request:
    incident: str
    reason: str
    opened_at: float
    events: list[str] = field(default_factory=list)
    payload: dict[str, Any] | None = None
    summary: str = ""
    released_seq: int = 0
    delivered_at: float | None = None


@dataclass(slots=True)
class _OwnerMessage:
    kind: str  # notice | triage
    topic: str
    text: str
    created_at: float
    state: str = "pending"


@dataclass(frozen=True, slots=True)
class _DeviceNote:
    """A delete/clear that reached agents (its `event` line carries `info_for`: the delivery
    key of the request it came after, "" when its message joined none). Lines written before
    that field existed restore no entry: which request the planner found, and whether it was
    still collecting, were read from the lost database and cannot be folded back."""

    record: Record
    at: float


@dataclass(frozen=True, slots=True)
class _OwnerAck:
    """The owner's ack (an `owner_reply` line, result `acknowledged`) at the incident's version
    as the lines before it fold it; `record["key"]` the owner message it answered, `via` the
    button's (a Signal reply's line names none)."""

    incident: str
    version: int
    at: float
    record: Record


_Info = _DeviceNote | _OwnerAck


@dataclass(frozen=True, slots=True)
class Summary:
    events: int
    requests: int
    pending_again: int
    owner_messages: int
    feed_entries: int
    seq: int
    cursor: str

    def __str__(self) -> str:
        return (
            f"{self.events} known ids, cursor {self.cursor}, {self.requests} triage requests "
            f"({self.pending_again} pending again), {self.owner_messages} owner messages, "
            f"{self.feed_entries} feed entries, seq {self.seq}"
        )


@dataclass(slots=True)
class _Fold:
    top_seq: int = 0
    events: dict[str, Record] = field(default_factory=dict)
    incidents: dict[str, list[Record]] = field(default_factory=dict)
    requests: dict[str, _Request] = field(default_factory=dict)
    owner: dict[str, _OwnerMessage] = field(default_factory=dict)
    acks: dict[str, tuple[int, float]] = field(default_factory=dict)  # incident: (version, at)
    # The `incident_info` channel's entries, in the order they were written (`_info`).
    info: list[_Info] = field(default_factory=list)
    # ts: (key, at, the incident's version then)
    signal_sent: dict[int, tuple[str, float, int | None]] = field(default_factory=dict)
    cursor_record: Record | None = None
    last_event: Record | None = None

    def apply(self, record: Record) -> None:
        seq = record.get("seq")
        if isinstance(seq, int):
            self.top_seq = max(self.top_seq, seq)
        ts = timestamps.parse_ts(record.get("ts")) or 0.0
        kind = record.get("kind")
        if kind == "event":
            self._event(record, ts)
        elif kind == "release":
            self._release(record, seq if isinstance(seq, int) else 0)
        elif kind == "delivery" and record.get("result") == "delivered":
            request = self.requests.get(str(record.get("delivery_key")))
            if request is not None and request.delivered_at is None:
                request.delivered_at = ts
        elif kind == "notice":
            self._notice(record, ts)
        elif kind == "owner_message":
            self._owner_message(record, ts)
        elif kind == "owner_reply" and record.get("result") == "acknowledged":
            incident = record.get("incident")
            if isinstance(incident, str) and incident in self.incidents:
                version = _version(self.incidents[incident])
                self.acks[incident] = (version, ts)
                self.info.append(_OwnerAck(incident, version, ts, record))

    def _event(self, record: Record, ts: float) -> None:
        event_id = record.get("event_id")
        if not isinstance(event_id, str) or event_id in self.events:
            return
        self.events[event_id] = record
        self.last_event = record
        if isinstance(record.get("info_for"), str) and isinstance(record.get("incident"), str):
            self.info.append(_DeviceNote(record, ts))
        if isinstance(record.get("expires"), int) and isinstance(record.get("time"), int):
            self.cursor_record = record
        incident = record.get("incident")
        # A frame that decides nothing (a delete/clear: rules/cadence_records.action_record)
        # names its incident but carries no status: live it merges into no incident (no
        # version, severity, event count or last seen), so the fold passes it by too.
        if isinstance(incident, str) and incident and record.get("status") in _STATUSES:
            self.incidents.setdefault(incident, []).append(record)
        key = record.get("delivery_key")
        if not isinstance(key, str):
            return
        if record.get("outcome") == "triage_requested" and key not in self.requests:
            self.requests[key] = _Request(str(incident), str(record.get("reason")), ts)
        if key in self.requests:
            self.requests[key].events.append(event_id)

    def _shown_version(self, key: str) -> int | None:
        """The version of the incident the owner message `key` is about, as folded so far (the
        live sender reads it in the transaction that stages the line: store/owner_replies)."""
        prefix, _, delivery_key = key.partition(":")
        request = self.requests.get(delivery_key) if prefix in ("notify", "escalate") else None
        lines = None if request is None else self.incidents.get(request.incident)
        return None if not lines else _version(lines)

    def _release(self, record: Record, seq: int) -> None:
        request = self.requests.get(str(record.get("delivery_key")))
        payload = record.get("payload")
        if request is not None and isinstance(payload, dict) and request.payload is None:
            request.payload = payload
            request.summary = str(record.get("summary") or request.incident)
            request.released_seq = seq

    def _notice(self, record: Record, ts: float) -> None:
        key, text = record.get("key"), record.get("text")
        if isinstance(key, str) and isinstance(text, str) and key not in self.owner:
            self.owner[key] = _OwnerMessage("notice", str(record.get("notice")), text, ts)

    def _owner_message(self, record: Record, ts: float) -> None:
        key, result = record.get("key"), record.get("result")
        if not isinstance(key, str):
            return
        signal_ts = record.get("signal_ts")
        if isinstance(signal_ts, int) and not isinstance(signal_ts, bool):
            self.signal_sent.setdefault(signal_ts, (key, ts, self._shown_version(key)))
        message = self.owner.get(key)
        if message is None:
            text = record.get("text")
            kind = record.get("message_kind", "triage")
            if kind not in ("triage", "escalation") or not isinstance(text, str):
                return
            # An escalation (flow/escalator.py) is sent as a triage row; its key is what keeps
            # it once per request after a rebuild.
            topic = "escalation" if kind == "escalation" else "triage"
            message = self.owner[key] = _OwnerMessage("triage", topic, text, ts)
        if result == "suppressed":
            message.state = "suppressed"
        elif result == "sent":
            message.state = "sent"


def from_audit(
    conn: Connection,
    audit_dir: Path,
    now: float,
    *,
    debounce: float,
    relay_enabled: bool,
    feed_append: FeedAppend | None,
) -> Summary | None:
    """Rebuild an empty database from the audit log; None when the log holds nothing."""
    fold = _Fold()
    records = sorted(
        (r for r in audit.read_records(audit_dir) if isinstance(r.get("seq"), int)),
        key=lambda r: int(r["seq"]),
    )
    for record in records:
        fold.apply(record)
    if fold.top_seq == 0:
        return None
    cursor = _cursor(fold)
    with db.write_txn(conn):
        _inbox(conn, fold.events.values(), now)
        _incidents(conn, fold.incidents)
        pending_again, feed_entries = _requests(
            conn, fold.requests, now, debounce, relay_enabled, feed_append
        )
        _owner(conn, fold.owner, now)
        _acks(conn, fold.acks)
        feed_entries += _info(conn, fold.info)
        _signal_sent(conn, fold.signal_sent)
        _seq(conn, fold.top_seq)
    save_cursor(conn, cursor, now)
    summary = Summary(
        events=len(fold.events),
        requests=len(fold.requests),
        pending_again=pending_again,
        owner_messages=len(fold.owner),
        feed_entries=feed_entries,
        seq=fold.top_seq,
        cursor=f"{cursor.kind}:{cursor.value}",
    )
    with db.write_txn(conn):
        audit.stage(
            conn,
            "rebuilt_from_audit",
            now,
            events=summary.events,
            requests=summary.requests,
            pending_again=summary.pending_again,
            owner_messages=summary.owner_messages,
            feed_entries=summary.feed_entries,
            top_seq=summary.seq,
            cursor=summary.cursor,
        )
    return summary


def _cursor(fold: _Fold) -> Cursor:
    record = fold.cursor_record
    if record is not None:
        return Cursor.at_id(str(record["event_id"]), int(record["time"]))
    last = fold.last_event
    if last is not None and isinstance(last.get("time"), int):
        return Cursor.at_time(int(last["time"]))
    return Cursor.everything()


def _inbox(conn: Connection, events: Iterable[Record], now: float) -> None:
    rows = []
    for record in events:
        event_id = str(record["event_id"])
        time = record.get("time") if isinstance(record.get("time"), int) else 0
        topic = record.get("topic") if isinstance(record.get("topic"), str) else ""
        expires = record.get("expires") if isinstance(record.get("expires"), int) else None
        frame: dict[str, Any] = {"event": "message", "id": event_id, "time": time, "topic": topic}
        if expires is not None:
            frame["expires"] = expires
        sha = record.get("sha256")
        rows.append(
            (
                event_id,
                topic,
                time,
                expires,
                json.dumps(frame, sort_keys=True, separators=(",", ":")),
                sha if isinstance(sha, str) else REBUILT_UNKNOWN_SHA256,
                str(record.get("incident") or ""),
                record.get("severity") if isinstance(record.get("severity"), int) else 3,
                str(record.get("outcome") or "recorded"),
                str(record.get("reason") or "rebuilt"),
                record.get("delivery_key") if isinstance(record.get("delivery_key"), str) else None,
                timestamps.parse_ts(record.get("ts")) or now,
            )
        )
    conn.executemany(
        "INSERT INTO inbox(event_id, topic, time, expires, raw, raw_sha256,"
        " incident_key, severity, outcome, reason, delivery_key, received_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        rows,
    )


def _incidents(conn: Connection, incidents: Mapping[str, list[Record]]) -> None:
    for key, records in incidents.items():
        last = records[-1]
        times = [r["time"] for r in records if isinstance(r.get("time"), int)] or [0]
        versions = _version(records)
        status = last.get("status") if last.get("status") in ("firing", "resolved") else "firing"
        severity = last.get("severity") if isinstance(last.get("severity"), int) else 3
        conn.execute(
            "INSERT INTO incidents(key, severity, status, status_time, status_event,"
            " first_seen, last_seen, events, version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT(key) DO UPDATE SET severity = excluded.severity,"
            " status = excluded.status, status_time = excluded.status_time,"
            " status_event = excluded.status_event, first_seen = excluded.first_seen,"
            " last_seen = excluded.last_seen, events = excluded.events,"
            " version = excluded.version",
            (
                key,
                severity,
                status,
                max(times),
                str(last["event_id"]),
                min(times),
                max(times),
                len(records),
                versions,
            ),
        )


def _version(records: list[Record]) -> int:
    """An incident's version after `records` (its event lines in order): one more at each change
    of severity or status, as rules/incidents.merge counts it."""
    return 1 + sum(
        1
        for before, after in itertools.pairwise(records)
        if (before.get("severity"), before.get("status"))
        != (after.get("severity"), after.get("status"))
    )


def _acks(conn: Connection, acks: Mapping[str, tuple[int, float]]) -> None:
    """An ack that ended since (the incident fired again, its severity rose) is restored too:
    store/owner_replies.ack_holds drops it at its first read, as it would have live."""
    conn.executemany(
        "INSERT INTO owner_acks(incident_key, version, acked_at) VALUES (?, ?, ?)"
        " ON CONFLICT (incident_key) DO NOTHING",
        [(incident, version, at) for incident, (version, at) in acks.items()],
    )


def _info(conn: Connection, entries: list[_Info]) -> int:
    """The `incident_info` channel as it was written, entry by entry in audit order (the order
    of the transactions that wrote them), so each takes the seq it had and an agent's cursor
    on the channel points where it did. Each entry is appended by the call and under the
    idempotency key that wrote it live: a second ack in one episode appends nothing, as then.
    `created_at` is the line's time, to the millisecond the audit log keeps."""
    for entry in entries:
        if isinstance(entry, _OwnerAck):
            key, via = entry.record.get("key"), entry.record.get("via", "signal")
            feed.append_owner_ack(
                conn,
                entry.incident,
                entry.version,
                entry.at,
                about=key if isinstance(key, str) else None,
                via=str(via),
            )
            continue
        record = entry.record
        note = device_note(
            record["incident"],
            kind=record.get("event"),
            event_id=record["event_id"],
            sequence_id=record.get("sequence_id"),
            topic=record.get("topic", ""),
            time=record.get("time"),
            delivery_key=record["info_for"] or None,
        )
        feed.append_unread(
            conn,
            feed.INFO_CHANNEL,
            note.payload,
            delivery_key=note.event_id,
            sender=feed.FEED_SENDER,
            summary=note.summary,
            idempotency_key=note.event_id,
            now=entry.at,
        )
    return feed.head_of(conn, feed.INFO_CHANNEL)


def _signal_sent(conn: Connection, sent: Mapping[int, tuple[str, float, int | None]]) -> None:
    """The Signal timestamps of sent owner messages: what the owner's replies quote."""
    conn.executemany(
        "INSERT INTO owner_signal_sent(signal_ts, key, sent_at, incident_version)"
        " VALUES (?, ?, ?, ?) ON CONFLICT (signal_ts) DO NOTHING",
        [(signal_ts, *row) for signal_ts, row in sent.items()],
    )


def _requests(
    conn: Connection,
    requests: Mapping[str, _Request],
    now: float,
    debounce: float,
    relay_enabled: bool,
    feed_append: FeedAppend | None,
) -> tuple[int, int]:
    pending_again = feed_entries = 0
    for key, request in requests.items():
        if request.delivered_at is not None:
            state, due, settled = "delivered", request.delivered_at, request.delivered_at
        elif request.payload is not None:
            state, due, settled = ("pending" if relay_enabled else "skipped"), now, None
            pending_again += relay_enabled
        else:
            state, due, settled = (
                "collecting",
                cadence.debounce_end(request.opened_at, debounce),
                None,
            )
        conn.execute(
            "INSERT INTO outbox(delivery_key, incident_key, reason, state, payload, attempts,"
            " due_at, created_at, settled_at) VALUES (?, ?, ?, ?, ?, 0, ?, ?, ?)",
            (
                key,
                request.incident,
                request.reason,
                state,
                None
                if request.payload is None
                else json.dumps(request.payload, separators=(",", ":"), ensure_ascii=True),
                due,
                request.opened_at,
                settled,
            ),
        )
        conn.executemany(
            "INSERT INTO outbox_events(delivery_key, event_id) VALUES (?, ?) ON CONFLICT DO NOTHING",
            [(key, event_id) for event_id in request.events],
        )
    released = sorted(
        ((r.released_seq, key, r) for key, r in requests.items() if r.payload is not None),
        key=lambda item: item[0],
    )
    for _, key, request in released:
        if feed_append is not None and request.payload is not None:
            feed_append(conn, key, request.payload, request.summary, now)
            feed_entries += 1
    return pending_again, feed_entries


def _owner(conn: Connection, messages: Mapping[str, _OwnerMessage], now: float) -> None:
    for key, message in messages.items():
        settled = None if message.state == "pending" else now
        conn.execute(
            "INSERT INTO owner_outbox(key, kind, topic, text, state, due_at,"
            " created_at, settled_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (
                key,
                message.kind,
                message.topic,
                message.text,
                message.state,
                now,
                message.created_at,
                settled,
            ),
        )


def _seq(conn: Connection, top: int) -> None:
    """Everything in the files is flushed, and new journal rows number above it. On PostgreSQL
    the journal holds none of those lines: a node whose files lack some is told so by its
    mirror (audit_mirror.unreachable), never left to believe it is whole."""
    conn.execute(
        "INSERT INTO kv(name, value) VALUES (?, ?)"
        " ON CONFLICT(name) DO UPDATE SET value = excluded.value",
        (audit.FLUSHED_KEY, str(top)),
    )
    audit.journal_seq_at_least(conn, top)
    if dialect.is_postgres(conn):
        audit_mirror.note_pruned(conn, top)
