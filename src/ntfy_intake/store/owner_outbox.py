"""The owner outbox's delivery side: lease the next due row, settle an attempt on it.

Rows enter through owner_queue.py (inside the caller's transaction, with their cadence
decision); the owner sender (flow/owner.py) claims one at a time here, sends with no
transaction open, and settles. All the state an attempt leaves for the next one lives in the
row: the attempt count, when the next attempt is due, the channel it uses, the Signal
recipients still owed (`signal_owed`, a JSON array; NULL = every configured one), when Signal
started failing (`signal_failing_since`) and the fallback's own attempt count (`ntfy_attempts`).

A settle applies only to the lease it was made for (`state = 'leased'` and the same attempt
count): a row whose lease ran out and was claimed again is not settled by the older attempt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from ntfy_intake.store import db, owner_replies
from ntfy_intake.store.db import Connection

__all__ = ["Claim", "claim_due", "record_signal_sent", "settle"]

State = Literal["pending", "sent", "dead"]


@dataclass(frozen=True, slots=True)
class Claim:
    key: str
    kind: str  # "notice" | "triage"
    topic: str  # the notice kind ("gap", "latch", ...) or "triage"
    text: str
    attempt: int
    channel: str | None  # "ntfy" once the row is routed to the fallback topic
    owed: tuple[str, ...] | None  # Signal recipients still owed; None = every configured one
    failing_since: float | None
    ntfy_attempts: int


def claim_due(conn: Connection, now: float, *, lease: float) -> Claim | None:
    """Lease the next due row (pending and due, or leased with its lease run out), in its own
    write transaction."""
    with db.write_txn(conn):
        row = conn.execute(
            "UPDATE owner_outbox SET state = 'leased', lease_until = ?, attempts = attempts + 1"
            " WHERE key = (SELECT key FROM owner_outbox"
            "   WHERE (state = 'pending' AND due_at <= ?) OR (state = 'leased' AND lease_until <= ?)"
            "   ORDER BY due_at, created_at, key LIMIT 1)"
            " RETURNING key, kind, topic, text, attempts, channel, signal_owed,"
            "   signal_failing_since, ntfy_attempts",
            (now + lease, now, now),
        ).fetchone()
    if row is None:
        return None
    owed = None if row[6] is None else tuple(str(r) for r in json.loads(row[6]))
    return Claim(
        key=row[0],
        kind=row[1],
        topic=row[2],
        text=row[3],
        attempt=int(row[4]),
        channel=row[5],
        owed=owed,
        failing_since=None if row[7] is None else float(row[7]),
        ntfy_attempts=int(row[8]),
    )


def settle(
    conn: Connection,
    claim: Claim,
    state: State,
    now: float,
    *,
    due_at: float | None,
    channel: str | None,
    error: str | None,
    owed: tuple[str, ...] | None,
    failing_since: float | None,
    ntfy_attempts: int,
) -> bool:
    """Settle the attempt `claim` leased, inside the caller's write transaction; False when the
    lease is no longer the claim's (nothing changed). A sent row forgets what it owed."""
    owed_json = None if owed is None else json.dumps(list(owed))
    return (
        conn.execute(
            "UPDATE owner_outbox SET state = ?, due_at = coalesce(?, due_at),"
            " lease_until = NULL, channel = ?, last_error = ?, settled_at = ?,"
            " signal_owed = ?, signal_failing_since = ?, ntfy_attempts = ?"
            " WHERE key = ? AND state = 'leased' AND attempts = ?",
            (
                state,
                due_at,
                channel,
                error,
                None if state == "pending" else now,
                None if state == "sent" else owed_json,
                None if state == "sent" else failing_since,
                max(ntfy_attempts, claim.ntfy_attempts),
                claim.key,
                claim.attempt,
            ),
        ).rowcount
        == 1
    )


def record_signal_sent(conn: Connection, key: str, signal_ts: int, now: float) -> None:
    """Remember that the send of `key` Signal answered with `signal_ts`, inside the caller's
    write transaction (the owner's reply quotes it: flow/owner_replies.py), with the version of
    its incident now: the firing the message showed. A timestamp seen again (the same answer
    settled twice) keeps its first row."""
    conn.execute(
        "INSERT INTO owner_signal_sent(signal_ts, key, sent_at, incident_version)"
        " VALUES (?, ?, ?, ?) ON CONFLICT (signal_ts) DO NOTHING",
        (signal_ts, key, now, owner_replies.shown_version(conn, key)),
    )
