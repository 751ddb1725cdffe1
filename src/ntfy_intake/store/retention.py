"""Retention: what the store keeps, and for how long. Run periodically by the daemon.

The inbox must remember every id at least as long as ntfy can replay it (its cache duration)
plus a margin, or a replay after an evicted cursor would record old events a second time. So
inbox rows live for `max(7 days, 2 x ntfy.cache_duration)`. Settled outbox rows, sent owner
messages and feed entries live for 30 days (long enough to investigate); quarantined frames
too. An inbox id also outlives its expiry on the *server's* clock (see `prune`), so a local
clock that jumps forward never prunes what ntfy still holds. Rows that something still needs (a request still collecting events, an undelivered row,
a dead row waiting for redrive) are never pruned.

On PostgreSQL the audit journal is the record every node mirrors (audit.py), so `flush` keeps
it and retention prunes it: rows older than `JOURNAL_SECONDS` (7 days) by their `ts`, and never
one above the flushed mark (the leader's files may not hold it yet). The window is how long a
standby may be down and still catch up from the journal alone: a weekend away, a holiday, a
week waiting for a replacement SD card; past it the node's files must be copied from another
node's (audit_mirror.unreachable says which seqs). A week of journal is small beside the inbox
it sits next to, which keeps ids for at least as long. There is no per-node mark in the
database (a standby writes nothing), so a standby down longer than the window is not waited
for: that is the simple rule, stated here and logged by the node when it comes back
(`audit.mirror_gap`, flow/journal.py). The window is judged by the newest row's `ts` as well as
by `now`, so a pruning node whose clock jumped ahead never prunes rows a standby still needs;
the highest seq pruned is noted (audit_mirror.PRUNED_KEY).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ntfy_intake.rules import timestamps
from ntfy_intake.store import audit, audit_mirror, db, dialect
from ntfy_intake.store.transaction import Connection

HISTORY_SECONDS = 30 * 86400.0
MIN_INBOX_SECONDS = 7 * 86400.0
# Past an id's expiry by the server's clock: ntfy's pruning period (1 min: expired rows replay
# until pruned), the backfill overlap (30 s) and the reorder window, with room to spare.
SERVER_MARGIN = 3600
JOURNAL_SECONDS = 7 * 86400.0


def inbox_retention(cache_duration: float) -> float:
    return max(MIN_INBOX_SECONDS, 2 * cache_duration)


@dataclass(frozen=True, slots=True)
class Pruned:
    inbox: int
    outbox: int
    owner: int
    feed: int
    quarantine: int
    journal: int = 0  # audit journal rows (PostgreSQL only: SQLite's flush prunes its own)


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
        journal = _prune_journal(conn, now) if dialect.is_postgres(conn) else 0
    return Pruned(inbox, len(outbox_keys), owner, feed, quarantine, journal)


def _prune_journal(conn: Connection, now: float) -> int:
    """PostgreSQL's journal past its window, never above the flushed mark (module doc)."""
    newest = conn.execute("SELECT line FROM audit_journal ORDER BY seq DESC LIMIT 1").fetchone()
    if newest is None:
        return 0
    newest_ts = timestamps.parse_ts(_ts_of(newest[0]))
    moment = now if newest_ts is None else min(now, newest_ts)
    # Every line begins with its `ts` (audit.encode), RFC 3339 with milliseconds,
    # so its text sorts as its time does; a line without one is never pruned by time.
    count, top = conn.execute(
        _PRUNE_JOURNAL, (audit.flushed_seq(conn), timestamps.rfc3339(moment - JOURNAL_SECONDS))
    ).fetchone()
    if top is not None:
        audit_mirror.note_pruned(conn, int(top))
    return int(count)


_PRUNE_JOURNAL = """WITH gone AS (
        DELETE FROM audit_journal WHERE seq <= ?
        AND substr(line, 1, 7) = '{"ts":"' AND substr(line, 8, 24) < ?
        RETURNING seq)
    SELECT count(*), max(seq) FROM gone"""


def _ts_of(line: str) -> object:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record.get("ts") if isinstance(record, dict) else None
