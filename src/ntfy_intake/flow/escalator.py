"""Escalation when the triage agent is silent (DESIGN.md section 13): the daemon tells the owner
itself about a request the agent has not answered within `relay.escalate_after` of its release.

One loop on the leader, next to the relay. Each turn reads the candidates (store/escalations.py),
lets the pure rule (rules/escalation.py) pick the due ones and the next due instant, and records
each due one's owner message, key `escalate:<delivery_key>`, with its `owner_message` audit
record in one write transaction (fenced on PostgreSQL like every write). The owner outbox's
unique key makes that once per request: across kill -9 (the row is committed or not), a rebuild
(rebuild.py restores the row from the audit record) and a failover (the row is in the shared
database). The request itself is untouched: the relay keeps retrying it, and a late 2xx is
handled as usual. With no relay and `relay.escalate_handle` named, the feed is waited on
instead: an entry that handle has not acked within `escalate_after` escalates the same way
(store/escalations.py reads which).

It sleeps until the next due instant, or until a committed batch (a new request, a severity
that rose: `committed`) or `stop` wakes it; there is no polling tick.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from ntfy_intake.rules import escalation
from ntfy_intake.settings import RelaySettings
from ntfy_intake.store import db
from ntfy_intake.store import escalations as store
from ntfy_intake.store.owner_queue import OwnerQueue

__all__ = ["Escalator", "Policy", "listen_to", "policy_for"]

Policy = escalation.Policy

log = structlog.get_logger("ntfy_intake.escalator")

HORIZON = escalation.HORIZON


class Escalator:
    def __init__(
        self,
        conn: db.Connection,
        *,
        run_db: db.Runner,
        queue: OwnerQueue,
        policy: escalation.Policy,
        debounce: float,
        clock: Callable[[], float],
        flush_audit: Callable[[], Awaitable[bool]],
        wake_sender: Callable[[], None],
        may_act: Callable[[], bool] = lambda: True,
        after_record: Callable[[], None] = lambda: None,
    ) -> None:
        self.conn = conn
        self.run_db = run_db
        self.queue = queue
        self.policy = policy
        self.debounce = debounce
        self.clock = clock
        self.flush_audit = flush_audit
        self.wake_sender = wake_sender
        self.may_act = may_act
        # Test hook (the daemon's crash points): right after an escalation committed, before the
        # audit flush and the send.
        self.after_record = after_record
        self.wakeup = asyncio.Event()
        self.recorded = 0  # escalations queued or suppressed by this process
        # The requests the last step saw (replaced whole by the database thread, read on the
        # loop): events joining them do not wake the loop.
        self.known: frozenset[str] = frozenset()

    def committed(self, records: list[dict[str, Any]]) -> None:
        """A batch committed (writer.on_committed): a new request or a higher severity may
        bring the next due instant forward."""
        if escalation.brings_news(records, self.known, self.policy.min_severity):
            self.wakeup.set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set() and self.may_act():
            self.wakeup.clear()
            recorded, next_due = await self.run_db(self.step)
            if recorded:
                self.recorded += recorded
                self.after_record()
                await self.flush_audit()
                self.wake_sender()
            wait = None if next_due is None else max(0.0, next_due - self.clock())
            await self._sleep(stop, wait)

    async def _sleep(self, stop: asyncio.Event, wait: float | None) -> None:
        stopping = asyncio.ensure_future(stop.wait())
        woken = asyncio.ensure_future(self.wakeup.wait())
        try:
            await asyncio.wait({stopping, woken}, timeout=wait, return_when="FIRST_COMPLETED")
        finally:
            for task in (stopping, woken):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def step(self) -> tuple[int, float | None]:
        """(database thread) Record the due escalations, each in its own transaction; how many,
        and the next due instant."""
        now = self.clock()
        pending = store.candidates(
            self.conn,
            since=now - HORIZON - self.policy.after - self.debounce,
            min_severity=self.policy.min_severity,
            debounce=self.debounce,
            feed_handle=self.policy.feed_handle,
        )
        plan = escalation.plan(self.policy, pending, now)
        for request in plan.due:
            self._record(request, now)
        self.known = frozenset(request.delivery_key for request in pending)
        return len(plan.due), plan.next_due

    def _record(self, request: escalation.Pending, now: float) -> None:
        key = escalation.key_for(request.delivery_key)
        with db.write_txn(self.conn) as txn:
            result, _ = self.queue.escalation(
                txn,
                key,
                escalation.message(request, now, feed_handle=self.policy.feed_handle),
                now,
                incident=request.incident_key,
                topics=store.topics(self.conn, request.delivery_key),
            )
        log.warning("escalator.escalated", key=key, incident=request.incident_key, result=result)


def policy_for(relay: RelaySettings) -> Policy | None:
    """The escalator's policy from the `[relay]` settings; None: no escalator runs."""
    return escalation.configured(
        relay.escalate_after,
        relay.escalate_min_severity,
        relay=relay.url is not None,
        feed_handle=relay.escalate_handle,
    )


def listen_to(writer: Any, escalator: Escalator) -> None:
    """Wake `escalator` after each committed batch, keeping the writer's other listener (the
    expectations' watch) told first."""
    previous: Callable[[list[dict[str, Any]]], None] | None = writer.on_committed

    def committed(records: list[dict[str, Any]]) -> None:
        if previous is not None:
            previous(records)
        escalator.committed(records)

    writer.on_committed = committed
