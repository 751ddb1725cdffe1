"""`ntfy-intake store copy --to DSN`: a one-box SQLite store moved into an empty PostgreSQL
database (DESIGN.md section 9), so the daemon on PostgreSQL sends nothing twice.

Every table is copied row for row in one transaction on the target (all of it or nothing):
the same delivery keys, owner-message keys, feed entries and cursors, the same inbox rows, and
the journal with its seq numbers. The target's identity counters then continue above the
copied rows, and its journal above every line the audit files hold, so a new journal row never
reuses a seq the files already have. A target that holds anything is refused before a row is
written; the source is only read.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ntfy_intake.errors import StartupError
from ntfy_intake.store import audit, db, migrations, rebuild
from ntfy_intake.store.transaction import Connection

# Parents before children (outbox_events references outbox).
TABLES = (
    "kv",
    "cursor",
    "inbox",
    "incidents",
    "outbox",
    "outbox_events",
    "quarantine",
    "owner_outbox",
    # The owner's replies (store/owner_replies.py): what a quote names, what was received, acks.
    "owner_signal_sent",
    "owner_replies",
    "owner_acks",
    # The fallback topic's buttons (store/action_tokens.py): without the key every button
    # already on the phone is refused as forged; without the used tokens a spent one acts again.
    "owner_action_key",
    "owner_action_uses",
    "audit_journal",
    "feed_entries",
    "feed_cursors",
)
# The identity columns whose counters must continue above the copied rows.
_IDENTITIES = (("inbox", "seq"), ("quarantine", "id"), ("audit_journal", "seq"))
_BATCH = 1000


@dataclass(frozen=True, slots=True)
class Copied:
    rows: dict[str, int]

    def __str__(self) -> str:
        return ", ".join(f"{table} {count}" for table, count in self.rows.items())


def refuse_unless_empty(target: Connection, where: str) -> None:
    if not rebuild.is_empty(target) or _any_rows(target, ("feed_entries", "feed_cursors")):
        raise StartupError(
            f"{where} already holds a store: store copy writes only into an empty database"
        )


def copy_file(path: Path, target: Connection, *, audit_top: int) -> Copied:
    """`copy_store` from the SQLite file at `path`, opened read-only."""
    source = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10, isolation_level=None)
    try:
        return copy_store(source, target, audit_top=audit_top)
    finally:
        source.close()


def copy_store(source: sqlite3.Connection, target: Connection, *, audit_top: int) -> Copied:
    """Copy every table of `source` into the migrated, empty `target` (module doc), reading
    `source` in one read transaction: one consistent snapshot."""
    migrations.apply(target)
    counts: dict[str, int] = {}
    source.execute("BEGIN")
    try:
        with db.write_txn(target):
            # Under the target's write lock: a daemon starting on it meanwhile waits.
            refuse_unless_empty(target, str(getattr(target, "dsn", "the target")))
            for table in TABLES:
                counts[table] = _copy_table(source, target, table)
            for table, column in _IDENTITIES:
                _continue_identity(target, table, column)
            top = target.execute("SELECT coalesce(max(seq), 0) FROM audit_journal").fetchone()[0]
            audit.journal_seq_at_least(target, max(int(top), audit_top))
    finally:
        source.execute("ROLLBACK")
    return Copied(counts)


def _copy_table(source: sqlite3.Connection, target: Connection, table: str) -> int:
    source_columns = [row[1] for row in source.execute(f"PRAGMA table_info({table})")]
    target_columns = set(_columns(target, table))
    columns = [c for c in source_columns if c in target_columns]
    if not columns:
        return 0
    names = ", ".join(columns)
    insert = f"INSERT INTO {table}({names}) VALUES ({', '.join('?' for _ in columns)})"
    rows = source.execute(f"SELECT {names} FROM {table}")
    copied = 0
    while batch := [tuple(row) for row in rows.fetchmany(_BATCH)]:
        target.executemany(insert, batch)
        copied += len(batch)
    return copied


def _columns(target: Connection, table: str) -> list[str]:
    return [
        row[0]
        for row in target.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND table_name = ? ORDER BY ordinal_position",
            (table,),
        )
    ]


def _continue_identity(target: Connection, table: str, column: str) -> None:
    target.execute(
        f"SELECT setval(pg_get_serial_sequence('{table}', '{column}'),"
        f" (SELECT max({column}) FROM {table})) WHERE EXISTS (SELECT 1 FROM {table})"
    )


def _any_rows(conn: Connection, tables: Iterable[str]) -> bool:
    return any(conn.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone() is not None for t in tables)
