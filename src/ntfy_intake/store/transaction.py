"""The write transaction and its lock, on SQLite: the part of the engine every writer passes through.

Invariants owned here:
- every write goes through `write_txn`, which starts with BEGIN IMMEDIATE (the write lock is taken
  up front, so two writers serialize instead of failing at COMMIT) and rolls back on any exception;
- in-memory state that a write transaction decides on (cadence decisions, notice streaks,
  counters, wake-ups) changes only after its COMMIT: code inside registers the change with
  `Transaction.after_commit`, and a rolled-back transaction drops it. A transaction that fails
  and is run again (a transient storage fault) therefore decides from the same memory as the
  first run: nothing is lost or done twice;
- a connection is left fully synced after every `commits_without_fsync` block, whatever happened.

Callers outside the store reach these through `db` (`db.write_txn`, `db.Transaction`, ...):
tests patch `db.write_txn` to fail chosen COMMITs, so every writer looks it up there.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator

from ntfy_intake.errors import InjectedFault

# The engine's connection. Flow and surface code type their connections with this alias (as
# `db.Connection`) and never import the driver.
Connection = sqlite3.Connection
# Every exception the engine's driver raises: what code outside the store catches instead of
# naming the driver (`except db.ERRORS`). A second engine adds its driver's base class here.
ERRORS: tuple[type[Exception], ...] = (sqlite3.Error,)

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


@contextlib.contextmanager
def write_txn(
    conn: Connection, *, before_commit: BeforeCommit | None = None
) -> Iterator[Transaction]:
    """BEGIN IMMEDIATE ... COMMIT, rolling back every table on any exception; then the
    transaction's `after_commit` effects, only if the COMMIT succeeded.

    `before_commit` exists for failure-mode tests: it runs after the body's last statement and
    before COMMIT, so a fault raised there must leave every table, and all memory, untouched.
    """
    txn = Transaction(conn)
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield txn
        if before_commit is not None:
            before_commit()
        conn.execute("COMMIT")
    except BaseException:
        # On a full disk, an I/O error or a busy deadlock SQLite may already have rolled the
        # transaction back; a failing ROLLBACK must not replace the cause with its own message.
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise
    # Outside the handler: the rows are durable, and no effect's failure may roll them back.
    txn._committed()


@contextlib.contextmanager
def commits_without_fsync(conn: Connection) -> Iterator[Connection]:
    """Commits inside do not fsync (WAL, synchronous=NORMAL); the next FULL commit or
    checkpoint makes them durable with its own fsync, and a power cut may lose them. Only for
    writes whose loss is harmless (a mark that recovery derives again). Outside a transaction."""
    conn.execute("PRAGMA synchronous=NORMAL")
    try:
        yield conn
    finally:
        conn.execute("PRAGMA synchronous=FULL")


def fail_before_commit() -> None:
    """A `before_commit` hook that always fails (for tests)."""
    raise InjectedFault()
