"""Issue 36: an idle relay sleeps until its next due row, not a claim transaction a second, and a
`redrive` from the command line (another process) still reaches it at once: a datagram to the
daemon's nudge socket (flow/relay_wakeup.py), the long poll only behind it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from ntfy_intake.flow import relay, relay_wakeup
from ntfy_intake.store import db
from ntfy_intake.testbed import receiver
from ntfy_intake.testbed.emulator import NtfyEmulator

from .. import harness
from ..conftest import owner_queue
from ..harness import DaemonThread, query, settings_for, wait_until

IDLE_S = 2.5


async def _flushed() -> bool:
    return True


def test_idle_relay_makes_no_claim_transaction_for_seconds(store: db.Connection) -> None:
    """It was: with nothing due or in flight, a claim write transaction each second."""
    trips: list[str] = []

    async def run_db(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        trips.append(getattr(fn, "__name__", repr(fn)))
        return fn(*args, **kwargs)

    async def scenario() -> None:
        async with httpx.AsyncClient() as client:
            r = relay.Relay(
                store,
                client,
                run_db=run_db,
                owner_queue=owner_queue(),
                url="http://receiver.invalid/triage",
                timeout=5,
                max_attempts=3,
                clock=time.time,
                flush_audit=_flushed,
            )
            stop = asyncio.Event()
            running = asyncio.create_task(r.run(stop))
            await asyncio.sleep(0.2)  # start-up: the released leases, the first claim
            before = len(trips)
            await asyncio.sleep(IDLE_S)
            idle = trips[before:]
            r.wake()  # and a wake still claims at once
            await asyncio.sleep(0.2)
            woken = trips[before + len(idle) :]
            stop.set()
            r.wakeup.set()
            await running
        assert idle == [], idle
        assert "_settle_and_claim" in woken, woken

    asyncio.run(scenario())


def test_a_cli_redrive_reaches_the_idle_relay_at_once(emu: NtfyEmulator, tmp_path: Path) -> None:
    """The relay's long poll (relay.POLL_S) is not what a redrive waits for: the CLI nudges."""
    state = tmp_path / "state"
    with receiver.running(tmp_path / "receiver.sqlite3") as triage:
        triage.faults.reject_next(400)
        config = settings_for(emu.url, state, relay_url=triage.url, cadence_debounce="0s")
        with DaemonThread(config):
            emu.wait_for_subscribers(1)
            emu.publish("alerts", "disk full", title="Disk")
            wait_until(lambda: query(state, "SELECT state FROM outbox") == [("dead",)], 30)
            time.sleep(1.5)  # the relay asleep: nothing due
            env = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
            env |= harness.env_for(emu.url, state)
            done = subprocess.run(
                [sys.executable, "-m", "ntfy_intake", "redrive", "--all"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            assert "redriven 1" in done.stdout
            redriven = time.monotonic()
            wait_until(lambda: query(state, "SELECT state FROM outbox") == [("delivered",)], 30)
            # The poll would take up to POLL_S; the nudge, a claim's time (loaded machine: 3 s).
            assert time.monotonic() - redriven < 3.0
    assert relay.POLL_S > 3.0


def test_a_nudge_with_no_daemon_listening_is_told_and_harmless(tmp_path: Path) -> None:
    assert relay_wakeup.nudge(tmp_path) is False
    (tmp_path / relay_wakeup.NUDGE_SOCKET).write_text("")  # a plain file where the socket was
    assert relay_wakeup.nudge(tmp_path) is False


def test_a_state_directory_deeper_than_a_socket_path_still_hears_nudges(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    assert len(str(deep / relay_wakeup.NUDGE_SOCKET)) > 108

    async def scenario() -> int:
        woken: list[int] = []
        listener = relay_wakeup.NudgeListener(deep, lambda: woken.append(1))
        try:
            assert (deep / relay_wakeup.NUDGE_SOCKET).stat().st_mode & 0o077 == 0
            for _ in range(3):  # a burst: one look
                assert relay_wakeup.nudge(deep)
            async with asyncio.timeout(5):
                while not woken:
                    await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
        finally:
            listener.close()
        assert not (deep / relay_wakeup.NUDGE_SOCKET).exists()
        return len(woken)

    assert asyncio.run(scenario()) == 1
    assert relay_wakeup.nudge(deep) is False  # closed: nobody listens


def test_a_socket_file_left_by_a_dead_daemon_is_replaced(tmp_path: Path) -> None:
    (tmp_path / relay_wakeup.NUDGE_SOCKET).write_text("left over")

    async def scenario() -> bool:
        woken = asyncio.Event()
        listener = relay_wakeup.NudgeListener(tmp_path, woken.set)
        try:
            assert relay_wakeup.nudge(tmp_path)
            async with asyncio.timeout(5):
                await woken.wait()
        finally:
            listener.close()
        return woken.is_set()

    assert asyncio.run(scenario())
