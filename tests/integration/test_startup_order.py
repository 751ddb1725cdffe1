"""What loads after intake: the HTTP surface and the scheduler wait for the replay to be
recorded, but never for long, and never when there is nothing to replay."""

from __future__ import annotations

import asyncio
import importlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ntfy_intake.flow import intake
from ntfy_intake.runtime import supervisor
from ntfy_intake.runtime.daemon import Daemon

from ..harness import settings_for

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


def test_http_surfaces_import_off_the_event_loop_not_holding_live_frames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """starlette, uvicorn and jinja2 took ~300 ms to import, on the event loop, just after intake
    subscribed: the first live frames waited that long. Now each surface module is imported in
    a worker thread; here its import waits for the event loop to run meanwhile."""
    daemon = Daemon(settings_for("http://127.0.0.1:9", tmp_path))
    daemon.recover()
    real = importlib.import_module
    loop_ran = threading.Event()
    imported: list[str] = []

    def import_module(name: str, package: str | None = None) -> Any:
        if name.startswith("ntfy_intake.surfaces."):
            assert loop_ran.wait(10), "the event loop did not run while the surfaces imported"
            imported.append(name)
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", import_module)

    async def scenario() -> None:
        daemon.writer.subscribed.set()
        stop = asyncio.Event()
        serving = asyncio.create_task(daemon._serve_http(stop))
        await asyncio.sleep(0)
        loop_ran.set()  # a live frame's turn, taken while the import is under way
        for _ in range(500):
            if daemon.vitals.http_port is not None:
                break
            await asyncio.sleep(0.01)
        stop.set()
        await serving

    try:
        asyncio.run(scenario())
    finally:
        daemon.close()
    assert imported == ["ntfy_intake.surfaces.http_api", "ntfy_intake.surfaces.console"]
