"""The daemon: local recovery, then intake -> inbox transaction -> audit -> cursor, until stopped.

Reading order of one event (docs/design.md section 2):
  Intake reads a frame and queues it                      (intake.py, no database)
  the writer takes a batch, records it in ONE transaction  (inbox.record_batch)
  appends the batch's audit records, flush + fsync         (audit.flush)
  and hands the durable events to the resume point         (cursor.ResumePoint)
  the ticker moves the persisted cursor once the reorder window has passed (cursor.save).
The relay and the agent feed read the outbox on their own; a webhook outage never stalls intake.

All database work runs in a worker thread under one lock, so the event loop keeps reading the
socket (and the keepalive watchdog keeps time) while SQLite fsyncs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import os
import signal
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import httpx
import structlog
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from ntfy_intake import (
    audit,
    cadence,
    db,
    diagnose,
    feed,
    http_api,
    inbox,
    intake,
    notices,
    outbox,
    owner,
    rebuild,
    refusals,
    rehydrate,
    relay,
    retention,
    schema,
    storage,
    watchdog,
)
from ntfy_intake import health as health_model
from ntfy_intake.clock import TrustedClock
from ntfy_intake.cursor import (
    Cursor,
    Owed,
    Resume,
    ResumePoint,
    load_resume,
    owe_backfill,
    save_last_frame_time,
)
from ntfy_intake.cursor import backfill_done as clear_backfill
from ntfy_intake.cursor import load as load_cursor
from ntfy_intake.cursor import save as save_cursor
from ntfy_intake.errors import AuditWriteError, StartupError, StateLockedError
from ntfy_intake.frames import Event, Junk
from ntfy_intake.owner_queue import Notice, OwnerQueue
from ntfy_intake.sdnotify import Notifier
from ntfy_intake.settings import Settings

log = structlog.get_logger("ntfy_intake.daemon")

MAX_BATCH = 500
STORAGE_RETRY_BASE = 0.1
STORAGE_RETRY_CAP = 5.0
TICK_SECONDS = 0.05
HEALTH_EVERY = 2.0
HEALTH_KEY = "health"
FEED_SENDER = "ntfy-intake"
TRIAGE_CHANNEL = "triage"
INFO_CHANNEL = "incident_info"  # device deletes/clears that came after their request went out

P = ParamSpec("P")
T = TypeVar("T")


def migrations() -> list[db.Migration]:
    return [
        *schema.CORE,
        *((name, list(sql)) for name, sql in feed.FEED_MIGRATIONS),
        *((name, list(sql)) for name, sql in owner.OWNER_MIGRATIONS),
    ]


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


class Daemon:
    def __init__(
        self,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
        crash_points: CrashPoints | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        backoff_base: float = 1.0,
        relay_retry_base: float = relay.RETRY_BASE,
        owner_retry_base: float = 2.0,
        notifier: Notifier | None = None,
        watchdog_interval: float | None = None,
    ) -> None:
        self.settings = settings
        # Every wall-clock reading goes through the server-checked clock (clock.py): a local
        # clock jump never moves cadence windows, the daily cap, retention or audit days.
        self.trusted_clock = TrustedClock(clock)
        self.clock: Callable[[], float] = self.trusted_clock
        self.crash = crash_points or CrashPoints(None)
        self.transport = transport
        # Test seams, not configuration: tests shorten the backoff schedules.
        self.backoff_base = backoff_base
        self.relay_retry_base = relay_retry_base
        self.owner_retry_base = owner_retry_base
        self.boot_id = uuid.uuid4().hex[:12]
        self.health = intake.IntakeHealth()
        self.counters = Counters()
        self.resume = ResumePoint(settings.ntfy.reorder_window)
        self.latched = False
        self.failed = False  # a task died: exit non-zero so systemd restarts us
        self.policy = cadence.Policy(
            debounce=settings.cadence.debounce,
            cooldown=settings.cadence.cooldown,
            daily_cap=settings.cadence.daily_cap,
            timezone=settings.cadence.timezone,
        )
        # Rebuilt from the audit log in recover(); the audit log is the only cadence store.
        self.owner_queue = OwnerQueue(self.policy, cadence.CadenceState.empty(self.policy))
        self.queue: asyncio.Queue[intake.Item] = asyncio.Queue()
        self._saved_frame_time: int | None = None  # last server time persisted (gap windows)
        self._frame_time_saved_at = 0.0
        self._db_lock = asyncio.Lock()
        self._conn: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self.relay: relay.Relay | None = None
        self.owner: owner.OwnerSender | None = None
        self._next_release: float | None = None
        self._audit = audit.AuditLog(settings.state.audit_dir, self.clock)
        self._cursor: Cursor | None = None
        self.ready = asyncio.Event()
        self.notifier = notifier or Notifier(None)
        self.watchdog_interval = watchdog_interval
        self.heartbeat_at = time.monotonic()  # the ticker's last pass: proves the loop turns
        self.liveness = watchdog.LivenessTracker(
            started_at=time.monotonic(),
            keepalive_timeout=settings.ntfy.keepalive_timeout,
            dead_after=settings.ntfy.dead_after,
            recover_after=settings.ntfy.keepalive_interval,
        )
        self._seen_frame_at: float | None = None
        self._wedged = False  # test hook: the ticker stops turning (a stuck task)
        self.watchdog_pings = 0
        self.dead_mans_pings = 0
        self.http_port: int | None = None
        self.http_error: str | None = None
        self._cached_counts: dict[str, Any] = {}
        # Health: wall-clock times, as in the stored snapshot that `status` reads.
        self.started_wall = time.time()
        self.health_limits = health_model.Limits(
            keepalive_timeout=settings.ntfy.keepalive_timeout,
            dead_after=settings.ntfy.dead_after,
        )
        self.degraded: dict[str, str] = {}  # source -> one-line reason (other modules may set)
        self._error_seen: tuple[int, str | None] = (0, None)
        self.last_error_wall: float | None = None
        # A transient storage failure being waited out (None: storage is fine).
        self.storage_wait: storage.StorageFault | None = None
        self.storage_episodes = 0
        self._storage_failed_fn: object = None
        self._storage_notices: list[Notice] = []

    # -- database access: one lock, one worker thread at a time ------------------------------

    @property
    def conn(self) -> sqlite3.Connection:
        assert self._conn is not None, "daemon not started"
        return self._conn

    async def _db(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `fn` in the worker thread. A transient storage failure (the database locked by
        another process past the busy timeout, a full disk, an I/O error) is waited out with
        backoff and `fn` run again: every database function here is one transaction that
        rolled back whole. Health is degraded meanwhile; nothing exits."""
        delay = STORAGE_RETRY_BASE
        while True:
            async with self._db_lock:
                try:
                    result = await asyncio.to_thread(fn, *args, **kwargs)
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

    async def _observe_server_time(self, response: httpx.Response) -> None:
        """ntfy's `Date` header: the server time the local clock is checked against."""
        if str(response.request.url).startswith(self.settings.ntfy.url):
            self.trusted_clock.observe_date_header(response.headers.get("date"))

    async def _notice_clock_jumps(self) -> None:
        for detail in self.trusted_clock.take_jumps():
            log.error("clock.jump", detail=detail)
            count = self.trusted_clock.jumps
            await self._db(self._record_notice, storage.clock_jump(detail, self.boot_id, count))
            await self._flush_audit()

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
            storage.database_locked(fault.detail, episode)
            if fault.kind == "locked"
            else storage.storage_fault(fault, episode)
        )

    async def _send_storage_notices(self) -> None:
        """One owner notice per storage episode, recorded once the database takes writes."""
        while self._storage_notices:
            notice = self._storage_notices.pop(0)
            await self._db(self._record_notice, notice)
            await self._flush_audit()

    # -- lifecycle -------------------------------------------------------------------------------

    def recover(self) -> None:
        """Local recovery, before READY: open the store, migrate, replay unwritten audit records.

        A storage failure here names itself; a permanent one is a StartupError (exit 2)."""
        problem = storage.check_state_dir(self.settings.state.dir)
        if problem is not None:
            raise StartupError(problem)
        try:
            self._recover()
        except (sqlite3.Error, OSError) as exc:
            if self._conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.close()
                self._conn = None
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
            raise storage.startup_error(exc, self.settings.state.database) from exc

    def _recover(self) -> None:
        problem = storage.check_audit_files(
            self.settings.state.audit_dir, audit.log_files(self.settings.state.audit_dir)[-1:]
        )
        if problem is not None:
            raise StartupError(problem)
        self._lock_fd = _exclusive_lock(self.settings.state.dir / "daemon.lock")
        rebuild.remove_orphan_wal(self.settings.state.database)
        self._conn = db.connect(self.settings.state.database)
        db.migrate(self._conn, migrations())
        rebuilt = self._rebuild_from_audit()
        self._rehydrate_cadence()
        if rebuilt is not None:
            self._record_notice(storage.rebuilt_from_audit(str(rebuilt), self.boot_id))
        try:
            written = audit.recover(self._conn, self._audit)
            if written:
                log.warning("audit.recovered", lines=written)
        except AuditWriteError as exc:
            self._trip_latch_sync(str(exc))
        cursor = load_cursor(self._conn)
        if cursor is None:
            cursor = self._first_cursor()
            save_cursor(self._conn, cursor, self.clock())
            log.info("intake.first_start", since=cursor.since)
        self._cursor = cursor
        self._next_release = outbox.next_release_at(self._conn)

    def _rebuild_from_audit(self) -> rebuild.Summary | None:
        """A missing or empty database beside an audit log is not a first start."""
        if not rebuild.is_empty(self.conn):
            return None
        summary = rebuild.from_audit(
            self.conn,
            self.settings.state.audit_dir,
            self.clock(),
            debounce=self.policy.debounce,
            relay_enabled=self.settings.relay.url is not None,
            feed_append=_feed_append,
        )
        if summary is not None:
            log.warning("database.rebuilt_from_audit", summary=str(summary))
        return summary

    def _rehydrate_cadence(self) -> None:
        """Cadence state from the audit log (only the files the longest window needs), plus the
        records that reached SQLite but not yet the log: together, every recorded outcome."""
        started = time.monotonic()
        # Before ntfy answers, the newest server time recorded bounds a local clock that jumped
        # ahead while we were down: pruning by it keeps cooldowns and the day's cap (clock.py).
        now = self.clock()
        newest = self.conn.execute("SELECT max(time) FROM inbox").fetchone()[0]
        loaded = rehydrate.load(self.settings.state.audit_dir, self.policy, min(now, newest or now))
        state = loaded.state
        mark = audit.flushed_seq(self.conn)
        pending = 0
        for (line,) in self.conn.execute(
            "SELECT line FROM audit_journal WHERE seq > ? ORDER BY seq", (mark,)
        ):
            state.apply(json.loads(line))
            pending += 1
        self.owner_queue.state = state
        log.info(
            "cadence.rehydrated",
            files=loaded.files,
            records=loaded.records,
            unflushed=pending,
            ms=round((time.monotonic() - started) * 1000, 1),
        )

    def _first_cursor(self) -> Cursor:
        first = self.settings.ntfy.first_start
        if first.mode == "all":
            return Cursor.everything()
        history = first.seconds if first.mode == "history" else 0.0
        # Persisted at once: a crash before the first event resumes from this time, inclusive.
        return Cursor.at_time(int(self.clock() - history))

    async def run(self, stop: asyncio.Event) -> None:
        if self._conn is None:
            await asyncio.to_thread(self.recover)
        # READY once local recovery is done, not when ntfy answers: an ntfy outage must never
        # become a restart loop.
        self.notifier.ready("recovered local state; connecting to ntfy")
        self.ready.set()
        intake_stop = asyncio.Event()
        log.info(
            "intake.subscribing",
            detail=diagnose.subscription(
                self.settings.ntfy.url,
                self.settings.ntfy.topics,
                token=self.settings.ntfy.token is not None,
                since=self._cursor.since if self._cursor is not None else "first start",
            ),
        )
        async with httpx.AsyncClient(
            transport=self.transport, event_hooks={"response": [self._observe_server_time]}
        ) as client:
            reader = intake.Intake(
                intake.IntakeConfig(
                    base_url=self.settings.ntfy.url,
                    topics=self.settings.ntfy.topics,
                    token=self.settings.ntfy.token,
                    keepalive_timeout=self.settings.ntfy.keepalive_timeout,
                    backoff_base=self.backoff_base,
                    overlap=self.settings.ntfy.overlap,
                    cache_settle=self.settings.ntfy.cache_settle,
                    cache_duration=self.settings.ntfy.cache_duration,
                ),
                client,
                sink=self.queue.put_nowait,
                current_resume=self._current_resume,
                on_rejected_cursor=self._drop_cursor,
                owe_backfill=self._owe_backfill,
                new_generation=self.resume.connection_lost,
                health=self.health,
            )
            tasks = [
                asyncio.create_task(reader.run(intake_stop), name="intake"),
                asyncio.create_task(self._writer(), name="writer"),
                asyncio.create_task(self._ticker(), name="ticker"),
                asyncio.create_task(self._systemd(), name="systemd"),
            ]
            relay_stop = asyncio.Event()
            if self.settings.relay.url is not None:
                self.relay = relay.Relay(
                    self.conn,
                    client,
                    run_db=self._db,
                    owner_queue=self.owner_queue,
                    url=self.settings.relay.url,
                    timeout=self.settings.relay.timeout,
                    max_attempts=self.settings.relay.max_attempts,
                    clock=self.clock,
                    flush_audit=self._flush_audit,
                    after_post=lambda: self.crash.hit("after_post"),
                    retry_base=self.relay_retry_base,
                    signing_key=self.settings.relay.signing_key,
                    token=self.settings.relay.token,
                )
                tasks.append(asyncio.create_task(self.relay.run(relay_stop), name="relay"))
            self.owner = owner.OwnerSender(
                self.conn,
                client,
                run_db=self._db,
                owner=self.settings.owner,
                ntfy_url=self.settings.ntfy.url,
                ntfy_token=self.settings.ntfy.token,
                clock=self.clock,
                flush_audit=self._flush_audit,
                retry_base=self.owner_retry_base,
                after_send=lambda: self.crash.hit("after_owner_send"),
            )
            tasks.append(asyncio.create_task(self.owner.run(relay_stop), name="owner"))
            # Housekeeping on a schedule (APScheduler): retention pruning, hourly and soon after
            # start; coalesced, never two runs at once.
            scheduler = AsyncIOScheduler(timezone="UTC")
            scheduler.add_job(
                self._prune,
                "interval",
                hours=1,
                next_run_time=datetime.now(UTC) + timedelta(minutes=1),
                coalesce=True,
                max_instances=1,
                id="retention",
            )
            scheduler.start()
            http_stop = asyncio.Event()
            tasks.append(asyncio.create_task(self._serve_http(http_stop), name="http"))
            if self.settings.health.ping_url is not None:
                tasks.append(
                    asyncio.create_task(self._dead_mans_switch(client), name="dead_mans_switch")
                )
            await self._supervise(tasks, stop)
            self.notifier.stopping("draining")
            await self._drain(intake_stop, tasks[0], tasks[1])
            relay_stop.set()
            senders = [t for t in tasks if t.get_name() in ("relay", "owner")]
            for sender in (self.relay, self.owner):
                if sender is not None:
                    sender.wakeup.set()
            # In-flight deliveries finish (bounded by the relay timeout) or stay leased, which
            # the next start releases: never marked delivered without a 2xx.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.gather(*(asyncio.shield(t) for t in senders), return_exceptions=True),
                    timeout=self.settings.relay.timeout + 1,
                )
            scheduler.shutdown(wait=False)
            http_stop.set()
            for task in tasks[1:]:
                if task.get_name() != "http":
                    task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        try:
            await self._flush_audit()
            if self.latched:
                # The space may be back: write what the log is owed now (never twice: the
                # writer knows its last seq) rather than leave it all to the next start.
                with contextlib.suppress(AuditWriteError):
                    await self._db(audit.flush, self.conn, self._audit)
            await self._db(self._write_health, final=True)
        except Exception as exc:  # noqa: BLE001 - shutting down: report, never a traceback
            log.error("daemon.shutdown_incomplete", error=repr(exc))
            self.failed = True
        finally:
            self._audit.close()
            self.conn.close()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
        log.info("daemon.stopped", recorded=self.counters.recorded, failed=self.failed)

    async def _supervise(self, tasks: list[asyncio.Task[None]], stop: asyncio.Event) -> None:
        """Wait for a stop request; a task that dies with an exception stops the daemon with a
        failure (systemd restarts it; a restart is the cure for an unexpected bug). A task that
        simply ends (the HTTP surface after failing to bind) does not."""
        stop_wait = asyncio.create_task(stop.wait())
        running = set(tasks)
        try:
            while not stop.is_set() and running:
                done, _ = await asyncio.wait(
                    [*running, stop_wait], return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    if task is stop_wait:
                        continue
                    running.discard(task)
                    if not task.cancelled() and task.exception() is not None:
                        log.error(
                            "daemon.task_failed", task=task.get_name(), error=repr(task.exception())
                        )
                        self.failed = True
                        stop.set()
        finally:
            stop_wait.cancel()

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

    # -- cursor callbacks for intake -------------------------------------------------------------

    async def _current_resume(self) -> Resume:
        resume = await self._db(load_resume, self.conn)
        assert resume is not None
        self._cursor = resume.cursor
        return resume

    async def _owe_backfill(self, since: int, gap_from: int | None) -> Owed:
        """The connection opened: persist the backfill it owes before anything else happens."""
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
        with db.write_txn(self.conn):
            self.conn.execute(
                "UPDATE cursor SET kind = 'all', value = 'all', message_time = NULL,"
                " updated_at = ? WHERE id = 1",
                (now,),
            )
            records = self.owner_queue.notice(self.conn, notice, now)
        self.owner_queue.commit(records)

    # -- the writer: batch -> transaction -> audit -> resume point --------------------------------

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

            def finish(
                conn: sqlite3.Connection, result: inbox.BatchResult, last: bool = last
            ) -> None:
                totals["new"] += result.recorded
                totals["duplicate"] += result.duplicates
                if last:
                    audit.stage(
                        conn,
                        "backfill",
                        self.clock(),
                        since=backfill.owed.since,
                        polled=backfill.polled,
                        new=totals["new"],
                        duplicate=totals["duplicate"],
                        gap=backfill.gap is not None,
                    )
                    clear_backfill(conn, backfill.owed)

            self.crash.hit("before_backfill_recorded" if last else "backfill_chunk")
            await self._record(frames, also=finish)
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

    async def _record(
        self,
        batch: list[intake.Received] | list[Event | Junk | Notice],
        also: inbox.InTransaction | None = None,
    ) -> None:
        frames: list[Event | Junk | Notice] = [
            item.frame if isinstance(item, intake.Received) else item for item in batch
        ]
        result = await self._db(
            inbox.record_batch,
            self.conn,
            frames,
            self.clock(),
            queue=self.owner_queue,
            relay_enabled=self.settings.relay.url is not None,
            feed_append=_feed_append,
            also=also,
            note_append=_feed_note,
        )
        self.owner_queue.adopt(result.state)
        self.crash.hit("after_inbox_commit")
        self.counters.batches += 1
        self.counters.recorded += result.recorded
        self.counters.duplicates += result.duplicates
        self.counters.conflicts += result.conflicts
        self.counters.quarantined += result.quarantined
        if result.recorded:
            self.counters.last_event_wall = self.clock()
            self._next_release = await self._db(outbox.next_release_at, self.conn)
        if result.released and self.relay is not None:
            self.relay.wakeup.set()
        if not await self._flush_audit():
            return  # latched: the cursor stays frozen for the life of the process
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

    def _gap_notice(self, gap: intake.GapFound) -> Notice:
        start = _utc(gap.window_start)
        end = _utc(gap.window_end)
        return notices.gap(gap.cursor.value, start, end)

    async def _flush_audit(self) -> bool:
        if self.latched:
            return False
        if self.owner is not None:
            self.owner.wakeup.set()  # a flush follows every write that may queue an owner row
        try:
            await self._db(audit.flush, self.conn, self._audit)
            if await self._db(self._note_replaced_audit_files):
                await self._db(audit.flush, self.conn, self._audit)
        except AuditWriteError as exc:
            await self._db(self._trip_latch_sync, str(exc))
            return False
        return True

    def _note_replaced_audit_files(self) -> bool:
        """An audit file deleted or replaced under us: one notice per time it happened."""
        replaced = self._audit.take_replacements()
        for detail in replaced:
            self.counters.extra["audit_file_replaced"] = count = (
                self.counters.extra.get("audit_file_replaced", 0) + 1
            )
            log.error("audit.file_replaced", detail=detail)
            self._record_notice(storage.audit_file_replaced(detail, self.boot_id, count))
        return bool(replaced)

    def _trip_latch_sync(self, detail: str) -> None:
        """Freeze the cursor for this process and queue exactly one owner notice."""
        if self.latched:
            return
        self.latched = True
        log.error("audit.latched", detail=detail)
        self._record_notice(notices.latch(detail, self.boot_id))

    # -- the ticker: cursor, debounce releases, health ------------------------------------------

    async def _ticker(self) -> None:
        last_health = 0.0
        while True:
            await asyncio.sleep(TICK_SECONDS)
            if self._wedged:
                await asyncio.Event().wait()  # test hook: a task stuck forever
            self.heartbeat_at = time.monotonic()
            self._stamp_error()
            if self._storage_notices:
                await self._send_storage_notices()
            await self._notice_clock_jumps()
            await self._settle_cursor()
            await self._save_frame_time()
            await self._observe_liveness()
            if self._next_release is not None and self._next_release <= self.clock():
                await self._db(self._release_due)
                if self.relay is not None:
                    self.relay.wakeup.set()
            now = time.monotonic()
            if now - last_health >= HEALTH_EVERY:
                last_health = now
                await self._db(self._write_health)

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

    async def _observe_liveness(self) -> None:
        """Dead longer than dead_after: one owner notice; back to live: one more."""
        frame_at = self.health.last_frame_at
        transition = None
        if frame_at is not None and frame_at != self._seen_frame_at:
            self._seen_frame_at = frame_at
            transition = self.liveness.frame(frame_at)
        transition = self.liveness.observe(time.monotonic()) or transition
        if transition is None:
            return
        episode = f"{self.boot_id}:{self.health.attempts}"
        if transition is watchdog.Transition.BECAME_DEAD:
            notice = notices.intake_dead(
                self.settings.ntfy.dead_after, self.health.last_error, episode
            )
        else:
            notice = notices.intake_recovered(episode)
        log.warning("intake.liveness", transition=str(transition))
        await self._db(self._record_notice, notice)
        await self._flush_audit()

    def _record_notice(self, notice: Notice) -> None:
        with db.write_txn(self.conn):
            records = self.owner_queue.notice(self.conn, notice, self.clock())
        self.owner_queue.commit(records)

    async def _systemd(self) -> None:
        """WATCHDOG=1 only while the loop makes progress; STATUS= a one-line summary."""
        interval = self.watchdog_interval
        period = interval if interval is not None else 5.0
        while True:
            await asyncio.sleep(period)
            decision = watchdog.should_ping(
                self._progress(),
                time.monotonic(),
                keepalive_timeout=self.settings.ntfy.keepalive_timeout,
                slack=max(1.0, period),
                heartbeat_timeout=max(2 * period, 1.0),
            )
            if interval is not None and decision.ping and self.notifier.watchdog():
                self.watchdog_pings += 1
            elif interval is not None and not decision.ping:
                log.error("systemd.watchdog_withheld", reason=decision.reason)
            self.notifier.status(self._status_line(decision.reason))

    def _progress(self) -> watchdog.Progress:
        health = self.health
        due: float | None = None
        if health.state == "backoff":
            due = health.next_attempt_due
        elif health.state in ("connecting", "starting") and health.last_attempt_at is not None:
            # A probe and a connect may each take the connect timeout, then `open` may take up
            # to a keepalive timeout to arrive.
            due = health.last_attempt_at + 2 * 10.0 + self.settings.ntfy.keepalive_timeout
        elif health.state == "starting":
            due = self.liveness.started_at + 30.0
        return watchdog.Progress(
            heartbeat_at=self.heartbeat_at,
            last_frame_at=health.last_frame_at,
            next_attempt_due=due,
            last_attempt_at=health.last_attempt_at,
        )

    def _status_line(self, reason: str) -> str:
        """STATUS=: the health model's line, then the counters; the watchdog's reason only when
        it withholds a ping (otherwise it would repeat the state)."""
        assessed = self.assess_health()
        parts = [assessed.line()]
        if assessed.intake is health_model.State.LIVE:
            parts.append(f"last frame {health_model.ago(assessed.last_frame_age_s)}")
        parts.append(f"{self.counters.recorded} recorded this run")
        parts.append(f"cursor {self._cursor.since if self._cursor else '-'}")
        if not reason.startswith(("intake live", "intake reconnecting on schedule")):
            parts.append(f"watchdog: {reason}")
        return "; ".join(parts)

    def _stamp_error(self) -> None:
        """Give the intake's last error a time, so every report can say how old it is."""
        failures = sum(n for kind, n in self.health.failures.items() if kind != "stream_ended")
        seen = (failures, self.health.last_error)
        if seen != self._error_seen:
            self._error_seen = seen
            if self.health.last_error is not None:
                self.last_error_wall = time.time()

    def assess_health(self) -> health_model.Health:
        """The one health verdict (see health.py), for /healthz, /metrics, STATUS= and pings."""
        self._stamp_error()
        return health_model.assess(self.health_snapshot(), time.time(), self.health_limits)

    # -- the loopback HTTP surface: feed, notify, health, metrics -------------------------------

    async def _serve_http(self, stop: asyncio.Event) -> None:
        app = http_api.create_app(
            db_path=self.settings.state.database,
            token=self.settings.http.token,
            notify=self._notify,
            health=self._http_health,
            metrics_snapshot=self.metrics_snapshot,
        )
        try:
            await http_api.serve(
                app, self.settings.http.host, self.settings.http.port, stop, self._http_bound
            )
        except OSError as exc:
            # Intake matters more than the HTTP surface: keep recording, say why loudly.
            log.error("http.bind_failed", listen=self.settings.http.listen, detail=str(exc))
            self.http_error = str(exc)

    def _http_bound(self, port: int) -> None:
        self.http_port = port
        log.info("http.listening", host=self.settings.http.host, port=port)

    def _http_health(self) -> tuple[bool, dict[str, Any]]:
        assessed = self.assess_health()
        details: dict[str, Any] = {"status": str(assessed.state), "intake": str(assessed.intake)}
        if assessed.reasons:
            details["reason"] = assessed.line()
            details["reasons"] = list(assessed.reasons)
        return assessed.healthy, details

    async def _notify(self, text: str, idempotency_key: str) -> tuple[int, dict[str, Any]]:
        """`POST /v1/notify`: an agent's later reply, through the owner outbox (stable key)."""
        key = f"agent:{idempotency_key}"
        result = await self._db(self._queue_agent_message, key, text)
        await self._flush_audit()
        return 202 if result != "duplicate" else 200, {"key": key, "result": result}

    def _queue_agent_message(self, key: str, text: str) -> str:
        with db.write_txn(self.conn):
            result, records = self.owner_queue.triage_message(self.conn, key, text, self.clock())
        self.owner_queue.commit(records)
        return result

    def metrics_snapshot(self) -> dict[str, Any]:
        now = time.monotonic()
        health = self.health
        relay_stats = self.relay.stats if self.relay is not None else None
        owner_stats = self.owner.stats if self.owner is not None else None
        assessed = self.assess_health()
        return {
            "intake_state": str(assessed.intake),
            "health_state": str(assessed.state),
            "last_frame_age_s": None
            if health.last_frame_at is None
            else now - health.last_frame_at,
            "connections_total": health.connections,
            "reconnects_total": max(0, health.attempts - 1),
            "watchdog_drops_total": health.watchdog_drops,
            "events_recorded_total": self.counters.recorded,
            "duplicates_total": self.counters.duplicates,
            "conflicts_total": self.counters.conflicts,
            "quarantined_total": self.counters.quarantined,
            "cursor_moves_total": self.counters.cursor_moves,
            "audit_latch": self.latched,
            "relay_delivered_total": relay_stats.delivered if relay_stats else 0,
            "relay_attempts_total": relay_stats.attempts if relay_stats else 0,
            "owner_sent_total": (owner_stats.sent_signal + owner_stats.sent_ntfy)
            if owner_stats
            else 0,
            **self._cached_counts,
        }

    async def _dead_mans_switch(self, client: httpx.AsyncClient) -> None:
        """Ping `health.ping_url` only while healthy: silence there means something is wrong here
        (or the Pi is gone), which no message from this process could ever report."""
        url = self.settings.health.ping_url
        assert url is not None
        interval = self.settings.health.ping_interval
        while True:
            healthy, details = self._http_health()
            wedged = time.monotonic() - self.heartbeat_at > max(2.0, 4 * TICK_SECONDS)
            if healthy and not wedged:
                try:
                    response = await client.get(url, timeout=min(10.0, interval))
                    if response.status_code < 300:
                        self.dead_mans_pings += 1
                    else:
                        log.warning("health.ping_failed", status=response.status_code)
                except httpx.HTTPError as exc:
                    log.warning("health.ping_failed", detail=type(exc).__name__)
            else:
                log.info("health.ping_withheld", reason=details.get("reason", "wedged"))
            await asyncio.sleep(interval)

    async def _prune(self) -> None:
        pruned = await self._db(
            retention.prune,
            self.conn,
            self.clock(),
            cache_duration=self.settings.ntfy.cache_duration,
        )
        log.info("retention.pruned", **dataclasses.asdict(pruned))

    def wedge_for_test(self) -> None:
        """Test hook: make the ticker hang forever, as a stuck task would."""
        self._wedged = True

    def _release_due(self) -> None:
        """Debounce windows that closed with no new event: freeze and release their requests."""
        with db.write_txn(self.conn):
            outbox.release_due(
                self.conn,
                self.clock(),
                relay_enabled=self.settings.relay.url is not None,
                feed_append=_feed_append,
            )
        self._next_release = outbox.next_release_at(self.conn)

    def health_snapshot(self) -> dict[str, Any]:
        now_mono = time.monotonic()
        frame_age = None
        if self.health.last_frame_at is not None:
            frame_age = round(now_mono - self.health.last_frame_at, 3)
        return {
            "liveness": str(self.liveness.state(now_mono)),
            "pid": os.getpid(),
            "boot_id": self.boot_id,
            "updated_at": self.clock(),
            "state": self.health.state,
            "last_frame_wall": self.health.last_frame_wall,
            "last_frame_age_s": frame_age,
            "last_event_wall": self.counters.last_event_wall,
            "connections": self.health.connections,
            "attempts": self.health.attempts,
            "watchdog_drops": self.health.watchdog_drops,
            "failures": dict(self.health.failures),
            "last_error": self.health.last_error,
            "last_error_wall": self.last_error_wall,
            "started_at": self.started_wall,
            "latch": self.latched,
            "storage": None if self.storage_wait is None else str(self.storage_wait),
            "http_port": self.http_port,
            "http_error": self.http_error,
            "degraded": sorted(self.degraded.values()),
            "recorded": self.counters.recorded,
            "duplicates": self.counters.duplicates,
        }

    def _write_health(self, *, final: bool = False) -> None:
        def count(sql: str) -> int:
            return int(self.conn.execute(sql).fetchone()[0])

        self._cached_counts = {
            "relay_collecting": count("SELECT count(*) FROM outbox WHERE state = 'collecting'"),
            "relay_pending": count(
                "SELECT count(*) FROM outbox WHERE state IN ('pending', 'leased')"
            ),
            "relay_dead": count("SELECT count(*) FROM outbox WHERE state = 'dead'"),
            "owner_pending": count(
                "SELECT count(*) FROM owner_outbox WHERE state IN ('pending', 'leased')"
            ),
            "owner_suppressed_total": count(
                "SELECT count(*) FROM owner_outbox WHERE state = 'suppressed'"
            ),
            "feed_head": {
                row[0]: row[1]
                for row in self.conn.execute(
                    "SELECT channel, max(seq) FROM feed_entries GROUP BY channel"
                )
            },
        }
        snapshot = self.health_snapshot()
        if final:
            snapshot["state"] = "stopped"
        with db.write_txn(self.conn):
            self.conn.execute(
                "INSERT INTO kv(name, value) VALUES (?, ?)"
                " ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                (HEALTH_KEY, json.dumps(snapshot)),
            )


def _feed_append(
    conn: sqlite3.Connection, key: str, payload: dict[str, Any], summary: str, now: float
) -> None:
    feed.append(
        conn,
        TRIAGE_CHANNEL,
        payload,
        delivery_key=key,
        sender=FEED_SENDER,
        summary=summary,
        idempotency_key=key,
        now=now,
    )


def _feed_note(
    conn: sqlite3.Connection, key: str, payload: dict[str, object], summary: str, now: float
) -> None:
    feed.append(
        conn,
        INFO_CHANNEL,
        payload,
        delivery_key=key,
        sender=FEED_SENDER,
        summary=summary,
        idempotency_key=key,
        now=now,
    )


def _exclusive_lock(path: Path) -> int:
    """One daemon per state directory: a second one would race the cursor and the audit log."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StateLockedError(
            f"another ntfy-intake daemon is using {path.parent} (lock {path.name})"
        ) from None
    return fd


def _utc(ts: int) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
