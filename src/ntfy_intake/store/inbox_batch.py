"""One batch's working set inside the inbox transaction: what each frame decides and the rows
it gathers, written together at the end (`Batch.write`).

A backlog repeats a few incidents many times, so each incident is read once and written once per
batch (`store/incident_rows.py`), and known ids are fetched in one query. The transaction itself,
and the one-by-one fallback, are `store/inbox.py`; ntfy's delete/clear, `store/device_actions.py`.

On PostgreSQL every wait for an answer is a round trip (the transaction is pipelined:
postgres.py), so the reads are asked together wherever one does not need another's answer (known
ids with the sequences, `prefetch`), and the writes are sent without a probe first: linking the
delete/clears a batch's messages name is one statement that nothing waits for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from ntfy_intake.rules import cadence, cadence_records, incidents, timestamps
from ntfy_intake.store import audit, dialect, event_line, incident_rows, outbox
from ntfy_intake.store.owner_queue import Record
from ntfy_intake.store.transaction import Connection, Cursor
from ntfy_intake.wire.frames import Event, Ignored, Junk, Message

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


# A batch of at most this many messages (a live one) asks its incidents with its first reads;
# a larger one (a backfill's overlap, a replay: mostly duplicates on a restart) once it knows
# which of its events are new, so a duplicate costs no incident read (`Batch.prefetch`).
SPECULATE_AT_MOST = 8


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

# Any delete/clear still waiting for its message? Read from the partial index `inbox_unlinked`
# (a few rows at most), named outright: left to the planner it picked `inbox_sequence` (every
# message ever recorded, once per batch: a long replay went quadratic) and, once the console's
# `inbox_incident` index came, that one, depending on SQLite's version and statistics.
# PostgreSQL has no INDEXED BY; its planner finds the partial index from the same WHERE.
UNLINKED_PROBE = (
    "SELECT 1 FROM inbox INDEXED BY inbox_unlinked"
    " WHERE incident_key = '' AND sequence_id IS NOT NULL LIMIT 1"
)
# SQLite: the probe, then one UPDATE per new sequence only when something waits.
_LINK = (
    "UPDATE inbox SET incident_key = ? WHERE topic = ? AND sequence_id = ?"
    " AND incident_key = '' AND event != 'message'"
)
# PostgreSQL: one statement for the batch, with no probe (a round trip): the join starts from
# the partial index inbox_unlinked (the few unlinked rows, `incident_key = ''`).
_LINK_PG = (
    "UPDATE inbox SET incident_key = u.key"
    " FROM unnest(CAST(? AS text[]), CAST(? AS text[]), CAST(? AS text[])) AS u(key, topic, seq)"
    " WHERE inbox.incident_key = '' AND inbox.topic = u.topic AND inbox.sequence_id = u.seq"
    " AND inbox.event != 'message'"
)

_INSERT_INBOX = (
    "INSERT INTO inbox(event_id, topic, time, expires, raw, raw_sha256, incident_key, severity,"
    " outcome, reason, delivery_key, received_at, event, sequence_id)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


class Batch:
    """One batch's working set (the module's docstring)."""

    def __init__(
        self,
        conn: Connection,
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
        # As the batch found them (None: not recorded yet), for every key `prefetch` read.
        self.stored: dict[str, incidents.IncidentState | None] = {}
        self.signals: dict[str, incidents.Signal] = {}  # by event id, of the events it records
        self.collecting: dict[str, bool] = {}
        self.collecting_stored: set[str] | None = None  # delivery keys, read once when needed
        self.inbox_rows: list[tuple[object, ...]] = []
        self.attach_rows: list[tuple[str, str]] = []
        self.journal: list[str] = []  # event records, staged together at the end
        # (topic, sequence) -> incident key of the messages recorded under that sequence.
        self.sequences: dict[tuple[str, str], str] = {}
        self.new_sequences: dict[tuple[str, str], str] = {}  # first recorded in this batch
        self.note_append: NoteAppend | None = None
        self.ts_text = timestamps.rfc3339(now)  # every record of the batch shares it
        # What `CadenceState.apply` reads back from a record's `ts` (None: it would skip it).
        self.fold_ts = timestamps.parse_ts(self.ts_text)

    def prefetch(self, events: Sequence[Event]) -> None:
        """What the batch reads before deciding: the ids already recorded and the incident of
        every sequence the events name, asked together (one answer to wait for on PostgreSQL),
        then every incident the messages name (a backlog repeats a few incidents: one lookup
        each per batch, not per event). A batch of at most `SPECULATE_AT_MOST` messages (a live
        one) asks its signals' incidents with the first reads, before it knows which of them
        are duplicates: one wait fewer. Then only what those did not foresee is asked: the
        incident an earlier message of a sequence names (an update that changed its title)."""
        known = self._ask(
            "SELECT event_id, raw_sha256 FROM inbox WHERE {}", "event_id", [e.id for e in events]
        )
        wanted = sorted(
            {
                e.sequence if isinstance(e, Message) else e.sequence_id
                for e in events
                if not isinstance(e, Ignored)
            }
        )
        sequences = self._ask(
            "SELECT topic, sequence_id, incident_key FROM inbox"
            " WHERE {} AND event = 'message' ORDER BY seq",
            "sequence_id",
            wanted,
        )
        messages = [e for e in events if isinstance(e, Message)]
        speculate = len(messages) <= SPECULATE_AT_MOST
        if speculate:
            self._sign(messages, ahead=True)
        named = self._ask_incidents({signal.key for signal in self.signals.values()})
        for cursor in known:
            self.known.update(cursor.fetchall())
        for cursor in sequences:
            for topic, sequence, key in cursor:
                self.sequences.setdefault((topic, sequence), key)
        self._take_incidents(named)
        for event_id in self.known:  # duplicates and conflicts: `seen` skips them
            self.signals.pop(event_id, None)
        if not speculate:
            self._sign(m for m in messages if m.id not in self.known)
        keys = {signal.key for signal in self.signals.values()}
        for message in messages:
            joined = self.sequences.get((message.topic, message.sequence))
            if joined is not None and message.id in self.signals:
                keys.add(joined)
        self._take_incidents(self._ask_incidents(keys - self.stored.keys()))

    def _sign(self, messages: Iterable[Message], *, ahead: bool = False) -> None:
        """The signal of each message, by id (a repeated id: its first). `ahead`: before the
        duplicates are known, so a value that breaks `signal_of` is left for `message` to meet
        (a duplicate never does, as before: it must not fail the batch)."""
        for message in messages:
            if message.id in self.signals:
                continue
            try:
                self.signals[message.id] = incidents.signal_of(message)
            except Exception:
                if not ahead:
                    raise

    def _ask_incidents(self, keys: set[str]) -> tuple[list[Cursor], dict[str, str]]:
        """The incidents `keys` name, asked (not yet read), each key marked as looked up; and
        each key by the form its row answers under (dialect.stored_text: a NUL as U+FFFD on
        PostgreSQL), so the row is kept under the key the batch asks by."""
        wanted = sorted(keys)
        self.stored.update(dict.fromkeys(wanted))
        asked = self._ask(f"{incident_rows.SELECT} WHERE {{}}", "key", wanted)
        return asked, {dialect.stored_text(self.conn, key): key for key in wanted}

    def _ask(self, select: str, column: str, values: list[str]) -> list[Cursor]:
        """`select`'s rows where `column` is one of `values`, asked (none when there are none;
        dialect.one_of: on PostgreSQL one statement text whatever the number of values)."""
        return [
            self.conn.execute(select.format(where), parameters)
            for where, parameters in dialect.one_of(self.conn, column, values)
        ]

    def _take_incidents(self, asked: tuple[list[Cursor], dict[str, str]]) -> None:
        cursors, by_stored = asked
        for cursor in cursors:
            for row in cursor:
                self.stored[by_stored.get(row[0], row[0])] = incident_rows.from_row(row)

    def seen(self, index: int, event: Event) -> bool:
        """Known id: a duplicate (a resume candidate again) or a conflict (quarantined)."""
        known = self.known.get(event.id)
        if known is None:
            self.known[event.id] = event.raw_sha256
            return False
        result = self.result
        if known in (event.raw_sha256, REBUILT_UNKNOWN_SHA256):
            result.duplicates += 1
            if event.time is not None:
                result.candidates.append(Candidate(index, event.id, event.time, event.cached))
        else:
            result.conflicts += 1
            reason = "conflict: id already recorded with a different body"
            self.quarantine(Junk(event.raw, reason, event.id), reason)
        return True

    def message(self, index: int, message: Message) -> None:
        # Runs once per event of every replay: values are read once into locals.
        event_id = message.id
        if event_id in self.known and self.seen(index, message):
            return
        self.known[event_id] = message.raw_sha256
        now = self.now
        signal = self.signals.get(event_id) or incidents.signal_of(message)
        key = signal.key
        sequence = (message.topic, message.sequence_id or event_id)
        joined = self.sequences.get(sequence)
        if joined is None:
            self.sequences[sequence] = key
            self.new_sequences[sequence] = key
        elif joined != key:
            # An update (or the original, after its update): one sequence, one incident.
            signal = signal._replace(key=joined)
            key = joined
        before = self.touched.get(key) or self._stored_incident(key)
        after = incidents.merge(before, signal, message)
        self.touched[key] = after
        view = cadence.IncidentView(key, after.severity, after.status, before is None)
        decision = self.work.decide_event(self.policy, view, event_id, now)
        outcome = decision.outcome
        if outcome == "joined" and not self._still_collecting(decision.delivery_key):
            # Only a wall clock stepping backwards can close a window early; never join a
            # request whose payload is already frozen: open a fresh one instead.
            decision = cadence.Decision(
                "triage_requested",
                "window_closed",
                cadence.delivery_key_for(event_id),
                now + self.policy.debounce,
            )
            outcome = decision.outcome
        delivery_key = decision.delivery_key
        if outcome == "triage_requested":
            assert delivery_key is not None and decision.due_at is not None
            outbox.create(self.conn, delivery_key, key, decision.reason, decision.due_at, now)
            self.collecting[delivery_key] = True
        if delivery_key is not None:
            self.attach_rows.append((delivery_key, event_id))
        self.inbox_rows.append(
            (
                event_id,
                message.topic,
                message.time,
                message.expires,
                message.raw,
                message.raw_sha256,
                key,
                signal.severity,
                outcome,
                decision.reason,
                delivery_key,
                now,
                "message",
                sequence[1],
            )
        )
        record = cadence_records.event_record(
            decision,
            view,
            event_id,
            now,
            topic=message.topic,
            time=message.time,
            expires=message.expires,
            sequence_id=message.sequence_id,
            sha256=message.raw_sha256,
        )
        self.journal.append(event_line.encode(self.ts_text, message, view, decision))
        # The fold of `record` (what `apply(record)` does), from the values at hand.
        self.work.apply_event(key, view.severity, view.status, outcome, delivery_key, self.fold_ts)
        result = self.result
        result.records.append(record)
        result.recorded += 1
        result.candidates.append(Candidate(index, event_id, message.time, message.cached))

    def _still_collecting(self, key: str | None) -> bool:
        if key is None:
            return False
        if key not in self.collecting:
            if self.collecting_stored is None:
                # Few rows (one per open debounce window), on the index outbox_due.
                self.collecting_stored = {
                    row[0]
                    for row in self.conn.execute(
                        "SELECT delivery_key FROM outbox WHERE state = 'collecting'"
                    )
                }
            self.collecting[key] = key in self.collecting_stored
        return self.collecting[key]

    def _stored_incident(self, key: str) -> incidents.IncidentState | None:
        if key in self.stored:
            return self.stored[key]
        return incident_rows.load(self.conn, key)  # a key `prefetch` did not foresee

    def write(self) -> None:
        """The rows gathered in memory, before anything reads them back (release_due does)."""
        self.conn.executemany(_INSERT_INBOX, self.inbox_rows)
        if self.new_sequences:
            # Deletes/clears that arrived before the message they name: link them now.
            links = [(key, topic, seq) for (topic, seq), key in self.new_sequences.items()]
            if dialect.is_postgres(self.conn):
                self.conn.execute(_LINK_PG, [list(column) for column in zip(*links, strict=True)])
            elif self.conn.execute(UNLINKED_PROBE).fetchone():
                self.conn.executemany(_LINK, links)
        self.conn.executemany(
            "INSERT INTO outbox_events(delivery_key, event_id) VALUES (?, ?) ON CONFLICT DO NOTHING",
            self.attach_rows,
        )
        self.conn.executemany(
            incident_rows.SAVE, [incident_rows.to_row(s) for s in self.touched.values()]
        )
        audit.stage_encoded(self.conn, self.journal)

    def quarantine(self, junk: Junk, reason: str) -> None:
        """A junk frame or a conflicting id, stored once per distinct raw line."""
        cursor = self.conn.execute(
            "INSERT INTO quarantine(raw_sha256, raw, reason, event_id, first_seen, last_seen, count)"
            " VALUES (?, ?, ?, ?, ?, ?, 1)"
            " ON CONFLICT(raw_sha256) DO UPDATE SET last_seen = excluded.last_seen,"
            " count = quarantine.count + 1 RETURNING count",
            (junk.raw_sha256, junk.raw, reason, junk.event_id, self.now, self.now),
        )
        first_time = cursor.fetchone()[0] == 1
        if first_time:
            # One audit record per distinct bad frame, not per replay of it.
            audit.stage(
                self.conn,
                "quarantine",
                self.now,
                event_id=junk.event_id,
                reason=reason,
                sha256=junk.raw_sha256,
            )
            self.result.quarantined += 1
