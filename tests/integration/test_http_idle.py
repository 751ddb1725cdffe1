"""Issue 36: the daemon's HTTP server costs no wake-ups while no request comes (uvicorn's own
main loop woke every 100 ms), and still says the time in `Date` and stops when told."""

from __future__ import annotations

import asyncio
import threading
import time
from email.utils import parsedate_to_datetime
from pathlib import Path

import httpx

from ntfy_intake.surfaces import http_api
from ntfy_intake.surfaces import serve as _serve

from ..harness import store_of

IDLE_S = 2.0


def _switches() -> int:
    """This thread's context switches (the event loop's wake-ups: it runs in this thread)."""
    status = Path(f"/proc/self/task/{threading.get_native_id()}/status").read_text()
    return sum(
        int(line.split()[1])
        for line in status.splitlines()
        if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"))
    )


def test_idle_http_server_does_not_wake_every_100_ms(tmp_path: Path) -> None:
    app = http_api.create_app(
        db_path=store_of(tmp_path),
        token=None,
        notify=None,
        health=lambda: (True, {}),
        metrics_snapshot=dict,
    )

    async def scenario() -> tuple[int, list[str], float]:
        stop = asyncio.Event()
        bound: list[int] = []
        server = asyncio.create_task(http_api.serve(app, "127.0.0.1", 0, stop, bound.append))
        while not bound:
            assert not server.done(), server
            await asyncio.sleep(0.01)
        base = _serve.base_url("127.0.0.1", bound[0])
        dates = []
        async with httpx.AsyncClient(timeout=30.0) as client:
            dates.append((await client.get(base + "/healthz")).headers["date"])
            await asyncio.sleep(0.2)  # the client's and the server's connection work settles
            before = _switches()
            await asyncio.sleep(IDLE_S)
            idle = _switches() - before
            dates.append((await client.get(base + "/healthz")).headers["date"])
        started = time.monotonic()
        stop.set()
        await asyncio.wait_for(server, 10)
        return idle, dates, time.monotonic() - started

    idle, dates, stopping = asyncio.run(scenario())
    # uvicorn's 100 ms tick made about 20 here; the sleep itself is one or two.
    assert idle <= 5, idle
    # The Date header is the time of the request, not of a tick that no longer runs.
    first, second = (parsedate_to_datetime(d).timestamp() for d in dates)
    assert second - first >= IDLE_S - 1
    assert abs(second - time.time()) < 5
    assert stopping < 5
