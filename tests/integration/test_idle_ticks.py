"""Issue 36: an idle daemon wakes only for what falls due, not on a fixed 50 ms tick.

The ticker's pass (cursor settle, frame time, debounce windows, liveness, the health snapshot) is
counted by its first step, `Writer.settle_cursor`; a live event still gets its cursor saved once
its reorder window passed, the ticker woken by the committed batch, not by polling.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest

from ntfy_intake.flow import writer as writer_module
from ntfy_intake.flow.journal import MARK_OWED_AT_MOST
from ntfy_intake.runtime import ticker
from ntfy_intake.runtime.daemon import Daemon
from ntfy_intake.runtime.sdnotify import Notifier
from ntfy_intake.store import audit, db, storage, vitals_state
from ntfy_intake.testbed.emulator import NtfyEmulator

from ..harness import DaemonThread, event_ids, query, settings_for, wait_until

IDLE_S = 3.0


def count_passes(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The ticker's passes, as the monotonic instants it asked the writer to settle the cursor
    (every pass does, first thing after its nap)."""
    passes: list[float] = []
    settle = writer_module.Writer.settle_cursor

    async def counted(self: writer_module.Writer, **kwargs: bool) -> None:
        passes.append(time.monotonic())
        await settle(self, **kwargs)

    monkeypatch.setattr(writer_module.Writer, "settle_cursor", counted)
    return passes


@pytest.mark.emulator(keepalive_interval=45.0)
def test_idle_ticker_does_not_wake_every_50_ms(
    emu: NtfyEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    passes = count_passes(monkeypatch)
    config = settings_for(emu.url, tmp_path, ntfy_keepalive_interval="45s")
    with DaemonThread(config) as running:
        emu.wait_for_subscribers(1, timeout=30)
        time.sleep(1.5)  # start-up: the overlap poll and its writes
        before = len(passes)
        time.sleep(IDLE_S)
        idle_passes = len(passes) - before
        # A fixed 50 ms tick makes 60 passes; due times alone (the snapshot's 10 s refresh) 0-1.
        # A wedged loop stays detectable without a beat a second: the ticker's sleep is a
        # promise (test_health's wedge test; the watchdog test below).
        assert idle_passes <= 2 * IDLE_S + 2, idle_passes

        # An event arriving while the ticker sleeps its longest: the cursor still follows it
        # once the reorder window (300 ms) passed, well within one heartbeat of sleep more,
        # and reaches the store with the owed writes (no batch comes to carry it).
        published = emu.publish("alerts", "after idle")["id"]
        wait_until(lambda: published in event_ids(tmp_path), 10, "the event recorded")
        began = time.monotonic()
        writer = running.daemon.writer if running.daemon is not None else None
        assert writer is not None
        wait_until(lambda: getattr(writer.cursor, "value", None) == published, 10, "settled")
        assert time.monotonic() - began < 2.0
        wait_until(lambda: cursor_value(tmp_path) == published, 10, "the cursor stored")
        assert time.monotonic() - began < 2.0 + MARK_OWED_AT_MOST


def cursor_value(state_dir: Path) -> str | None:
    rows = query(state_dir, "SELECT value FROM cursor")
    return None if not rows else str(rows[0][0])


@pytest.mark.emulator(keepalive_interval=45.0)
def test_unchanged_health_snapshot_is_not_stored_every_2_s(
    emu: NtfyEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored: list[dict[str, Any]] = []
    save = vitals_state.save_health

    def counted(conn: Any, snapshot: dict[str, Any], **how: Any) -> None:
        stored.append(snapshot)
        save(conn, snapshot, **how)

    monkeypatch.setattr(vitals_state, "save_health", counted)
    config = settings_for(emu.url, tmp_path, ntfy_keepalive_interval="45s")
    with DaemonThread(config) as running:
        emu.wait_for_subscribers(1, timeout=30)
        # Start-up's changes (the HTTP port, bound once intake runs) are changes, not idle.
        wait_until(lambda: running.daemon is not None and running.daemon.http_port, 30, "http")
        time.sleep(2.5)
        before = len(stored)
        time.sleep(11.0)
        idle = stored[before:]
        # Every 2 s stored 5 here; an unchanged one every 10 s stores at most 2.
        assert len(idle) <= 2, [s["updated_at"] for s in idle]
        assert idle  # still refreshed: `status` reads a snapshot older than 30 s as stopped

        # A change (an event recorded) is stored within the ticker's SNAPSHOT_EVERY.
        emu.publish("alerts", "a change")
        wait_until(lambda: any(s["recorded"] == 1 for s in stored), 10, "the change stored")
    assert stored[-1]["state"] == "stopped"


@pytest.mark.emulator(keepalive_interval=45.0)
def test_idle_ticker_does_not_beat_every_second_yet_the_watchdog_keeps_pinging(
    emu: NtfyEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ticker beat at least once a second so the watchdog could tell idle from wedged; it
    now sleeps until its next due work (the snapshot's 10 s refresh here), its sleep a promise
    the watchdog reads (Heartbeat.until), and pings go on."""
    passes = count_passes(monkeypatch)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
        systemd.bind(str(tmp_path / "notify.sock"))
        systemd.settimeout(0.05)
        config = settings_for(emu.url, tmp_path / "state", ntfy_keepalive_interval="45s")
        notifier = Notifier(str(tmp_path / "notify.sock"))
        with DaemonThread(config, notifier=notifier, watchdog_interval=0.25) as running:
            daemon = running.daemon
            assert daemon is not None
            emu.wait_for_subscribers(1, timeout=30)
            # Idle means after start-up's own work: the overlap poll a moment after the stream
            # opens, and the writes it leaves owed (a fixed 1.5 s sleep measured that poll's
            # passes too on a slow run: 3 passes, about 1 run in 4 on either code).
            wait_until(lambda: daemon.counters.extra.get("backfills", 0) >= 1, what="start-up poll")
            wait_until(lambda: db.owed_since(daemon.conn) is None, what="start-up writes")
            time.sleep(1.5)
            before = len(passes)
            drain(systemd)
            pings = 0
            for _ in range(16):  # 4 s, read as it comes: the socket queues 10 datagrams at most
                time.sleep(0.25)
                pings += drain(systemd).count("WATCHDOG=1")
            idle_passes = len(passes) - before
    # A beat a second made at least 4; the 10 s refresh at most 1 (2 under load).
    assert idle_passes <= 2, idle_passes
    assert pings >= 8, pings  # every 0.25 s: not withheld as a stalled loop


def drain(sock: socket.socket) -> list[str]:
    got: list[str] = []
    while True:
        try:
            got.append(sock.recv(4096).decode())
        except TimeoutError:
            return got


def test_a_storage_fault_being_waited_out_keeps_the_ticker_looking_each_second(
    tmp_path: Path,
) -> None:
    """A storage episode's notice is owed when any caller's retry succeeds, which wakes no
    ticker: asleep up to its snapshot refresh, it told the owner that much later."""
    daemon = Daemon(settings_for("http://127.0.0.1:9", tmp_path))
    daemon.recover()
    try:
        daemon.vitals.write_health()  # stored (and written): its refresh is 10 s away
        audit.write_owed_mark(daemon.conn)
        idle = daemon.ticker._wait()
        daemon.storage.fault = storage.StorageFault(
            "disk_full", "database", "No space left on device"
        )
        waiting = daemon.ticker._wait()
    finally:
        daemon.close()
    assert idle > ticker.STORAGE_LOOK_S, idle
    assert waiting <= ticker.STORAGE_LOOK_S, waiting
