"""What a graceful stop must not wait for (DESIGN.md section 9: a node hands over in < 2 s): a
storage backoff that grew during an outage (flow/database.Database.hurry), and the HTTP
surface's start-up grace when the stop came during start-up (runtime/supervisor.after_subscribing).
"""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
import time
from pathlib import Path

import pytest

from ntfy_intake.flow import database
from ntfy_intake.flow.database import Database, StorageWaits
from ntfy_intake.flow.pipeline import Heartbeat
from ntfy_intake.runtime import supervisor


def _database(tmp_path: Path) -> Database:
    return Database(
        tmp_path / "store.sqlite3",
        boot_id="b00t",
        waits=StorageWaits(),
        degraded={},
        heartbeat=Heartbeat(),
    )


def test_a_stop_retries_a_storage_fault_at_once_instead_of_sleeping_out_the_backoff(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kills the handover that slept out a 1.6 s backoff after a PostgreSQL restart: the
    drain's write waited for the next retry while the standby waited for the lease."""
    monkeypatch.setattr(database, "STORAGE_RETRY_BASE", 1.0)  # the first retry 1 s away
    db = _database(tmp_path)
    calls: list[float] = []

    def write() -> str:
        calls.append(time.monotonic())
        if len(calls) < 4:
            raise sqlite3.OperationalError("database is locked")
        return "committed"

    async def scenario() -> float:
        running = asyncio.create_task(db.run(write))
        await asyncio.sleep(0.1)  # the first try failed
        hurried = time.monotonic()
        db.hurry()
        assert await asyncio.wait_for(running, 5.0) == "committed"
        return hurried

    hurried = asyncio.run(scenario())
    assert len(calls) == 4
    assert calls[1] - hurried < 0.5  # retried at once
    # Then at the shortest backoff, never grown (1 s, 2 s, ...), nor spinning either.
    assert [round(b - a) for a, b in itertools.pairwise(calls[1:])] == [1, 1]
    assert db.waits.fault is None


def test_the_http_surface_waits_no_start_up_grace_once_stopped() -> None:
    """Kills the 1.5 s a SIGTERM during a term's start-up cost: the HTTP task waited for a
    subscription that never came, then imported its modules, before the lease could go."""

    async def scenario() -> float:
        stop = asyncio.Event()
        stop.set()
        queue: asyncio.Queue[object] = asyncio.Queue()
        started = time.monotonic()
        await supervisor.after_subscribing(asyncio.Event(), queue, stop)  # type: ignore[arg-type]
        return time.monotonic() - started

    assert asyncio.run(scenario()) < supervisor.STARTUP_GRACE_S / 4
