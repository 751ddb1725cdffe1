"""The writes owed to the next PostgreSQL transaction (store/transaction.py `ride`), read from the
event loop (`owed_since`, the ticker's) while the worker thread adds and drops them."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from ntfy_intake.store import db, postgres, transaction


def test_owed_since_read_while_the_worker_thread_changes_the_riders_never_raises() -> None:
    """Kills the ticker dying of "dictionary changed size during iteration": it looked at the
    riders while a commit dropped them in the worker thread."""
    conn = object.__new__(postgres.PgConnection)  # only its riders are used
    conn.riders = {}
    stop = threading.Event()

    def worker() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            transaction.ride(conn, f"mark{n % 64}", "SELECT 1", ())
            if n % 3 == 0:
                conn.riders.pop(f"mark{(n * 7) % 64}", None)

    found: list[float | None] = []
    errors: list[BaseException] = []
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # a thread switch between any two bytecodes, near enough
    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    try:
        for _ in range(20_000):
            try:
                found.append(transaction.owed_since(conn))
            except RuntimeError as exc:
                errors.append(exc)
                break
    finally:
        stop.set()
        thread.join(10)
        sys.setswitchinterval(switch)
    assert errors == []
    assert any(since is not None for since in found)


def _sqlite_store(path: Path) -> transaction.SqliteConnection:
    conn = db.connect(path)
    assert isinstance(conn, transaction.SqliteConnection)
    conn.execute("CREATE TABLE kv(name TEXT PRIMARY KEY, value TEXT NOT NULL)")
    return conn


_SAVE = "INSERT INTO kv VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = excluded.value"


def test_a_rider_owed_under_a_second_waits_for_a_later_transaction(tmp_path: Path) -> None:
    """Kills the WAL page every batch wrote for the mark it replaced a moment later: on SQLite a
    write transaction carries only what has been owed `RIDE_AFTER_S`."""
    conn = _sqlite_store(tmp_path / "riders.sqlite3")
    now = time.monotonic()
    conn.riders["fresh"] = transaction.Rider(_SAVE, ("fresh", "1"), now)
    conn.riders["due"] = transaction.Rider(_SAVE, ("due", "1"), now - transaction.RIDE_AFTER_S)
    with transaction.write_txn(conn):
        pass
    assert [tuple(r) for r in conn.execute("SELECT name FROM kv")] == [("due",)]
    assert list(conn.riders) == ["fresh"]


def test_carry_all_writes_a_rider_owed_a_moment_ago(tmp_path: Path) -> None:
    """The ticker's owed write and the one at stop leave nothing owed behind them."""
    conn = _sqlite_store(tmp_path / "riders.sqlite3")
    conn.riders["fresh"] = transaction.Rider(_SAVE, ("fresh", "1"), time.monotonic())
    with transaction.write_txn(conn, carry_all=True):
        pass
    assert [tuple(r) for r in conn.execute("SELECT name FROM kv")] == [("fresh",)]
    assert conn.riders == {}
