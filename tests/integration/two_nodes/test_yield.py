"""A leader that cannot do the work yields to a node that can (DESIGN.md section 11, issue 32):
two real `ntfy-intake run` processes on one PostgreSQL, lease 3 s / renew 1 s, each node
reaching the bundled ntfy emulator through its own loopback route (testbed/ntfy_route.py) the
test can cut, with `cluster.probe_every` 1 s and `cluster.yield_after` 4 s so that a yield takes
seconds. Each test is named after the failure it kills and makes the checks every two-node test
makes (tests/standby.py `settle`: every id recorded once, terms in order, every delivery
delivered, every node's audit files equal to the journal); the hand-over is bounded by
yield_after + lease_ttl + renew_every + 5 s from the fault, and printed.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ntfy_intake.testbed.ntfy_route import NtfyRoute

from ...harness import wait_until
from ...standby import (
    RENEW,
    TTL,
    Cluster,
    Fault,
    Lease,
    settle,
)
from ...standby_nodes import Stream
from .pair import (
    PROBE_EVERY,
    YIELD_AFTER,
    YIELD_BOUND,
    audit_disk_full,
    ready,
    start_pair,
    yield_for_a_full_disk,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("engine", ["postgresql"], indirect=True),
]


def handover_notices(cluster: Cluster) -> list[tuple[str, str, str]]:
    """The owner's notices of a change of leader: (key, kind, text)."""
    rows = cluster.rows(
        "SELECT key, topic, text FROM owner_outbox WHERE kind = 'notice'"
        " AND topic IN ('yielded', 'takeover') ORDER BY key"
    )
    return [(str(k), str(t), str(x)) for k, t, x in rows]


@pytest.mark.parametrize("how", ["cut", "silence"])
def test_a_leader_cut_off_from_ntfy_yields_instead_of_leading_deaf_while_alerts_age_out(
    cluster: Cluster, routes: dict[str, NtfyRoute], how: str
) -> None:
    """Issue 32: a leader whose route to ntfy was cut held the lease for the whole 60 s tried,
    alerts unrecorded, while the standby reached ntfy. Now the standby takes over within
    yield_after + lease_ttl + renew_every + 5 s, everything published during the cut is
    recorded once, and the owner reads one notice naming both nodes and the reason. `silence`:
    the same with the connections left open and not one byte coming back (a zombie link)."""
    alpha, _beta, lease = start_pair(cluster, routes)
    stream = Stream(cluster.emu).start()
    try:
        wait_until(lambda: cluster.recorded() >= 30, 30, "the stream flowing")
        getattr(routes["alpha"], how)()
        fault = cluster.fault(alpha, f"the leader's route to ntfy: {how}", time.monotonic())
        taken, took = cluster.failover(fault, lease.term, YIELD_BOUND)
        assert taken.node == "beta"
        count = cluster.recorded()
        wait_until(lambda: cluster.recorded() >= count + 30, 30, "beta recording")
    finally:
        published = stream.stop()
    settle(cluster, published)
    assert alpha.alive, alpha.stderr()  # it stands by, in the same process
    notices = handover_notices(cluster)
    assert [(k, kind) for k, kind, _ in notices] == [(f"takeover:{taken.term}", "yielded")]
    text = notices[0][2]
    assert text.startswith("alpha yielded to beta: ntfy unreachable from alpha for "), text
    yielded = alpha.events("cluster.yielding")
    assert len(yielded) == 1 and yielded[0]["to"] == "beta", yielded
    print(f"{len(published)} published; yield hand-over {took:.2f} s (bound {YIELD_BOUND:g} s)")


def test_a_leader_whose_audit_disk_is_full_yields_instead_of_leading_latched_until_a_restart(
    cluster: Cluster, routes: dict[str, NtfyRoute]
) -> None:
    """Issue 32: a leader whose audit disk filled (latched: the cursor frozen, the audit log it
    owes unwritten) led until a person restarted it. Now it yields to the ready standby."""
    if not Path("/dev/full").exists():
        pytest.skip("/dev/full is not available")
    alpha, _beta, lease = start_pair(cluster, routes)
    stream = Stream(cluster.emu).start()
    try:
        wait_until(lambda: cluster.recorded() >= 30, 30, "the stream flowing")
        with audit_disk_full(alpha):
            taken, took = yield_for_a_full_disk(cluster, alpha, lease.term)
            count = cluster.recorded()
            wait_until(lambda: cluster.recorded() >= count + 30, 30, "beta recording")
    finally:
        published = stream.stop()
    settle(cluster, published)
    assert alpha.alive, alpha.stderr()
    notices = handover_notices(cluster)
    assert [(k, kind) for k, kind, _ in notices] == [(f"takeover:{taken.term}", "yielded")]
    assert notices[0][2].startswith("alpha yielded to beta: the audit log cannot be written")
    print(f"{len(published)} published; yield hand-over {took:.2f} s (bound {YIELD_BOUND:g} s)")


def test_ntfy_unreachable_from_both_nodes_never_moves_the_lease_back_and_forth(
    cluster: Cluster, routes: dict[str, NtfyRoute]
) -> None:
    """No flapping: with ntfy unreachable from alpha AND beta, no node is ready, so the leader
    keeps the lease (nothing better exists) through four yield_after periods, and no notice is
    sent. Then beta's route comes back: the move happens once, to beta, and the alerts published
    while both were cut are recorded once."""
    alpha, _beta, lease = start_pair(cluster, routes)
    stream = Stream(cluster.emu).start()
    try:
        wait_until(lambda: cluster.recorded() >= 30, 30, "the stream flowing")
        routes["alpha"].cut()
        routes["beta"].cut()
        wait_until(lambda: not ready(cluster, "beta"), 30, "beta's row saying not ready")
        held_until = time.monotonic() + 4 * YIELD_AFTER
        while time.monotonic() < held_until:
            now = cluster.lease()
            assert now is not None and (now.node, now.term) == ("alpha", lease.term), now
            time.sleep(0.2)
        kept = [e["reason"] for e in alpha.events("cluster.keeps_leading")]
        assert any("no other node is ready: it keeps leading" in r for r in kept), kept
        assert handover_notices(cluster) == []
        routes["beta"].restore()
        fault = cluster.fault(alpha, "beta's route to ntfy back", time.monotonic())
        # beta ready at its next probe; alpha, dead for long, yields at once.
        taken, took = cluster.failover(fault, lease.term, 2 * PROBE_EVERY + TTL + RENEW + 5.0)
        assert taken == Lease("beta", lease.term + 1, True)
        count = cluster.recorded()
        wait_until(lambda: cluster.recorded() >= count + 30, 30, "beta recording")
    finally:
        published = stream.stop()
    settle(cluster, published)
    assert [kind for _, kind, _ in handover_notices(cluster)] == ["yielded"]
    print(f"{len(published)} published; moved once, {took:.2f} s after beta's route came back")


def test_a_yielding_leader_killed_after_its_notice_leaves_the_owner_one_notice_not_two(
    cluster: Cluster, routes: dict[str, NtfyRoute]
) -> None:
    """The yield notice is recorded under the yielder's term before it releases, with the next
    term's takeover key: alpha killed (-9) right after recording it, before the drain and the
    release, leaves beta to take the lease when it runs out, and beta's own takeover notice
    for that term is a no-op. One notice, not a yield notice and a failover notice."""
    alpha, _beta, lease = start_pair(
        cluster, routes, NTFY_INTAKE_TEST_CRASH_AT="after_yield_notice"
    )
    stream = Stream(cluster.emu).start()
    try:
        wait_until(lambda: cluster.recorded() >= 30, 30, "the stream flowing")
        routes["alpha"].cut()
        fault = cluster.fault(alpha, "the leader's route to ntfy cut", time.monotonic())
        assert alpha.proc is not None
        alpha.proc.wait(YIELD_BOUND)  # killed at the hook, right after its notice
        cluster.faults.append(Fault("alpha", time.monotonic(), "alpha killed after its notice"))
        taken, took = cluster.failover(fault, lease.term, YIELD_BOUND)
        assert taken.node == "beta"
        count = cluster.recorded()
        wait_until(lambda: cluster.recorded() >= count + 30, 30, "beta recording")
    finally:
        published = stream.stop()
    routes["alpha"].restore()  # alpha back as a ready standby (not ready, its health says so)
    settle(cluster, published, alpha)
    notices = handover_notices(cluster)
    assert [(k, kind) for k, kind, _ in notices] == [(f"takeover:{taken.term}", "yielded")]
    assert alpha.events("cluster.yielding") and not alpha.events("cluster.yielded")
    print(f"{len(published)} published; killed yielder, beta leads {took:.2f} s after the cut")
