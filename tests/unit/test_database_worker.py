"""The database's one worker thread (flow/database.py): a cancelled caller still holds the lock
until its call returned, calls run one at a time on one thread, and the thread ends with its
Database."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from pathlib import Path

import pytest

from ntfy_intake.flow.database import Database, StorageWaits
from ntfy_intake.flow.pipeline import Heartbeat


def _database(tmp_path: Path) -> Database:
    return Database(
        tmp_path / "store.sqlite3",
        boot_id="b00t",
        waits=StorageWaits(),
        degraded={},
        heartbeat=Heartbeat(),
    )


def _database_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "database"]


def test_a_cancelled_caller_holds_the_lock_until_its_call_returned(tmp_path: Path) -> None:
    """The next call must not start on the connection while the cancelled one still runs in
    the thread (it cannot be stopped): it would begin a transaction mid-way through another."""
    database = _database(tmp_path)
    release = threading.Event()
    log: list[str] = []

    def slow() -> str:
        log.append("slow begins")
        release.wait(5)
        log.append("slow ends")
        return "slow"

    def quick() -> str:
        log.append("quick")
        return "quick"

    async def scenario() -> str:
        first = asyncio.create_task(database.run(slow))
        while not log:
            await asyncio.sleep(0.01)
        first.cancel()
        second = asyncio.create_task(database.run(quick))
        await asyncio.sleep(0.2)
        assert not first.done()  # cancelled, yet waiting for the thread
        assert log == ["slow begins"]  # the next call has not started
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await first
        return await second

    try:
        assert asyncio.run(scenario()) == "quick"
    finally:
        database.close()
    assert log == ["slow begins", "slow ends", "quick"]


def test_calls_run_in_order_on_one_thread_and_errors_come_through(tmp_path: Path) -> None:
    database = _database(tmp_path)
    seen: list[tuple[int, int]] = []

    def call(n: int) -> int:
        seen.append((n, threading.get_ident()))
        if n == 3:
            raise KeyError("three")
        return n * 10

    async def scenario() -> list[int | str]:
        async def one(n: int) -> int | str:
            try:
                return await database.run(call, n)
            except KeyError as exc:
                return f"raised {exc}"

        return list(await asyncio.gather(*(one(n) for n in range(5))))

    try:
        assert asyncio.run(scenario()) == [0, 10, 20, "raised 'three'", 40]
    finally:
        database.close()
    assert [n for n, _ in seen] == [0, 1, 2, 3, 4]
    assert len({ident for _, ident in seen}) == 1
    assert threading.get_ident() not in {ident for _, ident in seen}


def test_the_worker_thread_ends_with_its_database(tmp_path: Path) -> None:
    """Closed, or dropped unclosed (a test's): no thread left waiting for calls."""
    # The two databases' own threads, not a count of every "database" thread: another test's
    # dropped database in the same process may end its thread meanwhile (a count failed so).
    before = set(_database_threads())
    closed, dropped = _database(tmp_path), _database(tmp_path)
    assert asyncio.run(closed.run(lambda: 1)) == 1
    assert asyncio.run(dropped.run(lambda: 2)) == 2
    ours = set(_database_threads()) - before
    assert len(ours) == 2
    closed.close()
    del dropped
    gc.collect()
    deadline = time.monotonic() + 5
    while any(t.is_alive() for t in ours) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.is_alive() for t in ours)
