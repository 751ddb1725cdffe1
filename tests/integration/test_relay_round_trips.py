"""The relay's claim and settle in as few waits as their answers allow (issue 23, second round),
deciding exactly as before on both engines: a claim's rows are read once its transaction
committed (a claim alone is one round trip on PostgreSQL), and a turn's settles are sent together
and their rowcounts read then (one wait), each acted on in order."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from ntfy_intake.flow import relay
from ntfy_intake.store import audit, db, outbox

from ..conftest import owner_queue
from .test_write_pipeline import answers_waited

pytestmark = pytest.mark.engines


async def _flushed() -> bool:
    return True


def _relay(
    conn: db.Connection, client: httpx.AsyncClient | None = None, **overrides: Any
) -> relay.Relay:
    """The relay these tests drive: a fixed clock and jitter unless `overrides` say otherwise."""
    settings: dict[str, Any] = {
        "run_db": db.run_inline,
        "owner_queue": owner_queue(),
        "url": "http://receiver.invalid/triage",
        "timeout": 5,
        "max_attempts": 3,
        "clock": lambda: 100.0,
        "flush_audit": _flushed,
        "rng": lambda: 0.5,
        **overrides,
    }
    return relay.Relay(conn, client or httpx.AsyncClient(), **settings)


def _pending(conn: db.Connection, *keys: str) -> None:
    with db.write_txn(conn):
        for n, key in enumerate(keys):
            outbox.create(conn, key, f"alerts:{key}", "new_incident", 0.0, float(n))
            conn.execute(
                "UPDATE outbox SET state = 'pending', payload = '{}' WHERE delivery_key = ?",
                (key,),
            )


def _journal(conn: db.Connection) -> list[dict[str, object]]:
    return [json.loads(line) for (line,) in conn.execute("SELECT line FROM audit_journal")]


def test_a_claim_alone_is_one_round_trip_and_its_rows_are_the_ones_leased(
    store: db.Connection,
) -> None:
    _pending(store, "triage_a", "triage_b", "triage_c")
    r = _relay(store)
    with answers_waited(store) as waited:
        claims = r._settle_and_claim([], 2, (), ())
    assert [c.delivery_key for c in claims] == ["triage_a", "triage_b"]  # oldest due first
    assert {c.attempt for c in claims} == {1}
    leased = store.execute("SELECT delivery_key FROM outbox WHERE state = 'leased'").fetchall()
    assert sorted(row[0] for row in leased) == ["triage_a", "triage_b"]
    if db.is_postgres(store):
        assert waited == [1]  # before: two SETs, BEGIN, the UPDATE, COMMIT


def test_settles_sent_together_decide_each_row_as_it_stood(store: db.Connection) -> None:
    """Three attempts settle in one turn; the middle row was redriven meanwhile (no longer this
    lease's): its settle changes nothing and writes no delivery line, the others settle in order
    (a retry, a dead row with its notice), and PostgreSQL waits once for the three rowcounts."""
    _pending(store, "triage_a", "triage_b", "triage_c")
    r = _relay(store)
    claims = r._settle_and_claim([], 3, (), ())
    with db.write_txn(store):
        store.execute(
            "UPDATE outbox SET state = 'pending', attempts = 0 WHERE delivery_key = 'triage_b'"
        )
    store.execute("DELETE FROM audit_journal")
    outcomes = [
        relay.Outcome("retry", "HTTP 503", 503),
        relay.Outcome("delivered", "HTTP 200", 200),
        relay.Outcome("permanent", "HTTP 400: no", 400),
    ]
    with answers_waited(store) as waited:
        r._settle_and_claim(list(zip(claims, outcomes, strict=True)), 0, (), ())
    states = dict(store.execute("SELECT delivery_key, state FROM outbox").fetchall())
    assert states == {"triage_a": "pending", "triage_b": "pending", "triage_c": "dead"}
    deliveries = [
        (line["delivery_key"], line["result"])
        for line in _journal(store)
        if line["kind"] == "delivery"
    ]
    assert deliveries == [("triage_a", "retry"), ("triage_c", "dead")]
    assert (r.stats.retries, r.stats.dead, r.stats.delivered) == (1, 1, 0)
    notices = store.execute("SELECT topic FROM owner_outbox").fetchall()
    assert [row[0] for row in notices] == ["dead_row"]
    if db.is_postgres(store):
        # The rowcounts, the owner queue's read for the dead row's notice, and COMMIT.
        assert waited == [3]
    assert audit.flushed_seq(store) == 0


def test_a_delivery_settles_in_two_round_trips(store: db.Connection) -> None:
    """The live case: one 2xx, no reply for the owner. PostgreSQL waits for the rowcount and
    for COMMIT (before: BEGIN, the UPDATE, the journal's INSERT, COMMIT, one wait each)."""
    _pending(store, "triage_a")
    r = _relay(store)
    (claim,) = r._settle_and_claim([], 1, (), ())
    with answers_waited(store) as waited:
        r._settle_and_claim([(claim, relay.Outcome("delivered", "HTTP 200", 200))], 0, (), ())
    assert store.execute("SELECT state FROM outbox").fetchone()[0] == "delivered"
    assert r.stats.delivered == 1
    assert [line["result"] for line in _journal(store) if line["kind"] == "delivery"] == [
        "delivered"
    ]
    if db.is_postgres(store):
        assert waited == [2]


def test_the_idle_wait_uses_the_due_time_its_last_transaction_saw(store: db.Connection) -> None:
    """No query of its own before each wait: a retry's due time comes from the settle that set
    it, and the relay wakes for it (not before, not a second later) and delivers."""
    _pending(store, "triage_a")
    answers = iter([httpx.Response(503), httpx.Response(200, json={"accepted": True})])
    posted_at: list[float] = []
    queried: list[object] = []
    stop = asyncio.Event()

    def handler(request: httpx.Request) -> httpx.Response:
        posted_at.append(time.monotonic())
        return next(answers)

    async def run_db(fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        if fn is outbox.next_due_at:
            queried.append(fn)
        return fn(*args, **kwargs)

    async def scenario() -> relay.Relay:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            r = _relay(store, client, run_db=run_db, clock=time.time, retry_base=0.4)
            running = asyncio.create_task(r.run(stop))
            deadline = time.monotonic() + 10
            while r.stats.delivered < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            stop.set()
            r.wakeup.set()
            await running
            return r

    r = asyncio.run(scenario())
    assert r.stats.delivered == 1 and len(posted_at) == 2
    assert 0.15 <= posted_at[1] - posted_at[0] < 0.9  # woke for the due time it was told
    assert queried == []


def _recording_relay(
    conn: db.Connection, steps: list[tuple[str, object]], after_settle: object = None
) -> tuple[relay.Relay, asyncio.Event]:
    """A relay whose claims, settles and audit flushes are written down in `steps`."""
    stop = asyncio.Event()

    async def run_db(fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        result = fn(*args, **kwargs)
        if getattr(fn, "__func__", None) is relay.Relay._settle_and_claim:
            if args[0]:
                steps.append(("settle", sorted(c.delivery_key for c, _ in args[0])))
                if callable(after_settle):
                    after_settle()
            if result:
                steps.append(("claim", sorted(c.delivery_key for c in result)))
        return result

    async def flushed() -> bool:
        steps.append(("flush", time.monotonic()))
        return True

    client = httpx.AsyncClient(
        transport=httpx.MockTransport(lambda request: httpx.Response(200, json={}))
    )
    r = _relay(conn, client, run_db=run_db, clock=time.time, flush_audit=flushed)
    return r, stop


async def _until(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def test_a_release_right_after_a_settle_is_claimed_before_that_settles_audit_flush(
    store: db.Connection,
) -> None:
    """The writer releases the next request while the relay settles the last one (back to back
    alerts): its claim goes first, so its POST does not wait behind the settle's flush."""
    steps: list[tuple[str, object]] = []
    _pending(store, "triage_a")

    def release_next() -> None:
        if not any(step == ("settle", ["triage_a"]) for step in steps[:-1]):
            _pending(store, "triage_b")
            r.wakeup.set()

    r, stop = _recording_relay(store, steps, release_next)

    async def scenario() -> None:
        running = asyncio.create_task(r.run(stop))
        await _until(lambda: r.stats.delivered == 2 and steps[-1][0] == "flush")
        stop.set()
        r.wakeup.set()
        await running

    asyncio.run(scenario())
    names = [(name, value) for name, value in steps if name != "flush"]
    first_flush = next(i for i, (name, _) in enumerate(steps) if name == "flush")
    assert names[:3] == [
        ("claim", ["triage_a"]),
        ("settle", ["triage_a"]),
        ("claim", ["triage_b"]),
    ]
    assert steps.index(("claim", ["triage_b"])) < first_flush


def test_a_settle_alone_is_flushed_within_the_grace(store: db.Connection) -> None:
    steps: list[tuple[str, object]] = []
    _pending(store, "triage_a")
    r, stop = _recording_relay(store, steps)
    settled_at: list[float] = []

    async def scenario() -> None:
        running = asyncio.create_task(r.run(stop))
        await _until(lambda: r.stats.delivered == 1)
        settled_at.append(time.monotonic())
        await _until(lambda: any(name == "flush" for name, _ in steps))
        stop.set()
        r.wakeup.set()
        await running

    asyncio.run(scenario())
    flushed_at = next(value for name, value in steps if name == "flush")
    assert isinstance(flushed_at, float)
    assert flushed_at - settled_at[0] < relay.FLUSH_GRACE + 0.5
