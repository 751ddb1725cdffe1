"""An intake attempt and the task that runs it end together (flow/intake.py `_unless_stopped`)."""

from __future__ import annotations

import asyncio
import contextlib

from ntfy_intake.flow import intake


def test_cancelling_the_intake_task_ends_its_attempt_instead_of_orphaning_the_stream() -> None:
    """Kills a node that steps down (its tasks cancelled) while an orphaned attempt goes on
    reading ntfy: the stream must close with the task that opened it."""
    closed = asyncio.Event()

    async def attempt() -> None:  # an open stream: reads until cancelled, then closes
        try:
            await asyncio.Event().wait()
        finally:
            closed.set()

    async def scenario() -> bool:
        outer = asyncio.create_task(intake._unless_stopped(attempt(), asyncio.Event()))
        await asyncio.sleep(0.05)
        outer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await outer
        await asyncio.sleep(0)  # the attempt's own cancellation runs
        return closed.is_set()

    assert asyncio.run(scenario())


def test_a_stop_still_cancels_the_attempt_and_reports_it() -> None:
    async def scenario() -> bool:
        stop = asyncio.Event()
        running = asyncio.create_task(intake._unless_stopped(asyncio.Event().wait(), stop))
        await asyncio.sleep(0.05)
        stop.set()
        return await running

    assert asyncio.run(scenario()) is False
