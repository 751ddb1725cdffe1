"""A release hands its rows to the relay in its own transaction (issue 23, fifth round).

Before, a released row waited for the relay's claim, a write transaction of its own queued behind
the writer's audit flush, before its POST. Now the release leases what the relay has room for
(outbox.ask_hand_off) and the writer hands those claims over once committed; the relay claims
only what it was not handed. Each test is named after the failure it kills: a row sent out of
its incident's order, sent twice, lost, or a claim trip spent where nothing is due.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ntfy_intake.flow import database, intake, relay
from ntfy_intake.runtime.daemon import Daemon
from ntfy_intake.store import audit, db, inbox, outbox
from ntfy_intake.testbed import receiver
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from ..conftest import make_message, owner_queue
from ..harness import daemon_process, engine_fault, env_for, query, settings_for, wait_until
from .test_relay_concurrency import _pending
from .test_relay_failures import deliveries, only_key
from .test_relay_round_trips import _relay as relay_under_test

pytestmark = pytest.mark.engines

NOW = 1_764_470_100.0
ROOM = outbox.HandOff(limit=4, lease=25.0)


def _record(conn: db.Connection, *messages: Any, room: outbox.HandOff | None = ROOM) -> Any:
    return inbox.record_batch(
        conn, list(messages), NOW, queue=owner_queue(), relay_enabled=True, hand_off=room
    )


def _rows(conn: db.Connection) -> list[tuple[Any, ...]]:
    rows = conn.execute(
        "SELECT delivery_key, state, attempts, lease_until FROM outbox ORDER BY delivery_key"
    ).fetchall()
    return [tuple(row) for row in rows]


# -- the release's transaction ---------------------------------------------------------------------


def test_released_row_waits_for_no_claim_when_the_relay_has_room(store: db.Connection) -> None:
    result = _record(store, make_message("handoff00001"))
    assert result.released == ["tri_handoff00001"]
    [claim] = result.handed
    payload = store.execute("SELECT payload FROM outbox").fetchone()[0]
    assert (claim.delivery_key, claim.attempt, claim.incident_key, claim.payload) == (
        "tri_handoff00001",
        1,
        "alerts:disk full",
        payload,
    )
    assert _rows(store) == [("tri_handoff00001", "leased", 1, NOW + ROOM.lease)]


def test_handed_row_never_overtakes_an_earlier_row_of_its_incident(store: db.Connection) -> None:
    """Its incident's earlier request still waits (pending): handing the new one over would
    send it first. It stays pending for the relay's claim, which keeps the order."""
    _pending(store, "triage_earlier", "alerts:disk full", 1.0)
    result = _record(store, make_message("handoff00002"), make_message("other0000001", title="Fan"))
    assert sorted(result.released) == ["tri_handoff00002", "tri_other0000001"]
    assert [claim.delivery_key for claim in result.handed] == ["tri_other0000001"]
    assert _rows(store) == [
        ("tri_handoff00002", "pending", 0, None),
        ("tri_other0000001", "leased", 1, NOW + ROOM.lease),
        ("triage_earlier", "pending", 0, None),
    ]


def test_release_hands_the_relay_no_more_rows_than_it_has_room_for(store: db.Connection) -> None:
    messages = [make_message(f"roomy{n:07d}", title=f"Alert {n}") for n in range(3)]
    result = _record(store, *messages, room=outbox.HandOff(limit=1, lease=25.0))
    assert len(result.released) == 3
    assert [claim.delivery_key for claim in result.handed] == result.released[:1]
    states = sorted(state for _, state, _, _ in _rows(store))
    assert states == ["leased", "pending", "pending"]


def test_release_without_room_leases_nothing(store: db.Connection) -> None:
    result = _record(store, make_message("noroom000001"), room=None)
    assert (result.released, result.handed) == (["tri_noroom000001"], [])
    assert _rows(store) == [("tri_noroom000001", "pending", 0, None)]


# -- the relay's side ------------------------------------------------------------------------------


class _Relay:
    """`Relay.run` over a mock receiver, each trip to the database recorded as (settled, want)."""

    def __init__(self, conn: db.Connection) -> None:
        self.conn = conn
        self.trips: list[tuple[int, int]] = []
        self.sent: list[str] = []

    async def run_db(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        if getattr(fn, "__func__", None) is relay.Relay._settle_and_claim:
            self.trips.append((len(args[0]), args[1]))
        return fn(*args, **kwargs)

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request.headers["Idempotency-Key"])
        return httpx.Response(200, json={"accepted": True})

    async def run(self, scenario: Any) -> None:
        stop = asyncio.Event()
        async with httpx.AsyncClient(transport=httpx.MockTransport(self.handler)) as client:
            self.relay = relay_under_test(self.conn, client, run_db=self.run_db, clock=lambda: NOW)
            task = asyncio.create_task(self.relay.run(stop))
            try:
                await scenario(self.relay)
            finally:
                stop.set()
                self.relay.wake()
                await asyncio.wait_for(task, timeout=10)

    def delivered(self) -> list[str]:
        rows = self.conn.execute("SELECT delivery_key FROM outbox WHERE state = 'delivered'")
        return [row[0] for row in rows.fetchall()]


async def _until(condition: Any) -> None:
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("timed out")


def test_handed_row_is_posted_with_no_claim_before_it_nor_after_it(store: db.Connection) -> None:
    """Before: the released row's POST waited for a claim transaction, and its settle's turn
    claimed again, finding nothing. Now the handed row is posted at once and settled alone."""
    driver = _Relay(store)

    async def scenario(r: relay.Relay) -> None:
        await _until(lambda: driver.trips)  # the start's own look: nothing due yet
        started = len(driver.trips)
        result = _record(store, make_message("handoff00003"), room=r.room())
        r.take(result.handed)
        await _until(driver.delivered)
        assert driver.trips[started:] == [(1, 0)]  # one settle, no claim

    asyncio.run(driver.run(scenario))
    assert driver.sent == ["tri_handoff00003"]
    assert _rows(store) == [("tri_handoff00003", "delivered", 1, None)]


def test_finished_attempt_is_settled_without_a_claim_that_finds_nothing(
    store: db.Connection,
) -> None:
    """An attempt that ends wakes the relay to settle it; that makes nothing new due, so its
    turn claims nothing (before: a claim transaction per delivery that found nothing)."""
    _pending(store, "triage_alone", "alerts:alone", 1.0)
    driver = _Relay(store)

    async def scenario(r: relay.Relay) -> None:
        await _until(driver.delivered)

    asyncio.run(driver.run(scenario))
    assert driver.sent == ["triage_alone"]
    assert driver.trips == [(0, driver.relay.window), (1, 0)]  # before: a claim between them


def test_rows_handed_to_a_stopping_relay_go_back_to_pending_unsent(store: db.Connection) -> None:
    driver = _Relay(store)

    async def scenario(r: relay.Relay) -> None:
        await _until(lambda: driver.trips)
        result = _record(store, make_message("handoff00004"), room=r.room())
        assert r._stop is not None
        r._stop.set()  # the daemon stops as they arrive
        r.take(result.handed)
        assert r.room() is None  # and a stopping relay is handed nothing more

    asyncio.run(driver.run(scenario))
    assert driver.sent == []
    assert _rows(store) == [("tri_handoff00004", "pending", 0, None)]


# -- the writer's side -----------------------------------------------------------------------------


class _Door:
    """A relay as the writer sees it, with room for `room` rows."""

    def __init__(self, room: int) -> None:
        self.offer = outbox.HandOff(room, 25.0) if room else None
        self.taken: list[list[str]] = []
        self.woken = 0

    def room(self) -> outbox.HandOff | None:
        return self.offer

    def take(self, claims: list[outbox.Claim]) -> None:
        self.taken.append([claim.delivery_key for claim in claims])

    def wake(self) -> None:
        self.woken += 1


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    monkeypatch.setattr(database, "STORAGE_RETRY_BASE", 0.001)
    config = settings_for(
        "http://127.0.0.1:9", tmp_path, cadence_debounce="0s", relay_url="http://127.0.0.1:9/t"
    )
    found = Daemon(config)
    found.recover()
    yield found
    found.close()


def _received(*messages: Any) -> list[intake.Received]:
    return [intake.Received(message, time.monotonic(), 0) for message in messages]


async def _record_live(daemon: Daemon, *messages: Any) -> None:
    await daemon.writer.record(_received(*messages))
    await asyncio.sleep(0)  # the hand-over is scheduled from the worker thread


def test_writer_hands_the_relay_its_room_and_wakes_it_only_for_the_rest(daemon: Daemon) -> None:
    door = _Door(room=1)
    daemon.writer.wake_relay_with(door)
    first, second = make_message("writer000001"), make_message("writer000002", title="Fan")
    asyncio.run(_record_live(daemon, first, second))
    assert door.taken == [["tri_writer000001"]]
    assert door.woken == 1  # the second waits for the relay's claim
    asyncio.run(_record_live(daemon, make_message("writer000003", title="Psu")))
    assert door.taken[-1] == ["tri_writer000003"] and door.woken == 1  # all handed: no wake


def test_storage_fault_after_the_commit_hands_no_row_over_twice(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flush fails after the batch committed and the trip runs again: the rows it leased
    are handed over once (a second hand-over would post them twice). The fault: SQLite, the
    read of the mark (the mark itself rides the next transaction); PostgreSQL, the mirror."""
    step = "mirror" if db.is_postgres(daemon.conn) else "flushed_seq"
    real, calls = getattr(audit, step), {"n": 0}

    def failing_once(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise engine_fault("disk_full")
        return real(*args, **kwargs)

    monkeypatch.setattr(audit, step, failing_once)
    door = _Door(room=4)
    daemon.writer.wake_relay_with(door)
    asyncio.run(_record_live(daemon, make_message("fault0000003")))
    assert calls["n"] >= 2  # the trip ran again
    assert door.taken == [["tri_fault0000003"]] and door.woken == 0


@pytest.mark.slow
def test_kill9_after_the_hand_off_commits_before_its_post_delivers_the_row_once(
    tmp_path: Path,
) -> None:
    """The release leased the row to this relay and committed; the daemon died before the POST.
    The lease must not strand it: the next start releases it and delivers it, once."""
    state, receipts_db = tmp_path / "state", tmp_path / "receiver.sqlite3"
    with (
        NtfyEmulator(EmulatorConfig(keepalive_interval=1.0)).running() as emu,
        receiver.running(receipts_db) as triage,
    ):
        env = env_for(emu.url, state, relay_url=triage.url, cadence_debounce="0s")
        crash = {"NTFY_INTAKE_TEST_CRASH_AT": "after_inbox_commit"}
        with daemon_process(env, extra_env=crash) as proc:
            emu.wait_for_subscribers(1)
            emu.publish("alerts", "disk full", title="Disk")
            assert proc.wait(timeout=20) == -signal.SIGKILL
        assert query(state, "SELECT state, attempts FROM outbox") == [("leased", 1)]
        assert receiver.receipts(receipts_db) == []
        key = only_key(state)
        with daemon_process(env):
            wait_until(lambda: bool(deliveries(state, key)), timeout=30)
        (receipt,) = receiver.receipts(receipts_db)
        assert receipt.key == key and receipt.repeats == 0
        assert [d["result"] for d in deliveries(state, key)] == ["delivered"]
