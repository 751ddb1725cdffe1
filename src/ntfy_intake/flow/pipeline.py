"""The event pipeline: how one event becomes exactly one recorded outcome.

  intake.py reads a frame and puts it on `queue`                  (no database there)
  `_writer` takes a batch off the queue and `_record`s it in ONE transaction
      inbox.record_batch: inbox row (dedup by id), incident merge, cadence decision,
      outbox row or "suppressed", the audit journal rows
  `_flush_audit` appends the journal to the JSONL log, flush + fsync  (audit.flush)
  `resume.durable` learns which events are durable; the ticker's `_settle_cursor` persists the
      cursor once the reorder window has passed                     (cursor.ResumePoint)
  after every (re)subscribe, intake's backfill poll arrives as one `Backfilled`: its events take
      the same path (`_record_backfill`), never move the cursor, and clear what was owed in the
      same transaction
The relay and the agent feed read the outbox on their own; a webhook outage never stalls intake.

All database work runs in a worker thread under one lock (`_db`), so the event loop keeps reading
the socket (and the keepalive watchdog keeps time) while SQLite fsyncs. A transient storage fault
(the database locked by another process, a full disk) is waited out there, never a crash.
`EventPipeline` holds the daemon's state that these steps share; `daemon.Daemon` sets it up.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ParamSpec, TypeVar

import structlog

from ntfy_intake.errors import AuditWriteError
from ntfy_intake.flow import intake, owner, relay
from ntfy_intake.rules import cadence, notices
from ntfy_intake.rules.notices import Notice
from ntfy_intake.settings import Settings
from ntfy_intake.store import audit, db, feed, inbox, outbox, storage
from ntfy_intake.store.cursor import (
    Cursor,
    Owed,
    Resume,
    ResumePoint,
    load_resume,
    owe_backfill,
    save_last_frame_time,
)
from ntfy_intake.store.cursor import backfill_done as clear_backfill
from ntfy_intake.store.cursor import save as save_cursor
from ntfy_intake.store.owner_queue import OwnerQueue, Record
from ntfy_intake.wire import refusals
from ntfy_intake.wire.frames import Event, Junk

log = structlog.get_logger("ntfy_intake.pipeline")

MAX_BATCH = 500
STORAGE_RETRY_BASE = 0.1
STORAGE_RETRY_CAP = 5.0
FEED_SENDER = "ntfy-intake"
TRIAGE_CHANNEL = "triage"
INFO_CHANNEL = "incident_info"  # device deletes/clears that came after their request went out

P = ParamSpec("P")
T = TypeVar("T")


class CrashPoints:
    """Test-only: SIGKILL this process when a named point is reached (inert unless armed).

    Armed by the drill through NTFY_INTAKE_TEST_CRASH_AT=<point>[:<nth hit>]; never in production.
    """

    def __init__(self, spec: str | None) -> None:
        self.point: str | None = None
        self.remaining = 0
        if spec:
            point, _, nth = spec.partition(":")
            self.point = point
            self.remaining = int(nth) if nth.isdigit() else 1

    def hit(self, point: str) -> None:
        if self.point != point:
            return
        self.remaining -= 1
        if self.remaining <= 0:
            os.kill(os.getpid(), signal.SIGKILL)


@dataclass(slots=True)
class Counters:
    recorded: int = 0
    duplicates: int = 0
    conflicts: int = 0
    quarantined: int = 0
    batches: int = 0
    cursor_moves: int = 0
    last_event_wall: float | None = None
    extra: dict[str, int] = field(default_factory=dict)


class CountedOwnerQueue(OwnerQueue):
    """The owner queue, counting the decisions it wrote once their transaction committed, so
    the pipeline wakes the sender only when one may be waiting."""

    queued: int = 0

    def notice(
        self,
        txn: db.Transaction,
        notice: Notice,
        now: float,
        *,
        state: cadence.CadenceState | None = None,
    ) -> list[Record]:
        records = super().notice(txn, notice, now, state=state)
        self._count_after_commit(txn, len(records))
        return records

    def triage_message(
        self,
        txn: db.Transaction,
        key: str,
        text: str,
        now: float,
        *,
        state: cadence.CadenceState | None = None,
    ) -> tuple[str, list[Record]]:
        result, records = super().triage_message(txn, key, text, now, state=state)
        self._count_after_commit(txn, len(records))
        return result, records

    def _count_after_commit(self, txn: db.Transaction, count: int) -> None:
        if count:
            txn.after_commit(lambda: setattr(self, "queued", self.queued + count))


@dataclass(slots=True)
class _BatchWrite:
    """One batch on its way to disk, and how far it got (see `EventPipeline._write_batch`)."""

    frames: list[Event | Junk | Notice]
    now: float
    also: inbox.InTransaction | None
    result: inbox.BatchResult | None = None
    next_release: float | None = None
    release_known: bool = False
    audit_written: bool = False


class EventPipeline:
    """frame -> inbox transaction -> audit line -> cursor (see the module docstring)."""

    # The state the steps share, set up by daemon.Daemon.__init__.
    settings: Settings
    clock: Callable[[], float]
    crash: CrashPoints
    boot_id: str
    health: intake.IntakeHealth
    counters: Counters
    resume: ResumePoint
    latched: bool
    failed: bool
    owner_queue: CountedOwnerQueue
    _owner_woken_for: int
    queue: asyncio.Queue[intake.Item]
    relay: relay.Relay | None
    owner: owner.OwnerSender | None
    heartbeat_at: float
    degraded: dict[str, str]
    storage_wait: storage.StorageFault | None
    storage_episodes: int
    _storage_failed_fn: object
    _storage_notices: list[Notice]
    _db_lock: asyncio.Lock
    _conn: sqlite3.Connection | None
    _audit: audit.AuditLog
    _replaced_pending: list[str]  # audit file replacements whose notice is not recorded yet
    _cursor: Cursor | None
    _next_release: float | None
    _saved_frame_time: int | None
    _frame_time_saved_at: float
    subscribed: asyncio.Event

    # -- database access: one lock, one worker thread; storage faults waited out ---------------------

    @property
    def conn(self) -> sqlite3.Connection:
        assert self._conn is not None, "daemon not started"
        return self._conn

    async def _db(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `fn` in the worker thread. A transient storage failure (the database locked by
        another process past the busy timeout, a full disk, an I/O error) is waited out with
        backoff and `fn` run again: every database function here is one transaction that
        rolled back whole. Health is degraded meanwhile; nothing exits. A caller cancelled
        meanwhile holds the lock until the thread returns (it cannot be stopped)."""
        delay = STORAGE_RETRY_BASE
        while True:
            async with self._db_lock:
                try:
                    result = await _until_done(asyncio.to_thread(fn, *args, **kwargs))
                except sqlite3.OperationalError as exc:
                    fault = storage.classify(exc, str(self.settings.state.database))
                    if not fault.transient:
                        raise
                else:
                    # Only the work that failed proves recovery (reads succeed on a full disk).
                    if self.storage_wait is not None and fn == self._storage_failed_fn:
                        self._storage_recovered()
                    return result
            self._storage_failed_fn = fn
            self._storage_waiting(fault)
            await asyncio.sleep(delay)
            delay = min(delay * 2, STORAGE_RETRY_CAP)

    def _storage_waiting(self, fault: storage.StorageFault) -> None:
        # Waiting on schedule is progress: the watchdog keeps pinging (DESIGN.md section 2).
        self.heartbeat_at = time.monotonic()
        if self.storage_wait is None:
            log.error("storage.waiting", fault=str(fault), transient=True)
            self.storage_episodes += 1
        self.storage_wait = fault
        self.degraded["storage"] = f"{fault}; waiting"

    def _storage_recovered(self) -> None:
        fault = self.storage_wait
        self.storage_wait = None
        self.degraded.pop("storage", None)
        if fault is None:
            return
        log.warning("storage.recovered", fault=str(fault))
        episode = f"{self.boot_id}:{self.storage_episodes}"
        self._storage_notices.append(
            notices.database_locked(fault.detail, episode)
            if fault.kind == "locked"
            else notices.storage_fault(fault.kind, str(fault), episode)
        )

    async def _send_storage_notices(self) -> None:
        """One owner notice per storage episode, recorded once the database takes writes."""
        while self._storage_notices:
            notice = self._storage_notices.pop(0)
            await self._db(self._record_notice, notice)
            await self._flush_audit()

    # -- cursor callbacks for intake -----------------------------------------------------------------

    async def _current_resume(self) -> Resume:
        resume = await self._db(load_resume, self.conn)
        assert resume is not None
        self._cursor = resume.cursor
        return resume

    async def _owe_backfill(self, since: int, gap_from: int | None) -> Owed:
        """The connection opened: persist the backfill it owes before anything else happens."""
        self.subscribed.set()
        owed = await self._db(owe_backfill, self.conn, since, gap_from, self.clock())
        self.crash.hit("after_backfill_owed")
        return owed

    async def _drop_cursor(self, cursor: Cursor, body: str) -> None:
        """HTTP 400 to a request carrying a cursor: replay everything, loudly, and tell the owner."""
        detail = refusals.describe_error_body(body)
        notice = notices.fallback_400(cursor.value, cursor.since, detail)
        await self._db(self._record_drop, notice)
        self.counters.extra["fallback_400"] = self.counters.extra.get("fallback_400", 0) + 1
        await self._flush_audit()

    def _record_drop(self, notice: Notice) -> None:
        now = self.clock()
        with db.write_txn(self.conn) as txn:
            self.conn.execute(
                "UPDATE cursor SET kind = 'all', value = 'all', message_time = NULL,"
                " updated_at = ? WHERE id = 1",
                (now,),
            )
            self.owner_queue.notice(txn, notice, now)

    # -- the writer: batch -> transaction -> audit -> resume point -----------------------------------

    async def _writer(self) -> None:
        while True:
            batch = [await self.queue.get()]
            while len(batch) < MAX_BATCH and not self.queue.empty():
                batch.append(self.queue.get_nowait())
            try:
                live: list[intake.Received] = []
                for item in batch:  # in order: a backfill or a refusal ends a run of frames
                    if isinstance(item, intake.Received):
                        live.append(item)
                        continue
                    if live:
                        await self._record(live)
                        live = []
                    if isinstance(item, intake.Backfilled):
                        await self._record_backfill(item)
                    else:
                        await self._record_refusal(item)
                if live:
                    await self._record(live)
            finally:
                for _ in batch:
                    self.queue.task_done()

    async def _record(
        self,
        batch: list[intake.Received] | list[Event | Junk | Notice],
        also: inbox.InTransaction | None = None,
    ) -> inbox.BatchResult:
        frames: list[Event | Junk | Notice] = [
            item.frame if isinstance(item, intake.Received) else item for item in batch
        ]
        write = _BatchWrite(frames, self.clock(), also)
        await self._db(self._write_batch, write, asyncio.get_running_loop())
        result = write.result
        assert result is not None
        self.counters.batches += 1
        self.counters.recorded += result.recorded
        self.counters.duplicates += result.duplicates
        self.counters.conflicts += result.conflicts
        self.counters.quarantined += result.quarantined
        if result.recorded:
            self.counters.last_event_wall = self.clock()
            self._next_release = write.next_release
        self._wake_owner()
        if not write.audit_written:
            return result  # latched: the cursor stays frozen for the life of the process
        self.crash.hit("after_audit_write")
        for candidate in result.candidates:
            item = batch[candidate.index]
            if not isinstance(item, intake.Received):
                continue  # backfilled events never move the cursor: they are off the stream
            self.resume.durable(
                candidate.event_id,
                candidate.message_time,
                cached=candidate.cached,
                read_at=item.read_at,
                generation=item.generation,
            )
        return result

    def _write_batch(self, write: _BatchWrite, loop: asyncio.AbstractEventLoop) -> None:
        """The batch's whole database work in ONE trip to the worker thread: the transaction,
        then the audit flush. `_db` runs this again after a transient storage fault; the
        transaction is committed at most once (`write` remembers it), and the flush writes only
        the lines the files lack, so a fault after the commit repeats nothing."""
        if write.result is None:
            result = inbox.record_batch(
                self.conn,
                write.frames,
                write.now,
                queue=self.owner_queue,
                relay_enabled=self.settings.relay.url is not None,
                feed_append=append_triage_entry,
                also=write.also,
                note_append=append_info_entry,
            )
            # Committed: the owner queue has adopted the batch's cadence decisions already,
            # before the flush (which may queue a notice) decides on them.
            write.result = result
            self.crash.hit("after_inbox_commit")
            if result.released and self.relay is not None:
                # The rows are durable: the relay queues for the lock while the audit is written.
                loop.call_soon_threadsafe(self.relay.wakeup.set)
        if write.result.recorded and not write.release_known:
            write.next_release = outbox.next_release_at(self.conn)
            write.release_known = True
        write.audit_written = self._flush_audit_sync()

    async def _record_backfill(self, backfill: intake.Backfilled) -> None:
        """The poll's events, in batches; the last one also writes the `backfill` audit record,
        the gap notice if any, and clears what was owed, so all of it commits together."""
        events = backfill.events
        totals = {"new": 0, "duplicate": 0}
        chunks = [events[i : i + MAX_BATCH] for i in range(0, len(events), MAX_BATCH)] or [[]]
        for number, chunk in enumerate(chunks):
            frames: list[Event | Junk | Notice] = list(chunk)
            last = number == len(chunks) - 1
            if last and backfill.gap is not None:
                frames.append(self._gap_notice(backfill.gap))

            def finish(conn: sqlite3.Connection, result: inbox.BatchResult) -> None:
                # Nothing is added up in here: a commit that fails runs this again.
                audit.stage(
                    conn,
                    "backfill",
                    self.clock(),
                    since=backfill.owed.since,
                    polled=backfill.polled,
                    new=totals["new"] + result.recorded,
                    duplicate=totals["duplicate"] + result.duplicates,
                    gap=backfill.gap is not None,
                )
                clear_backfill(conn, backfill.owed)

            self.crash.hit("before_backfill_recorded" if last else "backfill_chunk")
            result = await self._record(frames, also=finish if last else None)
            totals["new"] += result.recorded
            totals["duplicate"] += result.duplicates
        log.info("intake.backfill_recorded", since=backfill.owed.since, **totals)
        self.counters.extra["backfills"] = self.counters.extra.get("backfills", 0) + 1
        self.counters.extra["backfill_new"] = (
            self.counters.extra.get("backfill_new", 0) + totals["new"]
        )
        self.counters.extra["backfill_polled"] = (
            self.counters.extra.get("backfill_polled", 0) + backfill.polled
        )

    async def _record_refusal(self, refused: refusals.Refused) -> None:
        notice = notices.subscribe_refused(
            refused.category,
            refused.status,
            refused.code,
            refused.error,
            refused.topics,
            f"{self.boot_id}:{refused.episode}",
        )
        await self._db(self._record_notice, notice)
        await self._flush_audit()

    def _gap_notice(self, gap: intake.GapFound) -> Notice:
        start = _utc(gap.window_start)
        end = _utc(gap.window_end)
        return notices.gap(gap.cursor.value, start, end)

    def _record_notice(self, notice: Notice) -> None:
        with db.write_txn(self.conn) as txn:
            self.owner_queue.notice(txn, notice, self.clock())

    async def _flush_audit(self) -> bool:
        """Write what the audit log is owed (one trip to the worker thread); False if latched."""
        if self.latched:
            self._wake_owner()  # the latch notice, and what else was queued, still go out
            return False
        written = await self._db(self._flush_audit_sync)
        self._wake_owner()
        return written

    def _flush_audit_sync(self) -> bool:
        """In the worker thread. Safe to run again: only lines the files lack are written."""
        if self.latched:
            return False
        try:
            # The flush's own commit (the mark of what the files hold) skips its fsync: losing
            # it costs nothing (lines are found by seq in the files, never written twice), and
            # the next commit makes it durable. One fsync fewer before the relay can claim.
            with db.commits_without_fsync(self.conn):
                audit.flush(self.conn, self._audit)
            if self._note_replaced_audit_files():
                with db.commits_without_fsync(self.conn):
                    audit.flush(self.conn, self._audit)
        except AuditWriteError as exc:
            failure = str(exc)
        else:
            return True
        # Outside the handler: a storage fault while tripping must be judged on its own, not
        # through the audit error it would otherwise be chained to (see storage.classify).
        self._trip_latch_sync(failure)
        return False

    def _wake_owner(self) -> None:
        """Wake the owner sender when a row was queued for it since it was last woken (a flush
        follows every write that may queue one); not on every flush, where it would take the
        database lock twice per event for nothing."""
        if self.owner is None or self.owner_queue.queued == self._owner_woken_for:
            return
        self._owner_woken_for = self.owner_queue.queued
        self.owner.wakeup.set()

    def _note_replaced_audit_files(self) -> bool:
        """An audit file deleted or replaced under us: one notice per time it happened. A notice
        whose transaction fails stays pending, and the re-run of the trip records it."""
        pending = self._replaced_pending
        pending.extend(self._audit.take_replacements())
        noted = bool(pending)
        while pending:
            count = self.counters.extra.get("audit_file_replaced", 0) + 1
            self._record_notice(notices.audit_file_replaced(pending[0], self.boot_id, count))
            detail = pending.pop(0)
            self.counters.extra["audit_file_replaced"] = count
            log.error("audit.file_replaced", detail=detail)
        return noted

    def _trip_latch_sync(self, detail: str) -> None:
        """Freeze the cursor for this process and queue exactly one owner notice."""
        if self.latched:
            return
        # The notice first: a storage fault here is waited out and this run again, which must
        # still record it (its key makes a second attempt a no-op).
        self._record_notice(notices.latch(detail, self.boot_id))
        self.latched = True
        log.error("audit.latched", detail=detail)

    # -- what the ticker moves: the cursor, the last frame's time, debounce releases -----------------

    async def _settle_cursor(self) -> None:
        cursor = self.resume.settle(time.monotonic())
        if cursor is None or self.latched:
            return
        await self._db(save_cursor, self.conn, cursor, self.clock())
        self._cursor = cursor
        self.counters.cursor_moves += 1

    async def _save_frame_time(self) -> None:
        """Persist the server time of the last frame (at most once a second): where the window
        of a possible gap starts after a disconnect, a crash included. Lagging only widens it."""
        seen = self.health.last_server_time
        now = time.monotonic()
        if seen is None or seen == self._saved_frame_time or now - self._frame_time_saved_at < 1:
            return
        await self._db(save_last_frame_time, self.conn, seen)
        self._saved_frame_time, self._frame_time_saved_at = seen, now

    def _release_due(self) -> None:
        """Debounce windows that closed with no new event: freeze and release their requests."""
        with db.write_txn(self.conn):
            outbox.release_due(
                self.conn,
                self.clock(),
                relay_enabled=self.settings.relay.url is not None,
                feed_append=append_triage_entry,
            )
        self._next_release = outbox.next_release_at(self.conn)

    # -- graceful stop -------------------------------------------------------------------------------

    async def _drain(
        self, intake_stop: asyncio.Event, reader: asyncio.Task[None], writer: asyncio.Task[None]
    ) -> None:
        """Graceful stop: keep the stream open for one reorder window so the cursor can settle
        on an id, make everything read durable, move the cursor, then close the stream. After a
        failure there is nothing to drain into: close the stream and leave the rest to replay."""
        if self.failed or writer.done():
            intake_stop.set()
            with contextlib.suppress(Exception):
                await reader
            return
        # Frames already read but not yet durable count too: wait for the writer first, so a
        # stop right after the audit line is written still waits out their window.
        await self._wait_queue_empty()
        if self.resume.oldest_read_at is not None and not reader.done():
            await asyncio.sleep(self.settings.ntfy.reorder_window)
        await self._wait_queue_empty()
        await self._settle_cursor()
        intake_stop.set()
        with contextlib.suppress(Exception):
            await reader
        await self._wait_queue_empty()

    async def _wait_queue_empty(self) -> None:
        await self.queue.join()


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


def _append_to(channel: str) -> Callable[[sqlite3.Connection, str, Any, str, float], None]:
    """A feed appender for one channel, keyed by the delivery key (a replay appends nothing)."""

    def append(conn: sqlite3.Connection, key: str, payload: Any, summary: str, now: float) -> None:
        feed.append(
            conn,
            channel,
            payload,
            delivery_key=key,
            sender=FEED_SENDER,
            summary=summary,
            idempotency_key=key,
            now=now,
        )

    return append


append_triage_entry = _append_to(TRIAGE_CHANNEL)
append_info_entry = _append_to(INFO_CHANNEL)


def _utc(ts: int) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
