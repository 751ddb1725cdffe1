"""The inbox transaction's reads and writes: what a batch needs read before it is decided
(`read`), and the decided plan written (`write`). The decisions are rules/batch_plan.py's: this
module decides nothing, and `write` reads nothing back for a decision.

A backlog repeats a few incidents many times, so each incident is read once and written once per
batch (`store/incident_rows.py`), and known ids are fetched in one query. The transaction itself,
and the one-by-one fallback, are `store/inbox.py`; ntfy's delete/clear, `store/device_actions.py`.

On PostgreSQL every wait for an answer is a round trip (the transaction is pipelined:
postgres.py), so the reads are asked together wherever one does not need another's answer (the
known ids, the sequences, the open debounce windows, the quarantine's rows of its junk and, for a
live batch, its incidents: one wait), and the writes are sent without waiting for any answer
(but a notice's: the owner queue asks whether its key is queued, store/owner_queue.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ntfy_intake.rules import batch_plan, cadence
from ntfy_intake.rules.batch_plan import REBUILT_UNKNOWN_SHA256, Candidate
from ntfy_intake.rules.notices import Notice
from ntfy_intake.store import audit, db, device_actions, dialect, incident_rows, outbox
from ntfy_intake.store.owner_queue import OwnerQueue, Record
from ntfy_intake.store.transaction import Connection, Cursor
from ntfy_intake.wire.frames import DeviceAction, Event, Ignored, Junk, Message

__all__ = ["REBUILT_UNKNOWN_SHA256", "BatchResult", "Candidate", "NoteAppend", "decide", "read"]


@dataclass(slots=True)
class BatchResult:
    candidates: list[Candidate] = field(default_factory=list)
    recorded: int = 0
    duplicates: int = 0
    conflicts: int = 0
    quarantined: int = 0
    released: list[str] = field(default_factory=list)
    # Released rows leased to the caller's relay in the batch's transaction (outbox.ask_hand_off).
    handed: list[outbox.Claim] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)  # cadence records written this batch
    # When the next debounce window closes, as the batch's transaction left the outbox (read
    # in it when it recorded something): `release_known` False when not read.
    next_release: float | None = None
    release_known: bool = False
    # The cadence state with them folded in: the queue's live state once the batch committed.
    state: cadence.CadenceState | None = None


# Appends an information entry for agents (a delete/clear whose request already went out):
# (conn, idempotency key, payload, summary, now), inside the batch's transaction.
NoteAppend = Callable[[Connection, str, dict[str, object], str, float], None]

_KNOWN = "SELECT event_id, raw_sha256 FROM inbox WHERE {}"
# A sequence's incident is its first message's (ORDER BY seq: the first row wins).
_SEQUENCES = (
    "SELECT topic, sequence_id, incident_key FROM inbox WHERE {} AND event = 'message' ORDER BY seq"
)
# Few rows (one per open debounce window), on the index outbox_due.
_OPEN_WINDOWS = "SELECT delivery_key FROM outbox WHERE state = 'collecting'"
_INSERT_INBOX = (
    "INSERT INTO inbox(event_id, topic, time, expires, raw, raw_sha256, incident_key, severity,"
    " outcome, reason, delivery_key, received_at, event, sequence_id)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_ATTACH = "INSERT INTO outbox_events(delivery_key, event_id) VALUES (?, ?) ON CONFLICT DO NOTHING"
_QUARANTINED = "SELECT raw_sha256 FROM quarantine WHERE {}"
_QUARANTINE = (
    "INSERT INTO quarantine(raw_sha256, raw, reason, event_id, first_seen, last_seen, count)"
    " VALUES (?, ?, ?, ?, ?, ?, 1)"
    " ON CONFLICT(raw_sha256) DO UPDATE SET last_seen = excluded.last_seen,"
    " count = quarantine.count + 1"
)
# A tuple, not `Message | DeviceAction | Ignored`: that union is built again at every use, and
# this test runs once per frame.
EVENT_TYPES = (Message, DeviceAction, Ignored)


def read(
    conn: Connection,
    planner: batch_plan.Planner,
    frames: Sequence[Event | Junk | Notice],
    *,
    notes: bool,
) -> batch_plan.Answers:
    """What the planner asks, asked together (one answer to wait for on PostgreSQL), then the
    incidents those answers lead to (`Planner.still_needed`: none unless an update names an
    incident under another title, or a large batch asks its incidents once it knows which of
    its events are new) with the quarantine's rows of conflicts with recorded ids. `notes`:
    the caller appends notes, so where a delete/clear's message request stands is read."""
    events = [f for f in frames if isinstance(f, EVENT_TYPES)]
    messages = [e for e in events if isinstance(e, Message)]
    actions = [e for e in events if isinstance(e, DeviceAction)]
    asks = planner.asks(events, messages, actions)
    known = _ask(conn, _KNOWN, "event_id", asks.ids)
    sequences = _ask(conn, _SEQUENCES, "sequence_id", asks.sequences)
    windows = conn.execute(_OPEN_WINDOWS) if asks.windows else None
    # SQLite: is any delete/clear waiting for its message? (PostgreSQL links with no probe.)
    probe = device_actions.ask_unlinked(conn) if asks.sequences and messages else None
    requests = device_actions.ask_requests(conn, asks.actions) if notes else []
    ahead = _ask_incidents(conn, asks.incidents)
    # The junk's lines, and those of an id the batch holds twice (it may conflict with itself).
    lines = {f.raw_sha256 for f in frames if isinstance(f, Junk)}
    if len(asks.ids) != len(set(asks.ids)):
        counts = Counter(asks.ids)
        lines.update(_conflict(e).raw_sha256 for e in events if counts[e.id] > 1)
    quarantined = _ask(conn, _QUARANTINED, "raw_sha256", sorted(lines))
    answers = batch_plan.Answers()
    for cursor in known:
        answers.known.update(cursor.fetchall())
    for cursor in sequences:
        for topic, sequence, key in cursor:
            answers.sequences.setdefault((topic, sequence), key)
    if windows is not None:
        answers.windows = {row[0] for row in windows}
    if probe is not None:
        answers.unlinked = probe.fetchone() is not None
    for cursor in requests:
        for topic, sequence, delivery_key, state in cursor:
            answers.requests[(topic, sequence)] = (delivery_key, state)  # the latest wins
    _take_incidents(answers, ahead)
    for cursor in quarantined:
        answers.quarantined.update(row[0] for row in cursor)
    more = _ask_incidents(conn, planner.still_needed(answers))
    conflicting = {_conflict(e).raw_sha256 for e in planner.conflicts(answers)} - lines
    for cursor in _ask(conn, _QUARANTINED, "raw_sha256", sorted(conflicting)):
        answers.quarantined.update(row[0] for row in cursor)
    _take_incidents(answers, more)
    return answers


def _conflict(event: batch_plan.Arrival) -> Junk:
    """A conflicting event as the quarantine keeps it."""
    return Junk(event.raw, batch_plan.CONFLICT, event.id)


_Asked = tuple[list[Cursor], list[str], dict[str, str]]


def _ask_incidents(conn: Connection, keys: list[str]) -> _Asked:
    """The incidents `keys` name, asked (not yet read); and each key by the form its row answers
    under (dialect.stored_text: a NUL as U+FFFD on PostgreSQL), so the row is kept under the key
    the batch asks by."""
    asked = _ask(conn, f"{incident_rows.SELECT} WHERE {{}}", "key", keys)
    return asked, keys, {dialect.stored_text(conn, key): key for key in keys}


def _take_incidents(answers: batch_plan.Answers, asked: _Asked) -> None:
    cursors, keys, by_stored = asked
    answers.incidents.update(dict.fromkeys(keys))  # None: not recorded yet
    for cursor in cursors:
        for row in cursor:
            answers.incidents[by_stored.get(row[0], row[0])] = incident_rows.from_row(row)


def _ask(conn: Connection, select: str, column: str, values: list[str]) -> list[Cursor]:
    """`select`'s rows where `column` is one of `values`, asked (none when there are none;
    dialect.one_of: on PostgreSQL one statement text whatever the number of values)."""
    return [
        conn.execute(select.format(where), parameters)
        for where, parameters in dialect.one_of(conn, column, values)
    ]


def decide(
    planner: batch_plan.Planner,
    answers: batch_plan.Answers,
    state: cadence.CadenceState,
    frames: Sequence[Event | Junk | Notice],
) -> batch_plan.Plan:
    """The planner fed the frames in delivery order (no I/O): its `Plan`. A junk frame and a
    notice stay in their place, for `write`."""
    planner.start(answers, state)
    for index, frame in enumerate(frames):
        if isinstance(frame, Message):
            planner.message(index, frame)
        elif isinstance(frame, DeviceAction):
            planner.action(index, frame)
        elif isinstance(frame, Ignored):
            planner.ignored(index, frame)
        else:
            planner.aside(frame)
    return planner.plan


def write(
    txn: db.Transaction,
    plan: batch_plan.Plan,
    answers: batch_plan.Answers,
    now: float,
    *,
    queue: OwnerQueue,
    note_append: NoteAppend | None,
) -> BatchResult:
    """The plan's rows, in its transaction, before anything reads them back (release_due
    does). Its asides first, in frame order (their audit lines come before the events'), then
    the requests, inbox rows, links, incidents and the events' audit lines."""
    conn = txn.conn
    result = BatchResult(
        candidates=plan.candidates,
        recorded=plan.recorded,
        duplicates=plan.duplicates,
        conflicts=plan.conflicts,
    )
    noticed: list[tuple[int, list[Record]]] = []
    held = set(answers.quarantined)  # and, as the batch goes, what it quarantined
    for aside in plan.asides:
        item = aside.item
        if isinstance(item, Junk):
            result.quarantined += _quarantine(conn, item, now, held)
        elif isinstance(item, batch_plan.Conflict):
            result.quarantined += _quarantine(conn, _conflict(item.event), now, held)
        elif isinstance(item, batch_plan.Note):
            if note_append is not None:
                note_append(conn, item.event_id, item.payload, item.summary, now)
        elif isinstance(item, Notice):
            noticed.append((aside.at, queue.notice(txn, item, now, state=plan.state)))
    if plan.requests:
        conn.executemany(outbox.CREATE, [(*request, now) for request in plan.requests])
    conn.executemany(_INSERT_INBOX, plan.rows)
    if plan.unlinked:
        device_actions.link(conn, plan.links)
    conn.executemany(_ATTACH, plan.attach)
    conn.executemany(incident_rows.SAVE, [incident_rows.to_row(s) for s in plan.incidents.values()])
    audit.stage_encoded(conn, [audit.encode(record) for record in plan.records])
    result.records = _with_notices(plan.records, noticed)
    return result


def _with_notices(
    records: list[batch_plan.Record], noticed: list[tuple[int, list[Record]]]
) -> list[Record]:
    """The batch's records in frame order: each notice's where its frame stood."""
    if not noticed:
        return list(records)
    merged: list[Record] = []
    start = 0
    for at, extra in noticed:
        merged.extend(records[start:at])
        merged.extend(extra)
        start = at
    merged.extend(records[start:])
    return merged


def _quarantine(conn: Connection, junk: Junk, now: float, held: set[str]) -> int:
    """A junk frame or a conflicting id, stored once per distinct raw line: 1 the first time
    (with its one audit record, not one per replay of it), else 0. `held`: the lines the
    quarantine held before (read with the batch) and those this batch put there."""
    sha = junk.raw_sha256
    conn.execute(_QUARANTINE, (sha, junk.raw, junk.reason, junk.event_id, now, now))
    if sha in held:
        return 0
    held.add(sha)
    audit.stage(conn, "quarantine", now, event_id=junk.event_id, reason=junk.reason, sha256=sha)
    return 1
