"""What a (re)start replays beyond the cursor's own rows (cursor.py): the cursor dropped so that
everything replays (ntfy refused it), the newest server time the inbox holds (it bounds a local
clock that jumped ahead while the daemon was down), and the journal records the audit files do
not hold yet (the cadence state folds them in at start-up)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from ntfy_intake.store.db import Connection


def from_the_start(conn: Connection, now: float) -> None:
    """Drop the cursor: the next subscribe asks for everything ntfy holds. Inside the caller's
    transaction, which also queues the notice that says so."""
    conn.execute(
        "UPDATE cursor SET kind = 'all', value = 'all', message_time = NULL,"
        " updated_at = ? WHERE id = 1",
        (now,),
    )


def newest_server_time(conn: Connection) -> int | None:
    """The newest ntfy message time recorded in the inbox, None when it is empty."""
    newest = conn.execute("SELECT max(time) FROM inbox").fetchone()[0]
    return None if newest is None else int(newest)


def unflushed_records(conn: Connection, flushed_seq: int) -> Iterator[dict[str, Any]]:
    """The journal's records after `flushed_seq` (not yet in the audit files), in seq order.

    On PostgreSQL the kv mark is not this node's (another node may have written it, and the
    journal is kept past it): pass the highest seq this node's own files hold
    (`AuditLog.last_seq`, `Journal.last_written_seq`), or rows between are folded by neither."""
    for (line,) in conn.execute(
        "SELECT line FROM audit_journal WHERE seq > ? ORDER BY seq", (flushed_seq,)
    ):
        yield json.loads(line)
