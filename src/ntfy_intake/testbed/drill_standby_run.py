"""`drill --standby`'s run: the drill that starts both nodes, works through the rounds and ends
the run, as drill_standby.py's module doc describes (that module is the command: its arguments
and the temp dir, schema, emulator and receiver a run needs). The plan, the nodes and what the
drill reads of the cluster are drill_standby_parts.py, the faults of the work
drill_standby_work.py, the verdict drill_standby_report.py."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from ntfy_intake.store import audit_mirror, db
from ntfy_intake.testbed import drill_parts, drill_store, receiver
from ntfy_intake.testbed.drill_standby_parts import (
    PROCESS_FAULTS,
    WORK_FAULTS,
    Cluster,
    Fault,
    Journal,
    Lease,
    Node,
    Round,
    build_plan,
)
from ntfy_intake.testbed.drill_standby_report import StandbyTally, render
from ntfy_intake.testbed.drill_standby_work import PROBE_EVERY_S, YIELD_AFTER_S, WorkFaults
from ntfy_intake.testbed.emulator import NtfyEmulator

NODES = ("pi", "nas")
LEASE_TTL_S = 3.0
RENEW_EVERY_S = 1.0
READY_BOUND_S = 30.0  # a node started again must stand by (or lead) by then
STEP_DOWN_BOUND_S = 10.0  # after SIGCONT, the old leader must have stood by by then
GIVE_UP_AFTER_S = 10.0  # past the crash bound, a round stops waiting for a leader (a stall)
MIRROR_BOUND_S = 30.0  # after the catch-up, both nodes' files must equal the journal by then
POLL_S = 0.01


class StandbyDrill:
    def __init__(
        self,
        *,
        rounds: int,
        seed: int,
        lease_ttl: float,
        renew_every: float,
        database: str,
        pg_data: Path | None,
        kinds: Sequence[str],
        workdir: Path,
        emu: NtfyEmulator,
        receiver_server: drill_parts.ReceiverServer,
        progress: TextIO | None,
        yield_after: float = YIELD_AFTER_S,
        probe_every: float = PROBE_EVERY_S,
        yield_cooloff: float | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        self.plan = build_plan(rounds, self.rng, pg_restart=pg_data is not None, kinds=kinds)
        self.database = database
        self.pg_data = pg_data
        self.emu = emu
        self.receiver = receiver_server
        self.progress = progress
        self.ttl = lease_ttl
        self.renew_every = renew_every
        self.store = drill_store.StoreView(db.Dsn(database))
        self.cluster = Cluster(self.store)
        self.journal = Journal(self.store)
        self.ledger = drill_parts.Ledger()
        self.publisher = drill_parts.Publisher(
            drill_parts.emulator_sender(emu),
            drill_parts.EMULATOR_TOPICS,
            random.Random(seed + 1),
            self.ledger,
            drill_parts.EMULATOR_PACE,
        )
        self.work = WorkFaults(
            emu.url,
            NODES,
            workdir,
            audit_full="audit_full" in self.plan,
            yield_after=yield_after,
            probe_every=probe_every,
            yield_cooloff=yield_cooloff,
        )
        env = self._env()
        self.nodes = {
            name: Node(
                name, {**env, "NTFY_INTAKE_CLUSTER_NODE": name, **self.work.env(name)}, workdir
            )
            for name in NODES
        }
        self.tally = StandbyTally(
            seed=seed,
            rounds_requested=rounds,
            lease_ttl=lease_ttl,
            renew_every=renew_every,
            target=f"bundled emulator {emu.url} (topics {','.join(drill_parts.EMULATOR_TOPICS)})",
            state_dirs=[n.state_dir for n in self.nodes.values()],
            pg_restart=pg_data is not None,
            yield_after=yield_after,
            probe_every=probe_every,
            work_how={k: self.work.describe(k) for k in WORK_FAULTS if k in self.plan},
        )

    def _env(self) -> dict[str, str]:
        return {
            "NTFY_INTAKE_NTFY_URL": self.emu.url,
            "NTFY_INTAKE_NTFY_TOPICS": ",".join(drill_parts.EMULATOR_TOPICS),
            "NTFY_INTAKE_NTFY_REORDER_WINDOW": drill_parts.REORDER_WINDOW,
            "NTFY_INTAKE_NTFY_KEEPALIVE_INTERVAL": f"{drill_parts.KEEPALIVE_INTERVAL:g}s",
            "NTFY_INTAKE_NTFY_KEEPALIVE_TIMEOUT": f"{int(drill_parts.KEEPALIVE_TIMEOUT * 1000)}ms",
            "NTFY_INTAKE_RELAY_URL": self.receiver.url,
            "NTFY_INTAKE_RELAY_TIMEOUT": drill_parts.RELAY_TIMEOUT,
            "NTFY_INTAKE_RELAY_MAX_ATTEMPTS": drill_parts.RELAY_MAX_ATTEMPTS,
            "NTFY_INTAKE_CADENCE_DEBOUNCE": drill_parts.DEBOUNCE,
            "NTFY_INTAKE_STATE_DATABASE": self.database,
            "NTFY_INTAKE_CLUSTER_LEASE_TTL": f"{int(self.ttl * 1000)}ms",
            "NTFY_INTAKE_CLUSTER_RENEW_EVERY": f"{int(self.renew_every * 1000)}ms",
            # Two nodes on one machine: each its own free port, never a real daemon's.
            "NTFY_INTAKE_HTTP_LISTEN": "127.0.0.1:0",
        }

    def verdict(self, out: TextIO) -> bool:
        """Print the verdict table (after `run`); True on PASS."""
        return render(
            self.tally,
            self.journal,
            self.ledger.ids(),
            self.receiver.db_path,
            self.store,
            out,
        )

    def say(self, text: str) -> None:
        if self.progress is not None:
            print(f"drill: {text}", file=self.progress, flush=True)

    @property
    def crash_bound(self) -> float:
        return self.tally.crash_bound

    # -- running ---------------------------------------------------------------------------------

    def run(self) -> StandbyTally:
        began = time.monotonic()
        try:
            self._start_cluster()
            for index, kind in enumerate(self.plan):
                self._round(index, kind)
                time.sleep(self.rng.uniform(0.5, 1.5))
            self._final()
        finally:
            self.publisher.stop()
            for node in self.nodes.values():
                if node.process.alive():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(node.process.pid or 0, signal.SIGCONT)
                node.process.close()
        self.tally.published = self.ledger.count()
        self.tally.published_by_topic = dict(self.ledger.by_topic)
        self.tally.publish_errors = self.ledger.errors
        self.tally.starts = {name: n.process.starts for name, n in self.nodes.items()}
        self.tally.terms = dict(self.cluster.terms)
        self.tally.wall_s = time.monotonic() - began
        return self.tally

    def _start_cluster(self) -> None:
        """`pi` first, until it leads and has its first cursor; then `nas`, until it stands by;
        then the stream."""
        first, second = self.nodes["pi"], self.nodes["nas"]
        first.start()
        deadline = time.monotonic() + READY_BOUND_S
        while True:
            lease = self.cluster.lease()
            if lease is not None and lease.fresh and drill_parts.read_cursor(self.store):
                break
            if not first.process.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"node pi did not lead; see {first.process.log_path}")
            time.sleep(0.05)
        self.cluster.seen(lease)
        self.emu.wait_for_subscribers(1, timeout=READY_BOUND_S)
        second.start()
        self._await_ready(second, "first start")
        self.publisher.start()

    def _await_ready(self, node: Node, what: str) -> bool:
        """Until `node`, just started, stands by (or leads) and its readiness row says ready:
        a standby that is not ready yet (its first probe failed) is held off on purpose, and
        no bound for taking over applies to it."""
        since = self.cluster.server_now()
        deadline = time.monotonic() + READY_BOUND_S
        while not node.ready():
            if not node.process.alive():
                self._unexpected_exit(node, what)
                return False
            if time.monotonic() > deadline:
                self.tally.stalls.append(
                    f"node {node.name} ({what}): not standing by after {READY_BOUND_S:g} s"
                )
                return False
            time.sleep(0.05)
        if not self.work.await_ready(self.store, node.name, since=since):
            self.tally.stalls.append(f"node {node.name} ({what}): its readiness row not ready")
            return False
        return True

    def _unexpected_exit(self, node: Node, what: str) -> None:
        code = node.process.returncode()
        self.tally.unexpected_exits.append(
            f"node {node.name} ({what}): exit {code}, log {node.process.log_path}"
        )
        self.say(f"node {node.name} exited unexpectedly ({what}): exit {code}")

    def _steady(self, what: str) -> tuple[Node, Lease] | None:
        """Both nodes running (a dead one is an unexpected exit, started again) and a fresh
        lease held by one of them: that leader."""
        for node in self.nodes.values():
            if not node.process.alive():
                self._unexpected_exit(node, what)
                node.start()
                self._await_ready(node, f"{what}, started again")
        deadline = time.monotonic() + READY_BOUND_S
        while time.monotonic() < deadline:
            lease = self.cluster.lease()
            if lease is not None and lease.fresh and lease.node in self.nodes:
                leader = self.nodes[lease.node]
                if leader.process.alive():
                    return leader, lease
            time.sleep(POLL_S)
        self.tally.stalls.append(f"{what}: no node leads after {READY_BOUND_S:g} s")
        return None

    def _round(self, index: int, kind: str) -> None:
        what = f"round {index + 1}/{len(self.plan)} ({kind})"
        found = self._steady(what)
        if found is None:
            return
        leader, lease = found
        if kind in WORK_FAULTS and not self._recording(lease.term):
            # A fault of the work against a leader that is not working tests nothing.
            self.tally.stalls.append(f"{what}: {leader.name} records nothing before the fault")
            return
        self.say(f"{what} against {leader.name} (term {lease.term})")
        self.journal.poll()
        done = Round(index, kind, leader.name, lease.term, fault_mark=leader.mark())
        fault = Fault(self.journal.last_seq, self.cluster.server_now(), time.time())
        fault.started = time.monotonic()
        self._inject(kind, leader, done)
        self._await_leader(done, fault, stopped=leader if kind == "sigstop" else None)
        if kind == "sigstop":
            self._stood_by(leader, done)
        elif kind in ("kill9", "sigterm"):
            if kind == "sigterm":
                code = leader.process.wait_exit(drill_parts.STOP_BOUND_S)
                if code is None:
                    leader.process.kill9()
                done.exit_code = code
            leader.start()
            self._await_ready(leader, f"{what}, started again")
        elif kind in WORK_FAULTS:
            self._lift(leader, done, what)
        self.tally.rounds.append(done)
        self.say(done.describe())

    def _inject(self, kind: str, leader: Node, done: Round) -> None:
        pid = leader.process.pid
        assert pid is not None
        if kind == "kill9":
            os.kill(pid, signal.SIGKILL)
        elif kind == "sigstop":
            os.kill(pid, signal.SIGSTOP)
        elif kind == "sigterm":
            os.kill(pid, signal.SIGTERM)
        elif kind in WORK_FAULTS:
            done.detail = self.work.inject(kind, leader.name, pid)
        elif kind == "pg_terminate":
            done.sessions = drill_store.terminate(self.database, pid)
        elif kind == "pg_restart":
            assert self.pg_data is not None
            began = time.monotonic()
            problem = drill_store.restart(self.pg_data)
            if problem is not None:
                self.tally.stalls.append(f"PostgreSQL restart failed: {problem}")
            done.server_back_s = time.monotonic() - began

    def _await_leader(self, done: Round, fault: Fault, *, stopped: Node | None) -> None:
        """Until a leader is back and settled (module doc), recording both failover times in
        `done`. The leader counts once the lease row shows a term written after the fault (a
        new term; for the database faults also the old one, renewed after the fault) that
        recorded an event made after the fault, and the row kept that term for a further
        lease_ttl + renew_every: a leader that lapses a moment after the fault (one failed
        renewal can cost a lease this short) is not taken for one that held on. `stopped`
        (SIGSTOP) is resumed with SIGCONT a little after another node took the lease."""
        new_term = done.kind in PROCESS_FAULTS or done.kind in WORK_FAULTS
        settle = self.ttl + self.renew_every
        bound = max(self.crash_bound, self.tally.bound(done.kind))
        give_up = fault.started + bound + GIVE_UP_AFTER_S + settle
        resume_after = self.rng.uniform(0.2, 1.0)
        held: Lease | None = None  # the term that counts, and since when
        since = 0.0
        while True:
            lease = self.cluster.lease()
            now = time.monotonic()
            last = done.terms[-1][0] if done.terms else done.term_before
            if lease is not None and lease.fresh and lease.term > last:
                done.terms.append((lease.term, lease.node))
            if lease is not None and lease.fresh and (held is None or lease.term != held.term):
                after = lease.expires_at - self.ttl > fault.server_at
                moved = lease.term > done.term_before
                if moved and done.kind in WORK_FAULTS and lease.node == done.target:
                    # The node that cannot do the work took it back: not where it must go.
                    done.retook = True
                elif moved or (not new_term and after):
                    held, since = lease, now
                    done.lease_s = now - fault.started
                    done.term_after, done.leader_after = lease.term, lease.node
                    done.event_s = None
            self.journal.poll()
            if held is not None and done.event_s is None:
                row = self.journal.first_event(after=fault.top, wall=fault.wall, term=held.term)
                if row is not None:
                    done.event_s = row.seen - fault.started
            if stopped is not None and held is not None and now - since >= resume_after:
                done.resumed_mark = stopped.mark()
                os.kill(stopped.process.pid or 0, signal.SIGCONT)
                stopped = None
            if held is not None and done.event_s is not None and now - since >= settle:
                break
            if now > give_up:
                done.stalled = True
                self.tally.stalls.append(
                    f"round {done.index + 1} ({done.kind}): no settled leader recording"
                    f" {now - fault.started:.1f} s after the fault"
                )
                break
            time.sleep(POLL_S)
        if stopped is not None:  # nobody took over: resume it anyway
            done.resumed_mark = stopped.mark()
            os.kill(stopped.process.pid or 0, signal.SIGCONT)

    def _recording(self, term: int) -> bool:
        """Whether the leader of `term` records the live stream: an event row of that term read
        from now on, within READY_BOUND_S."""
        self.journal.poll()
        since = time.monotonic()
        return (
            self._until(
                lambda: (
                    self.journal.poll() >= 0
                    and any(
                        r.kind == "event" and r.term == term and r.seen >= since
                        for r in self.journal.rows[-50:]
                    )
                ),
                READY_BOUND_S,
                since,
            )
            is not None
        )

    def _lift(self, node: Node, done: Round, what: str) -> None:
        """After a work fault: lifted; a latched node restarted (its latch notice advises it);
        then the node must be ready to take the work again before the next round."""
        self.work.lift(done.kind, node.name)
        lifted = time.monotonic()
        done.latched = node.said("audit.latched", since=done.fault_mark)
        if not node.process.alive():
            self._unexpected_exit(node, f"{what}, after the fault")
        elif done.latched:
            done.exit_code = node.process.terminate(drill_parts.STOP_BOUND_S)
        if not node.process.alive():
            node.start()
            if self._await_ready(node, f"{what}, started again"):
                done.ready_again_s = time.monotonic() - lifted
        elif self.work.await_ready(self.store, node.name, since=self.cluster.server_now()):
            done.ready_again_s = time.monotonic() - lifted
        else:
            self.tally.stalls.append(f"{what}: node {node.name} not ready again after the fault")

    def _stood_by(self, leader: Node, done: Round) -> None:
        """After SIGCONT the old leader must step down and stand by, in the same process."""
        deadline = time.monotonic() + STEP_DOWN_BOUND_S
        while leader.process.alive():
            if leader.said("cluster.stepped_down", since=done.resumed_mark):
                done.stood_by = True
                return
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        done.stood_by = False

    # -- the end ---------------------------------------------------------------------------------

    def _final(self) -> None:
        self.publisher.stop()
        published = self.ledger.ids()
        self.say(f"publishing stopped after {len(published)} events; final catch-up")
        stopped = time.monotonic()
        found = self._steady("final catch-up")
        wanted = set(published)
        self.tally.catch_up_s = self._until(
            lambda: self.journal.poll() >= 0 and wanted <= self.journal.event_ids(),
            drill_parts.FINAL_BOUND_S,
            stopped,
        )
        if self.tally.catch_up_s is None:
            self.tally.stalls.append(
                f"final catch-up not done within {drill_parts.FINAL_BOUND_S:g} s"
            )
        self.tally.receipts_s = self._until(
            lambda: (
                self.journal.poll() >= 0
                and self.journal.keys <= {r.key for r in receiver.receipts(self.receiver.db_path)}
            ),
            drill_parts.RELAY_BOUND_S,
            stopped,
        )
        self.tally.mirrors_s = self._until(self._mirrors_equal, MIRROR_BOUND_S, stopped)
        # Stop the standby first, then the leader: both must exit 0.
        order = list(self.nodes.values())
        if found is not None:
            order.sort(key=lambda n: n is found[0])
        for node in order:
            code = node.process.terminate(drill_parts.STOP_BOUND_S)
            self.tally.final_stops[node.name] = code
        self.journal.poll()

    def _until(self, done: Callable[[], bool], bound: float, since: float) -> float | None:
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            if done():
                return time.monotonic() - since
            time.sleep(0.1)
        return None

    def _mirrors_equal(self) -> bool:
        conn = db.connect(db.Dsn(self.database), readonly=True)
        try:
            found = {
                name: audit_mirror.compare(conn, node.state_dir / "audit")
                for name, node in self.nodes.items()
            }
            floor = audit_mirror.floor(conn)
        finally:
            conn.close()
        self.tally.mirrors = {name: None if m is None else str(m) for name, m in found.items()}
        self.tally.mirror_floor = floor
        return all(m is None for m in found.values())
