"""What loads after intake: the HTTP surface and the scheduler wait for the replay to be
recorded, but never for long, and never when there is nothing to replay."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from ntfy_intake.runtime import daemon as daemon_module
from ntfy_intake.runtime.daemon import Daemon

from ..harness import settings_for


def waited(d: Daemon, *, subscribed: bool, backlog: int, drain_after: float | None) -> float:
    async def scenario() -> float:
        d.queue = asyncio.Queue()
        d.subscribed = asyncio.Event()
        if subscribed:
            d.subscribed.set()
        for i in range(backlog):
            d.queue.put_nowait(i)  # type: ignore[arg-type]

        async def drain() -> None:
            assert drain_after is not None
            await asyncio.sleep(drain_after)
            while not d.queue.empty():
                d.queue.get_nowait()

        drainer = asyncio.create_task(drain()) if drain_after is not None else None
        began = time.monotonic()
        await d._after_subscribing()
        if drainer is not None:
            await drainer
        return time.monotonic() - began

    return asyncio.run(scenario())


@pytest.fixture
def d(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Daemon:
    monkeypatch.setattr(daemon_module, "STARTUP_CAP_S", 1.0)
    monkeypatch.setattr(daemon_module, "STARTUP_GRACE_S", 0.2)
    return Daemon(settings_for("http://127.0.0.1:9", tmp_path / "state"))


def test_http_surface_waits_for_the_backlog_to_be_recorded(d: Daemon) -> None:
    assert waited(d, subscribed=True, backlog=5, drain_after=0.4) >= 0.4


def test_http_surface_is_not_held_back_by_an_endless_backlog(d: Daemon) -> None:
    assert 1.0 <= waited(d, subscribed=True, backlog=5, drain_after=None) < 3.0


def test_http_surface_loads_at_once_with_nothing_to_replay(d: Daemon) -> None:
    assert waited(d, subscribed=True, backlog=0, drain_after=None) < 0.9  # the cap is 1.0


def test_http_surface_loads_when_ntfy_never_answers(d: Daemon) -> None:
    assert waited(d, subscribed=False, backlog=0, drain_after=None) < 0.9
