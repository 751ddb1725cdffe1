"""Two nodes set up to yield (DESIGN.md section 11), shared by test_yield.py and
test_handover_bounds.py: each node reaches the one ntfy through its own route (the `routes`
fixture), probes every 1 s and yields after 4 s, so that a yield takes seconds."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

from ntfy_intake.testbed.ntfy_route import NtfyRoute

from ...harness import wait_until
from ...standby import RENEW, TTL, Cluster, Lease, serving_as_leader, standing_by
from ...standby_nodes import Node

PROBE_EVERY = 1.0
YIELD_AFTER = 4.0
# A yield's bound: yield_after + lease_ttl + renew_every + 5 s (DESIGN.md section 11).
YIELD_BOUND = YIELD_AFTER + TTL + RENEW + 5.0


def start_pair(
    cluster: Cluster, routes: dict[str, NtfyRoute], leader: str = "alpha", **leader_env: str
) -> tuple[Node, Node, Lease]:
    """`leader` (alpha unless named) leading and recording, the other standing by and READY
    (its row says so): (the leader, the other, the lease)."""
    other = "beta" if leader == "alpha" else "alpha"
    cluster.settings.update(
        cluster_probe_every=f"{PROBE_EVERY:g}s", cluster_yield_after=f"{YIELD_AFTER:g}s"
    )
    # One ntfy, reached through each node's own route: the work (its fingerprint) is the same.
    first = cluster.add(leader, test_work_ntfy_url=cluster.emu.url)
    second = cluster.add(other, test_work_ntfy_url=cluster.emu.url)
    for node in (first, second):
        node.env["NTFY_INTAKE_NTFY_URL"] = routes[node.name].url
    first.start(**leader_env)
    assert cluster.leader().name == leader
    cluster.emu.wait_for_subscribers(1, timeout=30)
    wait_until(lambda: serving_as_leader(first), 30, f"{leader} serving as the leader")
    second.start()
    wait_until(lambda: standing_by(second), 30, f"{other} standing by")
    wait_until(lambda: ready(cluster, other), 30, f"{other}'s row saying ready")
    lease = cluster.lease()
    assert lease is not None and lease.node == leader
    return first, second, lease


def ready(cluster: Cluster, node: str) -> bool:
    return bool(cluster.try_rows("SELECT ready FROM nodes WHERE node = ?", node) == [(True,)])


@contextlib.contextmanager
def audit_disk_full(node: Node) -> Iterator[None]:
    """Every write to the node's audit file of today fails with ENOSPC (the file swapped for
    /dev/full under the running daemon; the original kept aside). At the end the file comes
    back only once the node's process is gone: a process still running had read /dev/full as
    its file (a standby's mirror wrote the journal again behind it: "twice" in mirrors_match),
    which no real disk that fills and is freed does. A process this stopped is started again."""
    audit = node.state_dir / "audit"
    (today,) = sorted(audit.glob("audit-*.jsonl"))[-1:]
    aside = today.with_name(today.name + ".aside")
    link = today.with_name(today.name + ".full")
    link.symlink_to("/dev/full")
    os.rename(today, aside)
    os.rename(link, today)
    try:
        yield
    finally:
        running = node.alive
        if running:
            _at, code = node.terminate()
            assert code == 0, f"{node.name} exited {code} at its stop: {node.stderr()}"
        today.unlink()
        os.rename(aside, today)
        if running:
            node.start()


def yield_for_a_full_disk(cluster: Cluster, alpha: Node, term: int) -> tuple[Lease, float]:
    """Inside `audit_disk_full(alpha)`: the leader alpha latches and yields term
    `term` to beta within YIELD_BOUND; the lease beta took, and how long after the fault."""
    fault = cluster.fault(alpha, "the leader's audit disk full", time.monotonic())
    taken, took = cluster.failover(fault, term, YIELD_BOUND)
    assert taken.node == "beta"
    assert alpha.events("audit.latched"), "the fault did not latch the leader"
    return taken, took
