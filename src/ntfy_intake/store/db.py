"""SQLite foundation: connections, the one write-transaction helper, and the migration ledger.

Invariants owned here:
- every connection is in autocommit mode (isolation_level=None), WAL, synchronous=FULL (only
  `commits_without_fsync` relaxes it, for writes whose loss is harmless), foreign keys on, and
  a busy timeout, so no transaction is ever opened implicitly;
- every write goes through `write_txn`, which starts with BEGIN IMMEDIATE (the write lock is taken
  up front, so two writers serialize instead of failing at COMMIT) and rolls back on any exception;
- in-memory state that a write transaction decides on (cadence decisions, notice streaks,
  counters, wake-ups) changes only after its COMMIT: code inside registers the change with
  `Transaction.after_commit`, and a rolled-back transaction drops it. A transaction that fails
  and is run again (a transient storage fault) therefore decides from the same memory as the
  first run: nothing is lost or done twice;
- migrations are an ordered, named list, each applied once in its own transaction and recorded.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import ParamSpec, Protocol, TypeVar

from ntfy_intake.errors import InjectedFault

BUSY_TIMEOUT_MS = 10_000

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

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._effects: list[Effect] = []

    def after_commit(self, effect: Effect) -> None:
        self._effects.append(effect)

    def _committed(self) -> None:
        effects, self._effects = self._effects, []
        for effect in effects:
            effect()


def connect(path: Path | str, *, readonly: bool = False) -> sqlite3.Connection:
    """Open the database file with the settings every module relies on."""
    path = Path(path)
    if not readonly:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not path.exists():
            # Create 0600 before SQLite touches it: alert content lives here.
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
            os.close(fd)
    uri = f"file:{path}?mode=ro" if readonly else f"file:{path}"
    conn = sqlite3.connect(
        uri, uri=True, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
    )
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    if not readonly:
        _enable_wal(conn)
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def _enable_wal(conn: sqlite3.Connection) -> None:
    """Switching a fresh file to WAL does not wait on the busy handler when another process is
    doing the same at that moment: retry until the busy timeout instead of failing at once."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@contextlib.contextmanager
def write_txn(
    conn: sqlite3.Connection, *, before_commit: BeforeCommit | None = None
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
def commits_without_fsync(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
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


P = ParamSpec("P")
T = TypeVar("T")


class Runner(Protocol):
    """Runs a blocking database function off the event loop, serialized with every other user of
    the same connection (the daemon: one lock, one worker thread at a time)."""

    def __call__(
        self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> Awaitable[T]: ...


async def run_inline(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """A `Runner` for tests and tools with no concurrency: call directly."""
    return fn(*args, **kwargs)


Migration = tuple[str, Sequence[str]]


def migrate(conn: sqlite3.Connection, migrations: Sequence[Migration]) -> list[str]:
    """Apply pending migrations, each in its own transaction; return their names."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " name TEXT PRIMARY KEY,"
        " applied_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0))"
    )
    done: list[str] = []
    for name, statements in migrations:
        # Checked inside the write transaction: two processes opening a fresh file race here.
        with write_txn(conn):
            if conn.execute("SELECT 1 FROM schema_migrations WHERE name = ?", (name,)).fetchone():
                continue
            for statement in statements:
                conn.execute(statement)
            conn.execute("INSERT INTO schema_migrations(name) VALUES (?)", (name,))
        done.append(name)
    return done


# The connection type, named here so code outside the store types it without the driver.
Connection = sqlite3.Connection
