"""The audit flush on PostgreSQL in as few waits as it needs (issue 23, third round): twice per
live event (after the batch, after the settle) it reads the journal rows its files lack and
moves the mark, and it never reads back the mark this process wrote itself: the mark is forward
only in the store (audit.mark_forward), so writing it needs no read first."""

from __future__ import annotations

from pathlib import Path

import pytest

from ntfy_intake.store import audit, db

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
