"""The one migrations list: every earlier schema, and every ledger written before the list had
one naming scheme, upgrades to a database equal to a fresh one; a newer schema is refused."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from ntfy_intake.errors import SchemaTooNew, StartupError
from ntfy_intake.store import db, migrations
from ntfy_intake.store.feed import FeedStore
from ntfy_intake.store.migrations_pg import POSTGRES

from .. import harness

NAMES = [name for name, _ in migrations.SQLITE]
OLD_NAME = {new: old for old, new in migrations.FORMERLY.items()}

Dump = list[tuple[str, str, str, str | None]]


# PostgreSQL's catalog, one row per column, constraint and index of the store's schema (its
# name left out: a fresh store and an upgraded one live in different schemas).
_PG_DUMP = """
SELECT 'column', table_name || '.' || column_name, table_name,
       concat_ws(' ', data_type, is_nullable, column_default, is_identity)
  FROM information_schema.columns WHERE table_schema = current_schema()
UNION ALL
SELECT 'constraint', c.conname, r.relname, pg_get_constraintdef(c.oid)
  FROM pg_constraint c JOIN pg_class r ON r.oid = c.conrelid
 WHERE c.connamespace = current_schema()::regnamespace
UNION ALL
SELECT 'index', indexname, tablename, replace(indexdef, current_schema() || '.', '')
  FROM pg_indexes WHERE schemaname = current_schema()
ORDER BY 1, 2
"""


def dump(conn: db.Connection) -> Dump:
    """Every table, index and trigger with its SQL, whitespace normalised (PostgreSQL: every
    column, constraint and index from its catalog)."""
    if db.is_postgres(conn):
        rows = conn.execute(_PG_DUMP)
    else:
        rows = conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
        )
    return [
        (row[0], row[1], row[2], None if row[3] is None else " ".join(row[3].split()))
        for row in rows
    ]


def fresh(tmp_path: Path) -> tuple[Dump, list[str]]:
    """A fresh store's schema and ledger, on the test's engine, in a store of its own."""
    with harness.separate_store(tmp_path / "fresh") as where:
        conn = db.connect(where)
        try:
            assert migrations.apply(conn) == NAMES
            return dump(conn), sorted(migrations.ledger(conn))
        finally:
            conn.close()


@contextlib.contextmanager
def store(tmp_path: Path, name: str) -> Iterator[db.Connection]:
    """The test's own store: a SQLite file in tmp_path, or the test's PostgreSQL schema."""
    conn = db.connect(db.Dsn(harness.DATABASE) if harness.DATABASE else tmp_path / name)
    try:
        yield conn
    finally:
        conn.close()


SQLITE_HISTORY = "a ledger or a file from before PostgreSQL was an engine: SQLite's history only"


def test_names_are_one_numbered_scheme_and_every_former_name_maps_to_a_step() -> None:
    assert [int(name[:4]) for name in NAMES] == list(range(1, len(NAMES) + 1))
    assert all(re.fullmatch(r"\d{4}_[a-z0-9_]+", name) for name in NAMES)
    assert len(set(NAMES)) == len(NAMES)
    assert set(migrations.FORMERLY.values()) <= set(NAMES)
    assert not set(migrations.FORMERLY) & set(NAMES)


@pytest.mark.engines
@pytest.mark.parametrize("k", range(len(NAMES) + 1))
def test_every_earlier_schema_migrates_to_the_fresh_one(tmp_path: Path, k: int) -> None:
    expected = fresh(tmp_path)
    with store(tmp_path, "old.sqlite3") as conn:
        migrations.apply(conn, migrations.for_engine(conn)[:k])
        assert migrations.apply(conn) == NAMES[k:]
        assert (dump(conn), sorted(migrations.ledger(conn))) == expected
        assert migrations.apply(conn) == []


# Only the steps that had a former name (those before issue 22); later ones simply run.
@pytest.mark.sqlite_only(reason=SQLITE_HISTORY)
@pytest.mark.parametrize("k", range(1, len(OLD_NAME) + 1))
def test_a_ledger_of_former_names_is_recognised_and_nothing_runs_again(
    tmp_path: Path, k: int
) -> None:
    """A database created before issue 22 records 001_core, feed_0001_..., owner_001_...:
    running any of those steps again would fail (table exists, duplicate column)."""
    expected = fresh(tmp_path)
    conn = db.connect(tmp_path / "old.sqlite3")
    migrations.apply(conn, migrations.SQLITE[:k])
    with db.write_txn(conn):
        for name in NAMES[:k]:
            conn.execute(
                "UPDATE schema_migrations SET name = ? WHERE name = ?", (OLD_NAME[name], name)
            )
    ran: list[str] = []
    conn.set_trace_callback(ran.append)
    assert migrations.apply(conn) == NAMES[k:]
    conn.set_trace_callback(None)
    old_statements = {s for _, steps in migrations.SQLITE[:k] for s in steps}
    assert not old_statements & set(ran)
    assert (dump(conn), sorted(migrations.ledger(conn))) == expected
    conn.close()


@pytest.mark.sqlite_only(reason=SQLITE_HISTORY)
def test_a_database_the_old_feed_cli_created_first_is_upgraded(tmp_path: Path) -> None:
    """The old FeedStore.open migrated the feed's step alone, under its old name."""
    expected = fresh(tmp_path)
    conn = db.connect(tmp_path / "old.sqlite3")
    feed_step = migrations.SQLITE[NAMES.index("0003_feed_entries_and_cursors")]
    migrations.apply(conn, [("feed_0001_entries_and_cursors", feed_step[1])])
    conn.close()
    with FeedStore.open(tmp_path / "old.sqlite3") as store:
        store.post("triage", {"x": 1}, sender="test", summary="s")
    conn = db.connect(tmp_path / "old.sqlite3")
    assert (dump(conn), sorted(migrations.ledger(conn))) == expected
    conn.close()


@pytest.mark.sqlite_only(reason=SQLITE_HISTORY)
def test_a_former_name_beside_its_current_one_is_dropped(tmp_path: Path) -> None:
    """An older agent CLI opening a newer database records the feed step again, by its old
    name (its statements are IF NOT EXISTS): the ledger keeps one name per step."""
    expected = fresh(tmp_path)
    conn = db.connect(tmp_path / "mixed.sqlite3")
    migrations.apply(conn)
    with db.write_txn(conn):
        conn.execute("INSERT INTO schema_migrations(name) VALUES ('feed_0001_entries_and_cursors')")
    assert migrations.apply(conn) == []
    assert (dump(conn), sorted(migrations.ledger(conn))) == expected
    conn.close()


@pytest.mark.engines
def test_a_newer_schema_is_refused_with_one_line_and_left_untouched(tmp_path: Path) -> None:
    with store(tmp_path, "newer.sqlite3") as conn:
        migrations.apply(conn, migrations.for_engine(conn)[:2])
        with db.write_txn(conn):
            conn.execute("INSERT INTO schema_migrations(name) VALUES ('0099_from_the_future')")
        before = (dump(conn), migrations.ledger(conn))
        with pytest.raises(SchemaTooNew) as raised:
            migrations.apply(conn)
        assert isinstance(raised.value, StartupError)  # exit 2: restarting cannot help
        message = str(raised.value)
        assert "\n" not in message and "0099_from_the_future" in message
        where = db.Dsn(harness.DATABASE) if harness.DATABASE else tmp_path / "newer.sqlite3"
        assert str(where) in message
        assert (dump(conn), migrations.ledger(conn)) == before
        assert not conn.in_transaction


@pytest.mark.engines
def test_db_migrate_is_the_same_ledger(tmp_path: Path) -> None:
    """The test bed's receiver keeps its own list through db.migrate: same lock, same ledger."""
    with store(tmp_path, "own.sqlite3") as conn:
        assert db.migrate(conn, [("0001_t", ["CREATE TABLE t(x INTEGER)"])]) == ["0001_t"]
        assert db.migrate(conn, [("0001_t", ["CREATE TABLE t(x INTEGER)"])]) == []
        assert migrations.ledger(conn) == ["0001_t"]
        with pytest.raises(SchemaTooNew):
            db.migrate(conn, [])


def test_both_engines_have_one_list_of_the_same_steps_in_the_same_order() -> None:
    """Failure mode: a step added to one engine's list only, so the other engine's schema lacks
    a column or an index the store's statements need."""
    assert [name for name, _ in POSTGRES] == [name for name, _ in migrations.SQLITE]
    for name, statements in POSTGRES:
        text = " ".join(statements).upper()
        assert "AUTOINCREMENT" not in text and " REAL" not in text, name


@pytest.mark.sqlite_only(reason="the clustered outbox links are SQLite's (migrations 0014)")
def test_the_outbox_links_survive_their_table_becoming_clustered(tmp_path: Path) -> None:
    """Kills a 0014 that rebuilt `outbox_events` empty (a request collecting its events across
    the upgrade would be sent without the ones linked before it), or that failed on a link to
    no request (every start would fail)."""
    with store(tmp_path, "links.sqlite3") as conn:
        steps = migrations.for_engine(conn)
        migrations.apply(conn, steps[: NAMES.index("0014_fewer_pages_per_event")])
        with db.write_txn(conn):
            conn.execute(
                "INSERT INTO outbox(delivery_key, incident_key, reason, state, due_at, created_at)"
                " VALUES ('d1', 'alerts:x', 'first', 'collecting', 1, 1)"
            )
            conn.executemany(
                "INSERT INTO outbox_events(delivery_key, event_id) VALUES ('d1', ?)",
                [("e1",), ("e2",)],
            )
        conn.execute("PRAGMA foreign_keys=OFF")  # a link to no request, as a hand edit leaves
        with db.write_txn(conn):
            conn.execute("INSERT INTO outbox_events(delivery_key, event_id) VALUES ('gone', 'e3')")
        conn.execute("PRAGMA foreign_keys=ON")
        assert migrations.apply(conn) == NAMES[NAMES.index("0014_fewer_pages_per_event") :]
        rows = conn.execute("SELECT delivery_key, event_id FROM outbox_events ORDER BY 2")
        assert [tuple(row) for row in rows] == [("d1", "e1"), ("d1", "e2")]
        ((sql,),) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'outbox_events'")
        assert "WITHOUT ROWID" in sql
