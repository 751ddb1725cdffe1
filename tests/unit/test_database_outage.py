"""One owner notice per database outage longer than the lease (DESIGN.md section 11, "Also owed
by section 9"): rules/outage.py's episode clock, rules/notices.database_outage, and the node's
watch (runtime/recovery.OutageWatch) on a stand-in for the lease statements, time injected."""

from __future__ import annotations

from dataclasses import dataclass

from ntfy_intake.flow.database import StorageWaits
from ntfy_intake.rules import notices
from ntfy_intake.rules.lease import Seen
from ntfy_intake.rules.outage import Outage, OutageClock
from ntfy_intake.runtime.recovery import OutageWatch

TTL = 3.0


def test_an_outage_longer_than_the_lease_ends_with_its_length_and_the_term_before_it() -> None:
    clock = OutageClock(TTL)
    assert clock.observe(False, 100.0, 7) is None
    # Still down: the episode goes on from its first unanswered statement and its term.
    assert clock.observe(False, 104.0, 8) is None
    assert clock.observe(True, 108.5, 8) == Outage(8.5, 7)
    assert clock.observe(True, 109.0, 8) is None  # over: nothing twice


def test_an_outage_under_the_lease_tells_nothing_and_the_next_one_starts_afresh() -> None:
    clock = OutageClock(TTL)
    clock.observe(False, 10.0, 1)
    assert clock.observe(True, 12.9, 1) is None  # a restart: under the lease
    clock.observe(False, 50.0, 2)
    assert clock.observe(True, 60.0, 2) == Outage(10.0, 2)


def test_both_nodes_notices_of_one_outage_share_their_key_and_name_its_length() -> None:
    """Kills the double notice across a failover: the leader and the standby each owe one for
    the same outage; the second one recorded must be a no-op under the outbox's key."""
    leader = notices.database_outage(61.4, "alpha", 4, "a1b2.c3:1")
    standby = notices.database_outage(60.2, "beta", 4, "d4e5.f6:3")
    assert leader.key == standby.key == "database_outage:term-4"
    assert "did not answer for 61 s" in leader.text
    assert leader.fields == {"node": "alpha", "seconds": "61"}
    before_any_term = notices.database_outage(9.0, "alpha", None, "a1b2.c3:1")
    assert before_any_term.key == "database_outage:a1b2.c3:1"


@dataclass
class Statements:
    """The lease statements' last outcome, as runtime/cluster.Member keeps it."""

    node: str = "alpha"
    instance: str = "a1b2.c3d4e5"
    problem: str | None = None
    row: Seen | None = None


def _watch(member: Statements, waits: StorageWaits, now: list[float]) -> OutageWatch:
    return OutageWatch(member, waits, lease_ttl=TTL, monotonic=lambda: now[0])


def test_the_watch_owes_one_notice_once_the_store_answers_after_an_outage_past_the_lease() -> None:
    """Kills the silent 60 s outage: the term ended with the daemon that saw it, and the node
    that led afterwards owed nothing."""
    member = Statements(row=Seen("alpha", "a1b2.c3d4e5", 5, 0.0, 3.0))
    waits, now = StorageWaits(), [0.0]
    watch = _watch(member, waits, now)
    watch.check()
    member.problem = "connection refused"
    for now[0] in (1.0, 2.0, 30.0, 61.0):
        watch.check()
        assert waits.notices_owed == []  # owed only once it is over
    member.problem, member.row = None, Seen("beta", "f00.ba5", 6, 0.0, 3.0)
    now[0] = 61.3
    watch.check()
    watch.check()
    assert [n.key for n in waits.notices_owed] == ["database_outage:term-5"]
    assert "did not answer for 60 s" in waits.notices_owed[0].text


def test_the_watch_owes_nothing_for_a_blip_and_one_notice_per_key() -> None:
    member = Statements(row=Seen("alpha", "a1b2.c3d4e5", 5, 0.0, 3.0))
    waits, now = StorageWaits(), [0.0]
    watch = _watch(member, waits, now)
    member.problem = "server closed the connection unexpectedly"
    watch.check()
    now[0], member.problem = 1.5, None
    watch.check()
    assert waits.notices_owed == []  # a restart under the lease
    # Two long episodes before this node leads again under one term seen: one owed, the later.
    for began, ended in ((10.0, 20.0), (30.0, 45.0)):
        now[0], member.problem = began, "connection refused"
        watch.check()
        now[0], member.problem = ended, None
        watch.check()
    assert [n.key for n in waits.notices_owed] == ["database_outage:term-5"]
    assert "did not answer for 15 s" in waits.notices_owed[0].text
