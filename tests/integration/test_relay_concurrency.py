"""The relay's bounded concurrency: several incidents in flight at once, one incident never twice,
each incident's deliveries in the order they fell due, and a whole batch settled together."""

from __future__ import annotations

import asyncio
import sqlite3

import httpx
import pytest

from ntfy_intake.flow import relay
from ntfy_intake.store import db, migrations, outbox

from ..conftest import owner_queue

pytestmark = pytest.mark.engines

INCIDENTS = ("alerts:disk", "alerts:cpu", "backups:nas", "alerts:ups", "alerts:dns", "x:y")
PER_INCIDENT = 4


def _pending_rows(conn: sqlite3.Connection) -> dict[str, str]:
    """PER_INCIDENT due rows per incident, created in turn; delivery key -> incident."""
    owners: dict[str, str] = {}
    with db.write_txn(conn):
        for n in range(PER_INCIDENT):
            for i, incident in enumerate(INCIDENTS):
                key = f"triage_{incident.replace(':', '_')}_{n}"
                created = n * 10.0 + i
                outbox.create(conn, key, incident, "new_incident", 0.0, created)
                conn.execute(
                    "UPDATE outbox SET state = 'pending', payload = '{}' WHERE delivery_key = ?",
                    (key,),
                )
                owners[key] = incident
    return owners


async def _flushed() -> bool:
    return True


def _deliver_all(
    conn: sqlite3.Connection, owners: dict[str, str], concurrency: int
) -> tuple[int, dict[str, int], dict[str, list[str]], list[str]]:
    """Run the relay once against a receiver that holds each request a moment: the most in
    flight at once, overall and per incident, and the order each incident's keys arrived."""
    in_flight: dict[str, int] = {}
    most = {"all": 0}
    most_per: dict[str, int] = {}
    arrived: dict[str, list[str]] = {}
    flushes: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        key = request.headers["Idempotency-Key"]
        incident = owners[key]
        arrived.setdefault(incident, []).append(key)
        in_flight[incident] = in_flight.get(incident, 0) + 1
        most_per[incident] = max(most_per.get(incident, 0), in_flight[incident])
        most["all"] = max(most["all"], sum(in_flight.values()))
        await asyncio.sleep(0.002)
        in_flight[incident] -= 1
        return httpx.Response(200, json={"accepted": True})

    async def flushed() -> bool:
        flushes.append("flush")
        return True

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            r = relay.Relay(
                conn,
                client,
                run_db=db.run_inline,
                owner_queue=owner_queue(),
                url="http://receiver.invalid/triage",
                timeout=5,
                max_attempts=8,
                clock=lambda: 100.0,
                flush_audit=flushed,
                concurrency=concurrency,
            )
            while await r.run_once():
                pass

    asyncio.run(scenario())
    return most["all"], most_per, arrived, flushes


def test_relay_never_sends_two_deliveries_of_one_incident_at_once_nor_out_of_order(
    store: sqlite3.Connection,
) -> None:
    owners = _pending_rows(store)
    most, most_per, arrived, flushes = _deliver_all(store, owners, concurrency=4)
    assert most == 4  # concurrent across incidents, up to the limit
    assert len(flushes) == 1  # 24 rows fit one claim batch (8 per lane): one settle, one flush
    assert set(most_per.values()) == {1}
    for incident, keys in arrived.items():
        expected = [k for k, owner in owners.items() if owner == incident]  # creation order
        assert keys == expected, incident
    states = store.execute("SELECT state, attempts, count(*) FROM outbox GROUP BY 1, 2").fetchall()
    assert [tuple(row) for row in states] == [("delivered", 1, len(owners))]


def test_relay_in_flight_limit_is_the_constructor_concurrency(store: sqlite3.Connection) -> None:
    owners = _pending_rows(store)
    most, _, _, flushes = _deliver_all(store, owners, concurrency=2)
    assert most == 2
    assert len(flushes) == 2  # claim batches of 16 (at least CLAIM_BATCH)


def test_relay_refuses_a_concurrency_below_one(store: sqlite3.Connection) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        relay.Relay(
            store,
            httpx.AsyncClient(),
            run_db=db.run_inline,
            owner_queue=owner_queue(),
            url="http://receiver.invalid/triage",
            timeout=5,
            max_attempts=8,
            clock=lambda: 0.0,
            flush_audit=_flushed,
            concurrency=0,
        )


class _WatchedWakeup(relay.Wakeup):
    """Remembers whether it was already set each time the relay started waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.set_when_waited: list[bool] = []

    async def wait(self) -> bool:  # type: ignore[override]
        self.set_when_waited.append(self.is_set())
        return await super().wait()


def test_row_released_while_the_relay_looks_for_work_does_not_wait_out_the_poll(
    store: sqlite3.Connection,
) -> None:
    """The writer releases a row (and sets the wakeup) while the relay is between its claim and
    its wait: the relay must go again at once, not sleep its 1 s poll first."""
    released = {"done": False}

    async def run_db(fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        result = fn(*args, **kwargs)
        if getattr(fn, "__func__", None) is relay.Relay._settle_and_claim and not released["done"]:
            released["done"] = True
            with db.write_txn(store):
                outbox.create(store, "triage_late", "alerts:late", "new_incident", 0.0, 1.0)
                store.execute("UPDATE outbox SET state = 'pending', payload = '{}'")
            r.wakeup.set()
        return result

    def handler(request: httpx.Request) -> httpx.Response:
        stop.set()
        return httpx.Response(200, json={"accepted": True})

    async def scenario() -> None:
        nonlocal r, stop
        stop = asyncio.Event()
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            r = relay.Relay(
                store,
                client,
                run_db=run_db,
                owner_queue=owner_queue(),
                url="http://receiver.invalid/triage",
                timeout=5,
                max_attempts=8,
                clock=lambda: 100.0,
                flush_audit=_flushed,
            )
            r.wakeup = _WatchedWakeup()
            await asyncio.wait_for(r.run(stop), timeout=30)

    r: relay.Relay
    stop: asyncio.Event
    asyncio.run(scenario())
    assert isinstance(r.wakeup, _WatchedWakeup)
    assert r.wakeup.set_when_waited[0] is True
    assert store.execute("SELECT state FROM outbox").fetchone()[0] == "delivered"


# -- the continuous loop: claims made while earlier ones are still in flight ----------------------


def _pending(conn: sqlite3.Connection, key: str, incident: str, created: float) -> None:
    with db.write_txn(conn):
        outbox.create(conn, key, incident, "new_incident", 0.0, created)
        conn.execute(
            "UPDATE outbox SET state = 'pending', payload = '{}' WHERE delivery_key = ?", (key,)
        )


def _count(conn: sqlite3.Connection, state: str) -> int:
    return int(conn.execute("SELECT count(*) FROM outbox WHERE state = ?", (state,)).fetchone()[0])


class _Loop:
    """`Relay.run` over a mock receiver, stopped once `until()` holds."""

    def __init__(self, conn: sqlite3.Connection, handler, **options) -> None:  # type: ignore[no-untyped-def]
        self.conn = conn
        self.handler = handler
        self.options = {"concurrency": 4, "clock": lambda: 100.0, **options}
        self.stop = asyncio.Event()
        self.relay: relay.Relay

    def run(self, until) -> None:  # type: ignore[no-untyped-def]
        async def scenario() -> None:
            self.stop = asyncio.Event()
            transport = httpx.MockTransport(self.handler)
            async with httpx.AsyncClient(transport=transport) as client:
                self.relay = relay.Relay(
                    self.conn,
                    client,
                    run_db=db.run_inline,
                    owner_queue=owner_queue(),
                    url="http://receiver.invalid/triage",
                    timeout=5,
                    max_attempts=8,
                    flush_audit=_flushed,
                    **self.options,
                )
                task = asyncio.create_task(self.relay.run(self.stop))
                for _ in range(2000):
                    if until() or task.done():
                        break
                    await asyncio.sleep(0.005)
                self.stop.set()
                self.relay.wakeup.set()
                await asyncio.wait_for(task, timeout=10)

        asyncio.run(scenario())


def test_delivery_released_while_its_incidents_earlier_one_is_in_flight_waits_behind_it(
    store: sqlite3.Connection,
) -> None:
    """A row claimed in a later turn, while its incident's earlier delivery is still in flight,
    goes out only after that one ended; another incident's row goes out meanwhile."""
    _pending(store, "triage_disk_1", "alerts:disk", 1.0)
    events: list[str] = []
    first_may_end = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        key = request.headers["Idempotency-Key"]
        events.append(f"start {key}")
        if key == "triage_disk_1":
            # Released while the first is in flight: the relay claims them in its next turn.
            _pending(store, "triage_disk_2", "alerts:disk", 2.0)
            _pending(store, "triage_cpu_1", "alerts:cpu", 3.0)
            loop.relay.wakeup.set()
            await asyncio.wait_for(first_may_end.wait(), timeout=5)
        if key == "triage_cpu_1":
            first_may_end.set()  # the other incident went out while disk_1 was in flight
        events.append(f"end {key}")
        return httpx.Response(200, json={"accepted": True})

    loop = _Loop(store, handler)
    loop.run(until=lambda: _count(store, "delivered") == 3)
    assert events.index("start triage_cpu_1") < events.index("end triage_disk_1")
    assert events.index("start triage_disk_2") > events.index("end triage_disk_1")
    states = store.execute("SELECT state, attempts, count(*) FROM outbox GROUP BY 1, 2").fetchall()
    assert [tuple(row) for row in states] == [("delivered", 1, 3)]


def test_claim_whose_lease_runs_out_while_it_waits_its_turn_is_not_claimed_twice(
    store: sqlite3.Connection,
) -> None:
    """One connection, two claimed rows: the second waits while the first's attempt outlasts the
    lease. A claim made meanwhile (a new row released) must not take the waiting row again."""
    _pending(store, "triage_a", "alerts:a", 1.0)
    _pending(store, "triage_b", "alerts:b", 2.0)
    now = {"t": 100.0}
    sent: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        key = request.headers["Idempotency-Key"]
        sent.append(key)
        if key == "triage_a" and sent.count(key) == 1:
            now["t"] += loop.relay.lease + 1  # triage_b's lease has run out while it waits
            _pending(store, "triage_c", "alerts:c", 3.0)
            loop.relay.wakeup.set()
            for _ in range(20):  # let the relay take its turn (and claim) while this is in flight
                await asyncio.sleep(0)
        return httpx.Response(200, json={"accepted": True})

    loop = _Loop(store, handler, concurrency=1, clock=lambda: now["t"])
    loop.run(until=lambda: _count(store, "delivered") == 3)
    assert sorted(sent) == ["triage_a", "triage_b", "triage_c"]  # each once
    states = store.execute("SELECT state, attempts, count(*) FROM outbox GROUP BY 1, 2").fetchall()
    assert [tuple(row) for row in states] == [("delivered", 1, 3)]


def test_relay_stopping_puts_back_claims_it_never_started_without_counting_an_attempt(
    store: sqlite3.Connection,
) -> None:
    for n in range(3):
        _pending(store, f"triage_{n}", f"alerts:{n}", float(n))
    sent: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers["Idempotency-Key"])
        loop.stop.set()  # the daemon is stopping while the first attempt is in flight
        loop.relay.wakeup.set()
        return httpx.Response(200, json={"accepted": True})

    loop = _Loop(store, handler, concurrency=1)
    loop.run(until=lambda: False)
    assert sent == ["triage_0"]
    rows = store.execute("SELECT delivery_key, state, attempts, lease_until FROM outbox").fetchall()
    assert sorted(tuple(row) for row in rows) == [
        ("triage_0", "delivered", 1, None),
        ("triage_1", "pending", 0, None),
        ("triage_2", "pending", 0, None),
    ]


# -- the claim query -------------------------------------------------------------------------------


def _backlog(conn: sqlite3.Connection, n: int, *, per_due: int = 7) -> None:
    """`n` pending rows, `per_due` sharing each due time, created newest-key-first within it."""
    with db.write_txn(conn):
        for i in range(n):
            due = float(i // per_due)
            created = due * 100 + (per_due - i % per_due)
            outbox.create(conn, f"triage_{i:05d}", f"alerts:{i}", "new_incident", due, created)
        conn.execute("UPDATE outbox SET state = 'pending', payload = '{}'")


def test_claim_takes_the_oldest_due_then_oldest_created_even_when_a_tie_spans_the_limit(
    store: sqlite3.Connection,
) -> None:
    _backlog(store, 30)
    expected = [
        row[0]
        for row in store.execute(
            "SELECT delivery_key FROM outbox ORDER BY due_at, created_at, delivery_key LIMIT 10"
        )
    ]
    claims = outbox.claim_due(store, 1e9, limit=10, lease=60)  # 10 cuts the 2nd due time's 7
    assert [c.delivery_key for c in claims] == expected


def _claim_steps(conn: sqlite3.Connection) -> int:
    """SQLite VM steps (in hundreds) one claim of 32 takes."""
    steps = {"n": 0}

    def count() -> int:
        steps["n"] += 1
        return 0

    conn.set_progress_handler(count, 100)
    try:
        assert len(outbox.claim_due(conn, 1e9, limit=32, lease=60)) == 32
    finally:
        conn.set_progress_handler(None, 0)
    return steps["n"]


def test_claim_cost_does_not_grow_with_the_backlog(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A claim of 32 used to sort every due row: a 10x backlog made each claim 10x dearer."""
    costs = []
    for n in (300, 3000):
        conn = db.connect(tmp_path / f"backlog-{n}.sqlite3")
        migrations.apply(conn)
        _backlog(conn, n)
        costs.append(_claim_steps(conn))
        conn.close()
    assert costs[1] < costs[0] * 2, costs


def test_claim_alone_skips_its_fsync_and_the_connection_is_back_at_full_even_when_it_fails(
    store: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim-only turn commits at synchronous=NORMAL (a lost lease is re-sent under the same
    key anyway); a settle never does, and every other user of the connection finds FULL."""
    seen: list[str] = []

    def durability(conn: db.Connection) -> str:
        if db.is_postgres(conn):
            return (
                "full"
                if conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"
                else "relaxed"
            )
        return {2: "full", 1: "relaxed"}[conn.execute("PRAGMA synchronous").fetchone()[0]]

    def failing_lease(conn: db.Connection, *args: object, **kwargs: object) -> list[object]:
        seen.append(durability(conn))
        raise sqlite3.OperationalError("disk I/O error")

    r = relay.Relay(
        store,
        httpx.AsyncClient(),
        run_db=db.run_inline,
        owner_queue=owner_queue(),
        url="http://receiver.invalid/triage",
        timeout=5,
        max_attempts=8,
        clock=lambda: 100.0,
        flush_audit=_flushed,
    )
    monkeypatch.setattr(outbox, "ask_lease", failing_lease)
    with pytest.raises(sqlite3.OperationalError):
        r._settle_and_claim([], 8, (), ())
    claim = outbox.Claim("triage_x", "{}", 1, "alerts:x")
    with pytest.raises(sqlite3.OperationalError):
        r._settle_and_claim([(claim, relay.Outcome("retry", "HTTP 503", 503))], 8, (), ())
    assert seen == ["relaxed", "full"]  # NORMAL for the claim alone, FULL beside a settle
    assert durability(store) == "full"
    assert not store.in_transaction
