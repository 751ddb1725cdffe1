"""The daemon: compose the pieces and supervise them.

`Daemon` builds the parts and hands each its collaborators: the database (flow/database.py: one
connection, one worker thread), the journal (flow/journal.py: the audit log, the latch, notices),
the writer (flow/writer.py: frame -> inbox transaction -> audit line -> cursor), the vitals
(vitals.py: liveness, systemd, health, metrics) and the supervisor (supervisor.py: the tasks and
the drain). The state they share is small named objects made here (intake's health, the counters,
the heartbeat, the storage waits, the degraded reasons), given to those who read or change them.
`recover` does local recovery before READY (recovery.py); `run` starts the tasks (intake, writer,
ticker, relay, owner sender, systemd, HTTP, dead-man's switch, retention), supervises, drains.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import structlog

from ntfy_intake.flow import (
    escalator,
    intake,
    owner,
    owner_buttons,
    owner_replies,
    relay,
    relay_wakeup,
)
from ntfy_intake.flow.database import Database, StorageWaits
from ntfy_intake.flow.journal import Journal
from ntfy_intake.flow.pipeline import CountedOwnerQueue, Counters, CrashPoints, Heartbeat
from ntfy_intake.flow.writer import Writer
from ntfy_intake.rules import cadence
from ntfy_intake.rules import health as health_model
from ntfy_intake.runtime import expectations, heap, recovery, supervisor, switches
from ntfy_intake.runtime.clock import TrustedClock
from ntfy_intake.runtime.cluster import Holding
from ntfy_intake.runtime.recovery import StateLock
from ntfy_intake.runtime.sdnotify import Notifier
from ntfy_intake.runtime.supervisor import Supervisor
from ntfy_intake.runtime.ticker import Ticker
from ntfy_intake.runtime.vitals import Vitals
from ntfy_intake.settings import Settings
from ntfy_intake.store import audit, db, retention, storage
from ntfy_intake.store.cursor import ResumePoint
from ntfy_intake.wire import diagnose, http_post, http_stream

log = structlog.get_logger("ntfy_intake.daemon")

__all__ = ["Counters", "CrashPoints", "Daemon"]


class Daemon:
    """The parts, composed (module doc); the entry points the CLI and the tests use."""

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
        holding: Holding | None = None,
        state_lock: StateLock | None = None,
    ) -> None:
        self.settings = settings
        # A term this process leads (runtime/node.py), None for one daemon alone.
        self.holding = holding
        may_act = holding.may_act if holding is not None else (lambda: True)
        self.may_act = may_act
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
        # The state the parts share.
        self.health = intake.IntakeHealth()
        self.counters = Counters()
        self.heartbeat = Heartbeat()  # the ticker's last pass: proves the loop turns
        self.storage = StorageWaits()
        self.degraded: dict[str, str] = {}  # source -> one-line reason
        self.policy = cadence.Policy(
            debounce=settings.cadence.debounce,
            cooldown=settings.cadence.cooldown,
            daily_cap=settings.cadence.daily_cap,
            escalate_daily_cap=settings.relay.escalate_daily_cap,
            timezone=settings.cadence.timezone,
            maintenance=settings.maintenance,
            profiles=settings.ntfy.profiles == "auto",
        )
        # Rebuilt from the audit log in recover(); the audit log is the only cadence store.
        self.owner_queue = CountedOwnerQueue(self.policy, cadence.CadenceState.empty(self.policy))
        self.queue: asyncio.Queue[intake.Item] = asyncio.Queue()
        self.ready = asyncio.Event()
        self.relay: relay.Relay | None = None
        self.owner: owner.OwnerSender | None = None
        self.buttons: owner_buttons.OwnerButtons | None = None
        self.expectations: expectations.ExpectationWatch | None = None  # with `[[expect]]`
        # The parts, each given its collaborators.
        self.database = Database(
            settings.state.store,
            boot_id=self.boot_id,
            waits=self.storage,
            degraded=self.degraded,
            heartbeat=self.heartbeat,
            term=None if holding is None else holding.term,
            idle_limit=settings.cluster.lease_ttl / 2,
            on_fenced=self._fenced,
        )
        self.journal = Journal(
            self.database,
            audit.AuditLog(settings.state.audit_dir, self.clock),
            owner_queue=self.owner_queue,
            counters=self.counters,
            clock=self.clock,
            boot_id=self.boot_id,
        )
        self.writer = Writer(
            self.database,
            self.journal,
            queue=self.queue,
            resume=ResumePoint(settings.ntfy.reorder_window),
            counters=self.counters,
            owner_queue=self.owner_queue,
            clock=self.clock,
            crash=self.crash,
            relay_enabled=settings.relay.url is not None,
            boot_id=self.boot_id,
        )
        self.vitals = Vitals(
            settings,
            clock=self.trusted_clock,
            boot_id=self.boot_id,
            intake_health=self.health,
            counters=self.counters,
            heartbeat=self.heartbeat,
            storage=self.storage,
            degraded=self.degraded,
            database=self.database,
            journal=self.journal,
            writer=self.writer,
            notifier=notifier or Notifier(None),
            watchdog_interval=watchdog_interval,
            cluster_view=None if holding is None else holding.view,
        )
        self.supervisor = Supervisor()
        # The node's loop holds the directory's lock for the process's life: not ours to drop.
        self._owns_lock = state_lock is None
        self._state_lock = state_lock or StateLock(settings.state.dir / "daemon.lock")
        self.ticker = Ticker(
            database=self.database,
            journal=self.journal,
            writer=self.writer,
            vitals=self.vitals,
            intake_health=self.health,
            storage=self.storage,
            heartbeat=self.heartbeat,
            clock=self.clock,
        )

    # -- what the CLI, the HTTP surface and the tests read -------------------------------------------

    @property
    def conn(self) -> db.Connection:
        return self.database.conn

    @property
    def failed(self) -> bool:
        """A task died, or the shutdown was incomplete: exit non-zero so systemd restarts us."""
        return self.supervisor.failed

    @property
    def latched(self) -> bool:
        return self.journal.latched

    @property
    def resume(self) -> ResumePoint:
        return self.writer.resume

    @property
    def subscribed(self) -> asyncio.Event:
        return self.writer.subscribed

    @property
    def storage_wait(self) -> storage.StorageFault | None:
        """The transient storage fault being waited out, None when storage is fine."""
        return self.storage.fault

    @property
    def storage_episodes(self) -> int:
        return self.storage.episodes

    @property
    def http_port(self) -> int | None:
        return self.vitals.http_port

    @property
    def http_error(self) -> str | None:
        return self.vitals.http_error

    def health_snapshot(self) -> dict[str, Any]:
        return self.vitals.health_snapshot()

    def metrics_snapshot(self) -> dict[str, Any]:
        return self.vitals.metrics_snapshot()

    def assess_health(self) -> health_model.Health:
        return self.vitals.assess_health()

    @property
    def stream_reader(self) -> http_stream.StreamOpener | None:
        """The lean stream reader, or None when a test transport or a proxy means httpx must
        carry the stream."""
        if self.transport is not None or http_stream.proxied(self.settings.ntfy.url):
            return None
        return http_stream.RawStreamOpener(
            on_response=lambda headers: self.trusted_clock.observe_date_header(headers.get("date"))
        )

    # -- local recovery ------------------------------------------------------------------------------

    def recover(self) -> None:
        """Local recovery before READY (recovery.py); a permanent failure: StartupError (exit 2)."""
        recovered = recovery.recover(
            self.settings,
            database=self.database,
            journal=self.journal,
            state_lock=self._state_lock,
            owner_queue=self.owner_queue,
            clock=self.clock,
            boot_id=self.boot_id,
        )
        self.writer.start_from(recovered.cursor, recovered.next_release)

    def _fenced(self) -> None:
        """A write saw another term: this one is over (the node's loop stands by again)."""
        if self.holding is not None:
            log.error("cluster.fenced", term=self.holding.term)
            self.holding.lapse()
            self.holding.lost.set()

    @property
    def stepping_down(self) -> bool:
        return self.holding is not None and self.holding.lost.is_set()

    def close(self) -> None:
        """What the end of `run` lets go of (idempotent): the audit file, the store, the lock."""
        self.journal.close()
        self.database.close()
        if self._owns_lock:
            self._state_lock.release()

    # -- the tasks and their supervision -------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        # The event loop and the database thread take turns on the GIL: a thread wanting it back
        # (an fsync returned) waited up to the default switch interval, 5 ms, a live event's all.
        with switches.fast():
            await self._run(stop)

    async def _run(self, stop: asyncio.Event) -> None:
        if not self.database.is_open and not await recovery.when_reachable(
            self.recover, stop, self.storage, self.degraded, self.vitals.notifier, self.boot_id
        ):
            return
        # READY once recovered, not when ntfy answers: an ntfy outage is never a restart loop.
        self.vitals.notifier.ready("recovered local state; connecting to ntfy")
        self.ready.set()
        if self.holding is not None:  # what standing by owes (a wait for the database), and
            for notice in self.holding.owed_notices():  # the takeover's own notice
                await self.journal.note(notice)
        cursor = self.writer.cursor
        log.info(
            "intake.subscribing",
            detail=diagnose.subscription(
                self.settings.ntfy.url,
                self.settings.ntfy.topics,
                token=self.settings.ntfy.token is not None,
                since=cursor.since if cursor is not None else "first start",
            ),
        )
        tasks = self.supervisor
        nudges: relay_wakeup.NudgeListener | None = None
        async with httpx.AsyncClient(
            transport=self.transport, event_hooks={"response": [self.vitals.observe_server_time]}
        ) as client:
            intake_stop = asyncio.Event()
            reader = tasks.start(self._intake(client).run(intake_stop), "intake")
            writing = tasks.start(self.writer.run(), "writer")
            tasks.start(self.ticker.run(), "ticker")
            tasks.start(self.vitals.run_systemd(), "systemd")
            senders_stop = asyncio.Event()
            if self.settings.relay.url is not None:
                self.relay = self._relay(client, self.settings.relay.url)
                self.writer.wake_relay_with(self.relay)
                tasks.start(self.relay.run(senders_stop), "relay")
                nudges = self._listen_for_nudges(self.relay)
            self.owner = self._owner_sender(client)
            self.journal.wake_owner_sender_with(self.owner.wakeup)
            self.vitals.watch_senders(self.relay, self.owner)
            tasks.start(self.owner.run(senders_stop), "owner")
            if self.settings.owner.receive != "off":  # replies from the phone (section 13)
                replies = self._owner_replies(client)
                self.vitals.watch_replies(replies)
                tasks.start(replies.run(senders_stop), "owner_replies")
            tasks.start(self._housekeeping(), "housekeeping")
            if (policy := escalator.policy_for(self.settings.relay)) is not None:
                tasks.start(self._escalator(policy).run(senders_stop), "escalator")  # section 13
            if self.settings.expect:  # `[[expect]]`: runtime/expectations.py
                watch = self._expectations()
                tasks.start(watch.run(self.writer.subscribed, self.queue), "expectations")
            http_stop = asyncio.Event()
            tasks.start(self._serve_http(http_stop), "http")
            if self.settings.health.ping_url is not None:
                tasks.start(self.vitals.run_dead_mans_switch(client), "dead_mans_switch")
            await tasks.watch(stop)
            if not self.stepping_down:
                self.vitals.notifier.stopping("draining")
                # A node hands over at once (section 9: < 2 s): no reorder window, and no drain
                # past its term's end (a database not answering): supervisor.drain.
                window = None if self.holding is not None else self.settings.ntfy.reorder_window
                lost = None if self.holding is None else self.holding.lost
                await tasks.drain(self.writer, intake_stop, reader, writing, window, lost)
            if self.stepping_down:  # every side effect stops now; no drain: writes are fenced
                await tasks.abandon()
                self.close()
                return
            senders_stop.set()
            for sender in (self.relay, self.owner):
                if sender is not None:
                    sender.wakeup.set()
            await tasks.let_senders_finish(within=self.settings.relay.timeout + 1)
            http_stop.set()
            await tasks.cancel_the_rest(spare="http")
            if self.relay is not None and self.relay.poster is not None:
                await self.relay.poster.aclose()
            if nudges is not None:
                nudges.close()
        try:
            await self.journal.flush_at_stop()
            await self.database.run(self.vitals.write_health, final=True)
        except Exception as exc:  # noqa: BLE001 - shutting down: report, never a traceback
            log.error("daemon.shutdown_incomplete", error=repr(exc))
            self.supervisor.failed = True
        finally:
            self.close()
        log.info("daemon.stopped", recorded=self.counters.recorded, failed=self.failed)

    def _expectations(self) -> expectations.ExpectationWatch:
        self.expectations = expectations.ExpectationWatch(
            self.settings.expect,
            database=self.database,
            journal=self.journal,
            clock=self.clock,
            audit_dir=self.settings.state.audit_dir,
        )
        self.writer.on_committed = self.expectations.committed
        return self.expectations

    def _intake(self, client: httpx.AsyncClient) -> intake.Intake:
        ntfy = self.settings.ntfy
        return intake.Intake(
            intake.IntakeConfig(
                base_url=ntfy.url,
                topics=ntfy.topics,
                token=ntfy.token,
                keepalive_timeout=ntfy.keepalive_timeout,
                backoff_base=self.backoff_base,
                overlap=ntfy.overlap,
                cache_settle=ntfy.cache_settle,
                cache_duration=ntfy.cache_duration,
            ),
            client,
            sink=self.queue.put_nowait,
            current_resume=self.writer.current_resume,
            on_rejected_cursor=self.writer.drop_cursor,
            owe_backfill=self.writer.owe_backfill,
            new_generation=self.writer.resume.connection_lost,
            health=self.health,
            open_stream=self.stream_reader,
        )

    def _relay(self, client: httpx.AsyncClient, url: str) -> relay.Relay:
        return relay.Relay(
            self.conn,
            client,
            run_db=self.database.run,
            owner_queue=self.owner_queue,
            url=url,
            timeout=self.settings.relay.timeout,
            max_attempts=self.settings.relay.max_attempts,
            concurrency=self.settings.relay.concurrency,
            clock=self.clock,
            flush_audit=self.journal.flush,
            after_post=lambda: self.crash.hit("after_post"),
            retry_base=self.relay_retry_base,
            signing_key=self.settings.relay.signing_key,
            token=self.settings.relay.token,
            poster=self._relay_poster(url),
            may_act=self.may_act,
        )

    def _listen_for_nudges(self, sender: relay.Relay) -> relay_wakeup.NudgeListener | None:
        """A redrive from the CLI on this host wakes the relay at once (relay_wakeup.py); without
        the socket, the relay's long poll finds it."""
        try:
            return relay_wakeup.NudgeListener(self.settings.state.dir, sender.wake)
        except OSError as exc:
            log.warning("relay.nudge_unavailable", detail=str(exc), poll_s=relay.POLL_S)
            return None

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

    def _owner_sender(self, client: httpx.AsyncClient) -> owner.OwnerSender:
        sender = owner.OwnerSender(
            self.conn,
            client,
            run_db=self.database.run,
            owner=self.settings.owner,
            ntfy_url=self.settings.ntfy.url,
            ntfy_token=self.settings.ntfy.token,
            clock=self.clock,
            flush_audit=self.journal.flush,
            retry_base=self.owner_retry_base,
            after_send=lambda: self.crash.hit("after_owner_send"),
            may_act=self.may_act,
        )
        # The fallback topic's "Ack" and "Silence 2h" buttons (section 13), with a public URL.
        self.buttons = owner_buttons.attach(sender, self.owner_queue, self.settings.http.public_url)
        return sender

    def _escalator(self, policy: escalator.Policy) -> escalator.Escalator:
        sender = self.owner
        watch = escalator.Escalator(
            self.conn,
            run_db=self.database.run,
            queue=self.owner_queue,
            policy=policy,
            debounce=self.settings.cadence.debounce,
            clock=self.clock,
            flush_audit=self.journal.flush,
            wake_sender=lambda: sender.wakeup.set() if sender is not None else None,
            may_act=self.may_act,
            after_record=lambda: self.crash.hit("after_escalation_record"),
        )
        escalator.listen_to(self.writer, watch)
        return watch

    def _owner_replies(self, client: httpx.AsyncClient) -> owner_replies.OwnerReplies:
        sender = self.owner
        return owner_replies.OwnerReplies(
            self.conn,
            client,
            run_db=self.database.run,
            owner=self.settings.owner,
            queue=self.owner_queue,
            clock=self.clock,
            flush_audit=self.journal.flush,
            wake_sender=lambda: sender.wakeup.set() if sender is not None else None,
            status_line=lambda: self.vitals.assess_health().line(),
            may_act=self.may_act,
            after_receive=lambda: self.crash.hit("after_owner_receive"),
        )

    def wedge_for_test(self, wedged: bool = True) -> None:
        """Test hook: make the ticker hang forever, as a stuck task would (False: no longer,
        so the test can shut down; the stuck ticker is cancelled)."""
        self.ticker.wedge(wedged)

    # -- housekeeping and the loopback HTTP surface: feed, notify, health, metrics -------------------

    async def prune_retention(self) -> None:
        """Drop what retention no longer keeps (hourly, on the scheduler)."""
        pruned = await self.database.run(
            retention.prune,
            self.conn,
            self.clock(),
            cache_duration=self.settings.ntfy.cache_duration,
        )
        log.info("retention.pruned", **dataclasses.asdict(pruned))

    async def _housekeeping(self) -> None:
        """Retention pruning on a schedule (APScheduler): hourly and a minute after start,
        coalesced, never two runs at once. Stops with the task."""
        await supervisor.after_subscribing(self.writer.subscribed, self.queue)
        from apscheduler.schedulers.asyncio import AsyncIOScheduler  # noqa: PLC0415

        scheduler = AsyncIOScheduler(timezone="UTC")
        scheduler.add_job(
            self.prune_retention,
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
        await supervisor.after_subscribing(self.writer.subscribed, self.queue, stop)
        if stop.is_set():  # stopped during start-up: nothing to serve, no imports to wait for
            return
        # starlette, uvicorn, jinja2: once intake runs, in a thread (~300 ms held the loop's frames)
        for name in ("http_api", "console"):
            await asyncio.to_thread(importlib.import_module, f"ntfy_intake.surfaces.{name}")
        from ntfy_intake.surfaces import console, http_api, owner_actions  # noqa: PLC0415

        actions = console.Actions(
            run=self.database.run,
            conn=lambda: self.conn,
            queue=self.owner_queue,
            flush=self.journal.flush,
            wake_relay=lambda: self.relay.wake() if self.relay is not None else None,
            clock=self.clock,
        )
        cadence_now = lambda: (self.policy, self.owner_queue.view)  # noqa: E731
        app = http_api.create_app(
            **http_api.from_settings(self.settings),  # the store, http.token, the Host names
            notify=self.journal.queue_agent_reply,
            health=self.vitals.http_health,
            metrics_snapshot=self.metrics_snapshot,
            extra_routes=[
                *console.routes(
                    console.Config(self.settings, self.vitals.http_health, cadence_now, actions)
                ),
                *console.api_routes(self.settings.http.token, actions, self.clock),
                *owner_actions.routes(self.buttons),
            ],
            login_notice=self.journal.note,  # failed logins: one owner notice per episode
        )
        try:
            with heap.frozen():  # start-up's objects: never walked by a full collection again
                await http_api.serve(
                    app, self.settings.http.host, self.settings.http.port, stop, self._http_bound
                )
        except OSError as exc:
            # Intake matters more than the HTTP surface: keep recording, say why loudly.
            log.error("http.bind_failed", listen=self.settings.http.listen, detail=str(exc))
            self.vitals.http_down(str(exc))

    def _http_bound(self, port: int) -> None:
        self.vitals.http_listening(port)
        log.info("http.listening", host=self.settings.http.host, port=port)
