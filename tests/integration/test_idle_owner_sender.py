"""Issue 36: an idle owner sender sleeps until its next due row, not a claim transaction a second.

Real SQLite store, the signal-cli-rest-api stand-in on loopback; the sender's database trips are
counted by name through its `run_db`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ntfy_intake.flow.owner import OwnerSender
from ntfy_intake.settings import OwnerSettings
from ntfy_intake.store import audit, db, migrations
from ntfy_intake.testbed import signal_standin
from ntfy_intake.testbed.signal_standin import SignalHandle

from ..harness import store_of

IDLE_S = 2.5


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[db.Connection]:
    connection = db.connect(store_of(tmp_path))
    migrations.apply(connection)
    yield connection
    connection.close()


@pytest.fixture
def signal() -> Iterator[SignalHandle]:
    with signal_standin.running() as handle:
        yield handle


def queue(conn: db.Connection, key: str, due: float) -> None:
    with db.write_txn(conn):
        conn.execute(
            "INSERT INTO owner_outbox(key, kind, topic, text, state, due_at, created_at)"
            " VALUES (?, 'notice', 'gap', 'Possible alert loss.', 'pending', ?, ?)",
            (key, due, due),
        )


def state_of(conn: db.Connection, key: str) -> str:
    return str(conn.execute("SELECT state FROM owner_outbox WHERE key = ?", (key,)).fetchone()[0])


def run_sender(
    conn: db.Connection,
    tmp_path: Path,
    signal: SignalHandle,
    scenario: Callable[[OwnerSender, list[str]], Any],
) -> list[str]:
    """Run the sender's loop around `scenario(sender, trips)`; `trips` names each database trip."""
    trips: list[str] = []

    async def run_db(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        trips.append(getattr(fn, "__name__", repr(fn)))
        return fn(*args, **kwargs)

    async def main() -> None:
        with audit.AuditLog(tmp_path / "audit", time.time) as log:

            async def flush() -> bool:
                audit.flush(conn, log)
                return True

            async with httpx.AsyncClient() as client:
                sender = OwnerSender(
                    conn,
                    client,
                    run_db=run_db,
                    owner=OwnerSettings(
                        signal_url=signal.url,
                        signal_number="+31600000000",
                        recipients=("+31600000001",),
                        fallback_topic=None,
                    ),
                    ntfy_url="http://127.0.0.1:9",
                    ntfy_token=None,
                    clock=time.time,
                    flush_audit=flush,
                    timeout=2.0,
                )
                stop = asyncio.Event()
                task = asyncio.create_task(sender.run(stop))
                try:
                    await scenario(sender, trips)
                finally:
                    stop.set()
                    sender.wakeup.set()
                    await task

    asyncio.run(main())
    return trips


def test_idle_owner_sender_makes_no_claim_transaction_for_seconds(
    conn: db.Connection, tmp_path: Path, signal: SignalHandle
) -> None:
    """It was: a claim write transaction and a `next_due_at` read every second, no row queued."""

    async def idle(sender: OwnerSender, trips: list[str]) -> None:
        await asyncio.sleep(0.2)  # start-up: its first claim
        before = len(trips)
        await asyncio.sleep(IDLE_S)
        assert trips[before:] == [], trips[before:]

    run_sender(conn, tmp_path, signal, idle)


def test_a_row_queued_in_process_is_sent_at_once_when_woken(
    conn: db.Connection, tmp_path: Path, signal: SignalHandle
) -> None:
    async def woken(sender: OwnerSender, trips: list[str]) -> None:
        await asyncio.sleep(0.2)
        queue(conn, "gap:woken", time.time())
        began = time.monotonic()
        sender.wakeup.set()  # what journal.wake_owner does once the row's transaction committed
        while state_of(conn, "gap:woken") != "sent":
            await asyncio.sleep(0.01)
        assert time.monotonic() - began < 0.9  # the contract is no poll: not its second

    run_sender(conn, tmp_path, signal, woken)
    assert len(signal.messages()) == 1


def test_a_retry_due_later_is_sent_at_its_due_time_without_a_wake(
    conn: db.Connection, tmp_path: Path, signal: SignalHandle
) -> None:
    """The sleep is computed from the next due row: a due retry keeps its timer."""
    queue(conn, "gap:later", time.time() + 1.5)

    async def later(sender: OwnerSender, trips: list[str]) -> None:
        async with asyncio.timeout(10):
            while state_of(conn, "gap:later") != "sent":
                await asyncio.sleep(0.02)
        # One claim that found nothing due (with the due time read in the same trip), then one
        # at the due time, and the one after the send: no claim a second meanwhile.
        assert trips.count("_claim") <= 4, trips

    run_sender(conn, tmp_path, signal, later)
    assert len(signal.messages()) == 1
