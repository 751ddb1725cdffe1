"""A node standing by (DESIGN.md section 9): it campaigns for the lease, mirrors the journal to
its own audit files, and serves what every node serves, until it leads or is stopped.

What a standby does not do: subscribe, record, relay, send to the owner, or write to the store
(its only writes are its own audit files). What it serves on the loopback HTTP surface: the
agent feed (reads and acks work on every node), `/healthz` (`standby`: 200 while a leader's
lease is fresh, 503 when no node leads) and `/metrics`; an agent's `POST /v1/notify` answers
503 naming the leader, so the agent retries there or later.

Invariants owned here:
- the mirror appends journal rows in `seq` order after the highest `seq` its files hold, on a
  read-only connection; nothing it does can change the store;
- the HTTP surface is stopped before `run` returns: the leader's daemon binds the same port.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Mapping
from typing import Any

import structlog

from ntfy_intake.errors import AuditWriteError
from ntfy_intake.rules import cadence
from ntfy_intake.runtime import owed, sdnotify
from ntfy_intake.runtime.cluster import Holding, Member
from ntfy_intake.runtime.sdnotify import Notifier
from ntfy_intake.settings import Settings
from ntfy_intake.store import audit, db

log = structlog.get_logger("ntfy_intake.standby")


def _mirror_faults() -> tuple[type[Exception], ...]:
    """What a mirror step may meet: the database gone (db.ERRORS as it is now), the audit
    directory refusing writes. Both are waited out (the next step goes on after the files'
    last whole line)."""
    return (*db.ERRORS, OSError, AuditWriteError)


class Standby:
    """One stretch of standing by: `run` returns the Holding once this node leads."""

    def __init__(self, settings: Settings, member: Member, notifier: Notifier) -> None:
        self.settings = settings
        self.member = member
        self.notifier = notifier
        self.mirrored = 0
        self.mirror_problem: str | None = None
        self._log = audit.AuditLog(settings.state.audit_dir, time.time)
        self._conn: db.Connection | None = None

    async def run(self, stop: asyncio.Event) -> Holding | None:
        campaign = asyncio.create_task(self.member.campaign(stop), name="campaign")
        http_stop = asyncio.Event()
        helpers = [
            asyncio.create_task(self._mirror_loop(), name="mirror"),
            asyncio.create_task(self._systemd(), name="standby-systemd"),
            asyncio.create_task(self._serve_http(http_stop), name="standby-http"),
        ]
        try:
            return await campaign
        finally:
            http_stop.set()
            for task in helpers[:2]:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            await asyncio.to_thread(self._catch_up_and_close)

    # -- the journal, mirrored -----------------------------------------------------------------------

    async def _mirror_loop(self) -> None:
        while True:
            await asyncio.to_thread(self._mirror_once)
            await asyncio.sleep(self.member.renew_every / 2)

    def _mirror_once(self) -> None:
        try:
            if self._conn is None:
                self._conn = db.connect(self.settings.state.store, readonly=True)
            self.mirrored += audit.mirror(self._conn, self._log)
            self.mirror_problem = None
        except _mirror_faults() as exc:
            text = " ".join(str(exc).split()) or type(exc).__name__
            if text != self.mirror_problem:
                log.warning("standby.mirror_failed", error=text)
            self.mirror_problem = text

    def _catch_up_and_close(self) -> None:
        # What the old leader committed last reaches this node's files before it leads (the
        # leader's recovery appends it anyway; this keeps the mirror whole if it never leads).
        self._mirror_once()
        if self._conn is not None:
            with contextlib.suppress(*db.ERRORS):
                self._conn.close()
            self._conn = None
        self._log.close()

    # -- what a standby says about itself ------------------------------------------------------------

    def health(self) -> tuple[bool, Mapping[str, Any]]:
        """Healthy while a node leads AND the work is in hand (DESIGN.md section 11): this
        node ready itself, the leader's stored intake not dead or latched past yield_after with
        nobody ready to take over (`cluster_problems`, rules/readiness.judge)."""
        view = self.member.view()
        leader = view["leader"]
        work = list(view.get("cluster_problems") or [])
        status = "standby" if leader is not None else "no_leader"
        if leader is not None and work:
            status = "not_ready" if not view.get("ready", True) else "work_stalled"
        details: dict[str, Any] = {
            "status": status,
            "role": "standby",
            "node": view["node"],
            "leader": leader,
            "term": view["term"],
            "lease_age_s": view["lease_age_s"],
            "ready": view.get("ready"),
            "cluster_intake_live": view.get("cluster_intake_live"),
        }
        problems = [*work, *(p for p in (view["problem"], self.mirror_problem) if p)]
        if problems:
            details["reason"] = "; ".join(problems)
        return leader is not None and not work, details

    def leader_console(self) -> str:
        """Where the console sends the owner: the leader's console, or who leads."""
        view = self.member.view()
        if view["leader_url"]:
            return f"{view['leader_url']}/console"
        if view["leader"] is None:
            return "no node (the lease is free; a node takes it within seconds)"
        return f"node {view['leader']!r} (give it [cluster] url to link its console here)"

    def status_line(self) -> str:
        ok, details = self.health()
        if ok:
            return f"standby: node {details['leader']!r} leads (term {details['term']})"
        if details["leader"] is not None:
            return f"standby: {details['reason']}"
        return f"standby: no node leads ({details.get('reason', 'the lease is free')})"

    def metrics(self) -> Mapping[str, Any]:
        ok, _details = self.health()  # the one model: /healthz and /metrics agree
        view = self.member.view()
        return {
            "intake_state": "dead",  # this node does not subscribe
            "health_state": "live" if ok else "dead",
            "leader": 0,
            "term": view["term"],
            "failovers_total": view["takeovers"],
            "ready": view.get("ready"),
            "cluster_intake_live": view.get("cluster_intake_live"),
        }

    async def _systemd(self) -> None:
        """STATUS= when it changed and WATCHDOG=1, on the campaign's schedule (what changes the
        line: its answers, every renew_every) or the watchdog's half period when sooner; not a
        wake-up a second (issue 36). The line is logged on change under systemd or not."""
        said = ""
        watchdog = sdnotify.watchdog_interval(os.environ, os.getpid())
        self.notifier.ready(self.status_line())
        period = max(0.05, self.member.renew_every)
        if watchdog is not None:
            period = min(period, watchdog)
        while True:
            line = self.status_line()
            if line != said:
                self.notifier.status(line)
                log.info("standby.status", status=line)
                said = line
            self.notifier.watchdog()  # the loop turns: a standby's progress is its polling
            await asyncio.sleep(period)

    async def _serve_http(self, stop: asyncio.Event) -> None:
        from ntfy_intake.surfaces import console, http_api, owner_actions  # noqa: PLC0415

        async def notify(_text: str, _key: str) -> tuple[int, Mapping[str, Any]]:
            leader = self.member.view()["leader"]
            return 503, {
                "error": "standby",
                "message": f"this node stands by; send to the leader ({leader or 'none yet'})",
            }

        c = self.settings.cadence
        policy = cadence.Policy(
            debounce=c.debounce, cooldown=c.cooldown, daily_cap=c.daily_cap, timezone=c.timezone
        )
        idle = cadence.CadenceState.empty(policy)  # a standby decides nothing
        app = http_api.create_app(
            db_path=self.settings.state.store,
            token=self.settings.http.token,
            notify=notify,
            health=self.health,
            metrics_snapshot=self.metrics,
            extra_routes=[
                *console.routes(
                    console.Config(
                        self.settings,
                        self.health,
                        lambda: (policy, idle),
                        leader=self.leader_console,
                    )
                ),
                # The fallback topic's buttons: 503 naming the leader (a standby acts on nothing).
                *owner_actions.routes(
                    None, leader=self.leader_console if self.settings.http.public_url else None
                ),
            ],
            # A standby cannot write the outbox: the notice of its failed logins is owed on its
            # node row, and the leader's prober records it (runtime/owed.py).
            login_notice=owed.sink(self.member),
            hosts=http_api.trusted_hosts(self.settings),
        )
        try:
            await http_api.serve(app, self.settings.http.host, self.settings.http.port, stop)
        except OSError as exc:
            log.error("http.bind_failed", listen=self.settings.http.listen, detail=str(exc))
