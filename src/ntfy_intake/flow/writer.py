"""The writer: `Writer.record` takes a batch of frames to recorded outcomes, top to bottom. How
one event goes (the inbox transaction, the audit line, the cursor) is told once, in
docs/architecture.md ("The flow of one event").

Here besides: the one trip to the worker thread per batch (`_write_batch`, safe to re-run after
a storage fault), the backfill poll's batches, intake's cursor questions (where to resume, the
backfill a new connection owes, a cursor ntfy refused), the cursor and frame time the ticker
persists, and the debounce windows that closed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog

from ntfy_intake.flow import intake
from ntfy_intake.flow.database import Database
from ntfy_intake.flow.journal import Journal
from ntfy_intake.flow.pipeline import (
    CountedOwnerQueue,
    Counters,
    CrashPoints,
    append_info_entry,
    append_triage_entry,
)
from ntfy_intake.rules import notices
from ntfy_intake.rules.notices import Notice
from ntfy_intake.store import audit, db, inbox, inbox_batch, outbox, replay
from ntfy_intake.store.cursor import (
    Cursor,
    Owed,
    Resume,
    ResumePoint,
    load_resume,
    owe_backfill,
    owe_last_frame_time,
    save_last_frame_time,
)
from ntfy_intake.store.cursor import backfill_done as clear_backfill
from ntfy_intake.store.cursor import owe as owe_cursor
from ntfy_intake.store.cursor import save as save_cursor
from ntfy_intake.wire import refusals
from ntfy_intake.wire.frames import Event, Junk

log = structlog.get_logger("ntfy_intake.pipeline")

MAX_BATCH = 500
# While events flow, the settled cursor is persisted at most this often: a save every tick was a
# write transaction queued ahead of the next event's batch. Lagging only means a restart resumes
# a little earlier (the replayed events are duplicates); the overlap backfill reaches further.
CURSOR_SAVE_EVERY = 1.0

Frames = list[Event | Junk | Notice]


class RelayDoor(Protocol):
    """What the writer sees of the relay: the rows a release may lease to it in the release's
    own transaction (outbox.ask_hand_off), handed over once committed, and a wake for the rest."""

    def wake(self) -> None: ...

    def room(self) -> outbox.HandOff | None: ...

    def take(self, claims: list[outbox.Claim]) -> None: ...


@dataclass(slots=True)
class _BatchWrite:
    """One batch on its way to disk, and how far it got (see `Writer._write_batch`)."""

    frames: Frames
    now: float
    also: inbox.InTransaction | None
    hand_off: outbox.HandOff | None = None
    result: inbox_batch.BatchResult | None = None
    next_release: float | None = None
    release_known: bool = False
    audit_written: bool = False


class Writer:
    """Batches of frames to recorded outcomes (docs/architecture.md, "The flow of one event")."""

    def __init__(
        self,
        database: Database,
        journal: Journal,
        *,
        queue: asyncio.Queue[intake.Item],
        resume: ResumePoint,
        counters: Counters,
        owner_queue: CountedOwnerQueue,
        clock: Callable[[], float],
        crash: CrashPoints,
        relay_enabled: bool,
        boot_id: str,
    ) -> None:
        self._database = database
        self._journal = journal
        self.queue = queue
        self.resume = resume
        self._counters = counters
        self._owner_queue = owner_queue
        self._clock = clock
        self._crash = crash
        self._relay_enabled = relay_enabled
        self._boot_id = boot_id
        self._relay: RelayDoor | None = None
        self.subscribed = asyncio.Event()  # set when a subscription first opens
        self._between_batches = asyncio.Event()  # clear while a batch is recorded (`batch_done`)
        self._between_batches.set()
        self.cursor: Cursor | None = None  # the cursor last saved, or owed to the next write
        self.next_release: float | None = None  # when the next debounce window closes
        self._saved_frame_time: int | None = None  # the last server time persisted
        self._settled: Cursor | None = None  # settled, not yet persisted (`CURSOR_SAVE_EVERY`)
        self._backfilled: inbox_batch.Candidate | None = None  # a poll's newest cached event
        self._cursor_saved_at = float("-inf")  # monotonic
        self._frame_time_saved_at = 0.0
        self._cursor_just_saved = False  # by the ticker's pass that asks `save_frame_time` next
        # Told after each committed batch that recorded events (the ticker's `batch_committed`):
        # the ticker looks again if the batch brings a due time before it wakes anyway (a new
        # reorder window to wait out, a debounce window that closes sooner).
        self.due_moved: Callable[[], None] = lambda: None
        # Told each committed batch's records, in the event loop (the expectations' watch):
        # in-memory state changes only after COMMIT, so a rolled-back batch is never seen.
        self.on_committed: Callable[[list[dict[str, Any]]], None] | None = None

    def start_from(self, cursor: Cursor, next_release: float | None) -> None:
        """After local recovery: the cursor persisted, when the next debounce window closes."""
        self.cursor = cursor
        self.next_release = next_release

    def wake_relay_with(self, relay: RelayDoor) -> None:
        """The relay runs now: a release hands it the rows it has room for, and wakes it for the
        rest (it claims them itself)."""
        self._relay = relay

    # -- the loop: batches off the queue, in order ---------------------------------------------------

    async def run(self) -> None:
        while True:
            batch = [await self.queue.get()]
            self._between_batches.clear()
            while len(batch) < MAX_BATCH and not self.queue.empty():
                batch.append(self.queue.get_nowait())
            try:
                live: list[intake.Received] = []
                for item in batch:  # in order: a backfill or a refusal ends a run of frames
                    if isinstance(item, intake.Received):
                        live.append(item)
                        continue
                    if live:
                        await self.record(live)
                        live = []
                    if isinstance(item, intake.Backfilled):
                        await self.record_backfill(item)
                    else:
                        await self.record_refusal(item)
                if live:
                    await self.record(live)
            finally:
                for _ in batch:
                    self.queue.task_done()
                self._between_batches.set()

    async def wait_idle(self) -> None:
        """Until everything put on the queue so far is recorded."""
        await self.queue.join()

    async def batch_done(self) -> None:
        """Until the batch being recorded, if any, is: its events count for the cursor only once
        the worker thread is back, after its audit line is on disk (a handover's cursor)."""
        await self._between_batches.wait()

    def stopping(self) -> None:
        """The drain began: a storage fault being waited out is retried at once (Database.hurry)."""
        self._database.hurry()

    # -- one batch, top to bottom --------------------------------------------------------------------

    async def record(
        self,
        batch: list[intake.Received] | Frames,
        also: inbox.InTransaction | None = None,
    ) -> inbox_batch.BatchResult:
        """frame -> inbox transaction -> audit line -> cursor, for one batch."""
        frames: Frames = [
            item.frame if isinstance(item, intake.Received) else item for item in batch
        ]
        # The inbox transaction, then the audit line: one trip to the worker thread.
        room = self._relay.room() if self._relay is not None else None
        write = _BatchWrite(frames, self._clock(), also, room)
        await self._database.run(self._write_batch, write, asyncio.get_running_loop())
        result = write.result
        assert result is not None
        # Committed: add it up (a re-run after a storage fault counts nothing twice).
        self._counters.batches += 1
        self._counters.recorded += result.recorded
        self._counters.duplicates += result.duplicates
        self._counters.conflicts += result.conflicts
        self._counters.quarantined += result.quarantined
        if result.recorded:
            self._counters.last_event_wall = self._clock()
            self.next_release = write.next_release
            if self.on_committed is not None:
                self.on_committed(result.records)
        self._journal.wake_owner()
        if not write.audit_written:
            self._due_moved(result)
            return result  # latched: the cursor stays frozen for the life of the process
        self._crash.hit("after_audit_write")
        # The cursor: only over events whose audit line is durable, and stream events (a
        # poll's only from a time: `_adopt_backfilled`). settle_cursor persists it after the
        # window.
        for candidate in result.candidates:
            item = batch[candidate.index]
            if not isinstance(item, intake.Received):
                if candidate.cached:  # a poll's, in its order: the newest comes last
                    self._backfilled = candidate
                continue
            self.resume.durable(
                candidate.event_id,
                candidate.message_time,
                cached=candidate.cached,
                read_at=item.read_at,
                generation=item.generation,
            )
        self._due_moved(result)
        return result

    def _due_moved(self, result: inbox_batch.BatchResult) -> None:
        """Once the batch's events await their reorder window: tell the ticker (`due_moved`)."""
        if result.recorded:
            self.due_moved()

    def _write_batch(self, write: _BatchWrite, loop: asyncio.AbstractEventLoop) -> None:
        """In the worker thread: the batch's transaction, then the audit flush. The database
        runs this again after a transient storage fault; the transaction is committed at most
        once (`write` remembers it), and the flush writes only the lines the files lack, so a
        fault after the commit repeats nothing."""
        conn = self._database.conn
        if write.result is None:
            result = inbox.record_batch(
                conn,
                write.frames,
                write.now,
                queue=self._owner_queue,
                relay_enabled=self._relay_enabled,
                feed_append=append_triage_entry,
                also=write.also,
                note_append=append_info_entry,
                hand_off=write.hand_off,
            )
            # Committed: the owner queue has adopted the batch's cadence decisions already,
            # before the flush (which may queue a notice) decides on them.
            write.result = result
            self._crash.hit("after_inbox_commit")
            if result.released and self._relay is not None:
                # The rows are durable: the handed ones go out while the audit is written, and
                # the relay queues for the lock to claim the rest.
                loop.call_soon_threadsafe(self._hand_over, result.released, result.handed)
        if write.result.recorded and not write.release_known:
            # Read in the batch's transaction when it could be (not one by one, after a value
            # broke the batch): no statement of its own then.
            known = write.result.release_known
            write.next_release = (
                write.result.next_release if known else outbox.next_release_at(conn)
            )
            write.release_known = True
        write.audit_written = self._journal.flush_sync()

    async def settle_cursor(self, *, at_once: bool = False, whole: bool = False) -> None:
        """Persist the cursor over the events whose reorder window has passed (never latched):
        at most once per `CURSOR_SAVE_EVERY`, unless `at_once` (the drain). `whole`: over every
        durable event, window or not (a node handing over: the next leader's overlap backfill
        catches what a reorder would have delivered late)."""
        now = time.monotonic()
        horizon = now + self.resume.reorder_window if whole else now
        self._settled = self.resume.settle(horizon) or self._settled
        cursor = self._settled
        if cursor is None or self._journal.latched:
            return
        if not at_once and now - self._cursor_saved_at < CURSOR_SAVE_EVERY:
            return
        # Live, it rides the next write (store/cursor.owe): a lone alert's store costs one
        # fsync, not two. A drain or a handover saves it at once.
        conn = self._database.conn
        if at_once or not owe_cursor(conn, cursor, self._clock()):
            await self._database.run(save_cursor, conn, cursor, self._clock())
        self.cursor, self._settled, self._cursor_saved_at = cursor, None, now
        self._cursor_just_saved = True
        self._counters.cursor_moves += 1

    # -- a backfill poll, a refused subscription -----------------------------------------------------

    async def record_backfill(self, backfill: intake.Backfilled) -> None:
        """The poll's events, in batches; the last one also writes the `backfill` audit record,
        the gap notice if any, and clears what was owed, so all of it commits together."""
        events = backfill.events
        totals = {"new": 0, "duplicate": 0}
        chunks = [events[i : i + MAX_BATCH] for i in range(0, len(events), MAX_BATCH)] or [[]]
        for number, chunk in enumerate(chunks):
            frames: Frames = list(chunk)
            last = number == len(chunks) - 1
            if last and backfill.gap is not None:
                frames.append(_gap_notice(backfill.gap))

            def finish(conn: db.Connection, result: inbox_batch.BatchResult) -> None:
                # Nothing is added up in here: a commit that fails runs this again.
                audit.stage(
                    conn,
                    "backfill",
                    self._clock(),
                    since=backfill.owed.since,
                    polled=backfill.polled,
                    new=totals["new"] + result.recorded,
                    duplicate=totals["duplicate"] + result.duplicates,
                    gap=backfill.gap is not None,
                )
                clear_backfill(conn, backfill.owed)

            self._crash.hit("before_backfill_recorded" if last else "backfill_chunk")
            result = await self.record(frames, also=finish if last else None)
            totals["new"] += result.recorded
            totals["duplicate"] += result.duplicates
        self._adopt_backfilled()
        log.info("intake.backfill_recorded", since=backfill.owed.since, **totals)
        self._counters.add("backfills")
        self._counters.add("backfill_new", totals["new"])
        self._counters.add("backfill_polled", backfill.polled)

    def _adopt_backfilled(self) -> None:
        """The newest cached event of a poll becomes the cursor to save when the one persisted
        is a time (a first start's join, a history) and no live event settled one: a graceful
        stop leaves an id cursor once any event was recorded (DESIGN.md section 3), so that a
        restart after a cache loss can ask after it (the gap probe). Every event the cache held
        before it was in that poll and is recorded with its audit line: a resume from it leaves
        nothing unread. A live event settling later takes its place, as ever."""
        newest, self._backfilled = self._backfilled, None
        if newest is None or self._settled is not None:
            return
        if self.cursor is not None and self.cursor.kind == "id":
            return
        self._settled = Cursor.at_id(newest.event_id, newest.message_time)
        self.due_moved()

    async def record_refusal(self, refused: refusals.Refused) -> None:
        await self._journal.note(
            notices.subscribe_refused(
                refused.category,
                refused.status,
                refused.code,
                refused.error,
                refused.topics,
                f"{self._boot_id}:{refused.episode}",
            )
        )

    # -- intake's cursor questions -------------------------------------------------------------------

    async def current_resume(self) -> Resume:
        resume = await self._database.run(self._load_resume)
        assert resume is not None
        self.cursor = resume.cursor
        return resume

    def _load_resume(self) -> Resume | None:
        """In the worker thread: an owed cursor written first (unsynced, with whatever else is
        owed), so a reconnect resumes where this process settled, not where the store lags."""
        audit.write_owed_mark(self._database.conn)
        return load_resume(self._database.conn)

    async def owe_backfill(self, since: int, gap_from: int | None) -> Owed:
        """The connection opened: persist the backfill it owes before anything else happens."""
        self.subscribed.set()
        owed = await self._database.run(
            owe_backfill, self._database.conn, since, gap_from, self._clock()
        )
        self._crash.hit("after_backfill_owed")
        return owed

    async def drop_cursor(self, cursor: Cursor, body: str) -> None:
        """HTTP 400 to a request carrying a cursor: replay everything, loudly, and tell the owner."""
        detail = refusals.describe_error_body(body)
        notice = notices.fallback_400(cursor.value, cursor.since, detail)
        await self._database.run(self._record_drop, notice)
        self._settled = None  # the refused cursor's successors are not saved over the reset
        self._counters.add("fallback_400")
        await self._journal.flush()

    def _record_drop(self, notice: Notice) -> None:
        now = self._clock()
        # carry_all: an owed cursor goes first, so the reset is the cursor that stays.
        with db.write_txn(self._database.conn, carry_all=True) as txn:
            replay.from_the_start(txn.conn, now)
            self._owner_queue.notice(txn, notice, now)

    # -- what the ticker moves besides the cursor ----------------------------------------------------

    async def save_frame_time(self, seen: int | None) -> None:
        """Persist the server time of the last frame (at most once a second, but with a cursor
        save): where the window of a possible gap starts after a disconnect, a crash included.
        Lagging only widens it, so it rides the next write transaction (no trip to the worker
        thread of its own)."""
        now = time.monotonic()
        # With the cursor's save it goes sooner: the two are then due together, one pass a
        # second while events flow instead of two a few ms apart.
        joins, self._cursor_just_saved = self._cursor_just_saved, False
        if seen is None or seen == self._saved_frame_time:
            return
        if now - self._frame_time_saved_at < 1 and not joins:
            return
        if not owe_last_frame_time(self._database.conn, seen):
            await self._database.run(save_last_frame_time, self._database.conn, seen)
        self._saved_frame_time, self._frame_time_saved_at = seen, now

    def next_due(self, now: float, wall: float) -> list[float | None]:
        """The monotonic times the ticker's writer work next falls due: the reorder window's end
        for the oldest unsettled event (no sooner than the cursor may be saved again: settling
        one event a pass while events flow woke the ticker once per event for nothing), a
        settled cursor's save, the next debounce window's close (wall clock `wall` read at
        monotonic `now`). The last frame time's is `lazy_due`."""
        oldest = self.resume.oldest_read_at
        saveable = self._cursor_saved_at + CURSOR_SAVE_EVERY
        return [
            None if oldest is None else max(oldest + self.resume.reorder_window, saveable),
            None if self._settled is None else self._cursor_saved_at + CURSOR_SAVE_EVERY,
            None if self.next_release is None else now + (self.next_release - wall),
        ]

    def lazy_due(self, seen: int | None) -> float | None:
        """When the last frame time's save falls due (`seen`: the server time last read): work
        that may lag to share a pass with the cursor's (rules/ticks.wait, `lazy`)."""
        if seen is None or seen == self._saved_frame_time:
            return None
        return self._frame_time_saved_at + 1

    async def release_due(self) -> None:
        """Debounce windows that closed with no new event: freeze and release their requests."""
        if self.next_release is None or self.next_release > self._clock():
            return
        room = self._relay.room() if self._relay is not None else None
        released, handed = await self._database.run(self._release_due, room)
        if released:
            self._hand_over(released, handed)

    def _release_due(self, room: outbox.HandOff | None) -> tuple[list[str], list[outbox.Claim]]:
        conn = self._database.conn
        now = self._clock()
        with db.write_txn(conn):
            released = outbox.release_due(
                conn, now, relay_enabled=self._relay_enabled, feed_append=append_triage_entry
            )
            handed = outbox.ask_hand_off(conn, released, now, room)
        self.next_release = outbox.next_release_at(conn)
        return released, handed()

    def _hand_over(self, released: list[str], handed: list[outbox.Claim]) -> None:
        """In the event loop, once the release committed: the relay starts what it was handed
        and is woken to claim what it was not."""
        if self._relay is None:
            return
        if handed:
            self._relay.take(handed)
        if len(handed) < len(released):
            self._relay.wake()


def _gap_notice(gap: intake.GapFound) -> Notice:
    start = datetime.fromtimestamp(gap.window_start, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    end = datetime.fromtimestamp(gap.window_end, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return notices.gap(gap.cursor.value, start, end)
