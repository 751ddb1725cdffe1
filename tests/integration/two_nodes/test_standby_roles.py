"""Two nodes on one PostgreSQL store (DESIGN.md section 9), as real `ntfy-intake run`
subprocesses: who leads, who stands by, and what a standby serves. Each test is named after the
failure it kills and makes the checks tests/integration/test_standby.py makes (`settle`: every
id recorded once, terms in order, every delivery delivered, every node's audit files equal to
the journal), with its failover time printed and bounded (a graceful stop: under 2 s).
"""

from __future__ import annotations

import contextlib
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ntfy_intake.store import db
from ntfy_intake.testbed import signal_standin
from ntfy_intake.testbed.emulator import NtfyEmulator

from ... import harness
from ...harness import wait_until
from ...standby import (
    CRASH_BOUND,
    GRACEFUL_BOUND,
    RENEW,
    Cluster,
    leader_and_standby,
    serving_as_leader,
    settle,
    standing_by,
)
from ...standby_nodes import TOKEN, Node, Stream, TaggedReceiver

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("engine", ["postgresql"], indirect=True),
]

OWNER = {
    "owner_signal_number": "+31600000000",
    "owner_recipients": "+31600000001",
}


def flow(cluster: Cluster, events: int = 30) -> list[str]:
    """A steady stream until `events` more are recorded; the ids published."""
    stream = Stream(cluster.emu).start()
    try:
        count = cluster.recorded()
        wait_until(lambda: cluster.recorded() >= count + events, 30, "the stream recorded")
    finally:
        published = stream.stop()
    return published


def feed_answers(node: Node) -> bool:
    """Whether `node`'s HTTP surface serves the feed (it moves when a standby starts leading)."""
    try:
        return node.get("/v1/feed/agent").status_code == 200
    except httpx.HTTPError:
        return False


def test_two_nodes_starting_at_the_same_instant_make_one_leader_and_one_standby(
    cluster: Cluster,
) -> None:
    alpha, beta = cluster.add("alpha"), cluster.add("beta")
    alpha.start()
    beta.start()
    leader = cluster.leader()
    other = beta if leader is alpha else alpha
    wait_until(lambda: standing_by(other), 30, f"{other.name} standing by")
    cluster.emu.wait_for_subscribers(1, timeout=30)
    published = flow(cluster)
    settle(cluster, published)
    leading = [(n.name, e["term"]) for n in (alpha, beta) for e in n.events("cluster.leading")]
    print(f"\n{leader.name} leads; terms won: {leading}")
    assert leading == [(leader.name, 1)], "more than one term, or more than one leader"
    assert cluster.emu.subscriber_count() == 1, "only the leader subscribes"
    assert other.status()["cluster"]["role"] == "standby"
    assert leader.status()["cluster"]["role"] == "leader"


def test_a_second_process_with_a_live_nodes_name_exits_2_with_one_line(cluster: Cluster) -> None:
    alpha = cluster.add("alpha").start()
    assert cluster.leader().name == "alpha"
    cluster.emu.wait_for_subscribers(1, timeout=30)
    twin = cluster.add("alpha", state="alpha-twin").start()  # the same name, its own state dir
    started = time.monotonic()
    assert twin.proc is not None
    code = twin.proc.wait(30)
    took = time.monotonic() - started
    stderr = twin.stderr()
    print(f"\nthe twin exited {code} after {took:.2f} s: {stderr.strip()}")
    assert code == 2
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert "Traceback" not in stderr
    assert "'alpha' is in use" in stderr
    del cluster.nodes["alpha-twin"]  # never a node of the cluster
    published = flow(cluster)
    settle(cluster, published)
    assert alpha.alive
    assert [e["term"] for e in alpha.events("cluster.leading")] == [1]
    assert cluster.lease() is not None and cluster.lease().term == 1  # type: ignore[union-attr]


def test_graceful_stop_hands_over_within_2s_with_one_takeover_notice_naming_both_nodes(
    tmp_path: Path, emu: NtfyEmulator, tagged: TaggedReceiver
) -> None:
    assert harness.DATABASE is not None
    with signal_standin.running() as sig:
        cluster = Cluster(
            tmp_path, harness.DATABASE, emu, tagged, owner_signal_url=sig.url, **OWNER
        )
        try:
            alpha, _beta = leader_and_standby(cluster)
            stream = Stream(emu).start()
            try:
                wait_until(lambda: cluster.recorded() >= 30, 30, "the stream flowing")
                waits = cluster.cpu_waits()
                fault = cluster.fault(alpha, "SIGTERM of the leader", alpha.send(signal.SIGTERM))
                lease, _ = cluster.failover(fault, 1, GRACEFUL_BOUND, waits)
                assert lease.node == "beta"
                assert alpha.proc is not None and alpha.proc.wait(30) == 0
                count = cluster.recorded()
                wait_until(lambda: cluster.recorded() >= count + 20, 30, "beta recording")
            finally:
                published = stream.stop()
            repeated = settle(cluster, published, alpha)
            assert repeated == {}, "a graceful stop drains: nothing to send twice"
            rows = cluster.rows("SELECT key, text FROM owner_outbox WHERE key LIKE 'takeover:%'")
            assert [key for key, _ in rows] == ["takeover:2"]
            assert "'beta'" in rows[0][1] and "'alpha'" in rows[0][1], rows[0][1]
            wait_until(
                lambda: [m for m in sig.messages() if m.message.startswith("Failover")],
                30,
                "the takeover notice at Signal",
            )
            time.sleep(RENEW)  # a second one would be on its way by now
            sent = [m.message for m in sig.messages() if m.message.startswith("Failover")]
            assert sent == [rows[0][1]], sent
        finally:
            cluster.close()


def test_a_standby_is_healthy_while_a_leader_is_fresh_and_unhealthy_when_none_leads(
    cluster: Cluster,
) -> None:
    alpha, beta = leader_and_standby(cluster)
    answer = beta.healthz()
    assert answer is not None
    assert answer[0] == 200 and answer[1]["status"] == "standby" and answer[1]["leader"] == "alpha"
    assert beta.command("check").returncode == 0
    published = flow(cluster, 10)
    # No node may lead: alpha dead, beta paused until the lease has expired, then kept from
    # the row by a lock taken after the expiry (not the old term's: a takeover waits for it).
    beta.send(signal.SIGSTOP)
    fault = cluster.fault(alpha, "kill -9 of the leader", alpha.kill9())
    wait_until(lambda: cluster.lease() is not None and not cluster.lease().fresh, 30, "expiry")  # type: ignore[union-attr]
    blocker = db.connect(db.Dsn(cluster.dsn))
    try:
        blocker.execute("BEGIN")
        blocker.execute("SELECT term FROM leadership WHERE id = 1 FOR UPDATE")
        beta.send(signal.SIGCONT)
        wait_until(lambda: (beta.healthz() or (0, {}))[0] == 503, 30, "beta's 503")
        answer = beta.healthz()
        assert answer is not None and answer[1]["status"] == "no_leader", answer
        assert answer[1]["leader"] is None
        checked = beta.command("check")
        assert checked.returncode == 1, checked.stdout
        assert "no node leads" in checked.stdout
        held = time.monotonic()
        blocker.execute("ROLLBACK")
    finally:
        blocker.close()
    print(f"\nno node led for {held - fault.at:.2f} s after the kill (the row held)")
    lease, _ = cluster.failover(fault, 1, CRASH_BOUND + 30)
    assert lease.node == "beta"
    settle(cluster, published, alpha)
    answer = alpha.healthz()
    assert answer is not None and answer[0] == 200, answer
    assert (answer[1]["status"], answer[1]["leader"]) == ("standby", "beta")


def test_feed_reads_and_acks_work_on_the_standby_and_the_leader_sees_them(
    tmp_path: Path, emu: NtfyEmulator
) -> None:
    assert harness.DATABASE is not None
    cluster = Cluster(tmp_path, harness.DATABASE, emu)  # no relay: agents pull the feed
    try:
        alpha, beta = leader_and_standby(cluster)
        published = [emu.publish("alerts", f"feed #{n}", title=f"feed {n}")["id"] for n in range(5)]
        cluster.wait_recorded(published)
        wait_until(
            lambda: cluster.rows("SELECT count(*) FROM feed_entries") == [(5,)], 30, "the feed"
        )
        entries = beta.get("/v1/feed/agent?at=start")
        assert entries.status_code == 200, entries.text
        seqs = [e["seq"] for e in entries.json()]
        keys = {e["delivery_key"] for e in entries.json()}
        assert len(seqs) == 5
        assert keys == {r[0] for r in cluster.rows("SELECT delivery_key FROM inbox")}
        assert beta.get("/v1/feed/agent/wait?timeout=0").status_code == 200  # unacked: rings
        acked = beta.post("/v1/feed/agent/ack", {"channel": "triage", "seq": seqs[2]})
        assert acked.status_code == 200, acked.text
        assert acked.json()["cursor"] == seqs[2]
        assert [e["seq"] for e in beta.get("/v1/feed/agent").json()] == seqs[3:]
        assert [e["seq"] for e in alpha.get("/v1/feed/agent").json()] == seqs[3:]
        cursor = cluster.rows("SELECT acked_seq FROM feed_cursors WHERE handle = 'agent'")
        assert cursor == [(seqs[2],)]
        notify = beta.post("/v1/notify", {"text": "hello"}, **{"Idempotency-Key": "n1"})
        assert notify.status_code == 503 and "alpha" in notify.text, notify.text
        # The leader gone, the acks made on the standby hold where it leads now.
        fault = cluster.fault(alpha, "kill -9 of the leader", alpha.kill9())
        cluster.failover(fault, 1, CRASH_BOUND)
        wait_until(lambda: feed_answers(beta), 30, "beta's feed, as the leader")
        assert [e["seq"] for e in beta.get("/v1/feed/agent").json()] == seqs[3:]
        settle(cluster, published, alpha)
    finally:
        cluster.close()


@contextlib.contextmanager
def console_of(node: Node) -> Iterator[httpx.Client]:
    """A logged-in console session on `node`'s own HTTP port."""
    client = httpx.Client(base_url=f"http://127.0.0.1:{node.port}", timeout=5)
    try:
        yield _logged_in(client)
    finally:
        client.close()


def _logged_in(client: httpx.Client) -> httpx.Client:
    form = client.get("/console/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert csrf is not None, form.text
    answer = client.post("/console/login", data={"csrf": csrf.group(1), "token": TOKEN})
    assert answer.status_code == 303, answer.text
    return client


def test_a_standbys_console_names_the_leader_and_never_acts_itself(
    tmp_path: Path, emu: NtfyEmulator
) -> None:
    """Failure mode: a standby's console takes an action (a silence) the leader's cadence never
    hears of, or calls itself the leader."""
    assert harness.DATABASE is not None
    cluster = Cluster(tmp_path, harness.DATABASE, emu)
    try:
        alpha = cluster.add("alpha", cluster_url="http://alpha.lan:8080")
        beta = cluster.add("beta")
        alpha.start()
        assert cluster.leader().name == "alpha"
        wait_until(lambda: serving_as_leader(alpha), 30, "alpha serving as the leader")
        beta.start()
        wait_until(lambda: standing_by(beta), 30, "beta standing by")
        with console_of(beta) as console:
            page = console.get("/console/").text
            assert "This node is a standby" in page
            assert "http://alpha.lan:8080/console" in page  # actions link to the leader's pages
            assert 'href="http://alpha.lan:8080/console/"' in page
            assert 'action="http://alpha.lan' not in page  # never a form posted to the leader
            assert "leader (one box)" not in page
            csrf = re.search(r'name="csrf" value="([^"]+)"', page)
            assert csrf is not None
            posted = console.post(
                "/console/silences",
                data={"csrf": csrf.group(1), "scope": "topic", "target": "alerts", "for": "1h"},
            )
            assert posted.status_code == 409, posted.text
            assert "stands by" in posted.text
        silenced = 'SELECT count(*) FROM audit_journal WHERE line LIKE \'%"kind":"silence"%\''
        assert cluster.rows(silenced) == [(0,)]
        with console_of(alpha) as console:
            page = console.get("/console/").text
            assert "This node is a standby" not in page
    finally:
        cluster.close()
