"""Two nodes on one PostgreSQL store (DESIGN.md section 9), as real `ntfy-intake run`
subprocesses, under the faults that end a leader's term: the bundled ntfy emulator, the
reference receiver as the relay target, lease_ttl 3 s and renew_every 1 s, debounce 0 s. Each
test is named after the failure it kills, and each checks (tests/standby.py `settle`) that every
published id is recorded exactly once (inbox, journal, every node's audit files), that no
journal row of an older term follows a newer term's first or commits after it began, that every
delivery key is delivered (a repeat only under its own key, for a POST in flight at a fault),
that each node's audit files equal the journal once the run settles, and that the failover took
no longer than its bound (printed: a crash <= lease_ttl + renew_every + 5 s).

The roles and surfaces of the two nodes are tests/integration/test_standby_roles.py; the lease
in-process, tests/integration/test_standby_lease.py.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from ntfy_intake.testbed import drill_store, receiver, signal_standin
from ntfy_intake.testbed.emulator import NtfyEmulator

from ... import harness
from ...harness import wait_until
from ...standby import (
    CRASH_BOUND,
    GRACEFUL_BOUND,
    LOCAL_WINDOW,
    Cluster,
    leader_and_standby,
    settle,
    standing_by,
)
from ...standby_nodes import Stream, Subscribers, TaggedReceiver
from ...standby_proxy import Proxy

BACKLOG = 3000

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("engine", ["postgresql"], indirect=True),
]


def test_kill9_of_the_leader_mid_stream_loses_nothing_and_doubles_nothing(
    cluster: Cluster,
) -> None:
    started = time.monotonic()
    alpha, _beta = leader_and_standby(cluster)
    stream = Stream(cluster.emu).start()
    try:
        wait_until(lambda: cluster.recorded() >= 30, 30, "the stream flowing")
        fault = cluster.fault(alpha, "kill -9 of the leader mid-stream", alpha.kill9())
        lease, _ = cluster.failover(fault, 1, CRASH_BOUND)
        assert lease.node == "beta"
        count = cluster.recorded()
        wait_until(lambda: cluster.recorded() >= count + 30, 30, "beta recording")
    finally:
        published = stream.stop()
    settle(cluster, published, alpha)
    print(f"{len(published)} published; {time.monotonic() - started:.1f} s")


def test_kill9_of_the_leader_mid_post_redelivers_that_key_once_under_the_same_key(
    cluster: Cluster,
) -> None:
    alpha, _beta = leader_and_standby(cluster)
    tagged = cluster.tagged
    assert tagged is not None
    stream = Stream(cluster.emu).start()
    try:
        wait_until(lambda: len(tagged.snapshot()) >= 10, 30, "deliveries flowing")
        # The receiver commits the next receipt and holds its answer: the POST stays open.
        tagged.faults.commit_then_stall(4.0)
        held: list[str] = []

        def holding() -> bool:
            now = time.monotonic()
            held[:] = [p.key for p in tagged.in_flight("alpha") if now - p.started > 0.5]
            return bool(held)

        wait_until(holding, 30, "a POST of alpha held open")
        fault = cluster.fault(alpha, "kill -9 of the leader mid-POST", alpha.kill9())
        lease, _ = cluster.failover(fault, 1, CRASH_BOUND)
        assert lease.node == "beta"
        wait_until(
            lambda: any(p.node == "beta" and p.key == held[0] for p in tagged.snapshot()),
            30,
            "beta sending the held key again",
        )
    finally:
        published = stream.stop()
    repeated = settle(cluster, published, alpha)
    assert repeated.get(held[0]) == 2, repeated  # the held one, once more, under its own key


def test_sigstop_of_the_leader_past_the_ttl_then_sigcont_commits_and_sends_nothing_more(
    cluster: Cluster,
) -> None:
    alpha, beta = leader_and_standby(cluster)
    tagged = cluster.tagged
    assert tagged is not None
    stream = Stream(cluster.emu).start()
    try:
        wait_until(lambda: len(tagged.snapshot()) >= 10, 30, "deliveries flowing")
        tagged.faults.commit_then_stall(1.5)  # answered while alpha is stopped
        wait_until(lambda: tagged.in_flight("alpha"), 30, "a POST of alpha in flight")
        stopped = alpha.send(signal.SIGSTOP)
        fault = cluster.fault(alpha, "SIGSTOP of the leader past the TTL", stopped)
        lease, _ = cluster.failover(fault, 1, CRASH_BOUND)
        assert lease.node == "beta"
        count = cluster.recorded()
        wait_until(lambda: cluster.recorded() >= count + 20, 30, "beta recording")
        resumed = alpha.send(signal.SIGCONT)
        wait_until(lambda: alpha.status()["cluster"]["role"] == "standby", 30, "alpha standby")
        wait_until(lambda: standing_by(alpha), 30, "alpha's /healthz standing by")
        count = cluster.recorded()
        wait_until(lambda: cluster.recorded() >= count + 20, 30, "beta still recording")
    finally:
        published = stream.stop()
    settle(cluster, published)
    assert alpha.alive, "the paused leader died instead of standing by"
    # Stopped, it sent nothing: what reached the receiver meanwhile was in flight at SIGSTOP.
    late = [p for p in tagged.snapshot() if p.node == "alpha" and p.started >= resumed]
    assert late == [], f"alpha sent after SIGCONT: {cluster.timeline(late)}"
    paused = [p for p in tagged.snapshot() if p.node == "alpha" and stopped <= p.started]
    print(f"alpha's POSTs that reached the receiver while it was stopped: {len(paused)}")
    assert cluster.lease() is not None
    assert beta.alive
    assert [e["term"] for e in alpha.events("cluster.leading")] == [1]


def test_pg_terminate_backend_of_the_leaders_sessions_loses_and_doubles_nothing(
    cluster: Cluster,
) -> None:
    leader_and_standby(cluster)
    stream = Stream(cluster.emu).start()
    try:
        wait_until(lambda: cluster.recorded() >= 30, 30, "the stream flowing")
        for n in range(3):
            lease, _ = cluster.wait_lease(lambda _: True, 30, "a leader")
            leader = cluster.node_named(lease.node)
            # Without its own ports, terminate() would end every daemon's sessions on the server.
            assert drill_store.tcp_ports(leader.pid), "the leader's sockets cannot be read"
            at = time.monotonic()
            ended = drill_store.terminate(cluster.dsn, leader.pid)
            cluster.fault(leader, f"pg_terminate_backend #{n + 1} of {leader.name}", at)
            count = cluster.recorded()
            wait_until(lambda count=count: cluster.recorded() >= count + 20, 30, "recording")
            after, _ = cluster.wait_lease(lambda _: True, 30, "a leader")
            took = time.monotonic() - at
            print(
                f"\nterminate #{n + 1}: {ended} sessions of {leader.name} (term {lease.term});"
                f" {after.node} leads term {after.term}; recording again within {took:.2f} s"
            )
            if after.term != lease.term:
                cluster.note_term(after.term)
            assert took <= CRASH_BOUND
    finally:
        published = stream.stop()
    settle(cluster, published)
    assert all(node.alive for node in cluster.nodes.values())


def test_immediate_postgresql_restart_both_wait_one_leads_after_nothing_lost(
    tmp_path: Path, emu: NtfyEmulator, tagged: TaggedReceiver, own_server: tuple[str, Path]
) -> None:
    dsn, data_dir = own_server
    cluster = Cluster(tmp_path, dsn, emu, tagged)
    try:
        leader_and_standby(cluster)
        stream = Stream(emu).start()
        try:
            wait_until(lambda: cluster.recorded() >= 30, 30, "the stream flowing")
            before = cluster.lease()
            assert before is not None
            at = time.monotonic()
            problem = drill_store.restart(data_dir)
            assert problem is None, problem
            back = time.monotonic() - at
            leader = cluster.node_named(before.node)
            cluster.fault(leader, "immediate PostgreSQL restart", at, until=at + back)
            count = cluster.recorded()
            wait_until(lambda: cluster.recorded() >= count + 20, 60, "recording again")
            took = time.monotonic() - at
            after, _ = cluster.wait_lease(lambda _: True, 30, "a leader")
            print(
                f"\nPostgreSQL back after {back:.2f} s; {after.node} leads term {after.term}"
                f" (before: {before.node}, term {before.term}); recording again after {took:.2f} s"
            )
            if after.term != before.term:
                cluster.note_term(after.term)
            assert took <= back + CRASH_BOUND
        finally:
            published = stream.stop()
        settle(cluster, published)
        assert all(node.alive for node in cluster.nodes.values()), "a node exited"
        answers = {n.name: n.healthz() for n in cluster.nodes.values()}
        leader = cluster.leader().name
        assert [name for name, a in answers.items() if a and a[1].get("status") == "standby"] == [
            name for name in answers if name != leader
        ], answers
    finally:
        cluster.close()


def test_leader_cut_off_from_postgresql_stops_by_its_deadline_and_stands_by_when_back(
    cluster: Cluster,
) -> None:
    with Proxy.before(cluster.dsn).running() as proxy:
        alpha = cluster.add("alpha", state_database=proxy.dsn(cluster.dsn))
        beta = cluster.add("beta")
        alpha.start()
        assert cluster.leader().name == "alpha"
        cluster.emu.wait_for_subscribers(1, timeout=30)
        beta.start()
        wait_until(lambda: standing_by(beta), 30, "beta standing by")
        tagged = cluster.tagged
        assert tagged is not None
        streams = Subscribers(cluster.emu).start()
        stream = Stream(cluster.emu).start()
        try:
            wait_until(lambda: len(tagged.snapshot()) >= 10, 30, "deliveries flowing")
            proxy.cut()
            # It may act until its local deadline (it cannot tell a cut from a slow renewal):
            # a POST of that time may be repeated too.
            cut = time.monotonic()
            fault = cluster.fault(
                alpha, "the leader cut off from PostgreSQL", cut, cut + LOCAL_WINDOW
            )
            lease, _ = cluster.failover(fault, 1, CRASH_BOUND)
            assert lease.node == "beta"
            count = cluster.recorded()
            wait_until(lambda: cluster.recorded() >= count + 20, 30, "beta recording")
            proxy.restore()
            restored = time.monotonic()
            wait_until(lambda: standing_by(alpha), 60, "alpha standing by once it is back")
            print(f"alpha stands by {time.monotonic() - restored:.2f} s after the link is back")
            count = cluster.recorded()
            wait_until(lambda: cluster.recorded() >= count + 20, 30, "beta still recording")
        finally:
            published = stream.stop()
            streams.stop()
        settle(cluster, published)
        deadline = fault.at + LOCAL_WINDOW
        late = [p for p in tagged.snapshot() if p.node == "alpha" and p.started > deadline]
        assert late == [], f"alpha POSTed after its local deadline: {cluster.timeline(late)}"
        assert alpha.alive
        assert alpha.status()["cluster"]["role"] == "standby"
        # Its stream closed by its local deadline, before the standby could take over (the
        # lease expires a margin later): for a while, no stream at all.
        closed = streams.first(0, fault.at)
        print(f"streams open: {[(round(t - fault.at, 2), n) for t, n in streams.changes]}")
        assert closed is not None, "alpha's stream never closed"
        assert closed - fault.at <= LOCAL_WINDOW + 1.0, "alpha's stream outlived its deadline"


def test_failover_during_a_backlog_replay_the_standby_finishes_it_once(cluster: Cluster) -> None:
    alpha, beta = leader_and_standby(cluster)
    emu = cluster.emu
    first = emu.publish("alerts", "before the backlog", title="warm-up")["id"]
    cluster.wait_recorded([first])
    # The leader's stream goes silent (its watchdog drops it, its reconnects get nothing) while
    # a backlog builds up; back, it replays all of it at once.
    emu.faults.silence()
    topics = ("backups", "alerts")
    backlog = [
        emu.publish(topics[n % 2], f"backlog #{n}", title=f"backlog {n % 5}")["id"]
        for n in range(BACKLOG)
    ]
    emu.faults.silence(on=False)
    before = cluster.recorded()
    wait_until(lambda: cluster.recorded() >= before + BACKLOG // 10, 60, "the replay under way")
    fault = cluster.fault(alpha, "kill -9 of the leader mid-replay", alpha.kill9())
    at_kill = cluster.recorded() - before
    print(f"\n{at_kill} of {BACKLOG} replayed when alpha was killed")
    assert at_kill < BACKLOG, "the replay was over before the kill: the test proves nothing"
    lease, _ = cluster.failover(fault, 1, CRASH_BOUND)
    assert lease.node == beta.name
    settle(cluster, [first, *backlog], alpha)


def test_daily_cap_holds_across_three_failovers(
    tmp_path: Path, emu: NtfyEmulator, tagged: TaggedReceiver
) -> None:
    """The cadence is rebuilt from the journal at every term: the owner gets daily_cap
    triage messages in all, whoever leads and however the last leader ended."""
    assert harness.DATABASE is not None
    with signal_standin.running() as sig:
        owner = {
            "owner_signal_url": sig.url,
            "owner_signal_number": "+31600000000",
            "owner_recipients": "+31600000001",
            "cadence_daily_cap": "2",
        }
        cluster = Cluster(tmp_path, harness.DATABASE, emu, tagged, **owner)
        try:
            leader, standby = leader_and_standby(cluster)
            published: list[str] = []
            for n, how in enumerate(["kill9", "sigterm", "kill9", None]):
                published.append(
                    emu.publish("alerts", f"#{n} on fire", title=f"fire {n}", priority=5)["id"]
                )
                wait_until(
                    lambda n=n: len(receiver.receipts(tagged.db_path)) == n + 1, 30, "triaged"
                )
                wait_until(
                    lambda n=n: owner_settled(cluster, "triage") == n + 1, 30, "the reply, capped"
                )
                if how is None:
                    break
                term = cluster.lease().term  # type: ignore[union-attr]
                waits = None
                if how == "kill9":
                    fault = cluster.fault(leader, f"kill -9 of {leader.name}", leader.kill9())
                    bound = CRASH_BOUND
                else:
                    waits = cluster.cpu_waits()
                    at, code = leader.terminate()
                    assert code == 0
                    fault = cluster.fault(leader, f"SIGTERM of {leader.name}", at)
                    bound = GRACEFUL_BOUND
                lease, _ = cluster.failover(fault, term, bound, waits)
                assert lease.node == standby.name
                leader, standby = standby, leader
                standby.start()
                wait_until(lambda s=standby: standing_by(s), 30, f"{standby.name} standing by")
            settle(cluster, published)
            wait_until(lambda: owner_settled(cluster, "notice") >= 3, 30, "the notices sent")
            triage = [m.message for m in sig.messages() if m.message.startswith("[sev")]
            takeovers = [m.message for m in sig.messages() if m.message.startswith("Failover")]
            print(f"owner got {len(triage)} triage messages, {len(takeovers)} takeover notices")
            assert len(triage) == 2, triage  # daily_cap, across four terms
            assert cluster.rows(
                "SELECT state, count(*) FROM owner_outbox WHERE kind = 'triage'"
                " GROUP BY state ORDER BY state"
            ) == [("sent", 2), ("suppressed", 2)]
            assert len(takeovers) == 3, takeovers  # one per failover
            keys = cluster.rows("SELECT key FROM owner_outbox WHERE key LIKE 'takeover:%'")
            assert sorted(k for (k,) in keys) == ["takeover:2", "takeover:3", "takeover:4"]
        finally:
            cluster.close()


def owner_settled(cluster: Cluster, kind: str) -> int:
    """Owner messages of `kind` settled (sent, suppressed or dead); -1 while one is pending."""
    rows = dict(
        cluster.rows("SELECT state, count(*) FROM owner_outbox WHERE kind = ? GROUP BY state", kind)
    )
    if rows.get("pending") or rows.get("leased"):
        return -1
    return int(sum(rows.values()))
