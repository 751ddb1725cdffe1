"""The audit side of every write: what the audit log is owed, written; the latch; notices.

Outcomes reach the audit journal inside their own transactions; `flush` appends what the files
lack to the JSONL log, flush + fsync (audit.flush), and never writes a line twice. A write that
fails trips the latch: the cursor freezes for the life of the process and the owner gets exactly
one notice. Notices (from intake, the relay, vitals, storage) and agents' replies reach the owner
queue here, each in its own transaction; a flush follows each, and wakes the owner sender only
when something was queued for it.

On a PostgreSQL standby, `mirror` keeps this node's audit files a copy of the shared journal
(DESIGN.md section 9): it appends what the journal holds beyond them and writes nothing to the
database, so it latches nothing and queues no notice. A failing audit directory is logged once
and kept in `mirror_failure` (health can show it) until an append succeeds again; what the files
can no longer get from the journal (the node was down past its window) is logged once per gap.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import structlog

from ntfy_intake.errors import AuditWriteError
from ntfy_intake.flow.database import Database
from ntfy_intake.flow.pipeline import CountedOwnerQueue, Counters
from ntfy_intake.rules import notices
from ntfy_intake.rules.notices import Notice
from ntfy_intake.store import audit, audit_mirror, db

log = structlog.get_logger("ntfy_intake.pipeline")

# Journal rows appended per trip to the worker thread: a standby catching up on a long backlog
# lets the feed's reads and acks in between (each trip is `MIRROR_LIMIT / audit.MIRROR_BATCH`
# fsynced appends).
MIRROR_LIMIT = 5000

# How long the audit mark may wait for a write transaction to ride: its readers
# (status's "audit unflushed", retention) see it at most this much behind the files when idle.
# Past the second a batch waits before it carries a rider (transaction.RIDE_AFTER_S), so while
# events flow a batch carries it and the ticker's own write is for when they stop.
MARK_OWED_AT_MOST = 2.0


class Journal:
    """The audit log's writer, the latch and the owner notices (module doc)."""

    def __init__(
        self,
        database: Database,
        audit_log: audit.AuditLog,
        *,
        owner_queue: CountedOwnerQueue,
        counters: Counters,
        clock: Callable[[], float],
        boot_id: str,
    ) -> None:
        self._database = database
        self._audit = audit_log
        self._owner_queue = owner_queue
        self._counters = counters
        self._clock = clock
        self._boot_id = boot_id
        self.latched = False
        self._replaced_pending: list[str] = []  # replaced audit files whose notice is not recorded
        self._owner_wakeup: asyncio.Event | None = None
        self._owner_woken_for = 0
        self.mirror_failure: str | None = None  # the audit write a standby's mirror fails on
        self._gap_told: tuple[int, int] | None = None

    def wake_owner_sender_with(self, wakeup: asyncio.Event) -> None:
        """The owner sender runs now: wake it through `wakeup` when a row is queued for it."""
        self._owner_wakeup = wakeup

    @property
    def last_written_seq(self) -> int:
        """The last journal seq the audit files hold."""
        return self._audit.last_seq

    def close(self) -> None:
        self._audit.close()

    # -- notices -------------------------------------------------------------------------------------

    def record_notice(self, notice: Notice) -> None:
        """In the worker thread: queue `notice` for the owner, in its own transaction."""
        with db.write_txn(self._database.conn) as txn:
            self._owner_queue.notice(txn, notice, self._clock())

    async def note(self, notice: Notice) -> None:
        """Record `notice`, then write what the audit log is owed."""
        await self._database.run(self.record_notice, notice)
        await self.flush()

    async def queue_agent_reply(
        self, text: str, idempotency_key: str
    ) -> tuple[int, dict[str, Any]]:
        """`POST /v1/notify`: an agent's later reply, through the owner outbox (stable key)."""
        key = f"agent:{idempotency_key}"
        result = await self._database.run(self._queue_agent_message, key, text)
        await self.flush()
        return 202 if result != "duplicate" else 200, {"key": key, "result": result}

    def _queue_agent_message(self, key: str, text: str) -> str:
        with db.write_txn(self._database.conn) as txn:
            result, _ = self._owner_queue.triage_message(txn, key, text, self._clock())
        return result

    # -- the audit log -------------------------------------------------------------------------------

    async def flush(self) -> bool:
        """Write what the audit log is owed (one trip to the worker thread); False if latched."""
        if self.latched:
            self.wake_owner()  # the latch notice, and what else was queued, still go out
            return False
        written = await self._database.run(self.flush_sync)
        self.wake_owner()
        return written

    def flush_sync(self) -> bool:
        """In the worker thread. Safe to run again: only lines the files lack are written."""
        if self.latched:
            return False
        conn = self._database.conn
        try:
            # The mark of what the files hold rides the next write transaction (the next
            # batch's when live): losing it costs nothing (lines are found by seq in the files,
            # never written twice). No transaction of its own per event (`write_owed_mark`
            # writes it, without an fsync, when no write came to carry it), so none here.
            audit.flush(conn, self._audit, mark_rides=True)
            if self._note_replaced_audit_files():
                audit.flush(conn, self._audit, mark_rides=True)
        except AuditWriteError as exc:
            failure = str(exc)
        else:
            return True
        # Outside the handler: a storage fault while tripping must be judged on its own, not
        # through the audit error it would otherwise be chained to (see storage.classify).
        self.latch(failure)
        return False

    def recover(self) -> None:
        """At start-up: write the records that reached the database but not the log."""
        try:
            written = audit.recover(self._database.conn, self._audit)
            if written:
                log.warning("audit.recovered", lines=written)
        except AuditWriteError as exc:
            self.latch(str(exc))

    async def mirror(self) -> int:
        """A standby's step: append every journal row beyond this node's files, in seq order,
        one trip to the worker thread per `MIRROR_LIMIT` rows; return how many were appended
        (0 while the audit directory refuses writes: `mirror_failure`)."""
        total = 0
        while True:
            appended = await self._database.run(self.mirror_sync)
            total += appended
            if appended < MIRROR_LIMIT:
                return total

    def mirror_sync(self, limit: int = MIRROR_LIMIT) -> int:
        """In the worker thread: `audit.mirror`, at most `limit` rows; reads the database only.
        Safe to run again after any failure: the files' own last seq decides what follows."""
        conn = self._database.conn
        try:
            gap = audit_mirror.unreachable(conn, self._audit)
            if gap is not None and gap != self._gap_told:
                log.error("audit.mirror_gap", first=gap[0], last=gap[1])
            self._gap_told = gap
            appended = audit.mirror(conn, self._audit, limit=limit)
        except AuditWriteError as exc:
            if self.mirror_failure is None:
                log.error("audit.mirror_failed", detail=str(exc))
            self.mirror_failure = str(exc)
            return 0
        if self.mirror_failure is not None:
            log.warning("audit.mirror_recovered", lines=appended)
            self.mirror_failure = None
        return appended

    async def write_owed_mark(self, now: float) -> None:
        """The ticker's: a mark owed (`flush_sync`) since `MARK_OWED_AT_MOST` before
        `now` (monotonic), because no write came to carry it, in a transaction of its own."""
        since = db.owed_since(self._database.conn)
        if since is not None and now - since >= MARK_OWED_AT_MOST:
            await self._database.run(audit.write_owed_mark, self._database.conn)

    async def flush_at_stop(self) -> None:
        """The last flush; when latched, try once more: the space may be back, and what the log
        is owed is better written now (never twice: the writer knows its last seq) than left
        to the next start. Then the owed mark, if any."""
        await self.flush()
        if self.latched:
            with contextlib.suppress(AuditWriteError):
                await self._database.run(audit.flush, self._database.conn, self._audit)
        await self._database.run(audit.write_owed_mark, self._database.conn)

    def latch(self, detail: str) -> None:
        """In the worker thread: freeze the cursor for this process and queue exactly one owner
        notice."""
        if self.latched:
            return
        # The notice first: a storage fault here is waited out and this run again, which must
        # still record it (its key makes a second attempt a no-op).
        self.record_notice(notices.latch(detail, self._boot_id))
        self.latched = True
        log.error("audit.latched", detail=detail)

    def wake_owner(self) -> None:
        """Wake the owner sender when a row was queued for it since it was last woken (a flush
        follows every write that may queue one); not on every flush, where it would take the
        database lock twice per event for nothing."""
        queued = self._owner_queue.queued
        if self._owner_wakeup is None or queued == self._owner_woken_for:
            return
        self._owner_woken_for = queued
        self._owner_wakeup.set()

    def _note_replaced_audit_files(self) -> bool:
        """An audit file deleted or replaced under us: one notice per time it happened. A notice
        whose transaction fails stays pending, and the re-run of the trip records it."""
        pending = self._replaced_pending
        pending.extend(self._audit.take_replacements())
        noted = bool(pending)
        while pending:
            count = self._counters.extra.get("audit_file_replaced", 0) + 1
            self.record_notice(notices.audit_file_replaced(pending[0], self._boot_id, count))
            detail = pending.pop(0)
            self._counters.extra["audit_file_replaced"] = count
            log.error("audit.file_replaced", detail=detail)
        return noted
