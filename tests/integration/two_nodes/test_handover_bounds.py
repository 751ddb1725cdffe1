"""Section 9's bounds on two real `ntfy-intake run` nodes (DESIGN.md sections 9 and 11): a
graceful stop hands over in under 2 s in every state (right after an immediate PostgreSQL
restart, under a steady stream, with HTTP clients connected), and a database outage longer
than the lease owes the owner exactly one notice, naming its length. Each test is named after
the failure it kills and makes the checks every standby test makes (tests/standby.py `settle`:
every id recorded once, terms in order, every delivery delivered, the mirrors equal).

Both tests restart or stop a PostgreSQL cluster of their own (scripts/pg-cluster), never the
suite's shared server.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from ntfy_intake.testbed import drill_store, signal_standin
from ntfy_intake.testbed.emulator import NtfyEmulator
from ntfy_intake.testbed.ntfy_route import NtfyRoute

from ...harness import wait_until
from ...standby import (
    GRACEFUL_BOUND,
    Cluster,
    Lease,
    leader_and_standby,
    serving_as_leader,
    settle,
    standing_by,
)
from ...standby_nodes import Node, Stream, TaggedReceiver
from .pair import audit_disk_full, ready, start_pair

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("engine", ["postgresql"], indirect=True),
]

# A token `http.token`'s strength check accepts (settings/token.py), for the HTTP clients here.
TOKEN = "Hq7-handover-bounds-Zx9Lk4mW"
OWNER = {"owner_signal_number": "+31600000000", "owner_recipients": "+31600000001"}
# The outage test's lease: 5 s, so that an immediate restart on this shared box (0.3 to 3.6 s
# measured) stays under it, and an outage of 9 s is well over it.
OUTAGE_TTL = 5.0
OUTAGE = 9.0
OUTAGE_TEXT = "The database did not answer for"  # rules/notices.database_outage


def _pg_ctl(data_dir: Path, *args: str) -> None:
    command = [drill_store.pg_ctl(), "-D", str(data_dir), "-w", "-t", "60", *args]
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        command = ["runuser", "-u", data_dir.owner(), "--", *command]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=90)
    assert done.returncode == 0, done.stderr or done.stdout


def stop_server(data_dir: Path) -> float:
    """An immediate stop (every session dropped, new ones refused); when it was down."""
    _pg_ctl(data_dir, "-m", "immediate", "stop")
    return time.monotonic()


def start_server(data_dir: Path) -> float:
    """Started again with the options it ran with (postmaster.opts); when it answered."""
    argv = shlex.split((data_dir / "postmaster.opts").read_text())
    options = [a for i, a in enumerate(argv[1:], 1) if a != "-D" and argv[i - 1] != "-D"]
    _pg_ctl(data_dir, "-l", str(data_dir.parent / "server.log"), "-o", shlex.join(options), "start")
    return time.monotonic()


class Clients:
    """HTTP clients held on a node while it stops, each on a keep-alive connection, in loops
    until `stop` (errors once the node is gone are expected and ignored): an agent reading and
    acking the busy feed, a long poll on a channel nothing is published to (held open for 30 s
    unless the node ends it), and a logged-in console session reloading its page."""

    def __init__(self, node: Node) -> None:
        self.base = f"http://127.0.0.1:{node.port}"
        self.answers = {"feed": 0, "console": 0}
        self.polling = threading.Event()  # a quiet long poll is open now
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._feed, daemon=True),
            threading.Thread(target=self._quiet_poll, daemon=True),
            threading.Thread(target=self._console, daemon=True),
        ]

    def _quiet_poll(self) -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=self.base, headers=headers, timeout=40) as client:
            while not self._stop.is_set():
                self.polling.set()
                try:
                    client.get("/v1/feed/idle/wait?channel=quiet&timeout=30")
                except httpx.HTTPError:
                    self._stop.wait(0.1)
                finally:
                    self.polling.clear()

    def _feed(self) -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=self.base, headers=headers, timeout=40) as client:
            while not self._stop.is_set():
                try:
                    acked = client.get("/v1/feed/agent?at=start").json()
                    if acked:  # acked: the next wait blocks (a long poll held open)
                        seq = max(e["seq"] for e in acked)
                        client.post("/v1/feed/agent/ack", json={"channel": "triage", "seq": seq})
                    client.get("/v1/feed/agent/wait?timeout=30")
                    self.answers["feed"] += 1
                except (httpx.HTTPError, ValueError, KeyError, TypeError):
                    self._stop.wait(0.1)

    def _console(self) -> None:
        with httpx.Client(base_url=self.base, timeout=10) as client:
            logged_in = False
            while not self._stop.is_set():
                try:
                    if not logged_in:
                        form = client.get("/console/login")
                        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
                        if csrf is None:
                            raise ValueError("no login form")
                        data = {"csrf": csrf.group(1), "token": TOKEN}
                        logged_in = client.post("/console/login", data=data).status_code == 303
                    client.get("/console/")
                    self.answers["console"] += 1
                except (httpx.HTTPError, ValueError):
                    logged_in = False
                self._stop.wait(0.05)

    def start(self) -> Clients:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(45)


@pytest.mark.parametrize("state", ["after_a_restart", "steady", "relay_stalled"])
def test_graceful_stop_right_after_an_immediate_postgresql_restart_under_a_stream_hands_over_within_2s(
    tmp_path: Path,
    emu: NtfyEmulator,
    tagged: TaggedReceiver,
    own_server: tuple[str, Path],
    state: str,
) -> None:
    """Failure mode (issue 32): SIGTERM of the leader 2 s after an immediate PostgreSQL restart,
    under ~15 alerts/s, with an agent's long poll and a console open on it: the standby took
    over 5.3 s later (the drain waited out a whole reorder window before giving the lease up).
    The same without the restart, and with the relay's receiver holding a POST open (the stop
    waited for it, up to relay.timeout + 1 s): the held key is sent again by the new leader,
    under the same key."""
    restart = state == "after_a_restart"
    dsn, data_dir = own_server
    # The shipped reorder window (the tests' 300 ms hid the drain's wait for it) and lease:
    # under the tests' 3 s / 1 s, CI's load once held the restart 1.51 s, so alpha lost its 2 s
    # local window and stepped down, and no leader was left to stop gracefully.
    cluster = Cluster(
        tmp_path,
        dsn,
        emu,
        tagged,
        ntfy_reorder_window="5s",
        http_token=TOKEN,
        cluster_lease_ttl="8s",
        cluster_renew_every="2s",
    )
    try:
        alpha, beta = leader_and_standby(cluster)
        clients = Clients(alpha).start()
        stream = Stream(emu).start()
        try:
            wait_until(lambda: cluster.recorded() >= 30, 30, "the stream flowing")
            wait_until(lambda: all(clients.answers.values()), 30, "the HTTP clients served")
            restarted = back = time.monotonic()
            if restart:
                problem = drill_store.restart(data_dir)
                assert problem is None, problem
                back = time.monotonic()
                cluster.fault(alpha, "immediate PostgreSQL restart", restarted, until=back)
            time.sleep(max(0.0, restarted + 2.0 - time.monotonic()))
            lease, _ = cluster.wait_lease(lambda _: True, 10, "the lease")  # a fresh session
            assert lease.node == "alpha", lease
            if state == "relay_stalled":  # the receiver commits, then holds its answer 4 s
                tagged.faults.commit_then_stall(4.0)
                wait_until(lambda: tagged.in_flight("alpha"), 30, "a POST of alpha held open")
            wait_until(clients.polling.is_set, 10, "a quiet long poll open on alpha")
            assert not alpha.events("cluster.lease_lost"), "alpha no longer leads: the premise"
            waits = cluster.cpu_waits()
            at = alpha.send(signal.SIGTERM)
            fault = cluster.fault(alpha, f"SIGTERM of the leader ({state})", at)
            taken, seen = cluster.wait_lease(lambda s: s.term > lease.term, 30, "a new term")
            waited = waits.stop()
            assert alpha.proc is not None
            code = alpha.proc.wait(30)
            exited = time.monotonic()
            print(
                f"\nPostgreSQL back {back - restarted:.2f} s after the restart; SIGTERM at"
                f" +{at - restarted:.2f} s; {taken.node} took term {taken.term}"
                f" {seen - at:.2f} s after it ({waited:.2f} s waiting for a CPU); alpha exited"
                f" {code} after {exited - at:.2f} s"
            )
            assert taken.node == beta.name
            assert code == 0
            # Its POSTs until it exited may repeat at the next leader, under their own keys.
            cluster.fault(alpha, "the leader's stop", at, until=exited)
            cluster.note_term(taken.term)
            count = cluster.recorded()
            wait_until(lambda: cluster.recorded() >= count + 20, 30, "beta recording")
            handover = seen - fault.at
        finally:
            published = stream.stop()
            clients.stop()
        assert handover - waited < GRACEFUL_BOUND, (
            f"the graceful stop handed over in {handover:.2f} s, {waited:.2f} s of it the"
            " nodes waiting for a CPU (tests/cpu_waits.py)"
        )
        settle(cluster, published, alpha)
    finally:
        cluster.close()


def outage_notices(cluster: Cluster) -> list[str]:
    return [
        str(text)
        for (text,) in cluster.rows(
            "SELECT text FROM owner_outbox WHERE key LIKE 'database_outage:%' ORDER BY created_at"
        )
    ]


def test_database_outage_longer_than_the_lease_tells_the_owner_once_naming_its_length(
    tmp_path: Path, emu: NtfyEmulator, tagged: TaggedReceiver, own_server: tuple[str, Path]
) -> None:
    """Failure mode (issue 32): PostgreSQL down for longer than the lease, both nodes waiting
    it out, nothing lost, and the owner never told (docs/postgresql.md promised one notice per
    episode). Now: one notice, from whichever node leads once it is back, naming how long it
    lasted; a second outage shorter than the lease tells nothing."""
    dsn, data_dir = own_server
    with signal_standin.running() as sig:
        lease = {"cluster_lease_ttl": f"{OUTAGE_TTL:g}s", "cluster_renew_every": "1s"}
        cluster = Cluster(
            tmp_path, dsn, emu, tagged, owner_signal_url=sig.url, http_token=TOKEN, **OWNER, **lease
        )
        try:
            alpha, beta = leader_and_standby(cluster)
            stream = Stream(emu).start()
            try:
                wait_until(lambda: cluster.recorded() >= 30, 30, "the stream flowing")
                before, _ = cluster.wait_lease(lambda _: True, 10, "the lease")
                down = stop_server(data_dir)
                time.sleep(OUTAGE)
                up = start_server(data_dir)
                for node in (alpha, beta):
                    cluster.fault(node, "PostgreSQL stopped past the lease", down, until=up)
                after, _ = cluster.wait_lease(lambda s: s.term > before.term, 60, "a new term")
                cluster.note_term(after.term)
                count = cluster.recorded()
                wait_until(lambda: cluster.recorded() >= count + 20, 60, "recording again")
                wait_until(lambda: outage_notices(cluster), 30, "the outage's owner notice")
                told = outage_notices(cluster)
                print(f"\noutage of {up - down:.1f} s; {after.node} leads; told {told}")
                assert len(told) == 1, told
                length = re.search(r"for (\d+) s", told[0])
                assert length is not None, told[0]
                assert OUTAGE_TTL < int(length.group(1)) <= up - down + 3, told[0]
                wait_until(
                    lambda: any(OUTAGE_TEXT in m.message for m in sig.messages()),
                    30,
                    "the notice sent to the owner",
                )
                # A failover after it: the next leader owes the same episode, recorded once.
                leader = cluster.node_named(after.node)
                other = beta if leader is alpha else alpha
                at, code = leader.terminate()
                assert code == 0
                cluster.fault(leader, f"SIGTERM of {leader.name}", at)
                handed, _ = cluster.wait_lease(lambda s: s.term > after.term, 30, "a new term")
                assert handed.node == other.name
                cluster.note_term(handed.term)
                leader.start()
                wait_until(lambda: standing_by(leader), 30, f"{leader.name} standing by")
                # A short outage, under the lease (an immediate restart): nothing for the owner.
                down = time.monotonic()
                problem = drill_store.restart(data_dir)
                assert problem is None, problem
                up = time.monotonic()
                assert up - down < OUTAGE_TTL - 1, f"the restart took {up - down:.1f} s: no blip"
                cluster.fault(other, "immediate PostgreSQL restart", down, until=up)
                count = cluster.recorded()
                wait_until(lambda: cluster.recorded() >= count + 20, 60, "recording again")
                time.sleep(2 * OUTAGE_TTL)
            finally:
                published = stream.stop()
            settle(cluster, published)
            told = outage_notices(cluster)
            assert len(told) == 1, told
            sent = [m.message for m in sig.messages() if OUTAGE_TEXT in m.message]
            assert len(sent) == 1, sent
        finally:
            cluster.close()


def test_sigterm_while_postgresql_is_down_exits_by_the_lease_deadline_and_loses_nothing(
    tmp_path: Path, emu: NtfyEmulator, tagged: TaggedReceiver, own_server: tuple[str, Path]
) -> None:
    """Failure mode: a graceful stop while the database does not answer drains into nothing for
    as long as the outage lasts (systemd kills it at TimeoutStopSec): once its term is over
    (the local deadline), nothing it still holds may be written anyway; the next leader's
    overlap backfill reads it again."""
    dsn, data_dir = own_server
    cluster = Cluster(tmp_path, dsn, emu, tagged, http_token=TOKEN)
    try:
        alpha, beta = leader_and_standby(cluster)
        stream = Stream(emu).start()
        try:
            wait_until(lambda: cluster.recorded() >= 30, 30, "the stream flowing")
            down = stop_server(data_dir)
            at = alpha.send(signal.SIGTERM)
            assert alpha.proc is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                alpha.proc.wait(OUTAGE)
            exited = time.monotonic()
            up = start_server(data_dir)
            for node in (alpha, beta):
                cluster.fault(node, "SIGTERM while PostgreSQL is down", down, until=up)
            print(
                f"\nalpha exited {alpha.proc.poll()} after {exited - at:.2f} s (outage {OUTAGE} s)"
            )
            assert not alpha.alive, f"alpha still draining {OUTAGE} s into the outage"
            cluster.wait_lease(lambda s: s.node == beta.name, 60, "beta leading")
            count = cluster.recorded()
            wait_until(lambda: cluster.recorded() >= count + 20, 60, "beta recording")
        finally:
            published = stream.stop()
        settle(cluster, published, alpha)
    finally:
        cluster.close()


# -- a graceful stop whatever state the standby is in ---------------------------------------------------


def _said_at(node: Node, event: str) -> float | None:
    """The wall-clock instant (epoch seconds) of `node`'s first `event` log line, None before."""
    for record in node.events(event):
        stamp = record.get("timestamp")
        if isinstance(stamp, str):
            return datetime.fromisoformat(stamp).timestamp()
    return None


def _timeline(node: Node, zero: float) -> str:
    """`node`'s log, event by event, in seconds from `zero` (wall clock): the failure's text."""
    shown = []
    for record in node.events():
        stamp, event = record.get("timestamp"), str(record.get("event"))
        if isinstance(stamp, str) and not event.startswith(("relay.", "intake.")):
            at = datetime.fromisoformat(stamp).timestamp() - zero
            shown.append(f"{at:+.2f} {event}")
    return "; ".join(shown[-40:])


@pytest.mark.parametrize("after", [0.0, 0.1, 0.2, 0.3, 1.0, "spawn+1"])
def test_graceful_stop_just_after_the_standby_started_at_the_default_timing_hands_over_within_2s(
    cluster: Cluster, after: float | str
) -> None:
    """Failure mode (the defaults run, docs/standby.md): SIGTERM of the leader a moment after
    the standby started (it said `standby.status`, as `drill --standby` waits for) handed over
    in 2.94 s: lease 8 s / renew 2 s, probe_every 10 s, as shipped. Timed here: the standby
    read the lease, its loop was held by its HTTP surface's imports, its LISTEN came after the
    release's NOTIFY, and it took over at its next poll: on the old code, SIGTERM 0.0, 0.1 and
    0.3 s after `standby.status` handed over in 2.19 to 2.79 s (0.2 s once: 0.21 s), and 1 s
    after it or 1 s after the spawn in 0.17 to 0.24 s (its LISTEN set in time on this box, or
    the lease already free at its first read). The offsets span that window."""
    cluster.settings.update(cluster_lease_ttl="8s", cluster_renew_every="2s")
    alpha, beta = cluster.add("alpha"), cluster.add("beta")
    alpha.start()
    assert cluster.leader().name == "alpha"
    cluster.emu.wait_for_subscribers(1, timeout=30)
    wait_until(lambda: serving_as_leader(alpha), 30, "alpha serving as the leader")
    stream = Stream(cluster.emu).start()
    try:
        wait_until(lambda: cluster.recorded() >= 30, 30, "the stream flowing")
        lease, _ = cluster.wait_lease(lambda _: True, 10, "the lease")
        spawned = time.time()
        beta.start()
        if isinstance(after, str):  # 1 s after the process was spawned: still starting
            said: float | None = spawned
            after = 1.0
        else:
            wait_until(lambda: _said_at(beta, "standby.status"), 60, "beta standing by")
            said = _said_at(beta, "standby.status")
        assert said is not None
        time.sleep(max(0.0, said + after - time.time()))
        _sigterm_hands_over_to_beta(
            cluster, alpha, beta, lease.term, f"{after:g} s after beta started"
        )
    finally:
        published = stream.stop()
    settle(cluster, published, alpha)


def _sigterm_hands_over_to_beta(
    cluster: Cluster, alpha: Node, beta: Node, term: int, when: str
) -> None:
    """SIGTERM of the leader alpha: beta takes the next term within GRACEFUL_BOUND of the
    signal, or of its own first `readiness.ready` when it was still starting then (a process
    that is not up yet cannot take anything over: CI's load once held beta's start-up 1.96 s
    past the SIGTERM, and it led 0.08 s after it was ready), less the nodes' waits for a CPU
    (tests/cpu_waits.py), alpha exits 0, and beta records."""
    wall = time.time()
    waits = cluster.cpu_waits()
    at = alpha.send(signal.SIGTERM)
    fault = cluster.fault(alpha, f"SIGTERM of alpha {when}", at)
    taken, seen = cluster.wait_lease(lambda s: s.term > term, 30, "a new term")
    waited = waits.stop()
    assert alpha.proc is not None
    code = alpha.proc.wait(30)
    cluster.fault(alpha, "the leader's stop", at, until=time.monotonic())
    cluster.note_term(taken.term)
    handover = seen - fault.at
    ready = _said_at(beta, "readiness.ready")
    starting = max(0.0, ready - wall) if ready is not None else 0.0
    print(f"\n{taken.node} took term {taken.term} {handover:.2f} s after the SIGTERM")
    assert taken.node == "beta" and code == 0
    # The larger of the two allowances, never both: a start-up under load is CPU waits too.
    allowed = max(starting, waited)
    assert handover - allowed < GRACEFUL_BOUND, (
        f"handed over in {handover:.2f} s, {starting:.2f} s of it beta's start-up, "
        f"{waited:.2f} s the nodes waiting for a CPU; beta: {_timeline(beta, wall)}"
    )
    count = cluster.recorded()
    wait_until(lambda: cluster.recorded() >= count + 20, 30, "beta recording")


def _into_the_cooloff(cluster: Cluster, routes: dict[str, NtfyRoute], beta: Node) -> Lease:
    """beta's route cut: it yields to alpha; its route back, its row ready again, in its
    cool-off (the shipped 5 min); alpha recording. alpha's lease."""
    lease, _ = cluster.wait_lease(lambda _: True, 10, "the lease")
    routes["beta"].cut()
    cut = cluster.fault(beta, "beta's route to ntfy cut", time.monotonic())
    yielded, _ = cluster.failover(cut, lease.term, 4.0 + 3.0 + 1.0 + 5.0)
    assert yielded.node == "alpha"
    routes["beta"].restore()
    cluster.fault(beta, "beta's route back", cut.at, until=time.monotonic())
    wait_until(lambda: ready(cluster, "beta"), 30, "beta's row ready again")
    count = cluster.recorded()
    wait_until(lambda: cluster.recorded() >= count + 20, 30, "alpha recording")
    assert beta.events("cluster.yielded"), "beta did not yield"
    return yielded


def test_graceful_stop_while_the_standby_is_in_its_yield_cooloff_hands_over_within_2s(
    cluster: Cluster, routes: dict[str, NtfyRoute]
) -> None:
    """Failure mode (the defaults run, docs/standby.md): beta yielded to alpha (its route to
    ntfy cut), its route came back, and alpha stopped gracefully within beta's cool-off: beta
    took the lease 10.1 and 10.4 s later, once it had been free for lease_ttl + renew_every,
    because alpha's own row still read "ready" for up to two probes. Lease 3 s / renew 1 s,
    probe_every 1 s, yield_after 4 s, the shipped 5 min cool-off."""
    beta, alpha, _ = start_pair(cluster, routes, leader="beta")
    stream = Stream(cluster.emu).start()
    try:
        wait_until(lambda: cluster.recorded() >= 30, 30, "the stream flowing")
        yielded = _into_the_cooloff(cluster, routes, beta)
        _sigterm_hands_over_to_beta(cluster, alpha, beta, yielded.term, "within beta's cool-off")
    finally:
        published = stream.stop()
    settle(cluster, published, alpha)


def test_a_yield_back_to_a_node_in_its_cooloff_hands_over_within_2s_of_the_release(
    cluster: Cluster, routes: dict[str, NtfyRoute]
) -> None:
    """Failure mode (the defaults run, "two faults within one cool-off"): nas yielded to pi, then
    pi's audit directory filled and pi yielded back; nas, in its cool-off "while pi is ready"
    (pi, latched and just yielded, still reported ready), did not campaign, and after
    lease_ttl + renew_every pi took its own lease back, latched. Now the yielder's row says it
    yielded before it releases: beta (in its cool-off) takes the lease at the NOTIFY."""
    if not Path("/dev/full").exists():
        pytest.skip("/dev/full is not available")
    beta, alpha, _ = start_pair(cluster, routes, leader="beta")
    stream = Stream(cluster.emu).start()
    try:
        wait_until(lambda: cluster.recorded() >= 30, 30, "the stream flowing")
        yielded = _into_the_cooloff(cluster, routes, beta)
        wall = time.time()
        with audit_disk_full(alpha):
            fault = cluster.fault(alpha, "alpha's audit disk full", time.monotonic())
            taken, _ = cluster.wait_lease(lambda s: s.term > yielded.term, 30, "a new term")
            seen = time.time()
            cluster.fault(alpha, "alpha's drain", fault.at, until=time.monotonic())
            cluster.note_term(taken.term)
            # Its log line comes after the release's NOTIFY: beta may be quicker than it.
            wait_until(lambda: _said_at(alpha, "cluster.released"), 10, "alpha's release")
            released = _said_at(alpha, "cluster.released")
            assert released is not None
            handover = seen - released
            print(f"\n{taken.node} took term {taken.term} {handover:.2f} s after the release")
            assert alpha.events("audit.latched"), "the fault did not latch alpha"
            assert taken.node == "beta", f"{taken.node} took it; beta: {_timeline(beta, wall)}"
            assert handover < GRACEFUL_BOUND, (
                f"handed over in {handover:.2f} s; beta: {_timeline(beta, wall)}"
            )
            count = cluster.recorded()
            wait_until(lambda: cluster.recorded() >= count + 20, 30, "beta recording")
    finally:
        published = stream.stop()
    settle(cluster, published)
    assert alpha.alive, alpha.stderr()
