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
import contextvars
import queue
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, ParamSpec, TypeVar, cast

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
        self._worker: _Worker | None = None
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
        if self._worker is not None:
            self._worker.stop()  # after the call it may be running: the calls go in order
            self._worker = None

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `fn` in the worker thread, waiting out a transient storage fault (module doc). A
        caller cancelled meanwhile holds the lock until the thread returns (it cannot be
        stopped)."""
        delay = STORAGE_RETRY_BASE
        while True:
            async with self._lock:
                if self._worker is None:
                    self._worker = _Worker(self)
                call = _Call(asyncio.get_running_loop(), fn, args, kwargs)
                self._worker.put(call)
                try:
                    result = await _until_done(call)
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


class _Worker:
    """The worker thread: calls run in the order put, each one's end told to the event loop
    that waits for it. One thread and a queue instead of asyncio.to_thread, whose executor,
    Task and chained futures per call were most of a live event's hop to the store."""

    def __init__(self, owner: object) -> None:
        self._calls: queue.SimpleQueue[_Call[Any] | None] = queue.SimpleQueue()
        thread = threading.Thread(target=_serve, args=(self._calls,), name="database")
        thread.daemon = True  # a Database dropped unclosed (`finalize`) ends it; so does exit
        thread.start()
        weakref.finalize(owner, self._calls.put, None)

    def put(self, call: _Call[Any]) -> None:
        self._calls.put(call)

    def stop(self) -> None:
        self._calls.put(None)


def _serve(calls: queue.SimpleQueue[_Call[Any] | None]) -> None:
    while (call := calls.get()) is not None:
        call.run()


class _Call(Generic[T]):
    """One call on its way through the worker thread; `waiter` resolves (in the event loop)
    once it returned or raised."""

    __slots__ = ("args", "context", "error", "finished", "fn", "kwargs", "loop", "value", "waiter")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self.loop = loop
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.context = contextvars.copy_context()  # as asyncio.to_thread does
        self.waiter: asyncio.Future[None] = loop.create_future()
        self.finished = False
        self.value: T | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        """In the worker thread."""
        try:
            self.value = self.context.run(self.fn, *self.args, **self.kwargs)
        except BaseException as exc:  # noqa: BLE001 - the caller's, as an executor's future
            self.error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            self.loop.call_soon_threadsafe(self._finish)

    def _finish(self) -> None:
        self.finished = True
        if not self.waiter.done():
            self.waiter.set_result(None)

    def result(self) -> T:
        if self.error is not None:
            raise self.error
        return cast(T, self.value)


async def _until_done(call: _Call[T]) -> T:
    """Await `call` to its end even if the caller is cancelled meanwhile, then let the cancel
    through: a thread cannot be stopped, and the lock it runs under must stay held until it
    returns, or the next user would start a transaction on the same connection mid-way."""
    cancelled = False
    while not call.finished:
        try:
            await call.waiter
        except asyncio.CancelledError:
            cancelled = True
            if not call.finished:  # the cancel took the waiter: a fresh one for the end
                call.waiter = call.loop.create_future()
    if cancelled:
        raise asyncio.CancelledError  # the caller is gone, its cancel wins
    return call.result()
