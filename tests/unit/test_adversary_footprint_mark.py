"""Adversary of the rides that wait (fcc7d4e): on SQLite a rider owed under `RIDE_AFTER_S` is
left out of a write transaction and written later by `write_owed_mark` (carry_all). A later
value written directly meanwhile must not be moved back by the older rider."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ntfy_intake.store import audit, db, migrations, vitals_state

pytestmark = pytest.mark.sqlite_only(reason="SQLite's riders wait RIDE_AFTER_S")


def _record(conn: db.Connection, n: int) -> None:
    with db.write_txn(conn):
        audit.stage(conn, "notice", time.time(), notice=f"n{n}")


def test_an_owed_mark_never_moves_a_newer_mark_back(tmp_path: Path) -> None:
    """Kills the mark going back (the files hold 2, the store said 1, and status counted a line
    the files hold as unflushed): a mark owed under RIDE_AFTER_S was left out of
    `_mark_flushed`'s transaction, then written over the newer mark by `write_owed_mark`. The
    path: `Journal.flush_at_stop` when latched."""
    conn = db.connect(tmp_path / "intake.sqlite3")
    migrations.apply(conn)
    log = audit.AuditLog(tmp_path / "audit", time.time)
    try:
        _record(conn, 1)
        audit.flush(conn, log, mark_rides=True)  # the daemon's flush: mark 1 owed, trim too
        _record(conn, 2)  # a batch: the rider is under a second old, so not carried
        audit.flush(conn, log)  # flush_at_stop's retry when latched: writes the mark itself
        assert audit.flushed_seq(conn) == 2
        audit.write_owed_mark(conn)  # then the owed write at stop, carrying all
        assert audit.flushed_seq(conn) == log.last_seq == 2
    finally:
        log.close()
        conn.close()


def test_an_owed_snapshot_never_replaces_the_final_one(tmp_path: Path) -> None:
    """Kills `status` reading a stopped daemon as running: the final snapshot (`stopped`) is
    written at once, and a snapshot owed a moment before it, written later by the owed write
    at stop, replaced it."""
    conn = db.connect(tmp_path / "intake.sqlite3")
    migrations.apply(conn)
    try:
        vitals_state.save_health(conn, {"state": "running"}, ride=True)
        vitals_state.save_health(conn, {"state": "stopped"})
        audit.write_owed_mark(conn)
        row = conn.execute("SELECT value FROM kv WHERE name = ?", (vitals_state.HEALTH_KEY,))
        assert json.loads(row.fetchone()[0]) == {"state": "stopped"}
    finally:
        conn.close()


def test_the_daemons_flush_commits_nothing_so_it_needs_no_relaxed_sync(tmp_path: Path) -> None:
    """d2565b0 dropped commits_without_fsync around flush_sync because the riding flush commits
    nothing: were it to commit (the mark or the trim in a transaction of its own), each live
    event would pay a durable fsync again. Every statement of the flush is watched."""
    conn = db.connect(tmp_path / "intake.sqlite3")
    migrations.apply(conn)
    log = audit.AuditLog(tmp_path / "audit", time.time)
    statements: list[str] = []
    try:
        for n in range(3):
            _record(conn, n)
            conn.set_trace_callback(statements.append)  # type: ignore[attr-defined]
            try:
                assert audit.flush(conn, log, mark_rides=True) == 1
            finally:
                conn.set_trace_callback(None)  # type: ignore[attr-defined]
        assert log.last_seq == 3
    finally:
        log.close()
        conn.close()
    writes = [s for s in statements if s.split()[0].upper() in {"BEGIN", "COMMIT", "PRAGMA"}]
    assert writes == [], writes
