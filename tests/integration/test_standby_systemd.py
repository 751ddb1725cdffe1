"""Issue 36: a standby tells systemd on the campaign's schedule (or the watchdog's half period),
not with a wake-up a second. A real notify socket; the member is the campaign's view alone."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from ntfy_intake.runtime.sdnotify import Notifier
from ntfy_intake.runtime.standby import Standby

from ..harness import settings_for


class Campaign:
    """What `Standby._systemd` reads of the member: its renewal period and its view."""

    def __init__(self, renew_every: float) -> None:
        self.renew_every = renew_every

    def view(self) -> dict[str, Any]:
        return {
            "leader": "node-a",
            "leader_url": None,
            "node": "node-b",
            "term": 3,
            "lease_age_s": 0.5,
            "problem": None,
            "ready": True,
            "cluster_intake_live": True,
            "takeovers": 0,
        }


def pings_in(tmp_path: Path, seconds: float, renew_every: float) -> int:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
        systemd.bind(str(tmp_path / "notify.sock"))
        systemd.settimeout(0.02)
        standby = Standby(
            settings_for("http://127.0.0.1:9", tmp_path / "state"),
            Campaign(renew_every),  # type: ignore[arg-type]
            Notifier(str(tmp_path / "notify.sock")),
        )
        got: list[str] = []

        async def run() -> None:
            task = asyncio.create_task(standby._systemd())
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                while True:  # read as it comes: the socket queues 10 datagrams at most
                    try:
                        got.append(systemd.recv(4096).decode())
                    except TimeoutError:
                        break
            task.cancel()

        asyncio.run(run())
    assert got[0].startswith("READY=1")
    return got.count("WATCHDOG=1")


def test_a_standby_without_a_watchdog_pings_on_the_campaigns_schedule(tmp_path: Path) -> None:
    # A ping a second made 3 here; the campaign's 2 s period makes 2 (at 0 s and 2 s).
    assert pings_in(tmp_path, 2.5, renew_every=2.0) <= 2


def test_a_standby_under_a_watchdog_pings_at_its_half_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "600000")  # 0.6 s: a ping every 0.3 s
    assert pings_in(tmp_path, 2.0, renew_every=2.0) >= 5
