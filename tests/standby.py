"""Two nodes on one PostgreSQL store, as real `ntfy-intake run` subprocesses (DESIGN.md section 9),
and what the standby tests (tests/integration/test_standby*.py) check of them once a fault has
played out.

`Cluster` holds the nodes (tests/standby_nodes.py), the store's DSN, the faults and the lease as
the server sees it, and makes the checks every test makes: `recorded_once`, `terms_in_order`,
`delivered`, `mirrors_match`, all four through `settle`. The TCP proxy that cuts one node off
from PostgreSQL is tests/standby_proxy.py.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ntfy_intake.rules import lease as lease_rules
from ntfy_intake.store import audit_mirror, db
from ntfy_intake.testbed import receiver
from ntfy_intake.testbed.emulator import NtfyEmulator

from .cpu_waits import CpuWaits
from .harness import env_for, wait_until
from .standby_nodes import TOKEN, Node, Post, TaggedReceiver, free_port

TTL = 3.0
RENEW = 1.0
# A crash costs at most lease_ttl + renew_every plus the reconnect (DESIGN.md section 9); the
# tests allow 5 s on top for this shared 2-core machine. A graceful stop hands over within 2 s.
CRASH_BOUND = TTL + RENEW + 5.0
GRACEFUL_BOUND = 2.0
SETTLE = 60.0  # how long a run may take to settle after its last fault
# The receiver sees a POST a little after the node sent it (loopback, uvicorn's parse, a busy
# box): one that arrives this soon after a fault may have been sent before it.
RECEIVER_LAG = 0.25
# How long a leader may act after its last renewal began (rules/lease.py: ttl - margin).
LOCAL_WINDOW = lease_rules.LocalLease(TTL, RENEW).window


# -- the cluster -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lease:
    node: str
    term: int
    fresh: bool


@dataclass(frozen=True)
class Fault:
    node: str  # the node it struck
    at: float  # monotonic, this process
    what: str
    until: float | None = None  # the end of a fault that lasts (a server restarting)

    @property
    def end(self) -> float:
        return self.at if self.until is None else self.until


class Cluster:
    """The nodes of one store (module doc). Each node is made with `add`; `close` kills them."""

    def __init__(
        self,
        tmp_path: Path,
        dsn: str,
        emu: NtfyEmulator,
        tagged: TaggedReceiver | None = None,
        **settings: str,
    ) -> None:
        self.tmp_path = tmp_path
        self.dsn = dsn
        self.emu = emu
        self.tagged = tagged
        self.settings = {
            "cadence_debounce": "0s",
            "cluster_lease_ttl": f"{TTL:g}s",
            "cluster_renew_every": f"{RENEW:g}s",
            "http_token": TOKEN,
            "state_database": dsn,
            **settings,
        }
        self.nodes: dict[str, Node] = {}
        self.faults: list[Fault] = []
        # (a term, the journal rows of older terms when it was first seen): a takeover waits
        # for the old term's writes in flight, so none may commit after it.
        self.closed: list[tuple[int, int]] = []
        self._conn: db.Connection | None = None

    def add(self, name: str, *, state: str | None = None, **settings: str) -> Node:
        state_dir = self.tmp_path / (state or name) / "state"
        state_dir.parent.mkdir(parents=True, exist_ok=True)
        port = free_port()
        if self.tagged is not None:
            # One receiver, a path per node (to tell who posted): the work's relay is one.
            settings = {
                "relay_url": self.tagged.url_for(name),
                "test_work_relay_url": f"{self.tagged.base}/triage",
                **settings,
            }
        env = env_for(
            self.emu.url,
            state_dir,
            **{
                **self.settings,
                "cluster_node": name,
                "http_listen": f"127.0.0.1:{port}",
                **settings,
            },
        )
        node = Node(name, state_dir, env, port)
        self.nodes[state or name] = node
        return node

    def close(self) -> None:
        for node in self.nodes.values():
            node.stop()
        if self._conn is not None:
            with contextlib.suppress(*db.ERRORS):
                self._conn.close()

    # -- reads of the store --------------------------------------------------------------------

    def rows(self, sql: str, *params: object) -> list[tuple[Any, ...]]:
        if self._conn is None:
            self._conn = db.connect(db.Dsn(self.dsn), readonly=True)
        return [tuple(row) for row in self._conn.execute(sql, params)]

    def try_rows(self, sql: str, *params: object) -> list[tuple[Any, ...]] | None:
        """`rows`, or None while the store cannot answer (a server restarting)."""
        try:
            return self.rows(sql, *params)
        except db.ERRORS:
            if self._conn is not None:  # a fresh session next time
                with contextlib.suppress(*db.ERRORS):
                    self._conn.close()
                self._conn = None
            return None

    def lease(self) -> Lease | None:
        found = self.try_rows("SELECT node, term, expires_at > now() FROM leadership WHERE id = 1")
        if not found:
            return None
        node, term, fresh = found[0]
        return Lease(str(node), int(term), bool(fresh))

    def wait_lease(
        self, pred: Callable[[Lease], bool], timeout: float, what: str
    ) -> tuple[Lease, float]:
        """The first fresh lease that `pred` accepts, and when it was seen (monotonic)."""
        found: list[Lease] = []

        def seen() -> bool:
            lease = self.lease()
            if lease is not None and lease.fresh and pred(lease):
                found.append(lease)
            return bool(found)

        wait_until(seen, timeout, what)
        return found[0], time.monotonic()

    def leader(self, timeout: float = 30.0) -> Node:
        lease, _ = self.wait_lease(lambda _: True, timeout, "a leader")
        return self.node_named(lease.node)

    def node_named(self, name: str) -> Node:
        (node,) = (n for n in self.nodes.values() if n.name == name)
        return node

    def fault(self, node: Node, what: str, at: float, until: float | None = None) -> Fault:
        fault = Fault(node.name, at, what, until)
        self.faults.append(fault)
        return fault

    def failover(
        self, fault: Fault, term: int, bound: float, waits: CpuWaits | None = None
    ) -> tuple[Lease, float]:
        """Wait for a term above `term`; print and check the time it took from the fault, less
        what the nodes' threads waited for a CPU meanwhile when `waits` samples them (a graceful
        handover's bound: tests/cpu_waits.py)."""
        lease, seen = self.wait_lease(lambda s: s.term > term, bound + 5, f"a term above {term}")
        took = seen - fault.at
        waited = waits.stop() if waits is not None else 0.0
        self.note_term(lease.term)
        print(
            f"\n{fault.what}: term {lease.term} on {lease.node!r} after {took:.2f} s"
            f" ({waited:.2f} s of it waiting for a CPU)"
        )
        assert took - waited <= bound, (
            f"{fault.what}: failover took {took:.2f} s ({waited:.2f} s waiting for a CPU),"
            f" bound {bound:g} s"
        )
        return lease, took

    def cpu_waits(self) -> CpuWaits:
        """What every running node's threads wait for a CPU from now (tests/cpu_waits.py)."""
        return CpuWaits(*(n.pid for n in self.nodes.values() if n.alive)).start()

    def note_term(self, term: int) -> None:
        """Remember how many journal rows the terms before `term` wrote, as seen now (after
        `term` began): `terms_in_order` holds them to it."""
        older = self.rows("SELECT count(*) FROM audit_journal WHERE term > 0 AND term < ?", term)
        self.closed.append((term, int(older[0][0])))

    def recorded(self) -> int:
        found = self.try_rows("SELECT count(*) FROM inbox")
        return int(found[0][0]) if found else 0

    def wait_recorded(self, ids: list[str], timeout: float = SETTLE) -> None:
        want = set(ids)

        def done() -> bool:
            found = self.try_rows("SELECT event_id FROM inbox")
            return found is not None and want <= {r[0] for r in found}

        wait_until(done, timeout, f"{len(want)} events recorded")

    # -- the checks ----------------------------------------------------------------------------

    def recorded_once(self, published: list[str]) -> None:
        """Every published id: one inbox row, one journal event line, one event line in each
        node's audit files; nothing else recorded."""
        inbox = Counter(r[0] for r in self.rows("SELECT event_id FROM inbox"))
        journal = Counter(
            json.loads(line)["event_id"]
            for (line,) in self.rows("SELECT line FROM audit_journal ORDER BY seq")
            if json.loads(line).get("kind") == "event"
        )
        views = {"inbox": inbox, "journal": journal}
        views |= {f"{n.name} audit files": Counter(n.event_ids()) for n in self.nodes.values()}
        for view, counts in views.items():
            lost = [i for i in published if counts[i] == 0]
            doubled = {i: c for i, c in counts.items() if c > 1}
            assert lost == [], f"{view}: {len(lost)} lost, e.g. {lost[:5]}"
            assert doubled == {}, f"{view}: recorded more than once: {doubled}"
            assert set(counts) == set(published), f"{view}: ids nobody published"

    def terms_in_order(self) -> list[int]:
        """No journal row of an older term after a newer term's first, nor committed after the
        newer term began (`note_term`); the terms seen."""
        highest, late = 0, []
        for term, seq in self.rows("SELECT term, seq FROM audit_journal ORDER BY seq"):
            if term and term < highest:
                late.append((seq, term, highest))
            highest = max(highest, term)
        assert late == [], f"(seq, term, after term): {late[:10]}"
        for term, older in self.closed:
            now = self.rows("SELECT count(*) FROM audit_journal WHERE term > 0 AND term < ?", term)
            assert int(now[0][0]) == older, f"rows of terms before {term} committed after it began"
        return sorted({int(r[0]) for r in self.rows("SELECT DISTINCT term FROM audit_journal")})

    def delivered(self, tagged: TaggedReceiver) -> dict[str, int]:
        """Every delivery key delivered: the outbox row settled delivered and a receipt for it;
        a key POSTed more than once only where the earlier POST was sent before a fault of the
        node that sent it ended (in flight at the fault, or answered and not yet settled; the
        receiver may see it RECEIVER_LAG late). Returns the repeated keys with their count of
        POSTs."""
        outbox = dict(self.rows("SELECT delivery_key, state FROM outbox"))
        receipts = {r.key: r for r in receiver.receipts(tagged.db_path)}
        assert outbox, "no delivery at all: the test proves nothing about the relay"
        undelivered = {k: s for k, s in outbox.items() if s != "delivered"}
        assert undelivered == {}, f"not delivered: {undelivered}"
        assert set(receipts) == set(outbox), "receipts differ from the outbox's keys"
        posts: dict[str, list[Post]] = {}
        for post in tagged.snapshot():
            posts.setdefault(post.key, []).append(post)
        repeated = {k: v for k, v in posts.items() if len(v) > 1}
        for key, sent in repeated.items():
            for earlier in sorted(sent, key=lambda p: p.started)[:-1]:
                assert any(
                    f.node == earlier.node and earlier.started <= f.end + RECEIVER_LAG
                    for f in self.faults
                ), (
                    f"{key} sent again, though no fault met its POST in flight: {self.timeline(sent)}"
                )
        for key, receipt in receipts.items():
            assert receipt.repeats == len(posts.get(key, [])) - 1, (key, receipt)
        return {k: len(v) for k, v in repeated.items()}

    def timeline(self, posts: list[Post]) -> str:
        """`posts` and the faults, in seconds from the first fault (for a failure's text)."""
        zero = self.faults[0].at if self.faults else 0.0
        shown = [f"fault {f.what!r} at {f.at - zero:+.3f}" for f in self.faults]
        for p in posts:
            ended = "open" if p.ended is None else f"{p.ended - zero:+.3f}"
            shown.append(f"{p.node} POST {p.started - zero:+.3f} -> {ended} ({p.status})")
        return "; ".join(shown)

    def mirrors_match(self, timeout: float = SETTLE) -> None:
        """Each node's audit files hold exactly the journal (store/audit_mirror.compare), once
        every node has caught up (a standby mirrors every renew_every / 2)."""
        conn = db.connect(db.Dsn(self.dsn), readonly=True)
        try:
            for node in self.nodes.values():
                said: list[object] = []

                def matches(node: Node = node, said: list[object] = said) -> bool:
                    said[:] = [audit_mirror.compare(conn, node.state_dir / "audit")]
                    return said[0] is None

                try:
                    wait_until(matches, timeout, f"{node.name}'s audit files to mirror the journal")
                except AssertionError:
                    raise AssertionError(f"{node.name}: {said[0]}") from None
        finally:
            conn.close()


# -- the moves every test makes ----------------------------------------------------------------


def standing_by(node: Node) -> bool:
    answer = node.healthz()
    return answer is not None and answer[1].get("status") == "standby"


def serving_as_leader(node: Node) -> bool:
    """The node's daemon answers on its port. The lease row names a leader before then: the
    standby's HTTP surface closes and the daemon binds the port after it won the term."""
    answer = node.healthz()
    return answer is not None and answer[1].get("role") == "leader"


def leader_and_standby(cluster: Cluster) -> tuple[Node, Node]:
    """alpha started first and leading, beta standing by."""
    alpha, beta = cluster.add("alpha"), cluster.add("beta")
    alpha.start()
    assert cluster.leader().name == "alpha"
    cluster.emu.wait_for_subscribers(1, timeout=30)
    wait_until(lambda: serving_as_leader(alpha), 30, "alpha serving as the leader")
    beta.start()
    wait_until(lambda: standing_by(beta), 30, "beta standing by")
    return alpha, beta


def settle(cluster: Cluster, published: list[str], *restart: Node) -> dict[str, int]:
    """Everything recorded, the stopped nodes back as standbys, then the checks every test
    makes (and one ntfy stream open: the leader's); the repeated delivery keys with their count
    of POSTs."""
    cluster.wait_recorded(published)
    for node in restart:
        node.start()
    for node in restart:
        wait_until(lambda node=node: standing_by(node), 30, f"{node.name} standing by")
    if cluster.tagged is not None:
        wait_until(
            lambda: (
                cluster.rows("SELECT count(*) FROM outbox WHERE state <> 'delivered'") == [(0,)]
            ),
            SETTLE,
            "every delivery settled",
        )
    cluster.mirrors_match()
    wait_until(lambda: cluster.emu.subscriber_count() == 1, 10, "only the leader subscribing")
    cluster.recorded_once(published)
    terms = cluster.terms_in_order()
    repeated = cluster.delivered(cluster.tagged) if cluster.tagged is not None else {}
    print(f"terms in the journal {terms}; repeated keys {repeated}")
    return repeated
