"""The leadership row on PostgreSQL (DESIGN.md section 9): the lease's SQL, and only here.

One row (`id = 1`): `node`, `instance` (random per process), `term`, `expires_at`. Every time is
the server's `now()`; nothing here reads a local clock, so two boxes whose clocks disagree still
agree on who leads. The rules of what to do with a read live in rules/lease.py; this module
runs the statements and reports what the server saw (`lease.Seen`).

Invariants owned here:
- `claim` takes the lease only when it is absent (term 1), expired, or this instance's own
  (term + 1), and renews (same term) only the term the caller says it holds, while fresh. The
  take happens under `FOR UPDATE` of the row, re-checked after the lock: two claimants at the
  same instant get one winner;
- the fence (a leader's `write_txn`, postgres.PgConnection.begin_write, with the connection's
  `term` set) takes `FOR KEY SHARE` on the row and compares the term. A takeover's `FOR UPDATE`
  conflicts with it, so the takeover waits for every write of the old term already in flight,
  and a write that fences after the takeover reads the new term and is refused: nothing of
  term T commits after term T+1 began. That wait is bounded: a takeover that waited `lock_wait`
  in vain ends the old term's transactions still open on the row (`_OLD_TERM`), because a
  process paused in the middle of one (SIGSTOP, a frozen VM, a dead link; between two
  messages of a pipeline the server waits for the client, so neither its idle-in-transaction
  nor its statement timeout applies) would hold the row for as long as the pause lasts. A renewal only updates non-key columns (the lock it takes,
  FOR NO KEY UPDATE, does not conflict with KEY SHARE), so the leader's renewals never wait for
  its own writes, and the standby's polls read without locking. That is why the table has no
  unique index but its primary key: one on `term` or `node` would make every renewal a key
  update and put it back in the writers' queue;
- `release` expires the lease now and NOTIFYs `ntfy_intake_lease.<schema>` in the same
  statement, so the wake-up is sent only if the release committed.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from ntfy_intake.rules.lease import Seen
from ntfy_intake.settings.schema import Dsn
from ntfy_intake.store import postgres, transaction
from ntfy_intake.store.transaction import Connection

# What every statement returns, as `lease.Seen` reads it: the server's instant of expiry, and
# how far it is from the server's now() (negative once expired).
_SEEN = """node, instance, term, url,
    EXTRACT(EPOCH FROM expires_at)::float8 AS expires_at,
    EXTRACT(EPOCH FROM expires_at - now())::float8 AS remaining"""
_TTL = "now() + ? * INTERVAL '1 second'"

_READ = f"SELECT {_SEEN} FROM leadership WHERE id = 1"
_RENEW = f"""UPDATE leadership SET expires_at = {_TTL}
    WHERE id = 1 AND instance = ? AND term = ? AND expires_at > now()
    RETURNING {_SEEN}"""
_SEED = f"""INSERT INTO leadership(id, node, instance, term, expires_at, url)
    VALUES (1, ?, ?, 1, {_TTL}, ?) ON CONFLICT (id) DO NOTHING RETURNING {_SEEN}"""
_LOCK = f"SELECT {_SEEN} FROM leadership WHERE id = 1 FOR UPDATE"
_TAKE = f"""UPDATE leadership
    SET node = ?, instance = ?, term = term + 1, expires_at = {_TTL}, url = ?
    WHERE id = 1 RETURNING {_SEEN}"""
# The old term's transactions still locking rows of the table when its lease has expired (the
# modes of FOR KEY SHARE / FOR UPDATE and of UPDATE; a plain read never stands in a take's way):
# begun before that expiry (a claimant's begin after it), so under the old term; ended, they
# roll back.
_OLD_TERM = """SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM (
    SELECT DISTINCT a.pid FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid
    WHERE l.locktype = 'relation' AND l.granted AND l.relation = 'leadership'::regclass
      AND l.mode IN ('RowShareLock', 'RowExclusiveLock')
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND a.pid <> pg_backend_pid() AND a.xact_start < to_timestamp(?)) AS old_term"""
# What a lock wait that ran out raises: lock_timeout, or the lease connection's statement_timeout
# when that comes first.
_WAITED_OUT = frozenset({"55P03", "57014"})
_RELEASE = """WITH released AS (
        UPDATE leadership SET expires_at = now()
        WHERE id = 1 AND node = ? AND instance = ? AND expires_at > now() RETURNING term)
    SELECT pg_notify(?, '') FROM released"""


@dataclass(frozen=True, slots=True)
class Claimed:
    """What a claim did. `row` is the row after it (this instance's when `won`, the holder's
    otherwise); `before` is the row a new term replaced (the previous holder, for the takeover
    notice), None when the row was absent or nothing was taken."""

    won: bool
    renewed: bool
    row: Seen
    before: Seen | None = None


def connect(dsn: Dsn, ttl: float, renew_every: float) -> postgres.PgConnection:
    """A connection for the lease alone (renewals and claims never queue behind the writer's
    transactions on the daemon's connection). Every wait on it is bounded by `renew_every`: the
    statement timeout on the server, and TCP keepalives plus a user timeout on the socket, so a
    network that stopped answering fails the call instead of hanging it past the lease."""
    every = max(1, round(renew_every))
    return postgres.connect(
        dsn,
        timeout=renew_every,
        libpq={
            "keepalives": 1,
            "keepalives_idle": every,
            "keepalives_interval": 1,
            "keepalives_count": 2,
            "tcp_user_timeout": max(1000, round(ttl * 1000 / 2)),
        },
        statement_timeout=renew_every,
    )


def channel(conn: Connection) -> str:
    """The release wake-up's channel: one per store (schema), apart from the commit channel."""
    return f"ntfy_intake_lease.{_pg(conn).schema}"


def read(conn: Connection) -> Seen | None:
    """The row as the server sees it now, or None before anyone claimed it. No lock: a
    standby's polls never stand in the leader's way."""
    row = _pg(conn).execute(_READ).fetchone()
    return None if row is None else _seen(row)


def claim(
    conn: Connection,
    node: str,
    instance: str,
    ttl: float,
    *,
    holding: int | None = None,
    lock_wait: float | None = None,
    url: str = "",
    predecessor: str | None = None,
) -> Claimed:
    """Renew the lease (`holding`: the term this instance holds, while its LocalLease is
    valid), or take it when it is absent, expired or this instance's own; else report who holds
    it. `expires_at = now() + ttl` on the server. Call outside a transaction.

    A take waits for the old term's writes in flight (that wait is the fence), at most
    `lock_wait` seconds (default: ttl): a process stopped inside a transaction would otherwise
    hold it forever. Past it the old term's transactions still open on the row are ended (module
    doc; a role that may not end them leaves the take waiting, as before) and the driver's lock
    timeout is raised (one of `db.ERRORS`): try again at the next poll.
    """
    pg = _pg(conn)
    seconds = float(ttl)
    if holding is not None:
        renewed = renew(pg, instance, holding, seconds)
        if renewed is not None:
            return Claimed(won=True, renewed=True, row=renewed)
    current = read(pg)
    if current is not None and not _takeable(current, node, instance, predecessor):
        return Claimed(won=False, renewed=False, row=current)  # fresh, not mine: no lock taken
    pg.execute("BEGIN")
    try:
        wait_ms = max(1, round((seconds if lock_wait is None else lock_wait) * 1000))
        pg.execute("SELECT set_config('lock_timeout', ?, true)", (f"{wait_ms}ms",))
        if current is None:
            seeded = pg.execute(_SEED, (node, instance, seconds, url)).fetchone()
            if seeded is not None:
                pg.execute("COMMIT")
                return Claimed(won=True, renewed=False, row=_seen(seeded))
        # Locked, then looked at again: another claimant may have taken or renewed it since
        # the read above (READ COMMITTED gives the locking read the latest committed row).
        before = _seen(pg.execute(_LOCK).fetchone())
        if not _takeable(before, node, instance, predecessor):
            pg.execute("COMMIT")
            return Claimed(won=False, renewed=False, row=before)
        taken = _seen(pg.execute(_TAKE, (node, instance, seconds, url)).fetchone())
        pg.execute("COMMIT")
    except BaseException as exc:
        _rollback(pg)
        if current is not None and current.expired and _waited_out(exc):
            _end_old_term(pg, current)
        raise
    return Claimed(won=True, renewed=False, row=taken, before=before)


def _waited_out(exc: BaseException) -> bool:
    return getattr(exc, "sqlstate", None) in _WAITED_OUT


def _end_old_term(conn: postgres.PgConnection, expired: Seen) -> None:
    """End the transactions of the term whose lease `expired` still holding the row (module
    doc). Outside a transaction; a failure (no right to end them) changes nothing."""
    with contextlib.suppress(*transaction.errors()):
        conn.execute(_OLD_TERM, (expired.expires_at,))


def renew(conn: Connection, instance: str, term: int, ttl: float) -> Seen | None:
    """Extend this instance's lease of `term` while it is fresh; None when it is not (expired,
    or another term began): a leader then steps down, it never takes a new term in passing."""
    row = _pg(conn).execute(_RENEW, (float(ttl), instance, term)).fetchone()
    return None if row is None else _seen(row)


def release(conn: Connection, node: str, instance: str) -> bool:
    """Expire this instance's lease now and wake the standbys (graceful stop). False when it
    was not this instance's, or had already expired: nothing to give up, no NOTIFY."""
    pg = _pg(conn)
    return pg.execute(_RELEASE, (node, instance, channel(pg))).fetchone() is not None


class ReleaseListener:
    """A standby's wake-up on the release NOTIFY, on a connection of its own (a NOTIFY is a
    wake-up, not a delivery: the standby polls `read` as well). After a reconnect the LISTEN is
    renewed and `wait` answers True at once, since a release meanwhile went unheard."""

    def __init__(self, conn: Connection) -> None:
        self.conn = _pg(conn)
        self._reconnects = self.conn.reconnects
        self._listen()

    def _listen(self) -> None:
        quoted = channel(self.conn).replace('"', '""')
        self.conn.execute(f'LISTEN "{quoted}"')

    def wait(self, timeout: float) -> bool:
        """Block up to `timeout` seconds for a release; True when one (or a reconnect) came."""
        if self.conn.reconnects != self._reconnects:
            self._reconnects = self.conn.reconnects
            self._listen()
            return True
        try:
            for _ in self.conn.raw.notifies(timeout=timeout, stop_after=1):
                return True
        except transaction.errors():
            # The session broke while waiting: the next statement reconnects; wake the poll.
            self.conn.execute("SELECT 1")
            self._reconnects = self.conn.reconnects
            self._listen()
            return True
        return False


def _takeable(row: Seen, node: str, instance: str, predecessor: str | None) -> bool:
    """Expired, this instance's own, or (`predecessor`: the prefix of this node's dead
    instances, rules/lease.decide) a crashed predecessor's under this node's name."""
    if row.expired or row.instance == instance:
        return True
    return bool(predecessor) and row.node == node and row.instance.startswith(predecessor or "")


def _pg(conn: Connection) -> postgres.PgConnection:
    if not isinstance(conn, postgres.PgConnection):
        # One box needs no leadership; a standby needs a database both boxes reach.
        raise TypeError("leadership needs the PostgreSQL engine ([state] database)")
    return conn


def _seen(row: Any) -> Seen:
    return Seen(
        node=str(row["node"]),
        instance=str(row["instance"]),
        term=int(row["term"]),
        expires_at=float(row["expires_at"]),
        remaining=float(row["remaining"]),
        url=str(row["url"]),
    )


def _rollback(conn: postgres.PgConnection) -> None:
    if conn.in_transaction:
        # A broken session took the transaction with it: nothing left to roll back.
        with contextlib.suppress(*transaction.errors()):
            conn.execute("ROLLBACK")
