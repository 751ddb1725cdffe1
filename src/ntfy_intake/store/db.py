"""The SQLite engine's front door: connections, and the names every other module uses.

Invariants owned here:
- every connection is in autocommit mode (isolation_level=None), WAL, synchronous=FULL (only
  `commits_without_fsync` relaxes it, for writes whose loss is harmless), foreign keys on, and
  a busy timeout, so no transaction is ever opened implicitly;
- every write goes through `write_txn` (transaction.py: BEGIN IMMEDIATE, rollback on any
  exception, `Transaction.after_commit` effects only after COMMIT), looked up here as
  `db.write_txn` so a test can fail chosen COMMITs;
- the schema comes from the one ordered list in migrations.py (`migrate` delegates there);
- code outside the store names this engine only through `Connection`, `ERRORS`,
  `commit_counter` and the typed functions of the store's modules (store/__init__.py).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import ParamSpec, Protocol, TypeVar

from ntfy_intake.settings.schema import Dsn, is_dsn
from ntfy_intake.store import migrations, postgres, transaction
from ntfy_intake.store.migrations import Migration
from ntfy_intake.store.storage import startup_error as storage_error
from ntfy_intake.store.transaction import (
    BeforeCommit,
    Connection,
    Effect,
    SqliteConnection,
    Transaction,
    commits_without_fsync,
    fail_before_commit,
    owed_since,
    write_txn,
)

__all__ = [
    "BUSY_TIMEOUT_MS",
    "PAGE_SIZE",
    "BeforeCommit",
    "Connection",
    "Dsn",
    "Effect",
    "Migration",
    "Runner",
    "Target",
    "Transaction",
    "commit_counter",
    "commits_without_fsync",
    "connect",
    "exists",
    "fail_before_commit",
    "is_postgres",
    "migrate",
    "owed_since",
    "page_size",
    "read_only",
    "repage",
    "run_inline",
    "write_txn",
]

BUSY_TIMEOUT_MS = 10_000

# Where a store lives: a SQLite file, or a PostgreSQL database (`[state] database`).
Target = Path | Dsn


def __getattr__(name: str) -> tuple[type[Exception], ...]:
    """`db.ERRORS`: transaction.errors() as it is now (the PostgreSQL driver's exceptions join it
    when it is loaded; a copy bound at import would lack them)."""
    if name == "ERRORS":
        return transaction.errors()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def target_of(value: Path | Dsn | str) -> Target:
    """A path or a DSN string as the store's `Target`."""
    if isinstance(value, Dsn | Path):
        return value
    return Dsn(value) if is_dsn(value) else Path(value)


def is_postgres(conn: Connection) -> bool:
    return isinstance(conn, postgres.PgConnection)


def exists(target: Target | str) -> bool:
    """Whether there is a store to open read-only: a file on SQLite; on PostgreSQL, a database
    a daemon has migrated (its ledger table). A server that does not answer is not "no store":
    its error goes out as one named line (storage.startup_error)."""
    target = target_of(target)
    if not isinstance(target, Dsn):
        return target.exists()
    try:
        conn = postgres.connect(target, readonly=True, timeout=BUSY_TIMEOUT_MS / 1000)
        try:
            found = conn.execute("SELECT to_regclass('schema_migrations')").fetchone()
        finally:
            conn.close()
    except transaction.errors() as exc:
        raise storage_error(exc, target) from None
    return found is not None and found[0] is not None


# A new store's page size. Each B-tree a commit touches is one page in the WAL, fsynced: a live
# event touches about ten, each a few hundred bytes of rows, so on an SD card the page size is
# what an event costs (docs/performance.md, "Per live event: bytes and CPU").
PAGE_SIZE = 2048


def connect(target: Target | str, *, readonly: bool = False) -> Connection:
    """Open the store with the settings every module relies on: a SQLite file, or a
    PostgreSQL database when `target` is a DSN (postgres.connect)."""
    target = target_of(target)
    if isinstance(target, Dsn):
        return postgres.connect(target, readonly=readonly, timeout=BUSY_TIMEOUT_MS / 1000)
    path = target
    if not readonly:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not path.exists():
            # Create 0600 before SQLite touches it: alert content lives here.
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
            os.close(fd)
    uri = f"file:{path}?mode=ro" if readonly else f"file:{path}"
    conn = sqlite3.connect(
        uri,
        uri=True,
        isolation_level=None,
        check_same_thread=False,
        timeout=BUSY_TIMEOUT_MS / 1000,
        factory=SqliteConnection,
    )
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    if not readonly:
        conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # a new file's; an existing one keeps its
        _enable_wal(conn)
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def page_size(conn: Connection) -> int:
    """A SQLite store's page size in bytes."""
    return int(conn.execute("PRAGMA page_size").fetchone()[0])


def repage(conn: Connection, size: int = PAGE_SIZE) -> None:
    """Rewrite a SQLite store with `size`-byte pages (`store repage`), with no other connection
    open: a page size holds from a file's creation and WAL mode keeps it, so the journal leaves
    WAL for the VACUUM that rewrites every page, atomically (a failure, a full disk included,
    leaves the file as it was), and comes back."""
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("PRAGMA journal_mode=DELETE")
    try:
        conn.execute(f"PRAGMA page_size={int(size)}")
        conn.execute("VACUUM")
    finally:
        _enable_wal(conn)


def _enable_wal(conn: Connection) -> None:
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


def migrate(conn: Connection, steps: Sequence[Migration]) -> list[str]:
    """`migrations.apply` (kept for callers written before the one list): apply the steps the
    ledger lacks, under the write lock; return their names."""
    return migrations.apply(conn, steps)


def commit_counter(conn: Connection) -> int:
    """A number that changes whenever another connection commits (SQLite: PRAGMA data_version),
    read through a connection of one's own. Watchers of new rows poll it and query only when it
    moved: the store's notification of new rows. It says that something changed, not what.
    PostgreSQL: the NOTIFYs of committed write transactions this connection has received (it
    LISTENs from the first call; a round trip collects what arrived)."""
    if isinstance(conn, postgres.PgConnection):
        conn.listen()
        conn.execute("SELECT 1")
        return conn.notifications
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


def read_only(conn: Connection) -> Connection:
    """Refuse every write on `conn` from now on (a watcher's connection: the doorbell)."""
    if isinstance(conn, postgres.PgConnection):
        conn.execute("SET default_transaction_read_only = on")
        return conn
    conn.execute("PRAGMA query_only=ON")
    return conn


def fence_to(conn: Connection, term: int | None, *, idle_limit: float | None = None) -> None:
    """Fence `conn`'s write transactions to a leadership term (transaction.write_txn raises
    errors.Fenced once another term began); None unfences. `idle_limit`: seconds the server
    lets a transaction sit idle before it ends the session (a paused leader's open transaction
    would otherwise hold off the takeover). SQLite has one writer: no fence."""
    if isinstance(conn, postgres.PgConnection):
        conn.fence(term, idle_limit)
