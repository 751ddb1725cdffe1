"""The relay's claim and settle in as few waits as their answers allow (issue 23, second round),
deciding exactly as before on both engines: a claim's rows are read once its transaction
committed (a claim alone is one round trip on PostgreSQL), and a turn's settles are sent together
and their rowcounts read then (one wait), each acted on in order."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from ntfy_intake.flow import relay
from ntfy_intake.store import audit, db, outbox

from ..conftest import owner_queue
from .test_write_pipeline import answers_waited

pytestmark = pytest.mark.engines


async def _flushed() -> bool:
    return True


def _relay(conn: db.Connection) -> relay.Relay:
    return relay.Relay(
        conn,
        httpx.AsyncClient(),
        run_db=db.run_inline,
        owner_queue=owner_queue(),
        url="http://receiver.invalid/triage",
        timeout=5,
        max_attempts=3,
        clock=lambda: 100.0,
        flush_audit=_flushed,
        rng=lambda: 0.5,
    )


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
                rng=lambda: 0.5,
                retry_base=0.4,
            )
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
