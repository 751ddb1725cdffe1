"""A node whose audit log latched is not ready until its process restarts (DESIGN.md section
11: readiness is "that it could do the work"; rules/readiness.latch_reason): two real
`ntfy-intake run` processes on one PostgreSQL, lease 3 s / renew 1 s, probe every 1 s,
yield_after 4 s (pair.py). Named after the failure it kills."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ntfy_intake.rules.readiness import LATCHED
from ntfy_intake.testbed.ntfy_route import NtfyRoute

from ...harness import wait_until
from ...standby import Cluster, serving_as_leader, settle
from ...standby_nodes import Node, Stream
from .pair import PROBE_EVERY, audit_disk_full, start_pair, yield_for_a_full_disk

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("engine", ["postgresql"], indirect=True),
]

WATCHED_PROBES = 4  # after the other node holds the lease: the yielder's `leaving` is over by then


def role(node: Node) -> object:
    answer = node.healthz()
    return None if answer is None else answer[1].get("role")


def row_of(cluster: Cluster, node: str) -> tuple[bool, str | None, str]:
    (row,) = cluster.rows("SELECT ready, reason, intake FROM nodes WHERE node = ?", node)
    return bool(row[0]), row[1], str(row[2])


def test_a_node_that_yielded_for_its_latch_says_not_ready_yet_leads_when_nobody_else_can(
    cluster: Cluster, routes: dict[str, NtfyRoute]
) -> None:
    """The standby drill's audit_full round: the latched leader yielded, then its row said ready
    again once the other node held the lease, and it stayed a ready peer (to yield back to, to
    hold off for). Now its row, its /healthz and `status` name the latch for as long as the
    process runs; and when the other node stops, with no node ready, it still leads (latched
    again: the disk is still full) and records. Its audit file is put back only once that
    process is gone (a file swapped under a live reader is no disk a real box has)."""
    if not Path("/dev/full").exists():
        pytest.skip("/dev/full is not available")
    alpha, beta, lease = start_pair(cluster, routes)
    stream = Stream(cluster.emu).start()
    try:
        wait_until(lambda: cluster.recorded() >= 30, 30, "the stream flowing")
        with audit_disk_full(alpha):
            yield_for_a_full_disk(cluster, alpha, lease.term)
            wait_until(lambda: role(alpha) == "standby", 30, "alpha's standby surface answering")
            seen = []
            until = time.monotonic() + WATCHED_PROBES * PROBE_EVERY
            while time.monotonic() < until:
                seen.append(row_of(cluster, "alpha"))
                time.sleep(PROBE_EVERY / 4)
            assert all(not ready for ready, _, _ in seen), seen
            # The latch is named; on a busy box a late ntfy probe may be named beside it.
            ready_, reason, work = seen[-1]
            assert not ready_ and LATCHED in str(reason) and work == "standby", seen
            answer = alpha.healthz()
            assert answer is not None and answer[0] == 503, answer
            assert answer[1]["status"] == "not_ready" and LATCHED in answer[1]["reason"], answer
            cluster_view = alpha.status()["cluster"]
            assert cluster_view["ready"] is False and LATCHED in cluster_view["not_ready"]
            (mine,) = (n for n in cluster_view["nodes"] if n["node"] == "alpha")
            assert LATCHED in mine["reason"], mine
            # No other node ready (beta stops): the latched node still leads, within the
            # graceful bound, and records, its new term's daemon latched again.
            now = cluster.lease()
            assert now is not None and now.node == "beta"
            stopped, code = beta.terminate()
            assert code == 0
            stop = cluster.fault(beta, "beta stopped", stopped)
            back, took = cluster.failover(stop, now.term, 2.0)
            assert back.node == "alpha"
            wait_until(lambda: serving_as_leader(alpha), 30, "alpha serving as the leader")
            count = cluster.recorded()
            wait_until(lambda: cluster.recorded() >= count + 30, 30, "alpha recording")
            wait_until(
                lambda: _names_latch(row_of(cluster, "alpha"), "latched"),
                10,
                "alpha's row saying its new term latched",
            )
            _at, code = alpha.terminate()
            assert code == 0
        # The disk takes writes again, and alpha's process is restarted, as its notice advises.
        alpha.start()
        wait_until(lambda: serving_as_leader(alpha), 30, "alpha, restarted, leading")
        wait_until(lambda: row_of(cluster, "alpha")[0], 10, "alpha's row saying ready")
        beta.start()
        wait_until(lambda: role(beta) == "standby", 30, "beta standing by")
        count = cluster.recorded()
        wait_until(lambda: cluster.recorded() >= count + 30, 30, "alpha recording")
    finally:
        published = stream.stop()
    settle(cluster, published)
    print(f"{len(published)} published; the latched node led again {took:.2f} s after the stop")


def _names_latch(row: tuple[bool, str | None, str], work: str) -> bool:
    ready, reason, intake = row
    return not ready and LATCHED in str(reason) and intake == work
