"""The daemon's ticker: the loop's pulse, asleep until its next due work (issue 36).

A pass: owed storage notices, clock-jump notices, the cursor settle, the last frame's server
time, liveness, closed debounce windows, an owed audit mark (PostgreSQL), the stored health
snapshot when it changed (or its refresh is due). Each has a due time (rules/ticks.py); the
ticker sleeps until the earliest, woken sooner by a committed batch (`Writer.due_moved`) only
when the batch brings a due time before that: while events flow, the cursor's save a second
sets the pace, not each batch.

Its heartbeat is a promise, not a beat a second: going to sleep it says when it will be back
(`Heartbeat.until`), so the systemd watchdog and the dead-man's switch tell an idle ticker from a
pass stuck in an await, which ages from its start.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ntfy_intake.flow import intake
from ntfy_intake.flow.database import Database, StorageWaits
from ntfy_intake.flow.journal import MARK_OWED_AT_MOST, Journal
from ntfy_intake.flow.pipeline import Heartbeat
from ntfy_intake.flow.writer import Writer
from ntfy_intake.rules import ticks
from ntfy_intake.runtime.vitals import IDLE_TICK_S, TICK_SECONDS, Vitals
from ntfy_intake.store import audit, db

STORAGE_LOOK_S = 1.0
# Work falling due this soon after the earliest waits for it: one pass, not two in a row.
GATHER_S = 2 * TICK_SECONDS
# The frame time's save and the snapshot's may lag this long to share the cursor's pass.
LAG_S = 1.0


class Ticker:
    """The pulse; `run` is its task, `wedge` the tests' stuck pass."""

    def __init__(
        self,
        *,
        database: Database,
        journal: Journal,
        writer: Writer,
        vitals: Vitals,
        intake_health: intake.IntakeHealth,
        storage: StorageWaits,
        heartbeat: Heartbeat,
        clock: Callable[[], float],
    ) -> None:
        self.database = database
        self.journal = journal
        self.writer = writer
        self.vitals = vitals
        self.health = intake_health
        self.storage = storage
        self.heartbeat = heartbeat
        self.clock = clock
        self._wedged = False
        self._loop: asyncio.AbstractEventLoop | None = None
        # When the ticker, asleep, wakes next (monotonic); -inf while a pass runs (its own
        # `_wait` sees what a batch brought meanwhile). `_waiter`: its sleep, resolved True
        # when woken sooner, False at the deadline.
        self._deadline = float("-inf")
        self._waiter: asyncio.Future[bool] | None = None
        writer.due_moved = self._batch_committed

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        wait = TICK_SECONDS
        while True:
            # Asleep on schedule is not wedged: the watchdog and the dead-man's switch read the
            # promise (Heartbeat.until); a pass that hangs ages from its start.
            self.heartbeat.beat(until=time.monotonic() + wait)
            await self._nap(wait)
            self.heartbeat.beat()
            if self._wedged:
                await asyncio.Event().wait()  # test hook: a task stuck forever
            self.vitals.stamp_error()
            while self.storage.notices_owed:  # one owner notice per storage episode
                await self.journal.note(self.storage.notices_owed.pop(0))
            await self.vitals.notice_clock_jumps()
            await self.writer.settle_cursor()
            await self.writer.save_frame_time(self.health.last_server_time)
            await self.vitals.observe_liveness()
            await self.writer.release_due()
            now = time.monotonic()
            await self.journal.write_owed_mark(now)
            if self.vitals.health_due(now):
                await self.database.run(self._store_health)
            wait = self._wait()

    def _store_health(self) -> None:
        """In the worker thread: the snapshot stored; a refresh (unchanged: nothing is going on)
        written at once with what else is owed, not left to ride a write that is not coming and
        be written by a trip of its own a second later (`write_owed_mark`)."""
        if self.vitals.write_health():
            audit.write_owed_mark(self.database.conn)

    def _wait(self) -> float:
        """Until the next due work (issue 36: no fixed tick, no heartbeat a second)."""
        now = time.monotonic()
        return ticks.wait(
            now,
            self._due(now) + self.vitals.next_due(),
            floor=TICK_SECONDS,
            ceiling=IDLE_TICK_S,
            gather=GATHER_S,
            lazy=(self.writer.lazy_due(self.health.last_server_time), self.vitals.lazy_due()),
            lag=LAG_S,
        )

    def _batch_committed(self) -> None:
        if self._brought_sooner():
            self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(True)

    def _brought_sooner(self) -> bool:
        """In the event loop, after a committed batch: whether what it may have brought (a
        reorder window to wait out, a debounce window, the changed snapshot, an owed mark) falls
        due before the sleeping ticker wakes anyway. Cheap: no snapshot is built."""
        now = time.monotonic()
        return ticks.sooner(
            now,
            self._due(now),
            self._deadline,
            floor=TICK_SECONDS,
            lazy=(self.writer.lazy_due(self.health.last_server_time), self.vitals.changed_due()),
            lag=LAG_S,
        )

    def _due(self, now: float) -> list[float | None]:
        """The due times besides the vitals' (`Vitals.next_due`)."""
        due = self.writer.next_due(now, self.clock())
        if self.storage.notices_owed:
            due.append(now)
        if self.storage.fault is not None:
            # Its end (any caller's retry that succeeds) owes the owner a notice, and nothing
            # wakes the ticker for it: a look a second while storage is being waited out.
            due.append(now + STORAGE_LOOK_S)
        owed_since = db.owed_since(self.database.conn)  # an audit mark owed (PostgreSQL)
        if owed_since is not None:
            due.append(owed_since + MARK_OWED_AT_MOST)
        return due

    async def _nap(self, wait: float) -> None:
        """Sleep `wait` seconds, or less when a committed batch brings a due time sooner.

        A future and a timer, not asyncio.wait_for on an Event: its task per nap, and the
        cancel of that task awaited at each timeout, cost more than the pass it waited for."""
        loop = asyncio.get_running_loop()
        self._deadline = time.monotonic() + wait
        try:
            while (left := self._deadline - time.monotonic()) > 0:
                waiter = self._waiter = loop.create_future()
                timer = loop.call_later(left, _timed_out, waiter)
                try:
                    woken = await waiter
                finally:
                    timer.cancel()
                    self._waiter = None
                if not woken or self._wedged:
                    return  # the deadline; or the test hook: the pass that hangs
                self._deadline = min(self._deadline, time.monotonic() + self._wait())
        finally:
            self._deadline = float("-inf")

    def wedge(self, wedged: bool) -> None:
        """Test hook (Daemon.wedge_for_test), from the test's thread: the ticker, asleep until
        its next due work, is woken into the pass that hangs."""
        self._wedged = wedged
        if wedged and self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake)


def _timed_out(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)
