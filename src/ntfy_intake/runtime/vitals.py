"""The daemon's vitals: whether intake lives, and every place that says so.

Liveness notices (dead longer than `dead_after`, then recovered), the systemd watchdog (pinged only
while the loop makes progress) and its STATUS line, the health snapshot that `status` and `check`
read from the database, `/healthz` and `/metrics`, the dead-man's switch, and the clock checked
against ntfy's `Date` header. The verdict itself is the pure `health.assess`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

import httpx
import structlog

from ntfy_intake.flow import intake
from ntfy_intake.flow.database import Database, StorageWaits
from ntfy_intake.flow.journal import Journal
from ntfy_intake.flow.owner import OwnerSender
from ntfy_intake.flow.owner_replies import OwnerReplies
from ntfy_intake.flow.pipeline import Counters, Heartbeat
from ntfy_intake.flow.relay import Relay
from ntfy_intake.flow.writer import Writer
from ntfy_intake.rules import health as health_model
from ntfy_intake.rules import notices, ticks, watchdog
from ntfy_intake.runtime.clock import TrustedClock
from ntfy_intake.runtime.sdnotify import Notifier
from ntfy_intake.settings import Settings
from ntfy_intake.store import vitals_state
from ntfy_intake.surfaces import metrics

log = structlog.get_logger("ntfy_intake.daemon")

TICK_SECONDS = 0.05  # the ticker's shortest sleep (daemon.py, rules/ticks.py)
# The ticker's longest sleep when nothing falls due sooner (rules/ticks.py): what bounds work no
# due time names. Its heartbeat is the promise to be back by its next due time (Heartbeat.until),
# so wedging is judged without a beat a second (issue 36).
IDLE_TICK_S = 30.0
# A pass of the ticker stuck this long past its promised wake-up: wedged, for the systemd
# watchdog (at least; twice its own period when longer) and the dead-man's switch.
WEDGED_AFTER_S = 1.0
DEAD_MANS_WEDGED_AFTER_S = 4.0
# After each keepalive interval from the last frame seen, the ticker looks for the next one
# (rules/ticks.frame_due): the snapshot `status` reads keeps its frame within a few seconds.
FRAME_SLACK_S = 0.5
# An unchanged health snapshot is stored again only this often (issue 36: a write and an fsync
# every 2 s while nothing changes): `status` and `silence` read one older than 30 s as a daemon
# that is not running (status.SNAPSHOT_STALE_AFTER). A changed one is stored at the ticker's
# next pass, at most every SNAPSHOT_EVERY: each committed batch wakes it, a keepalive's time
# (FRAME_SLACK_S); a change nothing wakes it for (the intake's state) waits for this at most.
SNAPSHOT_REFRESH_S = 10.0
# What changes on every read: not a change of the daemon's health.
_SNAPSHOT_VOLATILE = frozenset({"updated_at", "last_frame_age_s"})


class Vitals:
    """Liveness, systemd, health reports and metrics, read from what it is given."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: TrustedClock,
        boot_id: str,
        intake_health: intake.IntakeHealth,
        counters: Counters,
        heartbeat: Heartbeat,
        storage: StorageWaits,
        degraded: dict[str, str],
        database: Database,
        journal: Journal,
        writer: Writer,
        notifier: Notifier,
        watchdog_interval: float | None,
        cluster_view: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.settings = settings
        # The node's role, term, leader and lease age (runtime/cluster.py), on PostgreSQL.
        self.cluster_view = cluster_view
        self.clock = clock
        self.boot_id = boot_id
        self.health = intake_health
        self.counters = counters
        self.heartbeat = heartbeat
        self.storage = storage
        self.degraded = degraded  # source -> one-line reason
        self._database = database
        self._journal = journal
        self._writer = writer
        self.notifier = notifier
        self.watchdog_interval = watchdog_interval
        self.liveness = watchdog.LivenessTracker(
            started_at=time.monotonic(),
            keepalive_timeout=settings.ntfy.keepalive_timeout,
            dead_after=settings.ntfy.dead_after,
            recover_after=settings.ntfy.keepalive_interval,
        )
        # Health: wall-clock times, as in the stored snapshot that `status` reads.
        self.started_wall = time.time()
        self.health_limits = health_model.Limits(
            keepalive_timeout=settings.ntfy.keepalive_timeout,
            dead_after=settings.ntfy.dead_after,
        )
        self.relay: Relay | None = None
        self.owner: OwnerSender | None = None
        self.replies: OwnerReplies | None = None
        self.http_port: int | None = None
        self.http_error: str | None = None
        self.watchdog_pings = 0
        self.dead_mans_pings = 0
        self.last_error_wall: float | None = None
        self._seen_frame_at: float | None = None
        self._error_seen: tuple[int, str | None] = (0, None)
        self._stored: dict[str, Any] | None = None  # the last stored snapshot, less the volatile
        self._stored_at = float("-inf")  # monotonic
        self._cached_counts: dict[str, Any] = {}

    def watch_senders(self, relay: Relay | None, owner: OwnerSender | None) -> None:
        """The relay and the owner sender run now: report their counters too."""
        self.relay, self.owner = relay, owner

    def watch_replies(self, replies: OwnerReplies) -> None:
        """Replies from the phone are received now (`owner.receive`): report that path too."""
        self.replies = replies

    def owner_receive(self) -> dict[str, Any] | None:
        """The reply path's health for the snapshot `status` reads: its mode, the clock time of
        the last successful receive, failures this run and the last one's line (an exception's
        type and text: never a message's text). None while `owner.receive` is off."""
        mode = self.settings.owner.receive
        if mode == "off":
            return None
        stats = self.replies.stats if self.replies is not None else None
        return {
            "mode": mode,
            "last_ok": None if stats is None else stats.last_ok,
            "failures": 0 if stats is None else stats.receive_failures,
            "last_error": None if stats is None else stats.last_error,
            "failing_since": None if self.replies is None else self.replies.failing_since,
            "dead_after": self.settings.owner.receive_dead_after,  # health.assess's limit
        }

    def http_listening(self, port: int) -> None:
        self.http_port = port

    def http_down(self, error: str) -> None:
        """The HTTP surface could not start: health says degraded, intake goes on."""
        self.http_error = error

    # -- the clock, checked against ntfy's -----------------------------------------------------------

    async def observe_server_time(self, response: httpx.Response) -> None:
        """ntfy's `Date` header: the server time the local clock is checked against."""
        if str(response.request.url).startswith(self.settings.ntfy.url):
            self.clock.observe_date_header(response.headers.get("date"))

    async def notice_clock_jumps(self) -> None:
        for detail in self.clock.take_jumps():
            log.error("clock.jump", detail=detail)
            count = self.clock.jumps
            await self._journal.note(notices.clock_jump(detail, self.boot_id, count))

    # -- liveness and systemd ------------------------------------------------------------------------

    async def observe_liveness(self) -> None:
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
        await self._journal.note(notice)

    async def run_systemd(self) -> None:
        """WATCHDOG=1 only while the loop makes progress; STATUS= a one-line summary. Not run
        at all outside systemd: nobody reads either (issue 36: no wake-up for nothing)."""
        interval = self.watchdog_interval
        if interval is None and not self.notifier.enabled:
            return
        period = interval if interval is not None else 5.0
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            decision = watchdog.should_ping(
                self._progress(now),
                now,
                keepalive_timeout=self.settings.ntfy.keepalive_timeout,
                slack=max(1.0, period),
                heartbeat_timeout=max(2 * period, WEDGED_AFTER_S),
            )
            if interval is not None and decision.ping and self.notifier.watchdog():
                self.watchdog_pings += 1
            elif interval is not None and not decision.ping:
                log.error("systemd.watchdog_withheld", reason=decision.reason)
            self.notifier.status(self.status_line(decision.reason))

    def _progress(self, now: float) -> watchdog.Progress:
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
            heartbeat_at=now - self.heartbeat.age(now),
            last_frame_at=health.last_frame_at,
            next_attempt_due=due,
            last_attempt_at=health.last_attempt_at,
        )

    def status_line(self, reason: str) -> str:
        """STATUS=: the health model's line, then the counters; the watchdog's reason only when
        it withholds a ping (otherwise it would repeat the state)."""
        assessed = self.assess_health()
        parts = [assessed.line()]
        if self.cluster_view is not None:
            view = self.cluster_view()
            age = view["lease_age_s"]
            parts.append(
                f"{view['role']} {view['node']!r} term {view['term']}"
                + ("" if age is None else f", lease renewed {health_model.ago(age)}")
            )
        if assessed.intake is health_model.State.LIVE:
            parts.append(f"last frame {health_model.ago(assessed.last_frame_age_s)}")
        parts.append(f"{self.counters.recorded} recorded this run")
        cursor = self._writer.cursor
        parts.append(f"cursor {cursor.since if cursor else '-'}")
        if not reason.startswith(("intake live", "intake reconnecting on schedule")):
            parts.append(f"watchdog: {reason}")
        return "; ".join(parts)

    # -- the health verdict and what reports it ------------------------------------------------------

    def stamp_error(self) -> None:
        """Give the intake's last error a time, so every report can say how old it is."""
        failures = sum(n for kind, n in self.health.failures.items() if kind != "stream_ended")
        seen = (failures, self.health.last_error)
        if seen != self._error_seen:
            self._error_seen = seen
            if self.health.last_error is not None:
                self.last_error_wall = time.time()

    def assess_health(self) -> health_model.Health:
        """The one health verdict (see health.py), for /healthz, /metrics, STATUS= and pings."""
        self.stamp_error()
        return health_model.assess(self.health_snapshot(), time.time(), self.health_limits)

    def http_health(self) -> tuple[bool, dict[str, Any]]:
        assessed = self.assess_health()
        details: dict[str, Any] = {"status": str(assessed.state), "intake": str(assessed.intake)}
        if self.cluster_view is not None:
            view = self.cluster_view()
            details.update(
                role=view["role"], node=view["node"], term=view["term"], leader=view["leader"]
            )
        if assessed.reasons:
            details["reason"] = assessed.line()
            details["reasons"] = list(assessed.reasons)
        return assessed.healthy, details

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
            "latch": self._journal.latched,
            "storage": None if self.storage.fault is None else str(self.storage.fault),
            "http_port": self.http_port,
            "http_error": self.http_error,
            "degraded": sorted(self.degraded.values()),
            "recorded": self.counters.recorded,
            "duplicates": self.counters.duplicates,
            "cluster": None if self.cluster_view is None else self.cluster_view(),
            "owner_receive": self.owner_receive(),
        }

    def health_due(self, now: float) -> bool:
        """In the event loop: whether `write_health` would store anything, so an unchanged
        snapshot costs no trip to the worker thread: a change, at most every SNAPSHOT_EVERY (as
        before: live events change it on every batch), or the refresh."""
        age = now - self._stored_at
        if age < health_model.SNAPSHOT_EVERY:
            return False
        return age >= SNAPSHOT_REFRESH_S or self._changed()

    def _changed(self) -> bool:
        snapshot = self.health_snapshot()
        return {k: v for k, v in snapshot.items() if k not in _SNAPSHOT_VOLATILE} != self._stored

    def changed_due(self) -> float:
        """When a changed snapshot may next be stored (monotonic): what a committed batch brings
        the ticker (it changes the snapshot), known without building one (`_changed`)."""
        return self._stored_at + health_model.SNAPSHOT_EVERY

    def lazy_due(self) -> float:
        """When the ticker next owes the snapshot's store (monotonic): a changed one's, else its
        refresh; work that may lag to share a pass (rules/ticks.wait, `lazy`)."""
        changed = self._changed()
        return self._stored_at + (health_model.SNAPSHOT_EVERY if changed else SNAPSHOT_REFRESH_S)

    def next_due(self) -> list[float | None]:
        """When the ticker next owes vitals work (monotonic): the frame time `status` reads, and
        the next liveness transition (rules/ticks.liveness_due). The snapshot's is `lazy_due`."""
        live = self.liveness
        return [
            ticks.frame_due(
                self._seen_frame_at,
                time.monotonic(),
                self.settings.ntfy.keepalive_interval,
                FRAME_SLACK_S,
            ),
            ticks.liveness_due(
                started_at=live.started_at,
                last_frame_at=live.last_frame_at,
                live_since=live.live_since,
                dead_episode_open=live.dead_episode_open,
                dead_after=live.dead_after,
                recover_after=live.recover_after,
            ),
        ]

    def write_health(self, *, final: bool = False) -> bool:
        """In the worker thread: refresh the queue counts and store the health snapshot; True
        when it was stored unchanged (the refresh `status` reads)."""
        conn = self._database.conn
        self._cached_counts = {
            **vitals_state.queue_counts(conn),
            **metrics.escalation_counts(conn, self.settings, time.time()),
        }
        snapshot = self.health_snapshot()
        if final:
            snapshot["state"] = "stopped"
        now = time.monotonic()
        lasting = {k: v for k, v in snapshot.items() if k not in _SNAPSHOT_VOLATILE}
        unchanged = lasting == self._stored
        if unchanged and now - self._stored_at < SNAPSHOT_REFRESH_S:
            return False
        vitals_state.save_health(conn, snapshot, ride=not final)
        self._stored, self._stored_at = lasting, now
        return unchanged

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
            "audit_latch": self._journal.latched,
            "relay_delivered_total": relay_stats.delivered if relay_stats else 0,
            "relay_attempts_total": relay_stats.attempts if relay_stats else 0,
            "owner_sent_total": (owner_stats.sent_signal + owner_stats.sent_ntfy)
            if owner_stats
            else 0,
            **self._receive_metrics(),
            **self._cached_counts,
            **self._cluster_metrics(),
        }

    def _receive_metrics(self) -> dict[str, Any]:
        """The reply path (absent while `owner.receive` is off): the age of the last successful
        receive (None before the first) and the failed receives this run."""
        if self.settings.owner.receive == "off" or self.replies is None:
            return {}
        stats = self.replies.stats
        return {
            "owner_receive_last_ok_age_s": None
            if stats.last_ok is None
            else max(0.0, self.clock() - stats.last_ok),
            "owner_receive_failures_total": stats.receive_failures,
        }

    def _cluster_metrics(self) -> dict[str, Any]:
        if self.cluster_view is None:
            return {}
        view = self.cluster_view()
        return {
            "leader": 1 if view["role"] == "leader" else 0,
            "term": view["term"],
            "failovers_total": view["takeovers"],
            # Readiness (runtime/readiness.py, merged into the view): on every node.
            "ready": view.get("ready"),
            "cluster_intake_live": view.get("cluster_intake_live"),
        }

    # -- the dead-man's switch -----------------------------------------------------------------------

    async def run_dead_mans_switch(self, client: httpx.AsyncClient) -> None:
        """Ping `health.ping_url` only while healthy: silence there means something is wrong here
        (or the Pi is gone), which no message from this process could ever report."""
        url = self.settings.health.ping_url
        assert url is not None
        interval = self.settings.health.ping_interval
        while True:
            healthy, details = self.http_health()
            wedged = self.heartbeat.age(time.monotonic()) > DEAD_MANS_WEDGED_AFTER_S
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
