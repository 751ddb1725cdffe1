"""The write transaction's contract, on both engines, and on PostgreSQL its round trips: the
statements of `db.write_txn` are pipelined there (store/postgres.py), so a rowcount, a row and an
error arrive only when the connection waits for them. Each test here pins what must not change
when the answers come later, or how many waits a transaction costs (issue 23, second round)."""

from __future__ import annotations

import contextlib
import select
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from ntfy_intake.errors import Fenced
from ntfy_intake.store import db, leadership, postgres

pytestmark = pytest.mark.engines


@contextlib.contextmanager
def answers_waited(conn: db.Connection) -> Iterator[list[int]]:
    """How many times the connection waited for the server to answer (a round trip): each
    psycopg wait in which the socket became readable. Always [0] on SQLite."""
    waited = [0]
    if not isinstance(conn, postgres.PgConnection):
        yield waited
        return
    raw = conn.raw
    wait = raw.wait

    def reading(gen: Generator[Any, Any, Any], seen: list[bool]) -> Generator[Any, Any, Any]:
        try:
            state = next(gen)
            while True:
                ready = yield state
                if isinstance(ready, int) and ready & 1:  # Ready.R: an answer came in
                    seen.append(True)
                state = gen.send(ready)
        except StopIteration as stop:
            return stop.value

    def counting(gen: Generator[Any, Any, Any], *args: Any, **kwargs: Any) -> Any:
        seen: list[bool] = []
        try:
            return wait(reading(gen, seen), *args, **kwargs)
        finally:
            waited[0] += bool(seen)

    raw.wait = counting  # type: ignore[method-assign]
    try:
        yield waited
    finally:
        del raw.wait


def _values(conn: db.Connection) -> dict[str, str]:
    return {str(r[0]): str(r[1]) for r in conn.execute("SELECT name, value FROM kv")}


def test_each_rowcount_read_late_is_its_own_statements(store: db.Connection) -> None:
    """An UPDATE's rowcount read after later statements were sent (as the relay's settles are)
    counts that UPDATE's rows, not the last statement's, and decides only once it is known."""
    with db.write_txn(store):
        store.executemany("INSERT INTO kv(name, value) VALUES (?, ?)", [("a", "1"), ("b", "1")])
    with db.write_txn(store):
        both = store.execute("UPDATE kv SET value = '2' WHERE value = '1'")
        none = store.execute("UPDATE kv SET value = '3' WHERE name = 'absent'")
        one = store.execute("UPDATE kv SET value = '4' WHERE name = 'a'")
        counts = (both.rowcount, none.rowcount, one.rowcount)
        if counts == (2, 0, 1):
            store.execute("INSERT INTO kv(name, value) VALUES ('decided', 'yes')")
    assert counts == (2, 0, 1)
    assert _values(store) == {"a": "4", "b": "2", "decided": "yes"}


def test_a_failed_statement_rolls_back_what_was_sent_before_and_after_it(
    store: db.Connection,
) -> None:
    """A duplicate key in the middle of a transaction that reads nothing before COMMIT: on
    PostgreSQL its error arrives with the COMMIT's answer, and still nothing of the transaction
    is committed, the statement before it included; the connection is ready for the next."""
    with db.write_txn(store):
        store.execute("INSERT INTO kv(name, value) VALUES ('kept', 'x')")
    with pytest.raises(db.ERRORS), db.write_txn(store):
        store.execute("INSERT INTO kv(name, value) VALUES ('before', 'x')")
        store.execute("INSERT INTO kv(name, value) VALUES ('kept', 'again')")
        store.execute("INSERT INTO kv(name, value) VALUES ('after', 'x')")
    assert not store.in_transaction
    assert _values(store) == {"kept": "x"}
    with db.write_txn(store):
        store.execute("INSERT INTO kv(name, value) VALUES ('next', 'x')")
    assert _values(store) == {"kept": "x", "next": "x"}


def test_a_failed_statement_is_raised_by_the_next_read_before_anything_is_read(
    store: db.Connection,
) -> None:
    """The body reads after a failing statement: the read raises the statement's error (it
    never sees a row), and the rollback takes the whole transaction."""
    read: list[object] = []
    with db.write_txn(store):
        store.execute("INSERT INTO kv(name, value) VALUES ('taken', 'x')")
    with pytest.raises(db.ERRORS), db.write_txn(store):
        store.execute("INSERT INTO kv(name, value) VALUES ('first', 'x')")
        store.execute("INSERT INTO kv(name, value) VALUES ('taken', 'y')")
        read.append(store.execute("SELECT count(*) FROM kv").fetchone())
    assert read == []
    assert _values(store) == {"taken": "x"}


def test_an_error_of_the_body_wins_over_a_statement_not_yet_answered(
    store: db.Connection,
) -> None:
    """The body raises after a statement that fails: SQLite raised the statement's error at
    once; on PostgreSQL it was not answered yet, and the body's own exception is what the caller
    gets. Either way the transaction is rolled back and the connection is clean."""
    with db.write_txn(store):
        store.execute("INSERT INTO kv(name, value) VALUES ('taken', 'x')")
    with pytest.raises((ValueError, *db.ERRORS)) as raised, db.write_txn(store):
        store.execute("INSERT INTO kv(name, value) VALUES ('taken', 'y')")
        raise ValueError("the body's own")
    assert isinstance(raised.value, ValueError) == db.is_postgres(store)
    assert not store.in_transaction
    assert _values(store) == {"taken": "x"}
    with db.write_txn(store):
        store.execute("UPDATE kv SET value = 'z'")
    assert _values(store) == {"taken": "z"}


def test_a_write_transaction_waits_only_for_what_it_reads_and_its_commit(
    store: db.Connection,
) -> None:
    """PostgreSQL: a transaction that reads nothing is one round trip, COMMIT included; each
    read costs one more (it waits for everything sent before it), a second read of answers
    already in costs none. Before the pipeline: BEGIN, each statement, COMMIT, one each."""
    with answers_waited(store) as waited, db.write_txn(store):
        store.execute("INSERT INTO kv(name, value) VALUES ('a', '1')")
        store.executemany("INSERT INTO kv(name, value) VALUES (?, ?)", [("b", "1"), ("c", "1")])
        store.execute("UPDATE kv SET value = '2' WHERE name = 'a'")
    with answers_waited(store) as waited_reading, db.write_txn(store):
        first = store.execute("SELECT value FROM kv WHERE name = 'a'")
        second = store.execute("SELECT count(*) FROM kv")
        assert (first.fetchone()[0], second.fetchone()[0]) == ("2", 3)
        store.execute("DELETE FROM kv WHERE name = 'c'")
    if db.is_postgres(store):
        assert (waited, waited_reading) == ([1], [2])
    assert _values(store) == {"a": "2", "b": "1"}


def test_commits_without_fsync_relax_only_their_write_transactions(
    store: db.Connection,
) -> None:
    """PostgreSQL: inside `commits_without_fsync` each write transaction commits without
    waiting for the WAL (asked for in its opening statement, no round trips of their own), and
    the session's setting stays on, so nothing else on the connection is relaxed, and nothing
    is left relaxed if the block fails."""
    if not db.is_postgres(store):
        pytest.skip("SQLite relaxes the connection (PRAGMA synchronous): unchanged")

    def setting() -> str:
        return str(store.execute("SHOW synchronous_commit").fetchone()[0])

    with db.commits_without_fsync(store):
        assert setting() == "on"
        with answers_waited(store) as waited, db.write_txn(store):
            store.execute("INSERT INTO kv(name, value) VALUES ('mark', '1')")
        with db.write_txn(store):
            inside = setting()
    assert (waited, inside, setting()) == ([1], "off", "on")
    with contextlib.suppress(RuntimeError), db.commits_without_fsync(store):
        raise RuntimeError("the block failed")
    with db.write_txn(store):
        assert setting() == "on"


def test_a_fenced_write_reads_nothing_and_commits_nothing(store: db.Connection) -> None:
    """PostgreSQL: a leader whose term is over sends its statements before the term's answer
    comes; the first read raises Fenced instead of handing over a row, and a transaction that
    reads nothing raises it before COMMIT is sent. Neither writes anything."""
    if not isinstance(store, postgres.PgConnection):
        pytest.skip("leadership is PostgreSQL's")
    term = leadership.claim(store, "pi", "inst-a", 8.0).row.term
    store.execute("UPDATE leadership SET term = term + 1")  # another node took over
    store.term = term
    read: list[object] = []
    with pytest.raises(Fenced, match=f"term {term} is over"), db.write_txn(store):
        store.execute("INSERT INTO kv(name, value) VALUES ('zombie', 'read')")
        read.append(store.execute("SELECT count(*) FROM kv").fetchone())
    with pytest.raises(Fenced), db.write_txn(store):
        store.execute("INSERT INTO kv(name, value) VALUES ('zombie', 'blind')")
    assert read == []
    assert not store.in_transaction
    store.term = term + 1
    with db.write_txn(store):
        store.execute("INSERT INTO kv(name, value) VALUES ('leader', 'x')")
    assert _values(store) == {"leader": "x"}


def _refusal_in(store: postgres.PgConnection) -> None:
    """Wait until the server's answer to what was sent is readable: its refusal of the opening
    statement is sent at once (errors are flushed), so the driver finds it at the next send."""
    readable, _, _ = select.select([store.raw.pgconn.socket], [], [], 10.0)
    assert readable, "no answer from the server in 10 s"


@pytest.mark.parametrize("body", ["a statement", "nothing but COMMIT"])
def test_a_term_refusal_that_arrives_before_the_next_send_is_still_fenced(
    store: db.Connection, body: str
) -> None:
    """PostgreSQL: the driver reads answers already in whenever it sends, so the opening
    statement's refusal can surface from the body's next statement or from COMMIT itself,
    not only from a wait; it is errors.Fenced there too, never a cast error."""
    if not isinstance(store, postgres.PgConnection):
        pytest.skip("leadership is PostgreSQL's")
    term = leadership.claim(store, "pi", "inst-a", 8.0).row.term
    store.execute("UPDATE leadership SET term = term + 1")
    store.term = term
    with pytest.raises(Fenced, match=f"term {term} is over"), db.write_txn(store):
        _refusal_in(store)
        if body == "a statement":
            store.execute("INSERT INTO kv(name, value) VALUES ('zombie', 'x')")
    assert not store.in_transaction
    store.term = None
    assert _values(store) == {}


def test_a_fenced_leaders_write_that_reads_nothing_is_one_round_trip(store: db.Connection) -> None:
    """PostgreSQL: the term is compared by the server in the transaction's opening statement,
    so a leader's blind write (a claim, the audit mark, the cursor) waits once, not once for
    the term and once more for COMMIT; a term that is over still commits nothing, and names
    what the row holds, a term or none."""
    if not isinstance(store, postgres.PgConnection):
        pytest.skip("leadership is PostgreSQL's")
    term = leadership.claim(store, "pi", "inst-a", 8.0).row.term
    store.term = term
    with answers_waited(store) as waited, db.write_txn(store):
        store.execute("INSERT INTO kv(name, value) VALUES ('leader', 'x')")
    assert waited == [1]
    store.execute("UPDATE leadership SET term = term + 1")
    over = rf"term {term} is over \(the leadership row holds term {term + 1}\): this write"
    with pytest.raises(Fenced, match=over), db.write_txn(store):
        store.execute("INSERT INTO kv(name, value) VALUES ('zombie', 'x')")
    store.execute("DELETE FROM leadership")
    with pytest.raises(Fenced, match=r"holds no term\)"), db.write_txn(store):
        store.execute("INSERT INTO kv(name, value) VALUES ('zombie', 'y')")
    assert not store.in_transaction
    assert _values(store) == {"leader": "x"}
