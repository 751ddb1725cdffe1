"""The one ordered list of the SQLite store's migrations, and the lock they are applied under.

Every table, index and column of the daemon's database comes from `SQLITE`, in order, each step
applied once and recorded by name in `schema_migrations`. Names are `NNNN_what`, numbered from
0001 with no gaps; a new step is appended, never inserted, and an applied step is never edited.

`apply` is the only way a database is migrated (the daemon at start, the feed CLI and agents on
open): one write transaction (BEGIN IMMEDIATE, SQLite's write lock) around reading the ledger
and applying what is missing, so two processes starting at once on a fresh file serialize: the
second waits for the lock, then finds everything applied. The whole upgrade commits or none of
it does (SQLite DDL is transactional).

Before issue 22 the steps lived in three lists with three naming schemes; databases created
then record the old names. `FORMERLY` maps each to its step here: such a ledger is renamed in
place, inside the same transaction, and nothing is run again. A ledger name that is neither a
step nor a former name was written by a newer ntfy-intake: `apply` refuses to touch the database
(`SchemaTooNew`, a StartupError: exit 2 with one line).

The invariants that live in the schema: one inbox row per ntfy id (PRIMARY KEY), outbox states
are a closed set (CHECK), a quarantined frame is stored once however often it is replayed (UNIQUE
hash), a feed entry's seq is unique per channel and an idempotency key too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ntfy_intake.errors import SchemaTooNew
from ntfy_intake.store import postgres, transaction
from ntfy_intake.store.migrations_pg import POSTGRES
from ntfy_intake.store.transaction import Connection

__all__ = ["FORMERLY", "SQLITE", "Migration", "apply", "for_engine", "ledger"]

# (name, statements): one step of a list.
Migration = tuple[str, Sequence[str]]

SQLITE: tuple[Migration, ...] = (
    (
        "0001_core",
        [
            """CREATE TABLE inbox(
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                event_id TEXT NOT NULL UNIQUE,
                topic TEXT NOT NULL,
                time INTEGER NOT NULL,
                expires INTEGER,
                raw TEXT NOT NULL,
                raw_sha256 TEXT NOT NULL,
                incident_key TEXT NOT NULL,
                severity INTEGER NOT NULL,
                outcome TEXT NOT NULL,
                reason TEXT NOT NULL,
                delivery_key TEXT,
                received_at REAL NOT NULL)""",
            "CREATE INDEX inbox_received ON inbox(received_at)",
            """CREATE TABLE incidents(
                key TEXT PRIMARY KEY,
                severity INTEGER NOT NULL,
                status TEXT NOT NULL CHECK (status IN ('firing', 'resolved')),
                status_time INTEGER NOT NULL,
                status_event TEXT NOT NULL,
                first_seen INTEGER NOT NULL,
                last_seen INTEGER NOT NULL,
                events INTEGER NOT NULL,
                version INTEGER NOT NULL)""",
            """CREATE TABLE outbox(
                delivery_key TEXT PRIMARY KEY,
                incident_key TEXT NOT NULL,
                reason TEXT NOT NULL,
                state TEXT NOT NULL CHECK (
                    state IN ('collecting', 'pending', 'leased', 'delivered', 'dead', 'skipped')),
                payload TEXT,
                incident_version INTEGER,
                attempts INTEGER NOT NULL DEFAULT 0,
                due_at REAL NOT NULL,
                lease_until REAL,
                last_error TEXT,
                response TEXT,
                created_at REAL NOT NULL,
                settled_at REAL)""",
            "CREATE INDEX outbox_due ON outbox(state, due_at)",
            "CREATE INDEX outbox_incident ON outbox(incident_key, state)",
            """CREATE TABLE outbox_events(
                delivery_key TEXT NOT NULL REFERENCES outbox(delivery_key),
                event_id TEXT NOT NULL,
                PRIMARY KEY(delivery_key, event_id))""",
            """CREATE TABLE quarantine(
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                raw_sha256 TEXT NOT NULL UNIQUE,
                raw TEXT NOT NULL,
                reason TEXT NOT NULL,
                event_id TEXT,
                first_seen REAL NOT NULL,
                last_seen REAL NOT NULL,
                count INTEGER NOT NULL)""",
            """CREATE TABLE owner_outbox(
                key TEXT PRIMARY KEY,
                kind TEXT NOT NULL CHECK (kind IN ('notice', 'triage')),
                topic TEXT NOT NULL,
                text TEXT NOT NULL,
                state TEXT NOT NULL
                    CHECK (state IN ('pending', 'leased', 'sent', 'suppressed', 'dead')),
                attempts INTEGER NOT NULL DEFAULT 0,
                due_at REAL NOT NULL,
                lease_until REAL,
                channel TEXT,
                last_error TEXT,
                created_at REAL NOT NULL,
                settled_at REAL)""",
            "CREATE INDEX owner_outbox_due ON owner_outbox(state, due_at)",
            """CREATE TABLE audit_journal(
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                line TEXT NOT NULL)""",
            """CREATE TABLE cursor(
                id INTEGER PRIMARY KEY CHECK (id = 1),
                kind TEXT NOT NULL CHECK (kind IN ('id', 'time', 'all')),
                value TEXT NOT NULL,
                message_time INTEGER,
                updated_at REAL NOT NULL)""",
            """CREATE TABLE kv(
                name TEXT PRIMARY KEY,
                value TEXT NOT NULL)""",
        ],
    ),
    # Issue 11: ntfy >= 2.16 events (an inbox row knows its event kind and the message sequence it
    # belongs to or names), the durable overlap backfill owed, and the server time of the last frame
    # seen (the start of a gap window).
    (
        "0002_sequences_backfill",
        [
            "ALTER TABLE inbox ADD COLUMN event TEXT NOT NULL DEFAULT 'message'",
            "ALTER TABLE inbox ADD COLUMN sequence_id TEXT",
            "CREATE INDEX inbox_sequence ON inbox(sequence_id, topic)",
            # Delete/clear events whose message has not arrived yet: linked when it does.
            "CREATE INDEX inbox_unlinked ON inbox(topic, sequence_id) WHERE incident_key = ''",
            "ALTER TABLE cursor ADD COLUMN backfill_from INTEGER",
            "ALTER TABLE cursor ADD COLUMN backfill_epoch INTEGER NOT NULL DEFAULT 0",
            "ALTER TABLE cursor ADD COLUMN last_frame_time INTEGER",
            "ALTER TABLE cursor ADD COLUMN gap_from INTEGER",
        ],
    ),
    # The agent feed (feed.py): per-channel entries and per-handle cursors.
    (
        "0003_feed_entries_and_cursors",
        [
            "CREATE TABLE IF NOT EXISTS feed_entries ("
            " channel TEXT NOT NULL,"
            " seq INTEGER NOT NULL CHECK (seq > 0),"
            " delivery_key TEXT NOT NULL,"
            " sender TEXT NOT NULL,"
            " payload TEXT NOT NULL CHECK (json_valid(payload)),"
            " summary TEXT NOT NULL,"
            " idempotency_key TEXT,"
            " created_at REAL NOT NULL,"
            " PRIMARY KEY (channel, seq),"
            " UNIQUE (channel, idempotency_key))",
            "CREATE TABLE IF NOT EXISTS feed_cursors ("
            " handle TEXT NOT NULL,"
            " channel TEXT NOT NULL,"
            " acked_seq INTEGER NOT NULL CHECK (acked_seq >= 0),"
            " joined_at REAL NOT NULL,"
            " PRIMARY KEY (handle, channel))",
        ],
    ),
    # The owner sender (flow/owner.py): what a row still owes after a failed attempt.
    (
        "0004_owner_delivery_state",
        [
            # JSON array of Signal recipients still owed after a partial failure; NULL = all.
            "ALTER TABLE owner_outbox ADD COLUMN signal_owed TEXT",
            # Start of the first failed Signal attempt still unresolved: the fallback clock.
            "ALTER TABLE owner_outbox ADD COLUMN signal_failing_since REAL",
            # Attempts on the fallback topic (its own max_attempts budget).
            "ALTER TABLE owner_outbox ADD COLUMN ntfy_attempts INTEGER NOT NULL DEFAULT 0",
        ],
    ),
    # Issue 25: the owner console reads an incident's events and the recent incidents by index
    # (store/console_reads.py), so a page stays fast with 100,000 events in the inbox.
    (
        "0005_console_reads",
        [
            "CREATE INDEX inbox_incident ON inbox(incident_key, time)",
            "CREATE INDEX incidents_last_seen ON incidents(last_seen)",
        ],
    ),
    # The console's incidents page reads each incident's newest triage requests by index: through
    # outbox_incident (incident_key, state) it sorted all of an incident's requests (one per
    # cooldown window, for as long as the incident lives) to keep five.
    (
        "0006_console_incident_requests",
        ["CREATE INDEX outbox_incident_created ON outbox(incident_key, created_at)"],
    ),
    # The standby's lease and the journal's term (DESIGN.md section 9) exist on PostgreSQL only:
    # one box on SQLite has no second process to fence. The step is named here too, so both
    # engines' ledgers list the same names.
    ("0007_leadership", []),
    # Readiness per node (DESIGN.md section 11) exists on PostgreSQL only, as the lease does.
    ("0008_nodes", []),
    # Replies from the phone (DESIGN.md section 13): the timestamp Signal answered for each send
    # of an owner message, which a reply's quote names. One row per send: a message retried to
    # the recipients a partial failure left has two timestamps, and either may be quoted.
    (
        "0009_owner_signal_sent",
        [
            """CREATE TABLE owner_signal_sent(
                signal_ts INTEGER PRIMARY KEY,
                key TEXT NOT NULL,
                sent_at REAL NOT NULL)""",
            "CREATE INDEX owner_signal_sent_at ON owner_signal_sent(sent_at)",
        ],
    ),
    # Replies from the phone (flow/owner_replies.py): each received envelope once, by its
    # (source, timestamp), recorded in the transaction of its effect; and the incidents the
    # owner acknowledged, with the incident's version then (it changes when the severity rises
    # or the status flips: store/owner_replies.py).
    (
        "0010_owner_replies",
        [
            """CREATE TABLE owner_replies(
                source TEXT NOT NULL,
                envelope_ts INTEGER NOT NULL,
                received_at REAL NOT NULL,
                command TEXT NOT NULL,
                result TEXT NOT NULL,
                PRIMARY KEY (source, envelope_ts))""",
            """CREATE TABLE owner_acks(
                incident_key TEXT PRIMARY KEY,
                version INTEGER NOT NULL,
                acked_at REAL NOT NULL)""",
        ],
    ),
    # The notices a standby owes the owner, on its node row (PostgreSQL only, as the rows are).
    ("0011_nodes_owed", []),
    # The fallback topic's action buttons (store/action_tokens.py): the one signing key, in the
    # database so that both nodes of a standby pair verify each other's tokens; and each token
    # used, recorded with its effect, so that a button acts once.
    (
        "0012_owner_action_tokens",
        [
            """CREATE TABLE owner_action_key(
                id INTEGER PRIMARY KEY CHECK (id = 1),
                secret TEXT NOT NULL,
                created_at REAL NOT NULL)""",
            """CREATE TABLE owner_action_uses(
                token_id TEXT PRIMARY KEY,
                used_at REAL NOT NULL,
                result TEXT NOT NULL)""",
            "CREATE INDEX owner_action_uses_at ON owner_action_uses(used_at)",
        ],
    ),
    # The incident's version when an owner message went out over Signal (store/owner_replies.py):
    # the firing it showed, so a reply quoting it cannot acknowledge a later firing. NULL for a
    # message about no incident, and for one sent before this step (it acts as before).
    (
        "0013_owner_signal_sent_version",
        ["ALTER TABLE owner_signal_sent ADD COLUMN incident_version INTEGER"],
    ),
    # Issue 36: every B-tree a live event's batch touches is a 4 KiB page in the WAL, on an SD
    # card. Two indexes were written by every event for reads that are rare (retention's sweep,
    # the console's list of incidents, a scan of a table a homelab keeps small), and the outbox's
    # event links were a table and an index of the same key: a clustered table now.
    (
        "0014_fewer_pages_per_event",
        [
            "DROP INDEX inbox_received",
            "DROP INDEX incidents_last_seen",
            """CREATE TABLE outbox_events_clustered(
                delivery_key TEXT NOT NULL REFERENCES outbox(delivery_key),
                event_id TEXT NOT NULL,
                PRIMARY KEY(delivery_key, event_id)) WITHOUT ROWID""",
            # A link whose request is gone (only writes made with foreign keys off leave one)
            # would fail the copy, and with it every start: it names nothing, so it stays out.
            # A link held twice (a table rebuilt by hand without its key) is one link.
            "INSERT OR IGNORE INTO outbox_events_clustered"
            " SELECT delivery_key, event_id FROM outbox_events"
            " WHERE delivery_key IN (SELECT delivery_key FROM outbox)",
            "DROP TABLE outbox_events",
            "ALTER TABLE outbox_events_clustered RENAME TO outbox_events",
        ],
    ),
)

# The names the steps had before issue 22 (schema.py's CORE, feed.py's FEED_MIGRATIONS, owner.py's
# OWNER_MIGRATIONS): a ledger holding one is the same step applied.
FORMERLY: Mapping[str, str] = {
    "001_core": "0001_core",
    "002_sequences_backfill": "0002_sequences_backfill",
    "feed_0001_entries_and_cursors": "0003_feed_entries_and_cursors",
    "owner_001_delivery_state": "0004_owner_delivery_state",
}

_LEDGER = (
    "CREATE TABLE IF NOT EXISTS schema_migrations ("
    " name TEXT PRIMARY KEY,"
    " applied_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0))"
)
# PostgreSQL has no rowid: the ledger's order is an identity column.
_LEDGER_PG = (
    "CREATE TABLE IF NOT EXISTS schema_migrations ("
    " name TEXT PRIMARY KEY,"
    " applied_at DOUBLE PRECISION NOT NULL DEFAULT extract(epoch FROM now()),"
    " ordinal BIGINT GENERATED ALWAYS AS IDENTITY)"
)


def for_engine(conn: Connection) -> tuple[Migration, ...]:
    """The product's list for `conn`'s engine."""
    if isinstance(conn, postgres.PgConnection):
        return POSTGRES
    return SQLITE


def apply(conn: Connection, steps: Iterable[Migration] | None = None) -> list[str]:
    """Apply the steps the ledger lacks, in order, under the write lock; return their names.

    `steps` is the product's list for the engine unless a caller keeps a database of its own
    (the test bed's receiver). Raises SchemaTooNew, with nothing changed, when the ledger names
    a step `steps` does not have."""
    steps = list(for_engine(conn) if steps is None else steps)
    known = {name for name, _ in steps}
    pg = isinstance(conn, postgres.PgConnection)
    # The lock: the engine's write lock (BEGIN IMMEDIATE; PostgreSQL: the store's advisory
    # lock) before the ledger is read. Not `db.write_txn`, which tests patch to fail the COMMITs
    # of the daemon's writers.
    with transaction.write_txn(conn):
        conn.execute(_LEDGER_PG if pg else _LEDGER)
        _rename_former(conn, known)
        done = set(ledger(conn))
        unknown = sorted(done - known)
        if unknown:
            raise SchemaTooNew(
                f"database {_file_of(conn)} was migrated by a newer ntfy-intake (unknown schema"
                f" migration {', '.join(unknown)}): run that version or a later one"
            )
        applied: list[str] = []
        for name, statements in steps:
            if name in done:
                continue
            for statement in statements:
                conn.execute(statement)
            conn.execute("INSERT INTO schema_migrations(name) VALUES (?)", (name,))
            done.add(name)
            applied.append(name)
    return applied


def ledger(conn: Connection) -> list[str]:
    """The names recorded as applied, in the order they were recorded."""
    if isinstance(conn, postgres.PgConnection):
        if conn.execute("SELECT to_regclass('schema_migrations')").fetchone()[0] is None:
            return []
        return [
            row[0] for row in conn.execute("SELECT name FROM schema_migrations ORDER BY ordinal")
        ]
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
    ).fetchone()
    if exists is None:
        return []
    return [row[0] for row in conn.execute("SELECT name FROM schema_migrations ORDER BY rowid")]


def _rename_former(conn: Connection, known: set[str]) -> None:
    """Record former names under their step's name (only for steps being applied now). A ledger
    holding both (an older agent CLI opened a newer database) keeps the current one."""
    recorded = set(ledger(conn))
    for old, new in FORMERLY.items():
        if old not in recorded or new not in known:
            continue
        if new in recorded:
            conn.execute("DELETE FROM schema_migrations WHERE name = ?", (old,))
        else:
            conn.execute("UPDATE schema_migrations SET name = ? WHERE name = ?", (new, old))


def _file_of(conn: Connection) -> str:
    if isinstance(conn, postgres.PgConnection):
        return str(conn.dsn)
    for row in conn.execute("PRAGMA database_list"):
        if row[1] == "main":
            return str(row[2]) or "(in memory)"
    return "(unknown)"
