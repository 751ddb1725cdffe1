"""Readiness, run (DESIGN.md section 11): every node, leader or standby, probes on its own every
`cluster.probe_every` whether it could do the work, and stores the verdict in its row.

One probe:
1. a `poll=1` GET to its OWN `ntfy.url` for its topics, with its credentials (the token as
   the intake sends it; userinfo in the URL as httpx sends it): 2xx is reachable, anything else
   is named by its status or its error, never by a credential (a 429 of the request bucket is
   no failure, and a leader whose stream is live sends none: `probe`); it must hold the
   leader's last recorded message (the store's cursor), and a refused token backs it off; and
   a HEAD to the relay's origin (runtime/work_probe says how and why);
2. the migration ledger: every step it names is one this code knows (a newer version migrated
   the schema: this node could not run the leader's daemon, migrations.apply would refuse);
3. its work fingerprint equals the live leader's (the lease holder's node row, same instance:
   rules/readiness says why the fingerprint lives in the node row);
then `nodes.report` and the rows of every node, on a connection of its own (never the lease's:
a renewal must not queue behind a probe), in a thread of its own.

What follows from a probe:
- at START (the first probe, before this node campaigns): a work that differs from a live
  leader's is a StartupError naming the differing keys (exit 2, one line);
- later: not ready, and `hold_off` keeps the node from campaigning. A "hard" reason (a schema
  it does not know, a different work, its name in use) holds it off always; a "soft" one (ntfy
  unreachable from here, the database failing the probe, its audit log latched in this term or
  in this process's last one) only while another node is ready: with nobody better, a node that
  cannot reach ntfy still leads (it resumes the moment ntfy answers), and a latched one still
  records and relays;
- another live instance keeps reporting under this node's name (seen renewed, as the lease's
  collision rule): a StartupError, raised by `hold_off` at the next campaign step; a crashed
  predecessor of this state directory (`directory_prefix`) is reclaimed at once;
- on the leader: a node whose work differs from its own is told to the owner once per pair of
  fingerprints (`tell_owner`, set by the leader's term);
- a node about to release the lease (a graceful stop, a yield) writes its row as not ready
  FIRST (`leaving`): the node that wakes on the release NOTIFY reads the rows again before it
  decides (`campaign_peers`, when the lease is free), so it does not count the leaver as a
  ready peer for up to two probes (a cool-off that waited lease_ttl + renew_every: 10 s at the
  defaults). A yielder's row says so until a probe sees another node holding the lease; one
  that yielded for its latch stays not ready after that (`stand_by`).

Invariants owned here:
- nothing a probe does can block the lease thread or the loop beyond its budget
  (`readiness.PROBE_BUDGET` of a period: the request's timeout and the statements');
- the reason stored and shown never holds a credential (the URL is shown as
  `readiness.work_address`, which cuts userinfo and query).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import structlog

from ntfy_intake import __version__
from ntfy_intake.errors import StartupError
from ntfy_intake.rules import health as health_model
from ntfy_intake.rules import notices, readiness
from ntfy_intake.rules.lease import Seen
from ntfy_intake.rules.notices import Notice
from ntfy_intake.rules.readiness import NodeSeen, Verdict, WorkState
from ntfy_intake.runtime import owed
from ntfy_intake.runtime.cluster import Member
from ntfy_intake.runtime.work_probe import WorkProbe
from ntfy_intake.settings import Settings
from ntfy_intake.store import cursor as stored_cursor
from ntfy_intake.store import db, leadership, migrations, nodes, postgres

log = structlog.get_logger("ntfy_intake.readiness")

NOT_PROBED = "readiness not probed yet"


def _leaving_faults() -> tuple[type[Exception], ...]:
    """What the leaving write may meet: its bound, a pool already shut down (RuntimeError), the
    database (db.ERRORS as it is now). None of them stops the release that follows."""
    return (TimeoutError, RuntimeError, *db.ERRORS)


# Test hooks (never set in production): the URLs a node's fingerprint names in place of its
# own, where a test gives each node its own route to ONE ntfy (a loopback proxy it can cut) or
# its own path on ONE receiver (to tell who posted). A real pair names one address for both.
WORK_NTFY_URL_ENV = "NTFY_INTAKE_TEST_WORK_NTFY_URL"
WORK_RELAY_URL_ENV = "NTFY_INTAKE_TEST_WORK_RELAY_URL"


def parts_of(settings: Settings, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """This node's work fingerprint, per key (rules/readiness: never of a secret)."""
    c = settings.cadence
    return readiness.fingerprint_parts(
        ntfy_url=environ.get(WORK_NTFY_URL_ENV) or settings.ntfy.url,
        topics=settings.ntfy.topics,
        relay_url=environ.get(WORK_RELAY_URL_ENV) or settings.relay.url,
        recipients=settings.owner.recipients,
        fallback_topic=settings.owner.fallback_topic,
        policy={
            "debounce": f"{c.debounce:g}",
            "cooldown": f"{c.cooldown:g}",
            "daily_cap": str(c.daily_cap),
            "timezone": c.timezone,
        },
        profiles=settings.ntfy.profiles,
    )


@dataclass(frozen=True, slots=True)
class _Found:
    """What one probe's store step saw."""

    rows: list[NodeSeen]
    lease: Seen | None
    reason: str | None
    hard: bool
    fatal: str | None


class WorkWatch:
    """A leader's intake as WorkState: live (or degraded), dead (reconnecting or dead), latched;
    `since` is when that state began here (monotonic)."""

    def __init__(
        self,
        assess: Callable[[], health_model.Health],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._assess = assess
        self._monotonic = monotonic
        self._state: WorkState | None = None

    def __call__(self) -> WorkState:
        assessed = self._assess()
        if assessed.state is health_model.State.LATCHED:
            intake = "latched"
        elif assessed.intake is health_model.State.LIVE:
            intake = "live"
        else:
            intake = "dead"
        if self._state is None or self._state.intake != intake:
            now = self._monotonic()
            since = now
            silent = assessed.last_frame_age_s
            if intake == "dead" and silent is not None:
                since = now - silent  # dead since its last frame, not since this probe saw it
            self._state = WorkState(intake, since)
        return self._state


class Prober:
    """This node's readiness probe (module doc)."""

    def __init__(
        self,
        settings: Settings,
        member: Member,
        work_state: Callable[[], WorkState] | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.member = member
        self.work_state: Callable[[], WorkState] = work_state or WorkState
        # Given (runtime/yielding.WorkWatch, by node.py): the yield rule's own reading of the
        # work, so the row stores what the leader decides on; `lead` keeps it then.
        self._given_work = work_state
        # Set by the leader's term: how the owner is told of a node whose work differs.
        self.tell_owner: Callable[[Notice], Awaitable[None]] | None = None
        self.probe_every = settings.cluster.probe_every
        self.budget = max(0.5, self.probe_every * readiness.PROBE_BUDGET)
        # Its ntfy (is it the leader's; a refused token backs off) and its relay: work_probe.
        self.work = WorkProbe(
            settings, member.node, self.budget, transport=transport, monotonic=monotonic
        )
        self.parts = parts_of(settings)
        self.fingerprint = readiness.fingerprint(self.parts)
        self.probes = 0
        self._rows: list[NodeSeen] = []
        self._read_at: float | None = None
        self._reason: str | None = NOT_PROBED
        self._hard = True
        self._fatal: str | None = None
        self._other: NodeSeen | None = None  # another instance seen under this node's name
        self._told: set[str] = set()
        self._transport = transport
        self._monotonic = monotonic
        self._conn: Any = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="readiness")
        # Why this node gives the work up (a stop, a yield), written into its row (`leaving`).
        self._leaving: str | None = None
        self._peek: Any = None  # the lease thread's connection for `campaign_peers`' reads
        # This process's last term ended with its audit log latched (`stand_by`): not ready.
        self._latched_term = False

    # -- what the rest of the node asks --------------------------------------------------------------

    def latest(self) -> tuple[list[NodeSeen], float | None]:
        """Every node's row as last read, and when (monotonic)."""
        return list(self._rows), self._read_at

    def rows_now(self) -> list[NodeSeen]:
        """The rows aged to now (their ages grow between reads)."""
        rows, read_at = self.latest()
        return readiness.aged(rows, 0.0 if read_at is None else self._monotonic() - read_at)

    def not_ready_reason(self) -> str | None:
        return self._reason

    def peers_ready(self) -> list[NodeSeen]:
        return readiness.ready_peers(
            self.rows_now(),
            me=self.member.node,
            fingerprint=self.fingerprint,
            probe_every=self.probe_every,
        )

    def says_not_ready(self, node: str) -> bool:
        """Whether `node`'s fresh row refuses the work (rules/readiness.says_not_ready)."""
        return readiness.says_not_ready(self.rows_now(), node, probe_every=self.probe_every)

    def campaign_peers(self) -> list[NodeSeen]:
        """`peers_ready` for a campaign step, in the lease thread, right after it read the lease:
        when the lease is free and the last read of the rows (older than that read of the lease)
        names a ready peer, the rows are read again first. A release is what frees a lease
        early, and the node that released wrote its row as not ready before it (`leaving`):
        the cached rows would count it as ready for up to two probes."""
        peers = self.peers_ready()
        lease, lease_read = self.member.row, self.member.row_read_at
        _, read_at = self.latest()
        if not peers or (lease is not None and not lease.expired):
            return peers
        if read_at is not None and lease_read is not None and read_at >= lease_read:
            return peers
        try:
            if self._peek is None:
                every = self.member.renew_every
                self._peek = postgres.connect(
                    self.member.dsn, timeout=every, statement_timeout=every
                )
            rows = nodes.read_all(self._peek)
        except db.ERRORS as exc:
            conn, self._peek = self._peek, None
            if conn is not None:
                with contextlib.suppress(*db.ERRORS):
                    conn.close()
            log.warning("readiness.reread_failed", error=type(exc).__name__)
            return peers  # the cool-off's own give-way (lease_ttl + renew_every) still holds
        self._rows, self._read_at = rows, self._monotonic()
        return self.peers_ready()

    def hold_off(self) -> str | None:
        """Member.hold_off (module doc): raises StartupError for a name in use."""
        if self._fatal is not None:
            raise StartupError(self._fatal)
        reason = self._reason
        if reason is None or self._hard:
            return reason
        return reason if self.campaign_peers() else None

    def verdict(self) -> Verdict:
        """The one model (rules/readiness.judge) over the last rows and the member's lease."""
        member = self.member
        row, read_at = member.row, member.row_read_at  # not member.view(): it asks us
        leader = None
        if row is not None and read_at is not None and row.remaining > self._since(read_at):
            leader = (row.node, row.instance)
        return readiness.judge(
            self.rows_now(),
            me=self.member.node,
            leader=leader,
            probe_every=self.probe_every,
            yield_after=self.settings.cluster.yield_after,
        )

    def view(self) -> dict[str, Any]:
        """What status, health and metrics show of readiness (Member.readiness_view)."""
        verdict = self.verdict()
        return {
            "ready": verdict.ready,
            "not_ready": verdict.reason,
            "cluster_intake_live": verdict.intake_live,
            "cluster_problems": list(verdict.problems),
            "fingerprint": self.fingerprint,
        }

    # -- probing -------------------------------------------------------------------------------------

    async def start(self, stop: asyncio.Event) -> None:
        """The first probe, before this node campaigns: a work that differs from the live
        leader's, or this node's name in use, is a StartupError (exit 2, one line)."""
        await self.probe(first=True)
        if self._fatal is not None:
            raise StartupError(self._fatal)

    async def run(self, stop: asyncio.Event) -> None:
        """A probe every `probe_every` until `stop` (the first one is `start`'s); every
        renew_every while a yielder's row says it left (`leaving`), so it says ready again
        soon after another node took the lease. The owner closes the prober (`close`): the
        leaving write of a graceful stop comes after `stop`, on this pool and connection."""
        while not stop.is_set():
            every = self.probe_every
            if self._leaving is not None:
                every = min(every, self.member.renew_every)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=every)
            if stop.is_set():
                break
            await self.probe()

    async def probe(self, *, first: bool = False) -> None:
        work = self.work_state()
        # A leader whose stream is live has its answer already, and ntfy counts every request
        # against the address's bucket (60, one back per 5 s): two nodes behind one address
        # probing every 10 s would spend the whole refill, and the leader's reconnects none.
        ntfy = await self.work.check(ntfy=work.intake != "live")
        loop = asyncio.get_running_loop()
        try:
            found = await loop.run_in_executor(self._pool, self._store_step, ntfy, work, first)
        except db.ERRORS as exc:
            self._drop_connection()
            text = " ".join(str(exc).split()) or type(exc).__name__
            self._set(f"the database failed the probe: {text}", hard=False)
            return
        self.probes += 1
        self._rows, self._read_at = found.rows, self._monotonic()
        if found.fatal is not None:
            self._fatal = found.fatal
            log.error("readiness.fatal", node=self.member.node, reason=found.fatal)
        self._set(found.reason, hard=found.hard)
        if self.tell_owner is not None and self.member.may_act():
            await self._tell_differing(found.rows)
            await self._record_owed()

    async def leaving(self, reason: str) -> None:
        """Before this node releases the lease (a graceful stop, a yield): its row says not
        ready, `reason`, now, and every probe until another node holds the lease (`_store_step`)
        or this node leads again (`lead`) writes it so. Bounded by renew_every (the release
        matters more); skipped while the lease's statements fail (the database is away: the
        release will not get through either, and the lease runs out instead)."""
        self._leaving = reason
        if self.probes == 0 or self.member.problem is not None:
            return
        me = self.member
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(me.renew_every):
                await loop.run_in_executor(
                    self._pool,
                    lambda: nodes.leaving(
                        self._connection(), node=me.node, instance=me.instance, reason=reason
                    ),
                )
        except _leaving_faults() as exc:
            log.warning("readiness.leaving_not_written", node=me.node, error=type(exc).__name__)

    def _set(self, reason: str | None, *, hard: bool) -> None:
        if reason != self._reason:
            if reason is None:
                log.info("readiness.ready", node=self.member.node)
            else:
                log.warning("readiness.not_ready", node=self.member.node, reason=reason)
        self._reason, self._hard = reason, hard

    def _store_step(self, ntfy: str | None, work: WorkState, first: bool) -> _Found:
        """In the probe thread: the ledger, the lease, the rows, this node's report."""
        conn = self._connection()
        known = {name for name, _ in migrations.for_engine(conn)}
        # The leader's last recorded message: the next probe asks this node's ntfy for it.
        self.work.leader_last = stored_cursor.load(conn)
        unknown = sorted(set(migrations.ledger(conn)) - known)
        lease = leadership.read(conn)
        rows = nodes.read_all(conn)
        me = self.member
        held = self._work_of_the_store(lease, rows)
        keys = [] if held is None else readiness.differing(self.parts, held.parts)
        fatal = None
        reasons: list[tuple[str, bool]] = []
        if keys and first and held is not None and lease is not None and not lease.expired:
            fatal = (
                f"this node's work differs from the leader's (node {held.node!r}) in"
                f" {', '.join(keys)}: give every node the same values for these keys"
            )
        if unknown:
            reasons.append(
                (
                    f"the database was migrated by a newer ntfy-intake (unknown migration"
                    f" {', '.join(unknown)}); this node runs {__version__}: upgrade it",
                    True,
                )
            )
        if keys and held is not None:
            reasons.append(
                (f"work differs from the leader {held.node!r} in {', '.join(keys)}", True)
            )
        if self._other is not None:
            reasons.append(
                (
                    f"node name {me.node!r} is in use by another process ({self._other.instance})",
                    True,
                )
            )
        if ntfy is not None:
            reasons.append((ntfy, False))
        latched = readiness.latch_reason(work, last_term_latched=self._latched_term)
        if latched is not None:
            # Soft: a latched node still records and relays, so with nobody else ready it
            # still leads (rules/readiness.latch_reason says why; DESIGN.md section 11).
            reasons.append((latched, False))
        reason = "; ".join(text for text, _ in reasons) or None
        hard = any(h for _, h in reasons)
        since = work.since
        leaving = self._leaving
        taken = lease is not None and not lease.expired and lease.instance != me.instance
        if leaving is not None and taken:
            self._leaving = leaving = None  # the work went on: the row tells the truth again
        # Only the row says it (the other nodes must not count this one): the node's own
        # campaign is held off by its own probe's reason, never by its leaving.
        written, row = nodes.report(
            conn,
            node=me.node,
            instance=me.instance,
            ready=reason is None and leaving is None,
            reason=reason if leaving is None else "; ".join(filter(None, [leaving, reason])),
            fingerprint=self.fingerprint,
            parts=self.parts,
            version=__version__,
            schema_known=not unknown,
            intake=work.intake,
            intake_age_s=None if since is None else self._monotonic() - since,
            predecessor=me.prefix,
            stale_s=readiness.fresh_within(self.probe_every),
        )
        if written:
            self._other = None
            rows = [r for r in rows if r.node != me.node] + [row]
        else:
            fatal = fatal or self._collision(row)
            reason = "; ".join(
                filter(None, [reason, f"node name {me.node!r} is in use by another process"])
            )
            hard = True
        return _Found(rows, lease, reason, hard, fatal)

    def _work_of_the_store(self, lease: Seen | None, rows: list[NodeSeen]) -> NodeSeen | None:
        """The row whose work this node must equal: the live leader's (its instance), or, once
        its lease expired, the last leader's (by name): a node with other work must not take
        over a store whose cursor and overlap were another work's (issue 32: the alerts of a
        topic it lacks would be skipped for good). Never this node's own former self: a restart
        with new settings is the operator's latest word on this node."""
        if lease is None or lease.node == self.member.node:
            return None
        if lease.expired:
            return next((r for r in rows if r.node == lease.node), None)
        return next((r for r in rows if (r.node, r.instance) == (lease.node, lease.instance)), None)

    def _collision(self, other: NodeSeen) -> str | None:
        """Another instance's fresh row under this name: a collision once seen reported again
        (a crashed process's row is never renewed; it goes stale and is taken)."""
        before = self._other
        self._other = other
        if (
            before is not None
            and before.instance == other.instance
            and other.seen_at > before.seen_at
        ):
            return (
                f"node name {self.member.node!r} is in use: another process (instance"
                f" {other.instance}) keeps reporting under it; give this one its own [cluster] node"
            )
        return None

    async def _tell_differing(self, rows: list[NodeSeen]) -> None:
        """On the leader: the owner hears once of each node whose work differs from its own."""
        limit = readiness.fresh_within(self.probe_every)
        for row in rows:
            if row.node == self.member.node or row.seen_age_s > limit or not row.fingerprint:
                continue
            keys = readiness.differing(self.parts, row.parts)
            key = f"{row.node}:{row.fingerprint}:{self.fingerprint}"
            if not keys or key in self._told or self.tell_owner is None:
                continue
            notice = notices.work_differs(
                self.member.node, row.node, keys, row.fingerprint, self.fingerprint
            )
            try:
                await self.tell_owner(notice)
            except Exception as exc:  # noqa: BLE001 - told at the next probe instead
                log.warning("readiness.notice_failed", node=row.node, error=type(exc).__name__)
                continue
            self._told.add(key)  # the outbox's key makes a repeat by the next leader a no-op

    async def _record_owed(self) -> None:
        """The notices other nodes owe the owner (runtime/owed.py), recorded by this leader."""
        if self.tell_owner is None:
            return
        loop = asyncio.get_running_loop()

        async def run(call: Callable[[], Any]) -> Any:
            return await loop.run_in_executor(self._pool, call)

        try:
            await owed.record(self._connection, run, self.tell_owner)
        except Exception as exc:  # noqa: BLE001 - still owed: the next probe records it
            log.warning("readiness.owed_failed", node=self.member.node, error=type(exc).__name__)

    def lead(self, leader: object) -> None:
        """A term begins: this node reports its daemon's intake, and tells the owner of nodes
        whose work differs (through that daemon's journal). A new daemon tries the audit log
        afresh: an older term's latch no longer says anything (`stand_by`)."""
        assess = getattr(leader, "assess_health", None)
        journal = getattr(leader, "journal", None)
        self._leaving = None
        self._latched_term = False
        if callable(assess) and self._given_work is None:
            self.work_state = WorkWatch(assess, self._monotonic)
        if journal is not None and callable(getattr(journal, "note", None)):
            self.tell_owner = journal.note

    def stand_by(self, *, latched: bool = False) -> None:
        """The term is over: this node reports "standby" again; not ready while the term's
        daemon ended `latched` (its audit log could not be written), until this process
        restarts or leads again (rules/readiness.latch_reason)."""
        self.work_state = self._given_work or WorkState
        self.tell_owner = None
        self._latched_term = latched

    # -- plumbing ------------------------------------------------------------------------------------

    def _connection(self) -> Any:
        if self._conn is None:
            dsn = self.member.dsn
            self._conn = postgres.connect(dsn, timeout=self.budget, statement_timeout=self.budget)
        return self._conn

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(*db.ERRORS):
                conn.close()

    def _since(self, instant: float) -> float:
        return self._monotonic() - instant

    def close(self) -> None:
        self._drop_connection()
        peek, self._peek = self._peek, None
        if peek is not None:
            with contextlib.suppress(*db.ERRORS):
                peek.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
