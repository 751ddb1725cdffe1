"""Two nodes on one PostgreSQL store, as real `ntfy-intake run` subprocesses (DESIGN.md section 9),
and what tests/integration/test_standby.py checks of them once a fault has played out.

- `Node`: one process of a node (its own state dir, its own node name, a fixed HTTP port), with
  its stdout (the JSON log) and stderr kept in files; started, signalled and killed by pid;
- `Cluster`: the nodes, the store's DSN, the lease as the server sees it, and the checks every
  test makes (`recorded_once`, `terms_in_order`, `delivered`, `mirrors_match`);
- `TaggedReceiver`: the reference receiver behind a wrapper that knows which node sent each POST
  (every node gets its own path, `/<node>/triage`) and when it started and ended, on the test's
  monotonic clock, so a repeat can be held to the POST that was in flight at a fault.
The TCP proxy that cuts one node off from PostgreSQL is tests/standby_proxy.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

import ntfy_intake
from ntfy_intake.store import audit, audit_mirror, db
from ntfy_intake.surfaces import serve as _serve
from ntfy_intake.testbed import receiver
from ntfy_intake.testbed.emulator import NtfyEmulator

from .harness import env_for, wait_until

TTL = 3.0
RENEW = 1.0
TOKEN = "standby-feed-token"
# A crash costs at most lease_ttl + renew_every plus the reconnect (DESIGN.md section 9); the
# tests allow 5 s on top for this shared 2-core machine. A graceful stop hands over within 2 s.
CRASH_BOUND = TTL + RENEW + 5.0
GRACEFUL_BOUND = 2.0
SETTLE = 60.0  # how long a run may take to settle after its last fault
# The receiver sees a POST a little after the node sent it (loopback, uvicorn's parse, a busy
# box): one that arrives this soon after a fault may have been sent before it.
RECEIVER_LAG = 0.25
# The source of the package under test: the daemons run the same code as the test.
SRC = Path(ntfy_intake.__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- the receiver ----------------------------------------------------------------------------------


@dataclass
class Post:
    node: str
    key: str
    started: float  # monotonic, this process
    ended: float | None = None
    status: int | None = None


class TaggedReceiver:
    """The reference receiver (testbed/receiver.py), each POST recorded with its node (module doc)."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self.faults = receiver.ReceiverFaults()
        self.app = receiver.create_app(db_path, faults=self.faults)
        self.posts: list[Post] = []
        self.base = ""
        self._lock = threading.Lock()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        parts = path.split("/")
        if len(parts) != 3 or parts[2] != "triage":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        post = Post(parts[1], headers.get(b"idempotency-key", b"").decode(), time.monotonic())
        with self._lock:
            self.posts.append(post)

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                post.status = int(message["status"])
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                post.ended = time.monotonic()

        await self.app({**scope, "path": "/triage", "raw_path": b"/triage"}, receive, sending)

    def url_for(self, node: str) -> str:
        return f"{self.base}/{node}/triage"

    def snapshot(self) -> list[Post]:
        with self._lock:
            return list(self.posts)

    def in_flight(self, node: str) -> list[Post]:
        return [p for p in self.snapshot() if p.node == node and p.ended is None]

    @contextlib.contextmanager
    def running(self) -> Iterator[TaggedReceiver]:
        with _serve.serving(self, on_stop=self.app.state.stopping.set) as base:
            self.base = base
            yield self


# -- the publisher ---------------------------------------------------------------------------------


class Stream:
    """Publishes one message every 20-40 ms on alternating topics until stopped; each its own
    incident (so each is one triage request) unless `incidents` cycles through that many."""

    def __init__(self, emu: NtfyEmulator, *, incidents: int | None = None, seed: int = 24) -> None:
        self.emu = emu
        self.incidents = incidents
        self.rng = random.Random(seed)
        self.ids: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stream", daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            title = f"steady {n if self.incidents is None else n % self.incidents}"
            event = self.emu.publish("alerts" if n % 2 else "backups", f"#{n}", title=title)
            with self._lock:
                self.ids.append(event["id"])
            self._stop.wait(self.rng.uniform(0.02, 0.04))

    def start(self) -> Stream:
        self._thread.start()
        return self

    def stop(self) -> list[str]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        return self.snapshot()

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self.ids)


class StreamLeftOpen(AssertionError):
    """A node that stepped down still holds its ntfy stream (only the leader subscribes)."""


class Subscribers:
    """The emulator's count of open streams, sampled every 20 ms from `start` to `stop`: when
    it changed, on the test's monotonic clock."""

    def __init__(self, emu: NtfyEmulator) -> None:
        self.emu = emu
        self.changes: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="subscribers", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            count = self.emu.subscriber_count()
            if not self.changes or self.changes[-1][1] != count:
                self.changes.append((time.monotonic(), count))
            self._stop.wait(0.02)

    def start(self) -> Subscribers:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def first(self, count: int, after: float) -> float | None:
        """When the count was first `count` after `after` (None: never)."""
        return next((t for t, n in self.changes if t >= after and n == count), None)

    def only_the_leader(self) -> None:
        """One stream open now: the leader's (StreamLeftOpen otherwise)."""
        count = self.emu.subscriber_count()
        if count != 1:
            raise StreamLeftOpen(f"{count} ntfy streams open, only the leader's should be")


# -- one node --------------------------------------------------------------------------------------


class Node:
    """One `ntfy-intake run` process of a node (module doc); every start appends to its logs."""

    def __init__(self, name: str, state_dir: Path, env: dict[str, str], port: int) -> None:
        self.name = name
        self.state_dir = state_dir
        self.env = env
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = state_dir.parent / f"{name}.log"
        self.err_path = state_dir.parent / f"{name}.stderr"
        self.starts = 0

    def start(self, **extra_env: str) -> Node:
        assert not self.alive, f"{self.name} runs already"
        env = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
        env.update(self.env)
        env.update(extra_env)
        with self.log_path.open("ab") as out, self.err_path.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ntfy_intake", "run"], env=env, stdout=out, stderr=err
            )
        self.starts += 1
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send(self, sig: signal.Signals) -> float:
        """Send `sig` by pid; the instant it was sent (monotonic)."""
        os.kill(self.pid, sig)
        return time.monotonic()

    def kill9(self) -> float:
        at = self.send(signal.SIGKILL)
        assert self.proc is not None
        self.proc.wait(10)
        return at

    def terminate(self, timeout: float = 30.0) -> tuple[float, int]:
        """SIGTERM, then the exit code (the instant it was sent, the code)."""
        at = self.send(signal.SIGTERM)
        assert self.proc is not None
        return at, self.proc.wait(timeout)

    def stop(self) -> None:
        """Whatever state it is in, gone (by pid): the fixtures' way out."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
                os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The JSON log lines this node wrote (every start), those named `name` when given."""
        found = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and name in (None, record.get("event")):
                    found.append(record)
        return found

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        return httpx.get(
            f"http://127.0.0.1:{self.port}{path}", headers=headers, timeout=5, **kwargs
        )

    def post(self, path: str, body: object) -> httpx.Response:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        url = f"http://127.0.0.1:{self.port}{path}"
        return httpx.post(url, headers=headers, json=body, timeout=5)

    def healthz(self) -> tuple[int, dict[str, Any]] | None:
        """(status, body) of this node's /healthz, None while nothing answers on its port."""
        try:
            response = httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=2)
        except httpx.HTTPError:
            return None
        return response.status_code, response.json()

    def status(self) -> dict[str, Any]:
        """`ntfy-intake status --json` with this node's environment."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
        env["PYTHONPATH"] = str(SRC)
        env.update(self.env)
        done = subprocess.run(
            [sys.executable, "-m", "ntfy_intake", "status", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        report: dict[str, Any] = json.loads(done.stdout)
        return report

    def event_ids(self) -> list[str]:
        records = audit.read_records(self.state_dir / "audit")
        return [r["event_id"] for r in records if r["kind"] == "event"]


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
            settings = {"relay_url": self.tagged.url_for(name), **settings}
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

    def failover(self, fault: Fault, term: int, bound: float) -> tuple[Lease, float]:
        """Wait for a term above `term`; print and check the time it took from the fault."""
        lease, seen = self.wait_lease(lambda s: s.term > term, bound + 5, f"a term above {term}")
        took = seen - fault.at
        self.note_term(lease.term)
        print(f"\n{fault.what}: term {lease.term} on {lease.node!r} after {took:.2f} s")
        assert took <= bound, f"{fault.what}: failover took {took:.2f} s, bound {bound:g} s"
        return lease, took

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
