"""Leadership, run (DESIGN.md section 9): a node campaigns for the lease while it stands by,
holds it while it leads, and says the moment its side effects must stop.

The rules are rules/lease.py's and the statements store/leadership.py's; this module gives them
a thread and a clock. Every lease statement runs on a connection of its own, in a thread of its
own (`lease`), so a renewal never queues behind the writer's transactions or the event loop,
and each is bounded on the server and on the socket (leadership.connect). The leader's renewals
are timed in that thread too, not on the loop, and queued there right behind the claim that won
the term: a loop that stalls (imports on a busy box, a slow callback), that is busy when the
claim wins, or slow to start the term (the standby winding down, the term's daemon being built)
delays no renewal, so it costs no term.

Invariants owned here:
- `may_act()` is what every side effect asks right before it acts (a relay POST, an owner send):
  True only while the LocalLease is valid on the monotonic clock. Once False it stays False for
  this holding (a lapsed holding is never resumed: the next one is a new term). The loop reads
  the LocalLease and the lease thread renews it: every use of it is under one lock;
- `hold` ends (sets `Holding.lost`) at the first of: a renewal refused (the row is not ours any
  more), a renewal that came back after the local deadline, the deadline passing with no
  renewal (the database is unreachable, the process was paused), a fence that saw another term;
- the instance token starts with this state directory's prefix and where it lives in this
  boot (`directory_prefix`): this process holds the directory's lock, so a fresh lease carrying
  both is a crashed predecessor's, reclaimed at once instead of waited out (rules/lease.decide,
  `predecessor`). The directory's prefix alone proves nothing: a box cloned from this one's SD
  card (or a copied directory) has it too, and its lock is another directory's. The place is
  the kernel's boot id (new at every boot, never copied with a disk) with the directory's
  device and inode: a row under this node's name from another boot or directory (a clone, a
  copy, this box before a reboot) is waited out, and a collision once it is seen renewed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import threading
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import structlog

from ntfy_intake.errors import StartupError
from ntfy_intake.rules import notices
from ntfy_intake.rules.lease import Action, LocalLease, Seen, decide
from ntfy_intake.rules.notices import Notice
from ntfy_intake.settings.schema import Dsn
from ntfy_intake.store import db, leadership, migrations, storage

log = structlog.get_logger("ntfy_intake.cluster")

PREFIX_FILE = "cluster-instance-prefix"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
LISTEN_SLICE_S = 0.5  # a standby's wait on the release NOTIFY, in slices a stop can cut
RETRY_FRACTION = 0.25  # of renew_every: how soon a failed lease statement is tried again

P = ParamSpec("P")
T = TypeVar("T")


def directory_prefix(state_dir: Path, boot_id: Path = BOOT_ID) -> str:
    """This state directory's instance prefix, then its place in this boot (module doc): the
    directory's is random, made once and kept in the directory."""
    path = state_dir / PREFIX_FILE
    try:
        text = path.read_text(encoding="ascii").strip()
    except (FileNotFoundError, UnicodeDecodeError):
        text = ""
    if not text.isalnum():
        text = secrets.token_hex(4)
        spare = path.with_suffix(".tmp")
        spare.write_text(text + "\n", encoding="ascii")
        os.replace(spare, path)
    return f"{text}.{place(state_dir, boot_id)}."


def place(state_dir: Path, boot_id: Path = BOOT_ID) -> str:
    """Where this state directory is in this boot, 12 hex digits: the kernel's boot id (Linux;
    a container reads its host's) with the directory's device and inode. Where there is no boot
    id, one of this process's own: no row is then ever taken for a crashed predecessor's, each
    is waited out (slower after a crash, never wrong)."""
    try:
        boot = boot_id.read_text(encoding="ascii").strip()
        where = state_dir.stat()
    except (OSError, UnicodeDecodeError):
        boot = ""
    if len(boot) < 16:
        return "p" + secrets.token_hex(6)
    seen = f"{boot}:{where.st_dev}:{where.st_ino}".encode()
    return hashlib.sha256(seen).hexdigest()[:12]


@dataclass(slots=True)
class Holding:
    """One won term, as the leader's daemon sees it: what to fence its writes to, whom it took
    over from (the takeover notice), what its side effects ask, and the end of it."""

    term: int
    node: str
    before: Seen | None
    may_act: Callable[[], bool]
    lapse: Callable[[], None]
    view: Callable[[], dict[str, Any]]  # Member.view: role, term, leader, lease age
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    # Notices the node owes from before this term (the database waited out at start-up).
    owed: list[Notice] = field(default_factory=list)

    def owed_notices(self) -> list[Notice]:
        """What this term's leader records first (once): the owed ones, then the takeover's."""
        taken, self.owed = self.owed, []
        takeover = self.takeover_notice()
        return taken if takeover is None else [*taken, takeover]

    def takeover_notice(self) -> Notice | None:
        """The owner's notice of a failover: a term taken from another node (a node restarting
        into its own crashed predecessor's lease, or the first leader ever, is no failover)."""
        before = self.before
        if before is None or before.node == self.node:
            return None
        return notices.takeover(self.node, before.node, self.term, before.term)


class Member:
    """This process in the cluster: its name, its instance, its lease (module doc)."""

    def __init__(
        self,
        dsn: Dsn,
        *,
        node: str,
        lease_ttl: float,
        renew_every: float,
        prefix: str,
        url: str | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.dsn = dsn
        self.node = node
        self.ttl = lease_ttl
        self.renew_every = renew_every
        self.prefix = prefix
        self.url = url or ""
        self.instance = prefix + secrets.token_hex(6)
        self.local = LocalLease(lease_ttl, renew_every)
        self._local_lock = threading.Lock()  # the loop reads `local`, the lease thread renews it
        # The won term's renewals, running in the lease thread, and what ends them.
        self._renewals: tuple[futures.Future[None], threading.Event] | None = None
        self.term: int | None = None
        self.row: Seen | None = None  # the last read of the row
        self.row_read_at: float | None = None  # monotonic
        self.takeovers = 0  # terms this process won from another holder
        self.problem: str | None = None  # why the last lease statement failed
        self._monotonic = monotonic
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="lease")
        self._conn: Any = None
        self._listener: leadership.ReleaseListener | None = None
        self._migrated = False
        # Why this node must not take the lease now (runtime/node.py composes it: readiness,
        # a yield's cool-off), None when it may. Asked at every campaign step, in the lease
        # thread; it may raise StartupError (a node name in use, a work that differs at start).
        self.hold_off: Callable[[], str | None] = lambda: None
        self.held_off: str | None = None  # the last reason given, for status and logs
        # Readiness as this node's probe sees it (runtime/readiness.Prober.view): merged into
        # `view`, so status, health and metrics read one model.
        self.readiness_view: Callable[[], dict[str, Any]] = dict

    # -- what the rest of the daemon asks ------------------------------------------------------------

    def may_act(self) -> bool:
        with self._local_lock:
            return self.local.is_valid(self._monotonic())

    @property
    def role(self) -> str:
        return "leader" if self.may_act() else "standby"

    def view(self) -> dict[str, Any]:
        """Role, node, term, the leader and the lease's age, for status, health and metrics."""
        row, read_at = self.row, self.row_read_at
        since_read = 0.0 if read_at is None else self._monotonic() - read_at
        remaining = None if row is None else row.remaining - since_read
        fresh = remaining is not None and remaining > 0
        return {
            "role": self.role,
            "node": self.node,
            "instance": self.instance,
            "term": self.term if self.may_act() else (row.term if row is not None else None),
            "leader": row.node if row is not None and fresh else None,
            "leader_url": row.url or None if row is not None and fresh else None,
            # How long ago the lease was last renewed (the server set expires_at = now + ttl).
            "lease_age_s": None if remaining is None else round(self.ttl - remaining, 3),
            "lease_remaining_s": None if remaining is None else round(remaining, 3),
            "takeovers": self.takeovers,
            "problem": self.problem,
            "held_off": self.held_off,
            **self.readiness_view(),
        }

    # -- standing by ---------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Blocking: connect and apply the migrations (the lease table is one of them), under
        the store's lock. The database not answering is `DatabaseUnreachable` (waited out by
        the caller); a refused login, a missing database, a newer schema: StartupError."""
        try:
            migrations.apply(self._connection())
        except db.ERRORS as exc:
            self._drop_connection()
            raise storage.startup_error(exc, self.dsn) from exc
        self._migrated = True

    async def campaign(self, stop: asyncio.Event) -> Holding | None:
        """Until this process leads (its Holding) or `stop` (None). A node name another live
        process keeps renewing is a StartupError (exit 2, one line)."""
        first_own: Seen | None = None
        while not stop.is_set():
            try:
                won, action, wait = await self._in_thread(self._campaign_step, first_own)
            except db.ERRORS as exc:
                said = storage.startup_error(exc, self.dsn)
                if isinstance(said, StartupError):
                    raise said from exc  # a refused login, a missing database: exit 2
                self._failed(said)
                # Soon, as a failed renewal is: a restarted server is back within a second or
                # two, and a release it carries then must find this node listening again.
                await _wait(stop, RETRY_FRACTION * self.renew_every)
                continue
            self.problem = None
            if won is not None:
                return won
            if action is Action.WAIT_OWN and first_own is None:
                first_own = self.row
            await self._await_release(stop, wait)
        return None

    def _campaign_step(self, first_own: Seen | None) -> tuple[Holding | None, Action, float]:
        conn = self._connection()
        if not self._migrated:
            # Under the store's lock: two nodes starting at once do not race (the lease table
            # is one of the steps).
            migrations.apply(conn)
            self._migrated = True
        # LISTEN before the read: a release between the two is heard. After the read, a standby
        # whose loop was busy at start (its HTTP surface's imports) missed the NOTIFY and took
        # over at its next poll, 2.2 to 2.8 s after the leader's SIGTERM.
        self._listening()
        self._saw(leadership.read(conn))
        reason = self.hold_off()  # every step: a StartupError it raises ends the campaign
        if reason != self.held_off and reason is not None:
            log.warning("cluster.holding_off", node=self.node, reason=reason)
        self.held_off = reason
        decision = decide(
            self.row,
            node=self.node,
            instance=self.instance,
            holding=None,
            renew_every=self.renew_every,
            first_own=first_own,
            predecessor=self.prefix,
        )
        if decision.action is Action.COLLISION:
            raise StartupError(decision.message)
        if decision.action is not Action.TAKE:
            return None, decision.action, decision.wait
        if reason is not None:
            # Not ready to do the work: it waits as for a fresh lease (a NOTIFY or the next
            # poll looks again), leaving the lease to a node that is.
            return None, Action.STAND_BY, self.renew_every
        started = self._monotonic()
        claimed = leadership.claim(
            conn,
            self.node,
            self.instance,
            self.ttl,
            lock_wait=self.renew_every,
            url=self.url,
            predecessor=self.prefix,
        )
        self._saw(claimed.row)
        with self._local_lock:
            acquired = claimed.won and self.local.acquired(started, self._monotonic())
        if not acquired:
            return None, Action.STAND_BY, 0.0  # another claimant won, or the claim was too slow
        self.term = claimed.row.term
        before = claimed.before
        if before is not None and before.instance != self.instance:
            self.takeovers += 1
        self._start_renewals(self.term)  # in this thread, behind this claim: the loop may be busy
        log.warning(
            "cluster.leading",
            node=self.node,
            term=self.term,
            before=None if before is None else f"{before.node} term {before.term}",
        )
        return (
            Holding(self.term, self.node, before, self.may_act, self._lapse, self.view),
            Action.TAKE,
            0.0,
        )

    async def _await_release(self, stop: asyncio.Event, wait: float) -> None:
        """Sleep up to `wait` seconds, cut short by the release NOTIFY or `stop`."""
        until = self._monotonic() + wait
        while not stop.is_set():
            left = until - self._monotonic()
            if left <= 0:
                return
            try:
                heard = await self._in_thread(self._listen, min(left, LISTEN_SLICE_S))
            except db.ERRORS as exc:
                self._failed(exc)
                # The lease's session most likely broke with it (a server restart): a fresh one
                # at the next read, not a dead socket that fails once more a retry later.
                self._drop_connection()
                await _wait(stop, min(left, RETRY_FRACTION * self.renew_every))
                return
            if heard:
                return

    def _listen(self, timeout: float) -> bool:
        return self._listening().wait(timeout)

    def _listening(self) -> leadership.ReleaseListener:
        if self._listener is None:
            self._listener = leadership.ReleaseListener(
                leadership.connect(self.dsn, self.ttl, self.renew_every)
            )
        return self._listener

    # -- leading -------------------------------------------------------------------------------------

    async def hold(self, holding: Holding) -> None:
        """Renew every `renew_every`, timed in the lease thread (module doc), until the holding
        is lost; then `lost` is set. The caller cancels it at a graceful stop (and then calls
        `release`)."""
        if self._renewals is None:
            self._start_renewals(holding.term)
        assert self._renewals is not None
        renewals, done = self._renewals
        watcher = asyncio.create_task(self._watch_deadline(holding), name="lease-deadline")
        try:
            await asyncio.wrap_future(renewals)
            holding.lost.set()
        finally:
            done.set()  # cancelled: the thread ends at its next wait
            self._renewals = None
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    def _start_renewals(self, term: int) -> None:
        """Queue the term's renewals in the lease thread (from it, or from the loop)."""
        done = threading.Event()
        self._renewals = (self._pool.submit(self._renew_while_held, term, done), done)

    def _renew_while_held(self, term: int, done: threading.Event) -> None:
        """In the lease thread: a renewal every `renew_every` while the holding may act; a
        failed one is tried again after RETRY_FRACTION of that. The local window can be as
        short as two periods (lease_ttl = 3 x renew_every): a retry a whole period later would
        start at the deadline, and one failed renewal would cost the term."""
        wait = self.renew_every
        while self.may_act() and not done.wait(wait):
            wait = self.renew_every
            try:
                kept = self._renew(term)
            except db.ERRORS as exc:
                self._failed(exc)  # the deadline decides: one failed renewal costs nothing
                wait = self.renew_every * RETRY_FRACTION
                continue
            self.problem = None
            if not kept:
                log.error("cluster.lease_lost", node=self.node, term=term)
                self._lapse()

    def _renew(self, term: int) -> bool:
        started = self._monotonic()
        row = leadership.renew(self._connection(), self.instance, term, self.ttl)
        if row is None:
            self._saw(leadership.read(self._connection()))
            return False
        self._saw(row)
        with self._local_lock:
            return self.local.renewed(started, self._monotonic())

    async def _watch_deadline(self, holding: Holding) -> None:
        """The local deadline, watched on the loop: the moment it passes without a renewal the
        holding is over, whatever the lease thread is stuck in."""
        while True:
            with self._local_lock:
                deadline = self.local.deadline
                now = self._monotonic()
                valid = self.local.is_valid(now)
            if deadline is None or not valid:
                if not holding.lost.is_set():
                    log.error("cluster.deadline_passed", node=self.node, term=holding.term)
                holding.lost.set()
                return
            await asyncio.sleep(deadline - now)

    def _lapse(self) -> None:
        with self._local_lock:
            self.local.lapse()

    async def name_taken(self) -> str | None:
        """After a term of this process ended: the collision line when the lease is now another
        instance's under this node's name, fresh (None otherwise, or when the row cannot be
        read). This process was alive and held it, so that instance is no crashed predecessor
        of it but a second live process (a clone that waited a paused lease out, a copy of
        the state directory): exit 2, as a collision seen at start, never exit 1 from the
        fenced write that told this one its term was over."""
        try:
            row = await self._in_thread(lambda: leadership.read(self._connection()))
        except db.ERRORS as exc:
            self._failed(exc)
            return None
        self._saw(row)
        if row is None or row.expired or row.node != self.node or row.instance == self.instance:
            return None
        return (
            f"node name {self.node!r} is in use: another process (instance {row.instance}) took"
            f" this one's lease under it; give each its own [cluster] node"
        )

    async def release(self) -> None:
        """Graceful stop: give the lease up now and wake the standbys (bounded; a failure only
        means the standby waits the lease out)."""
        with self._local_lock:
            held = self.local.deadline is not None
            self.local.lapse()
        if self._renewals is not None:  # a term that never got to hold(): its renewals end too
            self._renewals[1].set()
        if not held:
            return
        try:
            released = await self._in_thread(
                lambda: leadership.release(self._connection(), self.node, self.instance)
            )
        except db.ERRORS as exc:
            self._failed(exc)
            return
        log.info("cluster.released", node=self.node, term=self.term, released=released)

    def close(self) -> None:
        if self._renewals is not None:
            self._renewals[1].set()
        for conn in (self._conn, self._listener.conn if self._listener is not None else None):
            if conn is not None:
                with contextlib.suppress(*db.ERRORS):
                    conn.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- plumbing ------------------------------------------------------------------------------------

    def _drop_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(*db.ERRORS):
                self._conn.close()
            self._conn = None

    def _connection(self) -> Any:
        if self._conn is None:
            self._conn = leadership.connect(self.dsn, self.ttl, self.renew_every)
        return self._conn

    def _saw(self, row: Seen | None) -> None:
        self.row = row
        self.row_read_at = self._monotonic()

    def _failed(self, exc: BaseException) -> None:
        text = " ".join(str(exc).split()) or type(exc).__name__
        if text != self.problem:
            log.warning("cluster.lease_statement_failed", node=self.node, error=text)
        self.problem = text

    async def _in_thread(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
