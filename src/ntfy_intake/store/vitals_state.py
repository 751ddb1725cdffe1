"""What the daemon's vitals read from and write to the store: the queue counts that `/metrics`
reports, and the health snapshot that `status` and `check` read from another process."""

from __future__ import annotations

import json
from typing import Any

from ntfy_intake.store import db, transaction
from ntfy_intake.store.db import Connection

HEALTH_KEY = "health"


_COUNTS = (
    "SELECT"
    " (SELECT count(*) FROM outbox WHERE state = 'collecting'),"
    " (SELECT count(*) FROM outbox WHERE state IN ('pending', 'leased')),"
    " (SELECT count(*) FROM outbox WHERE state = 'dead'),"
    " (SELECT count(*) FROM owner_outbox WHERE state IN ('pending', 'leased')),"
    " (SELECT count(*) FROM owner_outbox WHERE state = 'suppressed')"
)


def queue_counts(conn: Connection) -> dict[str, Any]:
    """The relay's and the owner outbox's rows by state, and each feed channel's head: two
    statements (on PostgreSQL two round trips, where one per count made the 2 s snapshot hold
    the database thread for milliseconds ahead of a live event)."""
    collecting, pending, dead, owner_pending, suppressed = conn.execute(_COUNTS).fetchone()
    return {
        "relay_collecting": int(collecting),
        "relay_pending": int(pending),
        "relay_dead": int(dead),
        "owner_pending": int(owner_pending),
        "owner_suppressed_total": int(suppressed),
        "feed_head": {
            row[0]: row[1]
            for row in conn.execute("SELECT channel, max(seq) FROM feed_entries GROUP BY channel")
        },
    }


_SAVE = "INSERT INTO kv(name, value) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = excluded.value"


def save_health(conn: Connection, snapshot: dict[str, Any], *, ride: bool = False) -> None:
    """Replace the stored health snapshot, in its own transaction; `ride`: owed to the next
    write transaction instead (the next batch's while events flow, the ticker's owed write
    within `MARK_OWED_AT_MOST` otherwise), where a snapshot that changes with every event costs
    no transaction and no fsync of its own."""
    params = (HEALTH_KEY, json.dumps(snapshot))
    if ride and transaction.ride(conn, HEALTH_KEY, _SAVE, params):
        return
    # Every owed write goes first (carry_all): an owed snapshot, older than this one (the final
    # `stopped`), left owed and written later would replace it.
    with db.write_txn(conn, carry_all=True):
        conn.execute(_SAVE, params)
