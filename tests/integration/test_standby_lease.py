"""The lease of a leader, in-process on a real PostgreSQL (runtime/cluster.py, store/leadership.py;
DESIGN.md section 9): the failures the subprocess tests of tests/integration/test_standby.py met
on a busy 2-core box, each made deterministic here. Each test is named after the failure it
kills.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter

import psycopg
import pytest

from ntfy_intake.runtime.cluster import Member
from ntfy_intake.store import db, leadership, migrations
from ntfy_intake.testbed import drill_store

from .. import harness
from ..standby import CRASH_BOUND, LOCAL_WINDOW, RENEW, TTL

pytestmark = pytest.mark.parametrize("engine", ["postgresql"], indirect=True)


def lead_in_process(
    *, while_claiming: float = 0.0, before_hold: float = 0.0, in_term: float = 0.0
) -> tuple[bool, bool, int]:
    """A Member of this test's store wins a term; its event loop is blocked `while_claiming`
    seconds while the claim runs in the lease thread, `before_hold` seconds between the won
    claim and the term's start (hold), and `in_term` seconds after a renewal or so. What the
    holding says then: (may act, lost, term)."""
    assert harness.DATABASE is not None
    member = Member(
        db.Dsn(harness.DATABASE), node="alpha", lease_ttl=TTL, renew_every=RENEW, prefix="x."
    )

    async def lead() -> tuple[bool, bool, int]:
        asyncio.get_running_loop().call_soon(time.sleep, while_claiming)
        holding = await member.campaign(asyncio.Event())
        assert holding is not None
        time.sleep(before_hold)
        keeper = asyncio.create_task(member.hold(holding))
        await asyncio.sleep(RENEW * 1.5)  # renewing on schedule
        time.sleep(in_term)
        await asyncio.sleep(0.1)  # the deadline's watcher runs now, if it is due
        kept = (member.may_act(), holding.lost.is_set())
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
        await member.release()
        return (*kept, holding.term)

    try:
        return asyncio.run(lead())
    finally:
        member.close()


def test_a_leader_whose_event_loop_stalls_past_renew_every_keeps_its_lease() -> None:
    """In-process (a real PostgreSQL, no daemon): the leader's event loop blocked for longer
    than its local window, as the HTTP surface's imports at the start of a term block it for
    about a second on a busy 2-core box. The lease is held off the loop (runtime/cluster.py):
    the renewals go on meanwhile, and the holding survives the stall."""
    may_act, lost, term = lead_in_process(in_term=LOCAL_WINDOW + 0.5)
    assert (may_act, lost) == (True, False), "the stalled loop cost the lease"
    assert term == 1


@pytest.mark.parametrize("busy", ["while_claiming", "before_hold"])
def test_a_leader_slow_to_start_its_term_keeps_its_lease(busy: str) -> None:
    """In-process: the loop busy for three quarters of the local window around the claim that
    won the term, as it was for about a second in the subprocess tests: while the claim runs
    (the standby's HTTP surface importing starlette and uvicorn at its start), or between the
    won claim and the term's start (the standby winding down, the term's Daemon built). The
    term's renewals start in the lease thread with the claim, waiting for neither."""
    may_act, lost, term = lead_in_process(**{busy: LOCAL_WINDOW * 0.75})
    assert (may_act, lost) == (True, False), "a slow start cost the new term"
    assert term == 1


def test_a_takeover_is_not_held_off_for_ever_by_a_paused_leaders_write_in_flight() -> None:
    """In-process, on the lease's SQL: the old leader paused (SIGSTOP, a frozen VM, a dead link)
    in the middle of a fenced write sent as a pipeline (psycopg's executemany): BEGIN and the
    fence's FOR KEY SHARE of the leadership row reached the server, the rest never comes. The
    server waits for the client inside the transaction ('active', ClientRead), so neither
    idle_in_transaction_session_timeout nor statement_timeout ends it, and the takeover's
    FOR UPDATE would wait for it as long as the pause lasts. The standby must take over anyway,
    and the paused write must never commit."""
    assert harness.DATABASE is not None
    dsn = db.Dsn(harness.DATABASE)
    setup = db.connect(dsn)
    migrations.apply(setup)
    setup.close()
    old = leadership.connect(dsn, TTL, RENEW)
    new = leadership.connect(dsn, TTL, RENEW)
    paused = psycopg.connect(harness.DATABASE, autocommit=True, application_name="ntfy-intake")
    try:
        assert leadership.claim(old, "alpha", "inst-a", 1.0).row.term == 1  # expires in 1 s
        paused.execute(f"SET idle_in_transaction_session_timeout = {round(TTL * 500)}")
        paused_pid = paused.info.backend_pid
        pipe = paused.pgconn
        pipe.enter_pipeline_mode()
        pipe.send_query_params(b"BEGIN", None)
        pipe.send_query_params(b"SELECT term FROM leadership WHERE id = 1 FOR KEY SHARE", None)
        pipe.send_flush_request()
        pipe.flush()
        started = time.monotonic()
        won, failures = None, Counter[str]()
        while won is None and time.monotonic() - started < CRASH_BOUND:
            try:
                claimed = leadership.claim(new, "beta", "inst-b", TTL, lock_wait=RENEW)
            except db.ERRORS as exc:
                failures[type(exc).__name__] += 1
                time.sleep(RENEW)
                continue
            if claimed.won:
                won = claimed
            else:
                time.sleep(min(RENEW, max(0.05, claimed.row.remaining)))
        took = time.monotonic() - started
        print(f"\ntakeover past a paused write: {took:.2f} s; failed claims {dict(failures)}")
        assert won is not None, f"no takeover in {CRASH_BOUND:g} s: {dict(failures)}"
        assert won.row.term == 2
        sessions = new.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ?", (paused_pid,))
        assert sessions.fetchone()[0] == 0, "the paused write's session lives on"
    finally:
        for conn in (old, new):
            conn.close()
        with contextlib.suppress(psycopg.Error):
            paused.close()


def test_one_failed_renewal_costs_no_term() -> None:
    """In-process: the lease's session ended once mid-term (pg_terminate_backend, as
    test_standby's terminate test does to a whole daemon): that renewal fails, the next one
    reconnects. At the smallest timing allowed (lease_ttl = 3 x renew_every) the local window is
    two periods, so a retry a whole period later starts after the deadline: the retry must
    come sooner, and the term survive."""
    assert harness.DATABASE is not None
    dsn = db.Dsn(harness.DATABASE)
    member = Member(dsn, node="alpha", lease_ttl=TTL, renew_every=RENEW, prefix="x.")
    observer = db.connect(dsn)

    async def lead() -> tuple[bool, bool, int, int]:
        holding = await member.campaign(asyncio.Event())
        assert holding is not None
        keeper = asyncio.create_task(member.hold(holding))
        await asyncio.sleep(RENEW * 1.5)  # a renewal done, the next half a period away
        ended = await asyncio.to_thread(end_the_lease_session, observer)
        await asyncio.sleep(LOCAL_WINDOW + RENEW)  # past the deadline the failure would cost
        kept = (member.may_act(), holding.lost.is_set(), holding.term, ended)
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
        await member.release()
        return kept

    try:
        may_act, lost, term, ended = asyncio.run(lead())
    finally:
        member.close()
        observer.close()
    assert ended == 1, "no lease session to end: the test proves nothing"
    assert (may_act, lost, term) == (True, False, 1), "one failed renewal cost the term"


def end_the_lease_session(observer: db.Connection) -> int:
    """pg_terminate_backend of this process's session whose last statement renewed the lease
    (by its client port: other tests share the server)."""
    ports = sorted(drill_store.tcp_ports(os.getpid()))
    assert ports, "this process's sockets cannot be read"
    row = observer.execute(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE query LIKE 'UPDATE leadership SET expires_at%' AND pid <> pg_backend_pid()"
        f" AND state = 'idle' AND client_port IN ({', '.join('?' for _ in ports)})",
        tuple(ports),
    ).fetchone()
    return int(row[0])
