from __future__ import annotations

from pathlib import Path

import pytest

from ntfy_intake import db
from ntfy_intake.errors import InjectedFault


def test_injected_fault_before_commit_rolls_back(tmp_path: Path) -> None:
    conn = db.connect(tmp_path / "x.sqlite3")
    db.migrate(conn, [("001", ["CREATE TABLE t(x INTEGER)"])])
    with pytest.raises(InjectedFault), db.write_txn(conn, before_commit=db.fail_before_commit):
        conn.execute("INSERT INTO t VALUES (1)")
    assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 0


def test_migrations_apply_once(tmp_path: Path) -> None:
    conn = db.connect(tmp_path / "x.sqlite3")
    assert db.migrate(conn, [("001", ["CREATE TABLE t(x)"])]) == ["001"]
    assert db.migrate(conn, [("001", ["CREATE TABLE t(x)"])]) == []


def test_database_file_is_private(tmp_path: Path) -> None:
    db.connect(tmp_path / "state" / "x.sqlite3")
    assert (tmp_path / "state" / "x.sqlite3").stat().st_mode & 0o077 == 0


SYNC_FULL, SYNC_NORMAL = 2, 1


def test_commits_without_fsync_leave_every_later_commit_fully_synced(tmp_path: Path) -> None:
    """A relaxed commit that fails (or not) must never leave the connection relaxed: every
    inbox commit after it still fsyncs."""
    conn = db.connect(tmp_path / "x.sqlite3")
    db.migrate(conn, [("001", ["CREATE TABLE t(x INTEGER)"])])
    with db.commits_without_fsync(conn), db.write_txn(conn):
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == SYNC_NORMAL
        conn.execute("INSERT INTO t VALUES (1)")
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == SYNC_FULL
    with (
        pytest.raises(InjectedFault),
        db.commits_without_fsync(conn),
        db.write_txn(conn, before_commit=db.fail_before_commit),
    ):
        conn.execute("INSERT INTO t VALUES (2)")
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == SYNC_FULL
    assert [tuple(row) for row in conn.execute("SELECT x FROM t")] == [(1,)]
