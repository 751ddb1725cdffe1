"""The parts of the event pipeline that its objects share. How one event becomes exactly one
recorded outcome is told once, in docs/architecture.md ("The flow of one event").

Here: the counters the pipeline adds up, the heartbeat that proves the loop turns, the owner
queue that counts what it queued, the feed appenders, and the drill's crash points.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ntfy_intake.rules import cadence
from ntfy_intake.rules.notices import Notice
from ntfy_intake.store import db, feed
from ntfy_intake.store.owner_queue import OwnerQueue, Record

FEED_SENDER = "ntfy-intake"
TRIAGE_CHANNEL = "triage"
INFO_CHANNEL = "incident_info"  # device deletes/clears that came after their request went out


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

    def add(self, name: str, count: int = 1) -> int:
        """Add to a named counter of `extra`; its new value."""
        value = self.extra.get(name, 0) + count
        self.extra[name] = value
        return value


class Heartbeat:
    """When the loop last proved it turns (monotonic): the ticker's pass, or a storage fault
    being waited out on schedule. The systemd watchdog and the dead-man's switch read it.

    `until`: the ticker, going to sleep, promises its next pass by then (issue 36: it sleeps
    until its next due work, not a second at most), so an idle ticker is not a wedged one; a
    pass stuck in an await stops beating and ages from its start."""

    def __init__(self) -> None:
        self.at = time.monotonic()
        self.until = self.at

    def beat(self, until: float | None = None) -> None:
        self.at = time.monotonic()
        self.until = self.at if until is None else until

    def age(self, now: float) -> float:
        """Seconds since the last beat or the promised next one, whichever is later."""
        return max(0.0, now - max(self.at, self.until))


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


def _append_to(channel: str) -> Callable[[db.Connection, str, Any, str, float], None]:
    """A feed appender for one channel, keyed by the delivery key (a replay appends nothing)."""

    def append(conn: db.Connection, key: str, payload: Any, summary: str, now: float) -> None:
        feed.append_unread(
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
