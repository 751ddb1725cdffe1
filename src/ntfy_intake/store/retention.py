"""Retention: what the store keeps, and for how long. Run periodically by the daemon.

The inbox must remember every id at least as long as ntfy can replay it (its cache duration)
plus a margin, or a replay after an evicted cursor would record old events a second time. So
inbox rows live for `max(7 days, 2 x ntfy.cache_duration)`. Settled outbox rows, sent owner
messages and feed entries live for 30 days (long enough to investigate); quarantined frames
too. An inbox id also outlives its expiry on the *server's* clock (see `prune`), so a local
clock that jumps forward never prunes what ntfy still holds. Rows that something still needs (a request still collecting events, an undelivered row,
a dead row waiting for redrive) are never pruned.
"""

from __future__ import annotations

from dataclasses import dataclass

from ntfy_intake.store import db
from ntfy_intake.store.transaction import Connection

HISTORY_SECONDS = 30 * 86400.0
MIN_INBOX_SECONDS = 7 * 86400.0
# Past an id's expiry by the server's clock: ntfy's pruning period (1 min: expired rows replay
# until pruned), the backfill overlap (30 s) and the reorder window, with room to spare.
SERVER_MARGIN = 3600


def inbox_retention(cache_duration: float) -> float:
    return max(MIN_INBOX_SECONDS, 2 * cache_duration)


@dataclass(frozen=True, slots=True)
class Pruned:
    inbox: int
    outbox: int
    owner: int
    feed: int
    quarantine: int


def prune(conn: Connection, now: float, *, cache_duration: float) -> Pruned:
    inbox_before = now - inbox_retention(cache_duration)
    history_before = now - HISTORY_SECONDS
    with db.write_txn(conn):
        # Judged by the server's time as well as ours: the newest ntfy `time` recorded is a
        # lower bound of the server's clock, so a local clock that jumped forward cannot prune
        # an id the server may still replay (held until its expiry, or time + cache_duration).
        server_now = conn.execute("SELECT max(time) FROM inbox").fetchone()[0] or 0
        outbox_keys = [
            row[0]
            for row in conn.execute(
                "SELECT delivery_key FROM outbox WHERE state IN ('delivered', 'skipped')"
                " AND coalesce(settled_at, created_at) < ?",
                (history_before,),
            )
        ]
        conn.executemany(
            "DELETE FROM outbox_events WHERE delivery_key = ?", [(k,) for k in outbox_keys]
        )
        conn.executemany("DELETE FROM outbox WHERE delivery_key = ?", [(k,) for k in outbox_keys])
        inbox = conn.execute(
            "DELETE FROM inbox WHERE received_at < ?"
            " AND CASE WHEN coalesce(expires, 0) > time + ? THEN coalesce(expires, 0) ELSE time + ? END"
            " + ? < ?"
            " AND event_id NOT IN ("
            " SELECT e.event_id FROM outbox_events e JOIN outbox o USING (delivery_key)"
            " WHERE o.state = 'collecting')",
            (inbox_before, int(cache_duration), int(cache_duration), SERVER_MARGIN, server_now),
        ).rowcount
        owner = conn.execute(
            "DELETE FROM owner_outbox WHERE state IN ('sent', 'suppressed') AND created_at < ?",
            (history_before,),
        ).rowcount
        # The newest entry of a channel always stays: it carries the channel's head, and a head
        # that went back to 0 would hand out sequence numbers that agents already acked.
        feed = conn.execute(
            "DELETE FROM feed_entries WHERE created_at < ? AND seq < ("
            " SELECT max(seq) FROM feed_entries AS newest"
            " WHERE newest.channel = feed_entries.channel)",
            (history_before,),
        ).rowcount
        quarantine = conn.execute(
            "DELETE FROM quarantine WHERE last_seen < ?", (history_before,)
        ).rowcount
    return Pruned(inbox, len(outbox_keys), owner, feed, quarantine)
