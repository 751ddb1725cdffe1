"""The leadership row on a real PostgreSQL (store/leadership.py; DESIGN.md section 9). Each
test is named after the failure it kills. Run with NTFY_INTAKE_TEST_DATABASE set."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from ntfy_intake.errors import Fenced
from ntfy_intake.rules.lease import Action, Seen, decide
from ntfy_intake.store import db, leadership, migrations_pg, postgres

from .. import harness
from ..harness import wait_until

pytestmark = pytest.mark.parametrize("engine", ["postgresql"], indirect=True)

ROUNDS = 150
TTL = 8.0


@pytest.fixture
def connect(engine: str) -> Iterator[Callable[[], postgres.PgConnection]]:
    """Connections to this test's schema, with the leadership table (and a table the writers
    write to) created; every one is closed after the test."""
    opened: list[postgres.PgConnection] = []

    def open_one() -> postgres.PgConnection:
        conn = db.connect(harness.DATABASE or "")
        assert isinstance(conn, postgres.PgConnection)
        opened.append(conn)
        return conn

    setup = open_one()
    setup.execute(migrations_pg.LEADERSHIP)
    setup.execute("CREATE TABLE writes(seq BIGINT GENERATED ALWAYS AS IDENTITY, term BIGINT)")
    yield open_one
    for conn in opened:
        conn.close()


def write(conn: postgres.PgConnection, term: int) -> None:
    """One write transaction of a leader of `term`, fenced as the daemon's are."""
    conn.term = term
    with db.write_txn(conn):
        conn.execute("INSERT INTO writes(term) VALUES (?)", (term,))


def terms_written(conn: postgres.PgConnection) -> list[int]:
    return [int(row[0]) for row in conn.execute("SELECT term FROM writes ORDER BY seq")]


def expire(conn: postgres.PgConnection) -> None:
    conn.execute("UPDATE leadership SET expires_at = now() - INTERVAL '1 second'")


def waiting_on_a_lock(observer: postgres.PgConnection, conn: postgres.PgConnection) -> bool:
    row = observer.execute(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = ?",
        (conn.raw.info.backend_pid,),
    ).fetchone()
    return row is not None and row[0] == "Lock"


def test_two_instances_claiming_at_the_same_instant_make_exactly_one_leader(
    connect: Callable[[], postgres.PgConnection],
) -> None:
    """Kills a check-then-write claim: both see the row absent (or expired) and both lead."""
    control = connect()
    conns = [connect(), connect()]
    locked = [0, 0]  # how often each claimant got as far as the locked re-check
    for i, conn in enumerate(conns):
        plain = conn.execute

        def counting(sql: str, params: Any = (), *, i: int = i, plain: Any = plain) -> Any:
            if "FOR UPDATE" in sql or "ON CONFLICT" in sql:
                locked[i] += 1
            return plain(sql, params)

        conn.execute = counting  # type: ignore[method-assign]
    barrier = threading.Barrier(2)
    both_locked = 0

    def contend(i: int) -> leadership.Claimed:
        barrier.wait()
        return leadership.claim(conns[i], f"node-{i}", f"inst-{i}", TTL)

    with ThreadPoolExecutor(2) as pool:
        for round_ in range(2 * ROUNDS):
            if round_ < ROUNDS:
                control.execute("DELETE FROM leadership")  # nobody has claimed yet
                term_before = 0
            else:
                expire(control)  # the last winner's lease ran out
                term_before = int(control.execute("SELECT term FROM leadership").fetchone()[0])
            before = list(locked)
            a, b = pool.map(contend, range(2))
            both_locked += locked[0] > before[0] and locked[1] > before[1]
            winners = [c for c in (a, b) if c.won]
            assert len(winners) == 1, (round_, a, b)
            winner, loser = (a, b) if a.won else (b, a)
            assert winner.row.term == term_before + 1
            assert (loser.row.instance, loser.row.term) == (winner.row.instance, winner.row.term)
            assert not loser.row.expired
    print(f"\n{2 * ROUNDS} rounds, both claimants reached the locked path in {both_locked}")
    assert both_locked > 0, "the race never reached the lock: the test proves nothing"


def test_an_expired_lease_is_taken_with_term_plus_one_and_a_fresh_one_is_not(
    connect: Callable[[], postgres.PgConnection],
) -> None:
    a, b = connect(), connect()
    first = leadership.claim(a, "pi", "inst-a", 0.5)
    assert (first.won, first.row.term, first.before) == (True, 1, None)
    fresh = leadership.claim(b, "nas", "inst-b", TTL)
    assert not fresh.won
    assert (fresh.row.node, fresh.row.term) == ("pi", 1)
    wait_until(lambda: leadership.read(b).expired, 5, "the lease to expire")  # type: ignore[union-attr]
    taken = leadership.claim(b, "nas", "inst-b", TTL)
    assert (taken.won, taken.renewed, taken.row.term) == (True, False, 2)
    assert taken.before is not None
    assert taken.before.node == "pi"
    # The old leader's renewal comes back refused, and says who leads now.
    late = leadership.claim(a, "pi", "inst-a", TTL, holding=1)
    assert (late.won, late.row.node, late.row.term) == (False, "nas", 2)


def test_an_expired_lease_of_my_own_is_taken_again_as_a_new_term_not_renewed(
    connect: Callable[[], postgres.PgConnection],
) -> None:
    """Kills renewing a lapsed lease in place: its writes in flight must meet a new term."""
    a = connect()
    assert leadership.claim(a, "pi", "inst-a", 0.2).row.term == 1
    assert leadership.claim(a, "pi", "inst-a", TTL, holding=1).renewed
    expire(a)
    again = leadership.claim(a, "pi", "inst-a", TTL, holding=1)
    assert (again.won, again.renewed, again.row.term) == (True, False, 2)
    # Fresh but not the term it holds (its local deadline passed): a new term too.
    assert leadership.claim(a, "pi", "inst-a", TTL, holding=None).row.term == 3


def watch(conn: postgres.PgConnection, *, node: str, instance: str, seconds: float) -> list[Action]:
    """What a starting node decides over `seconds`, polling as the daemon will."""
    actions: list[Action] = []
    first_own: Seen | None = None
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen = leadership.read(conn)
        mine_elsewhere = seen is not None and seen.node == node and seen.instance != instance
        if mine_elsewhere and (first_own is None or first_own.instance != seen.instance):
            first_own = seen
        decision = decide(
            seen, node=node, instance=instance, holding=None, renew_every=0.1, first_own=first_own
        )
        actions.append(decision.action)
        if decision.action in (Action.COLLISION, Action.TAKE):
            break
        time.sleep(0.05)
    return actions


def test_a_second_process_with_the_same_node_name_while_the_first_renews_is_a_collision(
    connect: Callable[[], postgres.PgConnection],
) -> None:
    a, b = connect(), connect()
    term = leadership.claim(a, "pi", "inst-a", 1.0).row.term
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(0.1):
            assert leadership.claim(a, "pi", "inst-a", 1.0, holding=term).renewed

    renewer = threading.Thread(target=renew)
    renewer.start()
    try:
        actions = watch(b, node="pi", instance="inst-b", seconds=5)
    finally:
        stop.set()
        renewer.join()
    assert actions[0] is Action.WAIT_OWN  # at first it may be a crashed predecessor's
    assert actions[-1] is Action.COLLISION
    assert Action.TAKE not in actions
    assert leadership.read(b).instance == "inst-a"  # type: ignore[union-attr]


def test_the_same_node_restarting_after_a_crash_waits_out_and_reclaims_its_stale_lease(
    connect: Callable[[], postgres.PgConnection],
) -> None:
    """Kills exiting 2 on one's own crashed predecessor (a restart within the TTL)."""
    a, b = connect(), connect()
    assert leadership.claim(a, "pi", "inst-before-crash", 1.0).won
    a.close()  # crashed: nothing renews it any more
    actions = watch(b, node="pi", instance="inst-after", seconds=5)
    assert actions[0] is Action.WAIT_OWN
    assert actions[-1] is Action.TAKE
    assert Action.COLLISION not in actions
    reclaimed = leadership.claim(b, "pi", "inst-after", TTL)
    assert (reclaimed.won, reclaimed.row.term, reclaimed.row.instance) == (True, 2, "inst-after")


def test_a_takeover_waits_for_the_old_terms_write_and_a_later_write_of_it_rolls_back(
    connect: Callable[[], postgres.PgConnection],
) -> None:
    """Kills a fence that holds nothing: the takeover must not commit while a write of term T
    is in flight, and a write of T that fences after it must not commit at all."""
    old, writer, standby, observer = connect(), connect(), connect(), connect()
    term = leadership.claim(old, "pi", "inst-old", TTL).row.term
    with ThreadPoolExecutor(1) as pool:
        writer.term = term
        with db.write_txn(writer):
            writer.execute("INSERT INTO writes(term) VALUES (?)", (term,))
            expire(observer)  # the old leader's lease ran out, its write still in flight
            takeover = pool.submit(leadership.claim, standby, "nas", "inst-new", TTL)
            wait_until(lambda: waiting_on_a_lock(observer, standby), 10, "the takeover to wait")
            time.sleep(0.3)
            assert not takeover.done()  # blocked behind the old term's write
            # The lock-free read a standby polls with does not wait.
            assert leadership.read(observer).term == term  # type: ignore[union-attr]
        committed = time.monotonic()
        claimed = takeover.result(timeout=10)
        assert time.monotonic() - committed < 1  # and goes on as soon as that write commits
    assert (claimed.won, claimed.row.term) == (True, term + 1)
    with pytest.raises(Fenced):
        write(writer, term)  # a zombie of term T, after T+1 began
    write(standby, term + 1)
    assert terms_written(observer) == [term, term + 1]


def test_a_leaders_renewal_does_not_wait_for_its_own_write_in_flight(
    connect: Callable[[], postgres.PgConnection],
) -> None:
    """Kills a fence taken FOR SHARE: the renewal's UPDATE would queue behind every write, and a
    long write would cost the leader its lease."""
    leader, writer = connect(), connect()
    term = leadership.claim(leader, "pi", "inst", TTL).row.term
    leader.execute("SET lock_timeout = '2s'")
    writer.term = term
    with db.write_txn(writer):  # holds the row FOR KEY SHARE until it ends
        started = time.monotonic()
        assert leadership.claim(leader, "pi", "inst", TTL, holding=term).renewed
        assert time.monotonic() - started < 1.0


def test_writes_of_term_t_never_commit_after_term_t_plus_1_began(
    connect: Callable[[], postgres.PgConnection],
) -> None:
    """A zombie leader writing flat out while a standby takes over: every row of term T that
    ever commits is already committed when the takeover's claim returns."""
    old, zombie, standby, observer = connect(), connect(), connect(), connect()
    term = leadership.claim(old, "pi", "inst-old", 0.3).row.term
    stop = threading.Event()
    refused = threading.Event()

    def write_flat_out() -> None:
        while not stop.is_set():
            try:
                write(zombie, term)
            except Fenced:
                refused.set()
                return

    with ThreadPoolExecutor(1) as pool:
        writing = pool.submit(write_flat_out)
        wait_until(lambda: len(terms_written(observer)) >= 20, 10, "the zombie to write")
        wait_until(lambda: leadership.claim(standby, "nas", "inst-new", TTL).won, 10, "takeover")
        seen_at_takeover = terms_written(observer).count(term)
        wait_until(refused.is_set, 10, "the zombie to be fenced")
        stop.set()
        writing.result(timeout=10)
    print(f"\n{seen_at_takeover} writes of term {term} before the takeover, none after")
    assert terms_written(observer).count(term) == seen_at_takeover
    assert seen_at_takeover >= 20


def test_a_takeover_behind_a_process_stopped_inside_a_transaction_gives_up_in_time(
    connect: Callable[[], postgres.PgConnection],
) -> None:
    """Kills a standby that hangs for ever behind a SIGSTOPped leader's open transaction."""
    zombie, standby = connect(), connect()
    term = leadership.claim(zombie, "pi", "inst-old", TTL).row.term
    zombie.term = term
    zombie.begin_write()  # a write transaction's first statement: the fence
    expire(standby)
    started = time.monotonic()
    with pytest.raises(db.ERRORS):
        leadership.claim(standby, "nas", "inst-new", TTL, lock_wait=0.3)
    assert time.monotonic() - started < 3
    assert leadership.read(standby).term == term  # type: ignore[union-attr]
    zombie.execute("ROLLBACK")
    assert leadership.claim(standby, "nas", "inst-new", TTL).row.term == term + 1


def test_release_makes_the_lease_takeable_at_once_and_wakes_a_listening_standby(
    connect: Callable[[], postgres.PgConnection],
) -> None:
    leader, standby, ears = connect(), connect(), connect()
    listener = leadership.ReleaseListener(ears)
    term = leadership.claim(leader, "pi", "inst-a", TTL).row.term
    assert not leadership.claim(standby, "nas", "inst-b", TTL).won
    assert not leadership.release(leader, "nas", "inst-b")  # not its lease: nothing, no NOTIFY
    assert not listener.wait(0.2)
    started = time.monotonic()
    assert leadership.release(leader, "pi", "inst-a")
    assert listener.wait(5)
    assert time.monotonic() - started < 1
    taken = leadership.claim(standby, "nas", "inst-b", TTL)
    assert (taken.won, taken.row.term) == (True, term + 1)
    assert not leadership.release(leader, "pi", "inst-a")  # no longer its own


def test_the_lease_times_are_the_servers_whatever_the_local_clock_says(
    connect: Callable[[], postgres.PgConnection], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kills a node's clock in the lease: a box whose clock is decades off changes nothing."""
    a, b = connect(), connect()
    for wild in (0.0, 4_102_444_800.0):  # 1970, and 2100
        monkeypatch.setattr(time, "time", lambda wild=wild: wild)
        a.execute("DELETE FROM leadership")
        claimed = leadership.claim(a, "pi", "inst-a", TTL)
        server_now = float(a.execute("SELECT EXTRACT(EPOCH FROM now())::float8").fetchone()[0])
        assert TTL - 1 < claimed.row.remaining <= TTL
        assert abs(claimed.row.expires_at - (server_now + TTL)) < 1
        assert not leadership.claim(b, "nas", "inst-b", TTL).won
        assert leadership.claim(a, "pi", "inst-a", TTL, holding=claimed.row.term).renewed


def test_a_fenced_write_on_a_store_that_never_had_a_leader_is_refused(
    connect: Callable[[], postgres.PgConnection], tmp_path: Any
) -> None:
    """Kills a fence that passes when the row is absent (a term no lease ever granted)."""
    conn = connect()
    with pytest.raises(Fenced):
        write(conn, 1)
    assert terms_written(conn) == []
    lite = db.connect(tmp_path / "intake.sqlite3")
    try:
        with pytest.raises(TypeError):
            leadership.read(lite)  # one box on SQLite has no lease
    finally:
        lite.close()


def test_a_standby_whose_listening_session_was_cut_wakes_and_hears_the_next_release(
    connect: Callable[[], postgres.PgConnection],
) -> None:
    """Kills a LISTEN lost with its session: the standby would wait for a NOTIFY that can
    never reach it (the poll would still save it, one renew_every later)."""
    leader, ears, killer = connect(), connect(), connect()
    listener = leadership.ReleaseListener(ears)
    leadership.claim(leader, "pi", "inst-a", TTL)
    killer.execute("SELECT pg_terminate_backend(?)", (ears.raw.info.backend_pid,))
    assert listener.wait(5)  # cut: wake up and look (a release may have gone unheard)
    assert not listener.wait(0.2)
    assert leadership.release(leader, "pi", "inst-a")
    assert listener.wait(5)
