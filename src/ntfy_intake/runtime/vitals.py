"""The daemon's vitals: whether intake lives, and every place that says so.

Liveness notices (dead longer than `dead_after`, then recovered), the systemd watchdog (pinged only
while the loop makes progress) and its STATUS line, the health snapshot that `status` and `check`
read from the database, `/healthz` and `/metrics`, the dead-man's switch, and the clock checked
against ntfy's `Date` header. The verdict itself is the pure `health.assess`.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import httpx
import structlog

from ntfy_intake.flow.pipeline import EventPipeline
from ntfy_intake.rules import health as health_model
from ntfy_intake.rules import notices, watchdog
from ntfy_intake.runtime.clock import TrustedClock
from ntfy_intake.runtime.sdnotify import Notifier
from ntfy_intake.store import db

log = structlog.get_logger("ntfy_intake.daemon")

TICK_SECONDS = 0.05  # the ticker's period (daemon.py); the dead-man's switch judges wedging by it
HEALTH_EVERY = 2.0
HEALTH_KEY = "health"


class Vitals(EventPipeline):
    """Liveness, systemd, health reports and metrics, on top of the pipeline's state."""

    # Health state, set up by daemon.Daemon.__init__.
    trusted_clock: TrustedClock
    notifier: Notifier
    watchdog_interval: float | None
    liveness: watchdog.LivenessTracker
    health_limits: health_model.Limits
    started_wall: float
    last_error_wall: float | None
    http_port: int | None
    http_error: str | None
    watchdog_pings: int
    dead_mans_pings: int
    _seen_frame_at: float | None
    _error_seen: tuple[int, str | None]
    _cached_counts: dict[str, Any]

    # -- the clock, checked against ntfy's -----------------------------------------------------------

    async def _observe_server_time(self, response: httpx.Response) -> None:
        """ntfy's `Date` header: the server time the local clock is checked against."""
        if str(response.request.url).startswith(self.settings.ntfy.url):
            self.trusted_clock.observe_date_header(response.headers.get("date"))

    async def _notice_clock_jumps(self) -> None:
        for detail in self.trusted_clock.take_jumps():
            log.error("clock.jump", detail=detail)
            count = self.trusted_clock.jumps
            await self._db(self._record_notice, notices.clock_jump(detail, self.boot_id, count))
            await self._flush_audit()

    # -- liveness and systemd ------------------------------------------------------------------------

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

    # -- the health verdict and what reports it ------------------------------------------------------

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

    def _http_health(self) -> tuple[bool, dict[str, Any]]:
        assessed = self.assess_health()
        details: dict[str, Any] = {"status": str(assessed.state), "intake": str(assessed.intake)}
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

    # -- the dead-man's switch -----------------------------------------------------------------------

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
