"""The write transaction and its lock, on SQLite: the part of the engine every writer passes through.

Invariants owned here:
- every write goes through `write_txn`, which starts with BEGIN IMMEDIATE (the write lock is taken
  up front, so two writers serialize instead of failing at COMMIT) and rolls back on any exception;
- in-memory state that a write transaction decides on (cadence decisions, notice streaks,
  counters, wake-ups) changes only after its COMMIT: code inside registers the change with
  `Transaction.after_commit`, and a rolled-back transaction drops it. A transaction that fails
  and is run again (a transient storage fault) therefore decides from the same memory as the
  first run: nothing is lost or done twice;
- a connection is left fully synced after every `commits_without_fsync` block, whatever happened;
- on PostgreSQL, a connection fenced to a leadership term (`PgConnection.term`) holds the
  leadership row FOR KEY SHARE from its first statement and checks the term, so a takeover
  (FOR UPDATE of the row) waits for the write, and a write that starts after it raises
  `errors.Fenced` with nothing written: nothing of term T commits after term T+1 began. The
  transaction's statements are pipelined (postgres.py): the server compares the term in the
  opening statement and, when it is over, fails it, so nothing sent after it runs (COMMIT
  included) and `Fenced` comes from the first wait, the body's first read or COMMIT (or from
  the next statement's send, where the driver reads the refusal if it is in), instead of from
  BEGIN;
- on PostgreSQL a statement's error may likewise surface at a later read or at COMMIT, never
  later than that: the body reads nothing sent after a failed statement, and the whole
  transaction rolls back as before;
- a write whose loss is harmless and that nobody waits for (the audit flush's mark; on SQLite
  also the last frame's time) may ride the connection's next write transaction instead of taking
  one of its own (`ride`): it runs after the opening (PostgreSQL: with no wait of its own), and
  stays owed until a transaction carrying it commits. On SQLite this is what keeps a live event
  at one commit (docs/performance.md, "Per live event: bytes and CPU"). On SQLite a rider waits
  `RIDE_AFTER_S` before a transaction carries it (`write_owed` carries every one at once): each
  write to a table is a 4 KiB page in the WAL, and while events flow a rider replaced by every
  batch (the mark) would otherwise cost a page in each of them, where once a second is enough.

Callers outside the store reach these through `db` (`db.write_txn`, `db.Transaction`, ...):
tests patch `db.write_txn` to fail chosen COMMITs, so every writer looks it up there.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Protocol

from ntfy_intake.errors import InjectedFault
from ntfy_intake.store import postgres


class Cursor(Protocol):
    """What a statement returns on either engine: rows by position and by name."""

    @property
    def rowcount(self) -> int: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class SqliteConnection(sqlite3.Connection):
    """sqlite3's connection (db.connect's factory), with the writes owed to its next write
    transaction (`ride`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.riders: dict[str, Rider] = {}


class Connection(Protocol):
    """The engine's connection (sqlite3.Connection, or postgres.PgConnection). Flow and surface
    code type their connections with this (as `db.Connection`) and never import a driver."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Cursor: ...
    def executemany(self, sql: str, parameters: Any, /) -> Cursor: ...
    @property
    def in_transaction(self) -> bool: ...
    def close(self) -> None: ...


def errors() -> tuple[type[Exception], ...]:
    """Every exception the engines' drivers raise: what code outside the store catches instead
    of naming a driver (`except db.ERRORS`). PostgreSQL's are among them once its driver is
    loaded, before the first connection (postgres.load_driver): so it is read where it is
    caught, never copied at import."""
    return (sqlite3.Error, *postgres.DRIVER_ERRORS)


# A hook that tests set to raise between the last statement of a transaction and its COMMIT.
# It is None in production; `write_txn` calls it only when set.
BeforeCommit = Callable[[], None]
# An in-memory change that waits for the transaction's COMMIT.
Effect = Callable[[], None]


class Transaction:
    """One write transaction: its connection, and the in-memory changes waiting for its COMMIT.

    The statements go through `conn` as before; what the transaction decides on in memory is
    registered with `after_commit` and happens only once the COMMIT succeeded, in the order it
    was registered. A rollback drops it all, so running the transaction again starts from the
    memory the first run started from.
    """

    __slots__ = ("_effects", "conn")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._effects: list[Effect] = []

    def after_commit(self, effect: Effect) -> None:
        self._effects.append(effect)

    def _committed(self) -> None:
        effects, self._effects = self._effects, []
        for effect in effects:
            effect()


# SQLite: how long a rider is owed before a write transaction carries it.
RIDE_AFTER_S = 1.0


@contextlib.contextmanager
def write_txn(
    conn: Connection, *, before_commit: BeforeCommit | None = None, carry_all: bool = False
) -> Iterator[Transaction]:
    """BEGIN IMMEDIATE ... COMMIT, rolling back every table on any exception; then the
    transaction's `after_commit` effects, only if the COMMIT succeeded.

    `before_commit` exists for failure-mode tests: it runs after the body's last statement and
    before COMMIT, so a fault raised there must leave every table, and all memory, untouched.
    `carry_all`: every write owed to `conn` rides this transaction, not only the due ones.
    """
    txn = Transaction(conn)
    if isinstance(conn, postgres.PgConnection):
        # The store's write lock, the wake-up its watchers get once this commits (a rollback
        # drops the NOTIFY with everything else) and, on a leader, the fence: sent with the
        # statements that follow, answered with the first of them the body reads.
        try:
            conn.open_write()
            riding = dict(conn.riders)
            for rider in riding.values():
                conn.execute(rider.sql, rider.params)
            yield txn
            if before_commit is not None:
                before_commit()
            conn.commit_write()
        except BaseException:
            conn.rollback_write()
            raise
        _written(conn.riders, riding)
        txn._committed()
        return
    conn.execute("BEGIN IMMEDIATE")
    riders = conn.riders if isinstance(conn, SqliteConnection) else None
    riding = _due(riders, carry_all) if riders else {}
    try:
        for rider in riding.values():
            conn.execute(rider.sql, rider.params)
        yield txn
        if before_commit is not None:
            before_commit()
        conn.execute("COMMIT")
    except BaseException:
        # On a full disk, an I/O error or a busy deadlock SQLite may already have rolled the
        # transaction back; a failing ROLLBACK must not replace the cause with its own message.
        _rollback(conn)
        raise
    if riders:
        _written(riders, riding)
    # Outside the handler: the rows are durable, and no effect's failure may roll them back.
    txn._committed()


class Rider(NamedTuple):
    sql: str
    params: tuple[Any, ...]
    since: float  # monotonic: when it was first owed


def _due(riders: dict[str, Rider], carry_all: bool) -> dict[str, Rider]:
    if carry_all:
        return dict(riders)
    due = time.monotonic() - RIDE_AFTER_S
    return {name: rider for name, rider in tuple(riders.items()) if rider.since <= due}


def _written(riders: dict[str, Rider], riding: dict[str, Rider]) -> None:
    for name, rider in riding.items():  # written, unless owed again meanwhile
        if riders.get(name) is rider:
            del riders[name]


def ride(conn: Connection, name: str, sql: str, params: tuple[Any, ...]) -> bool:
    """Owe `sql` to the next write transaction on `conn`, in place of one owed under `name`
    (module doc). Only for a statement that cannot fail but with its transaction. False when
    `conn` carries no owed writes (only the store's own connections do): the caller writes it
    in a transaction of its own."""
    if not isinstance(conn, postgres.PgConnection | SqliteConnection):
        return False
    owed = conn.riders.get(name)
    conn.riders[name] = Rider(sql, params, time.monotonic() if owed is None else owed.since)
    return True


def owed_since(conn: Connection) -> float | None:
    """When the oldest write still owed to a transaction on `conn` was first owed (None: none).
    Safe from the event loop while the worker thread writes: the riders are copied in one step
    (a copy made by C code, under the GIL) before they are looked at."""
    ridden = conn if isinstance(conn, postgres.PgConnection | SqliteConnection) else None
    riders = tuple(ridden.riders.values()) if ridden is not None else ()
    return min((rider.since for rider in riders), default=None)


def _rollback(conn: Connection) -> None:
    if conn.in_transaction:
        with contextlib.suppress(*errors()):
            conn.execute("ROLLBACK")


@contextlib.contextmanager
def commits_without_fsync(conn: Connection) -> Iterator[Connection]:
    """Commits inside do not wait for the disk (SQLite: WAL, synchronous=NORMAL; PostgreSQL:
    synchronous_commit off); the next durable commit makes them durable too, and a power cut
    may lose them. Only for writes whose loss is harmless (a mark that recovery derives again).
    Outside a transaction."""
    if isinstance(conn, postgres.PgConnection):
        # Not a SET of the session's (two round trips): each write transaction inside asks for
        # it in its opening statement, for itself only (set_config(..., true), SET LOCAL).
        conn.relaxed += 1
        try:
            yield conn
        finally:
            conn.relaxed -= 1
        return
    conn.execute("PRAGMA synchronous=NORMAL")
    try:
        yield conn
    finally:
        conn.execute("PRAGMA synchronous=FULL")


def fail_before_commit() -> None:
    """A `before_commit` hook that always fails (for tests)."""
    raise InjectedFault()
