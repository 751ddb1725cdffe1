"""The daemon: compose the pieces and supervise them.

`recover` does local recovery before READY (open the store, migrate, rebuild it from the audit log
if it is missing, rehydrate cadence, replay unwritten audit records); `run` starts the tasks
(intake, the writer and the ticker of pipeline.py, the relay, the owner sender, systemd, the HTTP
surface, the dead-man's switch, retention on a schedule), supervises them, and drains on SIGTERM.
What happens to one event is pipeline.py; how the daemon knows it is alive is vitals.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import os
import sqlite3
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import structlog

from ntfy_intake.errors import AuditWriteError, StartupError, StateLockedError
from ntfy_intake.flow import intake, owner, relay
from ntfy_intake.flow.pipeline import CountedOwnerQueue, Counters, CrashPoints, append_triage_entry
from ntfy_intake.rules import cadence, notices, watchdog
from ntfy_intake.rules import health as health_model
from ntfy_intake.runtime.clock import TrustedClock
from ntfy_intake.runtime.sdnotify import Notifier
from ntfy_intake.runtime.vitals import HEALTH_EVERY, TICK_SECONDS, Vitals
from ntfy_intake.settings import Settings
from ntfy_intake.store import (
    audit,
    db,
    feed,
    outbox,
    rebuild,
    rehydrate,
    retention,
    schema,
    storage,
)
from ntfy_intake.store.cursor import (
    Cursor,
    ResumePoint,
)
from ntfy_intake.store.cursor import load as load_cursor
from ntfy_intake.store.cursor import save as save_cursor
from ntfy_intake.wire import diagnose, http_post, http_stream

log = structlog.get_logger("ntfy_intake.daemon")

STARTUP_GRACE_S = 1.0
STARTUP_CAP_S = 5.0
CATCH_UP_POLL_S = 0.05
GIL_SWITCH_INTERVAL_S = 0.001  # see run(); measured in bench/bench_live.py

__all__ = ["Counters", "CrashPoints", "Daemon", "migrations"]


class _ThreadSwitches:
    """The GIL switch interval at GIL_SWITCH_INTERVAL_S while any daemon in this process runs,
    and the interval found before the first one back once the last one stops (daemons in one
    process may stop in any order)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._found = 0.0

    @contextlib.contextmanager
    def fast(self) -> Iterator[None]:
        with self._lock:
            if self._users == 0:
                self._found = sys.getswitchinterval()
                sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    sys.setswitchinterval(self._found)


_thread_switches = _ThreadSwitches()


def migrations() -> list[db.Migration]:
    return [
        *schema.CORE,
        *((name, list(sql)) for name, sql in feed.FEED_MIGRATIONS),
        *((name, list(sql)) for name, sql in owner.OWNER_MIGRATIONS),
        *schema.LATER,
    ]


class Daemon(Vitals):
    # -- set-up and local recovery -------------------------------------------------------------------

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
        self.clock = self.trusted_clock
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
        self.owner_queue = CountedOwnerQueue(self.policy, cadence.CadenceState.empty(self.policy))
        self._owner_woken_for = 0
        self.queue = asyncio.Queue()
        self._saved_frame_time = None  # last server time persisted (gap windows)
        self._frame_time_saved_at = 0.0
        self._db_lock = asyncio.Lock()
        self._conn = None
        self._lock_fd: int | None = None
        self.relay = None
        self.owner = None
        self._next_release = None
        self._audit = audit.AuditLog(settings.state.audit_dir, self.clock)
        self._replaced_pending = []
        self._cursor = None
        self.ready = asyncio.Event()
        self.subscribed = asyncio.Event()  # set when a subscription first opens
        self.notifier = notifier or Notifier(None)
        self.watchdog_interval = watchdog_interval
        self.heartbeat_at = time.monotonic()  # the ticker's last pass: proves the loop turns
        self.liveness = watchdog.LivenessTracker(
            started_at=time.monotonic(),
            keepalive_timeout=settings.ntfy.keepalive_timeout,
            dead_after=settings.ntfy.dead_after,
            recover_after=settings.ntfy.keepalive_interval,
        )
        self._seen_frame_at = None
        self._wedged = False  # test hook: the ticker stops turning (a stuck task)
        self.watchdog_pings = 0
        self.dead_mans_pings = 0
        self.http_port = None
        self.http_error = None
        self._cached_counts = {}
        # Health: wall-clock times, as in the stored snapshot that `status` reads.
        self.started_wall = time.time()
        self.health_limits = health_model.Limits(
            keepalive_timeout=settings.ntfy.keepalive_timeout,
            dead_after=settings.ntfy.dead_after,
        )
        self.degraded = {}  # source -> one-line reason (other modules may set)
        self._error_seen = (0, None)
        self.last_error_wall = None
        # A transient storage failure being waited out (None: storage is fine).
        self.storage_wait = None
        self.storage_episodes = 0
        self._storage_failed_fn = None
        self._storage_notices = []

    def recover(self) -> None:
        """Local recovery, before READY: open the store, migrate, replay unwritten audit records.

        A storage failure here names itself; a permanent one is a StartupError (exit 2)."""
        problem = storage.check_state_dir(self.settings.state.dir)
        if problem is not None:
            raise StartupError(problem)
        unusable = http_stream.url_problem(self.settings.ntfy.url)
        if unusable is not None:  # a config error, found before anything is opened
            raise StartupError(f"ntfy.url cannot be requested: {unusable}")
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
            self._record_notice(notices.rebuilt_from_audit(str(rebuilt), self.boot_id))
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
            feed_append=append_triage_entry,
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

    def _stream_opener(self) -> http_stream.StreamOpener | None:
        """The lean stream reader, unless a test transport or a proxy means httpx must carry it."""
        if self.transport is not None or http_stream.proxied(self.settings.ntfy.url):
            return None
        return http_stream.RawStreamOpener(
            on_response=lambda headers: self.trusted_clock.observe_date_header(headers.get("date"))
        )

    def _relay_poster(self, url: str) -> http_post.KeepAlivePoster | None:
        """The lean keep-alive client for the relay, unless a test transport or a proxy means
        httpx must carry its POSTs."""
        if self.transport is not None or http_stream.proxied(url):
            return None
        return http_post.KeepAlivePoster(
            url,
            timeouts=httpx.Timeout(self.settings.relay.timeout),
            max_reply=relay.MAX_REPLY_BYTES,
        )

    # -- the tasks and their supervision -------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        # The event loop and the database thread take turns on the GIL. A thread that wants it
        # back (an fsync returned) waits up to the switch interval while the other runs Python
        # (httpx reading a reply): 5 ms by default, which is a live event's whole budget.
        with _thread_switches.fast():
            await self._run(stop)

    async def _run(self, stop: asyncio.Event) -> None:
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
                open_stream=self._stream_opener(),
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
                    concurrency=self.settings.relay.concurrency,
                    clock=self.clock,
                    flush_audit=self._flush_audit,
                    after_post=lambda: self.crash.hit("after_post"),
                    retry_base=self.relay_retry_base,
                    signing_key=self.settings.relay.signing_key,
                    token=self.settings.relay.token,
                    poster=self._relay_poster(self.settings.relay.url),
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
            tasks.append(asyncio.create_task(self._housekeeping(), name="housekeeping"))
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
            http_stop.set()
            for task in tasks[1:]:
                if task.get_name() != "http":
                    task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.relay is not None and self.relay.poster is not None:
                await self.relay.poster.aclose()
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

    def wedge_for_test(self) -> None:
        """Test hook: make the ticker hang forever, as a stuck task would."""
        self._wedged = True

    async def _prune(self) -> None:
        pruned = await self._db(
            retention.prune,
            self.conn,
            self.clock(),
            cache_duration=self.settings.ntfy.cache_duration,
        )
        log.info("retention.pruned", **dataclasses.asdict(pruned))

    # -- the loopback HTTP surface: feed, notify, health, metrics ------------------------------------

    async def _after_subscribing(self) -> None:
        """What intake does not need (the HTTP surface, the scheduler) loads once the first
        subscription is on its way and the writer has caught up with what it replays (its queue
        found empty twice, CATCH_UP_POLL_S apart), or STARTUP_CAP_S after start at the latest: a
        start never waits for starlette, and a backlog is not slowed by its imports."""
        cap = time.monotonic() + STARTUP_CAP_S
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.subscribed.wait(), STARTUP_GRACE_S)
        idle = 0
        while idle < 2 and time.monotonic() < cap:
            await asyncio.sleep(CATCH_UP_POLL_S)
            idle = idle + 1 if self.queue.empty() else 0

    async def _housekeeping(self) -> None:
        """Retention pruning on a schedule (APScheduler): hourly and a minute after start,
        coalesced, never two runs at once. Stops with the task."""
        await self._after_subscribing()
        from apscheduler.schedulers.asyncio import AsyncIOScheduler  # noqa: PLC0415

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
        try:
            await asyncio.Event().wait()
        finally:
            scheduler.shutdown(wait=False)

    async def _serve_http(self, stop: asyncio.Event) -> None:
        await self._after_subscribing()
        # starlette, uvicorn and jinja2: imported after intake is running
        from ntfy_intake.surfaces import console, http_api  # noqa: PLC0415

        actions = console.Actions(
            run=self._db,
            conn=lambda: self.conn,
            queue=self.owner_queue,
            flush=self._flush_audit,
            wake_relay=lambda: self.relay.wakeup.set() if self.relay is not None else None,
            clock=self.clock,
        )
        cadence_now = lambda: (self.policy, self.owner_queue.state)  # noqa: E731
        app = http_api.create_app(
            db_path=self.settings.state.database,
            token=self.settings.http.token,
            notify=self._notify,
            health=self._http_health,
            metrics_snapshot=self.metrics_snapshot,
            extra_routes=[
                *console.routes(
                    console.Config(self.settings, self._http_health, cadence_now, actions)
                ),
                *console.api_routes(self.settings.http.token, actions, self.clock),
            ],
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

    async def _notify(self, text: str, idempotency_key: str) -> tuple[int, dict[str, Any]]:
        """`POST /v1/notify`: an agent's later reply, through the owner outbox (stable key)."""
        key = f"agent:{idempotency_key}"
        result = await self._db(self._queue_agent_message, key, text)
        await self._flush_audit()
        return 202 if result != "duplicate" else 200, {"key": key, "result": result}

    def _queue_agent_message(self, key: str, text: str) -> str:
        with db.write_txn(self.conn) as txn:
            result, _ = self.owner_queue.triage_message(txn, key, text, self.clock())
        return result


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
