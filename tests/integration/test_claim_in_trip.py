"""The relay's claim offered to the trip that releases a request (flow/relay_wakeup.py; issue
23, second round): an idle relay's rows are claimed in the writer's trip, right after the batch
committed and before the audit flush, so the POST does not wait behind the flush; a relay busy
or not offering is woken as before; a finished attempt wakes the relay without a claim of its
own; a claim is never made twice, nor beside the relay's own."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ntfy_intake.flow import database, intake, relay, relay_wakeup
from ntfy_intake.runtime.daemon import Daemon
from ntfy_intake.store import db, outbox

from ..conftest import make_message, owner_queue
from ..harness import event_ids, query, settings_for

pytestmark = pytest.mark.engines


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    """A recovered daemon whose writer is driven directly (no ntfy, no tasks)."""
    monkeypatch.setattr(database, "STORAGE_RETRY_BASE", 0.001)
    config = settings_for(
        "http://127.0.0.1:9", tmp_path, cadence_debounce="0s", relay_url="http://127.0.0.1:9/t"
    )
    found = Daemon(config)
    found.recover()
    yield found
    found.close()


def _received(event_id: str) -> list[intake.Received]:
    return [intake.Received(make_message(event_id), time.monotonic(), 0)]


def test_an_offered_claim_runs_in_the_releasing_trip_after_commit_before_the_audit_flush(
    daemon: Daemon, tmp_path: Path
) -> None:
    seen: list[tuple[list[tuple[str, str]], list[str]]] = []
    wakeup = relay_wakeup.Wakeup()

    def claim() -> None:  # what the relay offers; here: where the trip is when it runs it
        rows = query(tmp_path, "SELECT state, incident_key FROM outbox")
        seen.append(([(str(r[0]), str(r[1])) for r in rows], event_ids(tmp_path)))

    wakeup.offer(claim)
    daemon.writer.wake_relay_with(wakeup)
    asyncio.run(daemon.writer.record(_received("intrip000001")))
    assert seen == [([("pending", "alerts:disk full")], [])]  # committed, not yet audited
    assert event_ids(tmp_path) == ["intrip000001"]
    assert not wakeup.is_set()  # claimed for it: nothing to wake
    assert wakeup.claim_in_trip() is False  # taken once only
    assert wakeup.withdraw()  # and the relay learns it was taken


def test_without_an_offer_the_releasing_trip_wakes_the_relay_to_look(daemon: Daemon) -> None:
    wakeup = relay_wakeup.Wakeup()

    async def record() -> None:
        await daemon.writer.record(_received("woken0000001"))
        await asyncio.sleep(0)  # the wake-up is handed to the loop from the worker thread

    daemon.writer.wake_relay_with(wakeup)
    asyncio.run(record())
    assert wakeup.is_set() and relay_wakeup.asked(wakeup)


def _pending(conn: db.Connection, key: str) -> None:
    with db.write_txn(conn):
        outbox.create(conn, key, f"alerts:{key}", "new_incident", 0.0, 1.0)
        conn.execute(
            "UPDATE outbox SET state = 'pending', payload = '{}' WHERE delivery_key = ?", (key,)
        )


def test_an_idle_relay_posts_what_a_trip_claimed_for_it_and_claims_nothing_itself(
    store: db.Connection,
) -> None:
    """Two releases, each taken by its trip (a thread standing in for the writer's): the relay
    posts both, once each, and after its start-up claim makes no claim of its own, not even
    when a finished attempt wakes it to settle, nor a next-due query before it waits."""
    posted: list[str] = []
    own_claims: list[int] = []
    stop = asyncio.Event()

    async def run_db(fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        if getattr(fn, "__func__", None) is relay.Relay._settle_and_claim and args[1] > 0:
            own_claims.append(args[1])
        if fn is outbox.next_due_at:
            own_claims.append(-1)  # a query of its own before waiting: asked in the turn now
        return fn(*args, **kwargs)

    def handler(request: httpx.Request) -> httpx.Response:
        posted.append(request.headers["Idempotency-Key"])
        return httpx.Response(200, json={"accepted": True})

    def trip(key: str) -> bool:
        """The writer's trip: the release commits, then the offered claim, if any, runs."""
        _pending(store, key)
        return relay_wakeup.claim_in_trip(r.wakeup)

    async def scenario() -> list[bool]:
        nonlocal r
        taken: list[bool] = []
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            r = relay.Relay(
                store,
                client,
                run_db=run_db,
                owner_queue=owner_queue(),
                url="http://receiver.invalid/triage",
                timeout=5,
                max_attempts=3,
                clock=time.time,
                flush_audit=_flushed,
                offer_claims=True,  # the default on PostgreSQL only
            )
            running = asyncio.create_task(r.run(stop))
            for key in ("triage_trip1", "triage_trip2"):
                await _until(lambda: r._offers._out is not None)
                taken.append(await asyncio.to_thread(trip, key))
                await _until(lambda key=key: _state(store, key) == "delivered")
            stop.set()
            r.wakeup.set()
            await running
        return taken

    r: relay.Relay
    assert asyncio.run(scenario()) == [True, True]
    assert posted == ["triage_trip1", "triage_trip2"]
    assert own_claims == [r.window]  # the start-up claim only
    assert r.stats.delivered == 2


def test_a_taken_offer_is_never_claimed_beside_the_relays_own(store: db.Connection) -> None:
    """A trip takes the offer and is slow to claim; a second release wakes the relay meanwhile:
    it claims nothing itself until the trip's claims came, then looks once; the row goes out
    once, on its first attempt."""
    posted: list[str] = []
    own_claims: list[str] = []
    stop = asyncio.Event()
    gate = threading.Event()
    loop_thread = threading.current_thread()

    def handler(request: httpx.Request) -> httpx.Response:
        posted.append(request.headers["Idempotency-Key"])
        return httpx.Response(200, json={"accepted": True})

    async def scenario() -> bool:
        nonlocal r
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            r = relay.Relay(
                store,
                client,
                run_db=db.run_inline,
                owner_queue=owner_queue(),
                url="http://receiver.invalid/triage",
                timeout=5,
                max_attempts=3,
                clock=time.time,
                flush_audit=_flushed,
                offer_claims=True,
            )
            real = r._settle_and_claim

            def settle_and_claim(*args):  # type: ignore[no-untyped-def]
                if threading.current_thread() is loop_thread:
                    if args[1] > 0:
                        own_claims.append("own")
                else:
                    gate.wait(5)  # the trip's claim, held back
                return real(*args)

            r._settle_and_claim = settle_and_claim  # type: ignore[method-assign]
            running = asyncio.create_task(r.run(stop))
            await _until(lambda: r._offers._out is not None)
            _pending(store, "triage_slow")
            trip = asyncio.create_task(asyncio.to_thread(relay_wakeup.claim_in_trip, r.wakeup))
            await _until(lambda: not r.wakeup._offer)  # type: ignore[attr-defined]
            r.wakeup.set()  # another release, while the trip claims
            await asyncio.sleep(0.1)
            assert r._offers.coming and posted == [] and own_claims == ["own"]  # start-up's
            gate.set()
            taken = await trip
            await _until(lambda: _state(store, "triage_slow") == "delivered")
            await _until(lambda: len(own_claims) == 2)  # the look it was asked for
            stop.set()
            r.wakeup.set()
            await running
        return taken

    r: relay.Relay
    assert asyncio.run(scenario()) is True
    assert posted == ["triage_slow"]
    assert _attempts(store, "triage_slow") == 1


def test_the_relay_offers_its_claim_by_default_on_postgresql_only(store: db.Connection) -> None:
    """SQLite's audit flush is a local fsync: the claim waits behind it, as before."""
    r = relay.Relay(
        store,
        httpx.AsyncClient(),
        run_db=db.run_inline,
        owner_queue=owner_queue(),
        url="http://receiver.invalid/triage",
        timeout=5,
        max_attempts=3,
        clock=time.time,
        flush_audit=_flushed,
    )
    assert r.offer_claims == db.is_postgres(store)


async def _flushed() -> bool:
    return True


async def _until(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def _state(conn: db.Connection, key: str) -> str:
    return str(
        conn.execute("SELECT state FROM outbox WHERE delivery_key = ?", (key,)).fetchone()[0]
    )


def _attempts(conn: db.Connection, key: str) -> int:
    row = conn.execute("SELECT attempts FROM outbox WHERE delivery_key = ?", (key,)).fetchone()
    return int(row[0])
