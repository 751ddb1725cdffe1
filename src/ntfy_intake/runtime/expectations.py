"""The expectations' watch (DESIGN.md section 12; the rule: rules/expectations.py): fold the audit
log once at start, then what the writer commits, and record each owed notice when it falls due.

No polling tick (DESIGN.md section 14): the task sleeps until the next window's deadline, or
until the writer wakes it with an arrival that ends a told episode. The first `missed` check
waits until a subscription opened and its replay has been recorded (supervisor.after_subscribing):
a message published while the daemon was down fills its window once replayed, and is not
reported missing first. A later disconnect does not pause the checks: a message ntfy holds
until the reconnect may then be told missed, and back once it is replayed. A notice goes through the journal under its key: recorded again after a
restart, a rebuild or on the other node after a failover, it is a no-op in the owner outbox.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import structlog

from ntfy_intake.flow import intake
from ntfy_intake.flow.database import Database
from ntfy_intake.flow.journal import Journal
from ntfy_intake.rules import expectations, notices
from ntfy_intake.rules.durations import format_duration
from ntfy_intake.rules.expectations import Due, Expectation, State
from ntfy_intake.runtime import supervisor
from ntfy_intake.store import expect_fold

log = structlog.get_logger("ntfy_intake.expectations")


class ExpectationWatch:
    """The live state of the `[[expect]]` entries and the task that tells the owner."""

    def __init__(
        self,
        expected: tuple[Expectation, ...],
        *,
        database: Database,
        journal: Journal,
        clock: Callable[[], float],
        audit_dir: Path,
    ) -> None:
        self._expected = expected
        self._database = database
        self._journal = journal
        self._clock = clock
        self._audit_dir = audit_dir
        self._started = clock()
        self.state: State | None = None  # None until the audit log is folded
        self._early: list[Mapping[str, Any]] = []  # committed before that
        self._wakeup = asyncio.Event()

    def committed(self, records: Iterable[Mapping[str, Any]]) -> None:
        """The writer's hook, in the event loop, once a batch's transaction committed."""
        if self.state is None:
            self._early.extend(records)
            return
        for record in records:
            expectations.fold(self.state, record)
        if any(d.kind == "back" for d in expectations.due(self.state, self._clock())):
            self._wakeup.set()

    async def run(self, subscribed: asyncio.Event, queue: asyncio.Queue[intake.Item]) -> None:
        state = await self._database.run(self._load, self._journal.last_written_seq)
        for record in self._early:
            expectations.fold(state, record)
        self._early.clear()
        self.state = state
        # Not before ntfy answered once (an outage at start is intake_dead's to tell, and what
        # ntfy holds is not replayed yet), then not before its replay was recorded.
        await subscribed.wait()
        await supervisor.after_subscribing(subscribed, queue)
        while True:
            self._wakeup.clear()  # before `due`: an arrival folded meanwhile wakes the next wait
            for item in expectations.due(state, self._clock()):
                await self._journal.note(self._notice(item))
                expectations.told(state, item)
                log.warning(
                    "expectations.told",
                    kind=item.kind,
                    expectation=item.expectation.name,
                    key=item.key,
                )
            deadline = expectations.next_check(state)
            timeout = None if deadline is None else max(0.0, deadline - self._clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout)

    def _load(self, folded_above: int) -> State:
        """In the worker thread: the audit files, then the journal rows they lack."""
        state, read = expect_fold.load(
            self._audit_dir,
            self._expected,
            now=self._clock(),
            started=self._started,
            conn=self._database.conn,
            folded_above=folded_above,
        )
        log.info("expectations.folded", entries=len(self._expected), records=read)
        return state

    @staticmethod
    def _notice(item: Due) -> notices.Notice:
        e = item.expectation
        start = expectations.instant(item.window_start)
        if item.kind == "back":
            arrived = expectations.instant(item.arrived or item.window_start)
            return notices.expect_back(e.name, e.topic, start, arrived, item.key)
        heard = item.heard
        return notices.expect_missed(
            e.name, e.topic, format_duration(e.every), start, item.key, heard
        )
