from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from ntfy_intake.errors import InjectedFault
from ntfy_intake.store import db

from .. import harness


def target(tmp_path: Path) -> db.Target:
    """The test's store: a file in tmp_path, or the test's PostgreSQL schema."""
    return db.Dsn(harness.DATABASE) if harness.DATABASE else tmp_path / "x.sqlite3"


@pytest.mark.engines
def test_injected_fault_before_commit_rolls_back(tmp_path: Path) -> None:
    conn = db.connect(target(tmp_path))
    db.migrate(conn, [("001", ["CREATE TABLE t(x INTEGER)"])])
    with pytest.raises(InjectedFault), db.write_txn(conn, before_commit=db.fail_before_commit):
        conn.execute("INSERT INTO t VALUES (1)")
    assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 0
    assert not conn.in_transaction
    conn.close()


@pytest.mark.engines
def test_migrations_apply_once(tmp_path: Path) -> None:
    conn = db.connect(target(tmp_path))
    assert db.migrate(conn, [("001", ["CREATE TABLE t(x INTEGER)"])]) == ["001"]
    assert db.migrate(conn, [("001", ["CREATE TABLE t(x INTEGER)"])]) == []
    conn.close()


@pytest.mark.sqlite_only(reason="the SQLite file's mode (PostgreSQL keeps no file of ours)")
def test_database_file_is_private(tmp_path: Path) -> None:
    db.connect(tmp_path / "state" / "x.sqlite3").close()
    assert (tmp_path / "state" / "x.sqlite3").stat().st_mode & 0o077 == 0


def synced(conn: db.Connection) -> bool:
    """Whether a COMMIT on `conn` waits for the disk: SQLite's synchronous=FULL (2; NORMAL is
    1), PostgreSQL's synchronous_commit on."""
    if db.is_postgres(conn):
        value = conn.execute("SHOW synchronous_commit").fetchone()[0]
        assert value in ("on", "off"), value
        return bool(value == "on")
    value = conn.execute("PRAGMA synchronous").fetchone()[0]
    assert value in (1, 2), value
    return bool(value == 2)


@pytest.mark.engines
def test_commits_without_fsync_leave_every_later_commit_fully_synced(tmp_path: Path) -> None:
    """A relaxed commit that fails (or not) must never leave the connection relaxed: every
    inbox commit after it still fsyncs."""
    conn = db.connect(target(tmp_path))
    db.migrate(conn, [("001", ["CREATE TABLE t(x INTEGER)"])])
    assert synced(conn)
    with db.commits_without_fsync(conn), db.write_txn(conn):
        assert not synced(conn)
        conn.execute("INSERT INTO t VALUES (1)")
    assert synced(conn)
    with (
        pytest.raises(InjectedFault),
        db.commits_without_fsync(conn),
        db.write_txn(conn, before_commit=db.fail_before_commit),
    ):
        conn.execute("INSERT INTO t VALUES (2)")
    assert synced(conn)
    assert [tuple(row) for row in conn.execute("SELECT x FROM t")] == [(1,)]
    conn.close()


@pytest.mark.engines
def test_after_commit_effects_run_in_order_once_the_commit_is_durable(tmp_path: Path) -> None:
    """An effect ran before COMMIT: memory moved on for rows that were not there yet (a
    transaction run again after a failed COMMIT then took its own notice as already sent)."""
    conn = db.connect(target(tmp_path))
    db.migrate(conn, [("001", ["CREATE TABLE t(x INTEGER)"])])
    seen: list[tuple[str, bool, int]] = []

    def effect(name: str) -> db.Effect:
        def run() -> None:
            with contextlib.closing(db.connect(target(tmp_path))) as other:
                count = other.execute("SELECT count(*) FROM t").fetchone()[0]
            seen.append((name, conn.in_transaction, count))

        return run

    with db.write_txn(conn) as txn:
        txn.conn.execute("INSERT INTO t VALUES (1)")
        txn.after_commit(effect("first"))
        txn.after_commit(effect("second"))
        assert seen == []
    # After COMMIT, in order, and another connection already sees the row.
    assert seen == [("first", False, 1), ("second", False, 1)]
    conn.close()


@pytest.mark.engines
@pytest.mark.parametrize("where", ["body", "commit"])
def test_rolled_back_transaction_drops_its_after_commit_effects(tmp_path: Path, where: str) -> None:
    """An effect of a rolled-back transaction ran anyway: the retry found memory already moved
    (a streak set, a counter bumped, a cadence decision taken) for rows that never existed."""
    conn = db.connect(target(tmp_path))
    db.migrate(conn, [("001", ["CREATE TABLE t(x INTEGER)"])])
    ran: list[str] = []
    fault = db.fail_before_commit if where == "commit" else None
    with pytest.raises(InjectedFault), db.write_txn(conn, before_commit=fault) as txn:
        txn.conn.execute("INSERT INTO t VALUES (1)")
        txn.after_commit(lambda: ran.append("effect"))
        if where == "body":
            raise InjectedFault()
    assert ran == []
    assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 0
    conn.close()
