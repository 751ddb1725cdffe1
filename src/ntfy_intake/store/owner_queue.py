"""Queueing owner messages and notices through the cadence state: the daily cap and rate limits.

Every owner message (a triage agent's reply, or an operational notice) enters the owner outbox
here, under a stable key, inside the caller's write transaction, together with the
`owner_message` audit record of its cadence decision (queued, or suppressed with a reason). The
same records, folded, are the cadence state: nothing else counts messages, so a restart rebuilds
exactly the day's count from the audit log and the cap holds across any number of redeploys.

The live state changes only after the caller's transaction committed (`db.Transaction
.after_commit`, the one rule for in-memory state): a decision made on the live state is folded
into it then, and a batch that decides on a fork of it has the queue adopt the fork then. A
rolled-back transaction leaves the live state untouched, so running it again decides the same.
The live state is the database thread's alone; other threads read `view`, a copy of its owner
side published after each such change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ntfy_intake.rules import cadence, cadence_records, sanitize, timestamps
from ntfy_intake.rules.notices import Notice
from ntfy_intake.store import audit, db, owner_replies
from ntfy_intake.store.transaction import Connection

Record = dict[str, Any]


class OwnerQueue:
    def __init__(self, policy: cadence.Policy, state: cadence.CadenceState) -> None:
        self.policy = policy
        self._state = state
        self._view = state.owner_view()
        # The transaction whose records wait to be folded (in one effect) and those records.
        self._folding: tuple[db.Transaction, list[Record]] | None = None

    @property
    def state(self) -> cadence.CadenceState:
        """The live state. Only the database thread reads or changes it: everyone else reads
        `view`."""
        return self._state

    @state.setter
    def state(self, state: cadence.CadenceState) -> None:
        self._state = state
        self._publish()

    @property
    def view(self) -> cadence.CadenceState:
        """The owner's side of the live state as of the last COMMIT that changed it (the counted
        owner messages and the silences: `CadenceState.owner_view`), for the console and the
        HTTP surface on the event loop. A copy, replaced whole once a transaction's records are
        all folded and never changed after, so a reader sees every transaction whole or not at
        all, and never a dict the writer is resizing."""
        return self._view

    def _publish(self) -> None:
        self._view = self._state.owner_view()

    def fork_for(self, txn: db.Transaction) -> cadence.CadenceState:
        """A copy of the live state for a transaction that makes several decisions (a batch):
        each sees the earlier ones, and the queue adopts the copy once `txn` committed.

        Safe because every user of the queue runs under the daemon's single database lock: no
        other decision can have changed the live state between the fork and the commit."""
        work = self.state.fork()
        txn.after_commit(lambda: self.adopt(work))
        return work

    def adopt(self, state: cadence.CadenceState | None) -> None:
        """Take over a state decided on in a transaction that committed (see `fork_for`)."""
        if state is not None:
            self.state = state

    def commit(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Fold records whose transaction committed into the live state, then publish `view`."""
        for record in records:
            self._state.apply(record)
        self._publish()

    def _after_commit(self, txn: db.Transaction, records: list[Record]) -> None:
        """Fold `records` into the live state once `txn` commits: every record of one
        transaction in one effect (the first registered), so `view` is published once, with
        the whole transaction in it."""
        if self._folding is not None and self._folding[0] is txn:
            self._folding[1].extend(records)
            return
        pending = list(records)
        self._folding = (txn, pending)

        def fold() -> None:
            self._folding = None
            self.commit(pending)

        txn.after_commit(fold)

    def _decided(
        self, txn: db.Transaction, records: list[Record], state: cadence.CadenceState | None
    ) -> None:
        """Fold a decision's records: into the transaction's fork now (the fork is adopted
        after COMMIT), or into the live state once `txn` commits."""
        if state is not None:
            for record in records:
                state.apply(record)
        else:
            self._after_commit(txn, records)

    def notice(
        self,
        txn: db.Transaction,
        notice: Notice,
        now: float,
        *,
        state: cadence.CadenceState | None = None,
    ) -> list[Record]:
        """Queue (or rate-limit) a notice; a repeated key is a no-op. `state`: the fork the
        transaction decides on (`fork_for`), else the live state, changed after COMMIT."""
        conn = txn.conn
        if _exists(conn, notice.key):
            return []
        decision = (state or self.state).decide_notice(self.policy, notice.notice, now)
        _insert(conn, notice.key, "notice", notice.notice, notice.text, decision, now)
        audit.stage(
            conn,
            "notice",
            now,
            notice=notice.notice,
            key=notice.key,
            text=notice.text,
            **notice.fields,
        )
        record = cadence_records.owner_record(
            notice.key,
            now,
            message_kind="notice",
            notice=notice.notice,
            result=decision.result,
            reason=decision.reason,
        )
        _stage(conn, record, now)
        self._decided(txn, [record], state)
        return [record]

    def triage_message(
        self,
        txn: db.Transaction,
        key: str,
        text: str,
        now: float,
        *,
        state: cadence.CadenceState | None = None,
    ) -> tuple[str, list[Record]]:
        """Queue a triage reply under the daily cap: ('queued' | 'suppressed' | 'duplicate',
        records); `state` as for `notice`."""
        conn = txn.conn
        if _exists(conn, key):
            return "duplicate", []
        incident, topics = _subject(conn, key)
        acked = incident is not None and owner_replies.ack_holds(conn, incident)
        decision = (state or self.state).decide_owner_message(
            self.policy, now, incident=incident, topics=topics, acknowledged=acked
        )
        _insert(conn, key, "triage", "triage", text, decision, now)
        record = cadence_records.owner_record(
            key,
            now,
            message_kind="triage",
            result=decision.result,
            reason=decision.reason,
            text=sanitize.valid_utf8(text),  # the audit log can rebuild the message (rebuild.py)
        )
        _stage(conn, record, now)
        self._decided(txn, [record], state)
        return decision.result, [record]

    def escalation(
        self,
        txn: db.Transaction,
        key: str,
        text: str,
        now: float,
        *,
        incident: str,
        topics: tuple[str, ...],
    ) -> tuple[str, list[Record]]:
        """Queue the daemon's own message for a request the agent left unanswered
        (flow/escalator.py) under its own daily cap: ('queued' | 'suppressed' | 'duplicate',
        records). Its row is a triage row (the owner path sends it as one) keyed `key`; its
        record's `message_kind` "escalation" counts it against the escalation cap alone."""
        conn = txn.conn
        if _exists(conn, key):
            return "duplicate", []
        acked = owner_replies.ack_holds(conn, incident)
        decision = self.state.decide_escalation(
            self.policy, now, incident=incident, topics=topics, acknowledged=acked
        )
        _insert(conn, key, "triage", "escalation", text, decision, now)
        record = cadence_records.owner_record(
            key,
            now,
            message_kind="escalation",
            result=decision.result,
            reason=decision.reason,
            incident=incident,
            text=sanitize.valid_utf8(text),  # the audit log can rebuild the message (rebuild.py)
        )
        _stage(conn, record, now)
        self._decided(txn, [record], None)
        return decision.result, [record]

    def silence(self, txn: db.Transaction, kind: str, now: float, **fields: Any) -> Record:
        """Stage a `silence` or `silence_end` audit record; the live state folds it after COMMIT
        (a silence is an audit record and nothing else: rules/silences.py)."""
        record: Record = {"ts": timestamps.rfc3339(now), "kind": kind, **fields}
        _stage(txn.conn, record, now)
        self._after_commit(txn, [record])
        return record


# A triage reply to a relayed request is keyed `notify:<delivery key>`: its incident and the
# topics of the request's events are what a silence matches. Other keys (an agent's later
# /v1/notify) name no incident, so no silence holds them.
_REPLY_PREFIX = "notify:"


def _subject(conn: Connection, key: str) -> tuple[str | None, tuple[str, ...]]:
    if not key.startswith(_REPLY_PREFIX):
        return None, ()
    delivery_key = key[len(_REPLY_PREFIX) :]
    row = conn.execute(
        "SELECT incident_key FROM outbox WHERE delivery_key = ?", (delivery_key,)
    ).fetchone()
    topics = conn.execute(
        "SELECT DISTINCT i.topic FROM outbox_events e JOIN inbox i ON i.event_id = e.event_id"
        " WHERE e.delivery_key = ?",
        (delivery_key,),
    ).fetchall()
    return (None if row is None else str(row[0])), tuple(str(t[0]) for t in topics)


def _exists(conn: Connection, key: str) -> bool:
    return conn.execute("SELECT 1 FROM owner_outbox WHERE key = ?", (key,)).fetchone() is not None


def _insert(
    conn: Connection,
    key: str,
    kind: str,
    topic: str,
    text: str,
    decision: cadence.OwnerDecision,
    now: float,
) -> None:
    # A suppressed message is kept (and audited) so the owner can see what the cap held back.
    # The text may come from a receiver or an agent: made valid UTF-8 before SQLite sees it.
    text = sanitize.valid_utf8(text)
    conn.execute(
        "INSERT INTO owner_outbox(key, kind, topic, text, state, due_at, created_at, last_error,"
        " settled_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            key,
            kind,
            topic,
            text,
            "pending" if decision.allowed else "suppressed",
            now,
            now,
            decision.reason,
            None if decision.allowed else now,
        ),
    )


def _stage(conn: Connection, record: Record, now: float) -> None:
    audit.stage(
        conn, record["kind"], now, **{k: v for k, v in record.items() if k not in ("ts", "kind")}
    )
