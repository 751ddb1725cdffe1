"""What the daemon's vitals read from and write to the store: the queue counts that `/metrics`
reports, and the health snapshot that `status` and `check` read from another process."""

from __future__ import annotations

import json
from typing import Any

from ntfy_intake.store import db
from ntfy_intake.store.db import Connection

HEALTH_KEY = "health"


def queue_counts(conn: Connection) -> dict[str, Any]:
    """The relay's and the owner outbox's rows by state, and each feed channel's head."""

    def count(sql: str) -> int:
        return int(conn.execute(sql).fetchone()[0])

    return {
        "relay_collecting": count("SELECT count(*) FROM outbox WHERE state = 'collecting'"),
        "relay_pending": count("SELECT count(*) FROM outbox WHERE state IN ('pending', 'leased')"),
        "relay_dead": count("SELECT count(*) FROM outbox WHERE state = 'dead'"),
        "owner_pending": count(
            "SELECT count(*) FROM owner_outbox WHERE state IN ('pending', 'leased')"
        ),
        "owner_suppressed_total": count(
            "SELECT count(*) FROM owner_outbox WHERE state = 'suppressed'"
        ),
        "feed_head": {
            row[0]: row[1]
            for row in conn.execute("SELECT channel, max(seq) FROM feed_entries GROUP BY channel")
        },
    }


def save_health(conn: Connection, snapshot: dict[str, Any]) -> None:
    """Replace the stored health snapshot, in its own transaction."""
    with db.write_txn(conn):
        conn.execute(
            "INSERT INTO kv(name, value) VALUES (?, ?)"
            " ON CONFLICT(name) DO UPDATE SET value = excluded.value",
            (HEALTH_KEY, json.dumps(snapshot)),
        )
