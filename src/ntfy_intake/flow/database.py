"""The daemon's one connection to the store, and the one worker thread it is used from.

Every database call runs in that thread under one lock, so the event loop keeps reading the
socket (and the keepalive watchdog keeps time) while SQLite fsyncs. A transient storage fault
(the database locked by another process past the busy timeout, a full disk, an I/O error) is
waited out with backoff and the same call run again: every call made through here is one
transaction that rolled back whole. Health is degraded meanwhile, each episode owes the owner
one notice (but a node's PostgreSQL not answering: recovery.OutageWatch, when longer than the
lease), and nothing exits.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

import structlog

from ntfy_intake.errors import Fenced
from ntfy_intake.flow.pipeline import Heartbeat
from ntfy_intake.rules import notices
from ntfy_intake.rules.notices import Notice
from ntfy_intake.store import db, storage

log = structlog.get_logger("ntfy_intake.pipeline")

STORAGE_RETRY_BASE = 0.1
STORAGE_RETRY_CAP = 5.0

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(slots=True)
class StorageWaits:
    """A transient storage fault being waited out (None: storage is fine), how many episodes
    this process has had, and the owner notices the ended ones still owe."""

    fault: storage.StorageFault | None = None
    episodes: int = 0
    notices_owed: list[Notice] = field(default_factory=list)


class Database:
    """One connection, one lock, one worker thread; storage faults waited out (module doc)."""

    def __init__(
        self,
        path: db.Target,
        *,
        boot_id: str,
        waits: StorageWaits,
        degraded: dict[str, str],
        heartbeat: Heartbeat,
        term: int | None = None,
        idle_limit: float | None = None,
        on_fenced: Callable[[], None] = lambda: None,
    ) -> None:
        self._path = path
        # A leader's writes are fenced to its term (DESIGN.md section 9): a write after another
        # term began raises errors.Fenced, which is never waited out: `on_fenced` steps down.
        self._term = term
        self._idle_limit = idle_limit
        self._on_fenced = on_fenced
        self._where = str(path)
        self._boot_id = boot_id
        self.waits = waits
        self._degraded = degraded
        self._heartbeat = heartbeat
        self._lock = asyncio.Lock()
        self._conn: db.Connection | None = None
        self._failed_call: object = None
        # Set by a stop (`hurry`): a fault being waited out is tried again at once, then at the
        # shortest backoff, so a drain never sleeps out a backoff that grew during an outage.
        self._hurry = asyncio.Event()

    @property
    def conn(self) -> db.Connection:
        assert self._conn is not None, "daemon not started"
        return self._conn

    @property
    def is_open(self) -> bool:
        return self._conn is not None

    def open(self) -> db.Connection:
        self._conn = db.connect(self._path)
        if self._term is not None:
            db.fence_to(self._conn, self._term, idle_limit=self._idle_limit)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `fn` in the worker thread, waiting out a transient storage fault (module doc). A
        caller cancelled meanwhile holds the lock until the thread returns (it cannot be
        stopped)."""
        delay = STORAGE_RETRY_BASE
        while True:
            async with self._lock:
                try:
                    result = await _until_done(asyncio.to_thread(fn, *args, **kwargs))
                except Fenced:
                    self._on_fenced()
                    raise
                except Exception as exc:
                    fault = storage.waitable(exc, self._where)
                    if fault is None:
                        raise
                else:
                    # Only the work that failed proves recovery (reads succeed on a full disk).
                    if self.waits.fault is not None and fn == self._failed_call:
                        self._recovered()
                    return result
            self._failed_call = fn
            self._waiting(fault)
            if self._hurry.is_set():  # stopping: the shortest backoff, never a grown one
                await asyncio.sleep(STORAGE_RETRY_BASE)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._hurry.wait(), delay)  # a stop cuts it short
            delay = min(delay * 2, STORAGE_RETRY_CAP)

    def hurry(self) -> None:
        """A stop began (the drain): retry a fault being waited out now, and from then on at
        STORAGE_RETRY_BASE. A PostgreSQL restart grew the backoff to 1.6 s; the drain slept it
        out while the standby waited for the lease."""
        self._hurry.set()

    def _waiting(self, fault: storage.StorageFault) -> None:
        # Waiting on schedule is progress: the watchdog keeps pinging (DESIGN.md section 2).
        self._heartbeat.beat()
        if self.waits.fault is None:
            log.error("storage.waiting", fault=str(fault), transient=True)
            self.waits.episodes += 1
        self.waits.fault = fault
        self._degraded["storage"] = f"{fault}; waiting"

    def _recovered(self) -> None:
        fault = self.waits.fault
        self.waits.fault = None
        self._degraded.pop("storage", None)
        if fault is None:
            return
        log.warning("storage.recovered", fault=str(fault))
        if fault.kind == "unreachable" and self._term is not None:
            # A node's (PostgreSQL): a blip (a restart, a dropped session) tells the owner
            # nothing; an outage longer than the lease ends the term, and the node tells it
            # once per episode across both nodes (recovery.OutageWatch).
            return
        episode = f"{self._boot_id}:{self.waits.episodes}"
        self.waits.notices_owed.append(
            notices.database_locked(fault.detail, episode)
            if fault.kind == "locked"
            else notices.storage_fault(fault.kind, str(fault), episode)
        )


async def _until_done(work: Awaitable[T]) -> T:
    """Await `work` to its end even if the caller is cancelled meanwhile, then let the cancel
    through: a thread cannot be stopped, and the lock it runs under must stay held until it
    returns, or the next user would start a transaction on the same connection mid-way."""
    future = asyncio.ensure_future(work)
    cancelled = False
    while not future.done():
        try:
            await asyncio.wait((future,))  # never cancels `future`, never raises its error
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        if not future.cancelled():
            future.exception()  # retrieved: the caller is gone, its cancel wins
        raise asyncio.CancelledError
    return future.result()
