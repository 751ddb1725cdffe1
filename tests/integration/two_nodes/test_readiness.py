"""Readiness per node (DESIGN.md section 11), on two real `ntfy-intake run` subprocesses sharing
one PostgreSQL store: a standby that could not do the work says so on every surface, and never
takes it; a node configured for other work, or under a name in use, exits 2 with one line.
Each test is named after the failure it kills (issue 32); each failed on the code before it.
"""

from __future__ import annotations

import signal
import subprocess
import time

import httpx
import pytest

from ntfy_intake.store import db, migrations
from ntfy_intake.testbed.ntfy_route import NtfyRoute

from ...harness import wait_until
from ...standby import Cluster, serving_as_leader, standing_by
from ...standby_nodes import Node, free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("engine", ["postgresql"], indirect=True),
]

# yield_after well past two probes: a standby cut at the leader's instant is seen not ready
# before the leader's yield_after ends (the yield's own tests time that race).
PROBE = {"cluster_probe_every": "1s", "cluster_yield_after": "4s"}


def leader_alpha(cluster: Cluster) -> Node:
    alpha = cluster.add("alpha", **PROBE).start()
    assert cluster.leader().name == "alpha"
    cluster.emu.wait_for_subscribers(1, timeout=30)
    wait_until(lambda: serving_as_leader(alpha), 30, "alpha serving as the leader")
    return alpha


def exits_2_with_one_line(node: Node, timeout: float = 30.0) -> str:
    assert node.proc is not None
    started = time.monotonic()
    try:
        code = node.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{node.name} still runs after {timeout:g} s: {node.healthz()}")
    took = time.monotonic() - started
    stderr = node.stderr().strip()
    print(f"\n{node.name} exited {code} after {took:.2f} s: {stderr}")
    assert code == 2, stderr
    assert len(stderr.splitlines()) == 1, stderr
    assert "Traceback" not in stderr
    return stderr


def unhealthy(node: Node, words: str) -> bool:
    answer = node.healthz()
    return answer is not None and answer[0] == 503 and words in str(answer[1].get("reason"))


def metric(node: Node, name: str) -> float | None:
    try:
        text = httpx.get(f"http://127.0.0.1:{node.port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return None


def test_a_node_subscribed_to_other_topics_than_the_leader_exits_2_at_start_naming_the_key(
    cluster: Cluster,
) -> None:
    """Issue 32: b on `alerts` while a led on `alerts,backups` lost 3 backups alerts."""
    alpha = leader_alpha(cluster)
    beta = cluster.add("beta", ntfy_topics="alerts", **PROBE).start()
    line = exits_2_with_one_line(beta)
    assert "ntfy.topics" in line
    assert "backups" not in line, "a key is named, never its value"
    assert "ntfy.url" not in line and "relay.url" not in line, "only the keys that differ"
    del cluster.nodes["beta"]
    assert alpha.alive
    assert cluster.lease() is not None and cluster.lease().node == "alpha"  # type: ignore[union-attr]


def test_a_standby_whose_ntfy_does_not_answer_is_not_ready_on_every_surface(
    cluster: Cluster,
) -> None:
    """Issue 32: a standby pointed at a dead ntfy URL reported healthy until it had to lead."""
    leader_alpha(cluster)
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: refused at once
    # The same work (the hook names the one ntfy): only this node's route to it is dead.
    beta = cluster.add("beta", test_work_ntfy_url=cluster.emu.url, **PROBE)
    beta.env["NTFY_INTAKE_NTFY_URL"] = dead
    beta.start()
    wait_until(lambda: unhealthy(beta, "ntfy unreachable"), 30, "beta's /healthz 503 naming ntfy")
    answer = beta.healthz()
    assert answer is not None
    print(f"\n/healthz: {answer}")
    assert answer[1]["status"] == "not_ready" and answer[1]["ready"] is False
    assert dead.split("//")[1] in answer[1]["reason"]
    check = beta.command("check")
    print(f"check: {check.returncode} {check.stdout.strip()}")
    assert check.returncode == 1, check.stdout
    assert "not ready" in check.stdout and "ntfy unreachable" in check.stdout
    assert metric(beta, "ntfy_intake_ready") == 0
    assert metric(beta, "ntfy_intake_healthy") == 0
    assert metric(beta, "ntfy_intake_cluster_intake_live") == 1  # alpha's intake is live
    nodes = {n["node"]: n for n in beta.status()["cluster"]["nodes"]}
    assert nodes["alpha"]["ready"] and nodes["alpha"]["role"] == "leader"
    assert nodes["alpha"]["intake"] == "live"
    assert not nodes["beta"]["ready"] and "ntfy unreachable" in nodes["beta"]["reason"]
    rendered = beta.command("status").stdout
    assert "'beta' standby, NOT READY: ntfy unreachable" in rendered, rendered


def test_a_standby_pointed_at_another_ntfy_exits_2_naming_ntfy_url(cluster: Cluster) -> None:
    """Issue 32: a standby pointed at its own ntfy reported healthy; its cursor is not ours."""
    leader_alpha(cluster)
    beta = cluster.add("beta", **PROBE)
    beta.env["NTFY_INTAKE_NTFY_URL"] = f"http://127.0.0.1:{free_port()}"
    beta.start()
    line = exits_2_with_one_line(beta)
    assert "ntfy.url" in line and "127.0.0.1" not in line
    del cluster.nodes["beta"]


def test_a_standby_older_than_the_schema_is_not_ready_and_never_takes_the_lease(
    cluster: Cluster,
) -> None:
    """Issue 32: after a newer version migrated, the old standby won the term and exited 2."""
    alpha = leader_alpha(cluster)
    beta = cluster.add("beta", **PROBE).start()
    wait_until(lambda: standing_by(beta), 30, "beta standing by")
    conn = db.connect(db.Dsn(cluster.dsn))
    try:
        conn.execute("INSERT INTO schema_migrations(name) VALUES ('0099_from_a_newer_version')")
    finally:
        conn.close()
    wait_until(lambda: unhealthy(beta, "0099_from_a_newer_version"), 30, "beta not ready")
    assert beta.command("check").returncode == 1
    _, code = alpha.terminate()
    assert code == 0
    # The lease is free now: a ready standby would take it within a second (section 9).
    time.sleep(8.0)
    lease = cluster.lease()
    print(f"\nlease after alpha stopped: {lease}; beta alive: {beta.alive}")
    assert beta.alive, beta.stderr()
    assert lease is not None and lease.node == "alpha" and not lease.fresh
    assert beta.events("cluster.leading") == []
    assert [e for e in beta.events("cluster.holding_off") if "0099" in e["reason"]]
    assert unhealthy(beta, "0099_from_a_newer_version")
    beta.send(signal.SIGTERM)


def test_a_second_process_under_a_standing_by_node_s_name_exits_2_with_one_line(
    cluster: Cluster,
) -> None:
    """Issue 32: a second standby under an existing node name was accepted; one of them exited
    2 at failover. A node restarting after a crash still reclaims its own row at once."""
    leader_alpha(cluster)
    beta = cluster.add("beta", **PROBE).start()
    wait_until(lambda: standing_by(beta), 30, "beta standing by")
    twin = cluster.add("beta", state="beta-twin", **PROBE).start()
    line = exits_2_with_one_line(twin)
    assert "'beta' is in use" in line
    del cluster.nodes["beta-twin"]
    assert beta.alive
    assert standing_by(beta)
    # A crash and a restart of the same state directory: its own row is reclaimed, no exit 2.
    beta.kill9()
    beta.start()
    wait_until(lambda: standing_by(beta), 30, "beta standing by again")
    wait_until(
        lambda: any(n["node"] == "beta" and n["ready"] for n in beta.status()["cluster"]["nodes"]),
        30,
        "beta's row ready again",
    )
    assert beta.alive, beta.stderr()


def test_a_node_that_finds_out_later_its_work_differs_never_leads_and_the_owner_hears_once(
    cluster: Cluster,
) -> None:
    """Issue 32: b on `alerts` led while a was on `alerts,backups` (3 alerts lost, no notice).
    Both start while a lease nobody reports under holds (no leader's work to compare with):
    whichever wins the term, the other finds out then, is not ready, never campaigns, and the
    leader tells the owner once."""
    conn = db.connect(db.Dsn(cluster.dsn))
    try:
        migrations.apply(conn)
        conn.execute(
            "INSERT INTO leadership(id, node, instance, term, expires_at)"
            " VALUES (1, 'gone', 'gone.0', 1, now() + INTERVAL '6 seconds')"
        )
    finally:
        conn.close()
    alpha = cluster.add("alpha", **PROBE).start()
    beta = cluster.add("beta", ntfy_topics="alerts", **PROBE).start()
    lease, _ = cluster.wait_lease(lambda s: s.term == 2, 30, "term 2")
    leader = cluster.node_named(lease.node)
    other = beta if leader is alpha else alpha
    print(f"\n{leader.name} leads; {other.name} must find out")
    wait_until(lambda: unhealthy(other, "work differs from the leader"), 30, "not ready")
    answer = other.healthz()
    assert answer is not None and "ntfy.topics" in answer[1]["reason"], answer
    assert "backups" not in answer[1]["reason"], "a key is named, never its value"
    assert other.command("check").returncode == 1

    def told() -> list[tuple[object, ...]]:
        return cluster.rows("SELECT key, text FROM owner_outbox WHERE key LIKE 'work_differs:%'")

    wait_until(told, 30, "the owner told")
    time.sleep(3.0)  # three more probes of the leader: still one notice
    (row,) = told()
    print(f"notice: {row[1]}")
    assert f"'{other.name}'" in str(row[1]) and "ntfy.topics" in str(row[1])
    # The leader stops: the lease is free, and the node with other work still does not take it.
    _, code = leader.terminate()
    assert code == 0
    time.sleep(6.0)
    after = cluster.lease()
    assert after is not None and after.term == 2 and not after.fresh, after
    assert other.alive, other.stderr()
    assert other.events("cluster.leading") == []


def test_a_standby_says_unhealthy_when_the_leader_s_intake_is_dead_and_nobody_can_take_over(
    cluster: Cluster,
) -> None:
    """Issue 32: the leader cut off from ntfy held the lease while the standby answered check 0
    and /healthz 200 and its /metrics said healthy. With both routes cut nobody can take over
    (so nobody yields); every surface of the standby says so, and the cluster-wide metric the
    documented alert reads is 0 on both nodes."""
    routes = {name: NtfyRoute(cluster.emu.url, name) for name in ("alpha", "beta")}
    try:
        nodes = {}
        for name, route in routes.items():
            node = cluster.add(name, test_work_ntfy_url=cluster.emu.url, **PROBE)
            node.env["NTFY_INTAKE_NTFY_URL"] = route.url
            nodes[name] = node
        alpha, beta = nodes["alpha"].start(), nodes["beta"]
        assert cluster.leader().name == "alpha"
        wait_until(lambda: serving_as_leader(alpha), 30, "alpha serving as the leader")
        beta.start()
        wait_until(lambda: standing_by(beta), 30, "beta standing by")
        wait_until(lambda: beta.command("check").returncode == 0, 30, "check 0 on beta")
        for route in routes.values():
            route.cut()
        cut = time.monotonic()
        wait_until(lambda: unhealthy(beta, "no node is ready"), 30, "beta unhealthy")
        print(f"\nbeta unhealthy {time.monotonic() - cut:.2f} s after the cut: {beta.healthz()}")
        check = beta.command("check")
        assert check.returncode == 1 and "'alpha' has had its intake dead" in check.stdout
        assert metric(beta, "ntfy_intake_cluster_intake_live") == 0
        assert metric(alpha, "ntfy_intake_cluster_intake_live") == 0
        assert metric(beta, "ntfy_intake_healthy") == 0
        lease = cluster.lease()
        assert lease is not None and lease.node == "alpha", "nobody better: alpha keeps leading"
        for route in routes.values():
            route.restore()
        wait_until(lambda: standing_by(beta), 60, "beta healthy again")
        wait_until(lambda: metric(beta, "ntfy_intake_cluster_intake_live") == 1, 30, "live")
    finally:
        for route in routes.values():
            route.close()
