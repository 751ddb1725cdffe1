"""The audit flush on PostgreSQL in as few waits as it needs (issue 23, third and fourth rounds):
twice per live event (after the batch, after the settle) it reads the journal rows its files
lack and moves the mark, and it never reads back the mark this process wrote itself: the mark is
forward only in the store (audit.mark_forward), so writing it needs no read first. The daemon's
flush (`mark_rides`) does not commit the mark in a transaction of its own either: it rides the
connection's next write transaction (transaction.ride), stays owed until one carrying it
commits, and is written alone only when nothing else writes (`write_owed_mark`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ntfy_intake.store import audit, db, postgres

from .test_audit_mirror import node, record
from .test_write_pipeline import answers_waited


def test_a_flush_does_not_read_back_the_mark_it_wrote(store: db.Connection, tmp_path: Path) -> None:
    """Kills a round trip per flush: the mark read before each move of it (SQLite waits for
    nothing: what is counted is PostgreSQL's; the outcome is held on both)."""
    conn = store
    pg = db.is_postgres(conn)
    with node(tmp_path) as log:
        record(conn, "aaaaaaaaaaa1")
        audit.flush(conn, log)
        record(conn, "bbbbbbbbbbb2")
        with answers_waited(conn) as waited:
            assert audit.flush(conn, log) == 1
        assert waited[0] == (2 if pg else 0)  # the rows the files lack, the mark's commit
        with answers_waited(conn) as waited:
            assert audit.flush(conn, log) == 0
        assert waited[0] == (1 if pg else 0)  # the rows: none, so no mark to move
    assert audit.flushed_seq(conn) == 2


def test_a_flush_behind_another_nodes_mark_leaves_it_where_it_is(
    store: db.Connection, tmp_path: Path
) -> None:
    """A node whose files are behind a mark another node wrote: its flush writes its own mark
    without reading that one first, and the store keeps the higher."""
    if not db.is_postgres(store):
        pytest.skip("one box on SQLite: its own mark is the only one")
    conn = store
    record(conn, "aaaaaaaaaaa1", "bbbbbbbbbbb2")
    with db.write_txn(conn):
        audit.mark_forward(conn, audit.FLUSHED_KEY, 9)
    with node(tmp_path) as log:
        assert audit.flush(conn, log) == 2
    assert audit.flushed_seq(conn) == 9


def pg_only(conn: db.Connection) -> postgres.PgConnection:
    if not isinstance(conn, postgres.PgConnection):
        pytest.skip("SQLite's flush commits its mark with the prune it decides (unchanged)")
    return conn


def test_a_daemons_flush_commits_no_transaction_of_its_own_for_the_mark(
    store: db.Connection, tmp_path: Path
) -> None:
    """Kills the mark's own transaction (BEGIN, the lock and the fence, then COMMIT: two waits
    per flush, twice per live event): it rides the next write, which waits no more for it."""
    conn = pg_only(store)
    record(conn, "aaaaaaaaaaa1")
    with node(tmp_path) as log:
        with answers_waited(conn) as waited:
            assert audit.flush(conn, log, mark_rides=True) == 1
        assert waited[0] == 1  # the rows the files lack; before: 3 (and the mark's commit)
        assert audit.flushed_seq(conn) == 0  # owed, not written
        with answers_waited(conn) as alone:
            record(conn, "bbbbbbbbbbb2")
        assert audit.flushed_seq(conn) == 1  # the next write carried it
        with answers_waited(conn) as carrying:
            record(conn, "ccccccccccc3")  # nothing owed: the same transaction without a rider
        assert alone[0] == carrying[0]
        assert audit.write_owed_mark(conn) is False  # nothing left to write alone


def test_an_owed_mark_outlives_a_transaction_that_rolled_back(
    store: db.Connection, tmp_path: Path
) -> None:
    """A rider dropped with a failed transaction would leave the mark behind the files for good
    (until a restart): it stays owed until a transaction carrying it commits."""
    conn = pg_only(store)
    record(conn, "aaaaaaaaaaa1", "bbbbbbbbbbb2")
    with node(tmp_path) as log:
        audit.flush(conn, log, mark_rides=True)
    with pytest.raises(RuntimeError), db.write_txn(conn):
        conn.execute("SELECT 1")
        raise RuntimeError("the body failed")
    assert audit.flushed_seq(conn) == 0
    assert db.owed_since(conn) is not None
    assert audit.write_owed_mark(conn) is True
    assert (audit.flushed_seq(conn), db.owed_since(conn)) == (2, None)


def test_an_owed_mark_is_owed_from_the_first_flush_that_left_it(
    store: db.Connection, tmp_path: Path
) -> None:
    """A steady trickle of flushes with no write between them must not keep the mark owed for
    ever: the age the ticker judges (`db.owed_since`) is the first flush's, the value the last's."""
    conn = pg_only(store)
    with node(tmp_path) as log:
        record(conn, "aaaaaaaaaaa1")
        audit.flush(conn, log, mark_rides=True)
        first = db.owed_since(conn)
        conn.execute('INSERT INTO audit_journal(line, term) VALUES (\'{"kind":"x"}\', 0)')
        audit.flush(conn, log, mark_rides=True)
        assert db.owed_since(conn) == first
        assert audit.write_owed_mark(conn) is True
    assert audit.flushed_seq(conn) == 2
