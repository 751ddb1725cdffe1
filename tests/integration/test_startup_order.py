"""What loads after intake: the HTTP surface and the scheduler wait for the replay to be
recorded, but never for long, and never when there is nothing to replay."""

from __future__ import annotations

import asyncio
import time

import pytest

from ntfy_intake.flow import intake
from ntfy_intake.runtime import supervisor

pytestmark = pytest.mark.engines


def waited(*, subscribed: bool, backlog: int, drain_after: float | None) -> float:
    async def scenario() -> float:
        queue: asyncio.Queue[intake.Item] = asyncio.Queue()
        opened = asyncio.Event()
        if subscribed:
            opened.set()
        for i in range(backlog):
            queue.put_nowait(i)  # type: ignore[arg-type]

        async def drain() -> None:
            assert drain_after is not None
            await asyncio.sleep(drain_after)
            while not queue.empty():
                queue.get_nowait()

        drainer = asyncio.create_task(drain()) if drain_after is not None else None
        began = time.monotonic()
        await supervisor.after_subscribing(opened, queue)
        if drainer is not None:
            await drainer
        return time.monotonic() - began

    return asyncio.run(scenario())


@pytest.fixture(autouse=True)
def short_startup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor, "STARTUP_CAP_S", 1.0)
    monkeypatch.setattr(supervisor, "STARTUP_GRACE_S", 0.2)


def test_http_surface_waits_for_the_backlog_to_be_recorded() -> None:
    assert waited(subscribed=True, backlog=5, drain_after=0.4) >= 0.4


def test_http_surface_is_not_held_back_by_an_endless_backlog() -> None:
    assert 1.0 <= waited(subscribed=True, backlog=5, drain_after=None) < 3.0


def test_http_surface_loads_at_once_with_nothing_to_replay() -> None:
    assert waited(subscribed=True, backlog=0, drain_after=None) < 0.9  # the cap is 1.0


def test_http_surface_loads_when_ntfy_never_answers() -> None:
    assert waited(subscribed=False, backlog=0, drain_after=None) < 0.9
