"""A node's graceful stop (the handover drain, runtime/supervisor.py) right after a batch's audit
line was written: the cursor it leaves covers that batch, so the next leader's gap probe has an
id to ask about.

The handover took the cursor before the batch in flight had marked its events durable (that
happens in the event loop once the worker thread returns, after the audit line is on disk).
The first stop after a first start then left the join time as the cursor, and after a cache
loss the next leader resumed by time: no probe, no `gap` notice (the real-ntfy gap tests timed
out on PostgreSQL under load). The daemon runs in this process so the test can hold the worker
thread between the audit line and its return, and lead as a node does (`holding`).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from ntfy_intake.runtime.cluster import Holding
from ntfy_intake.settings import Settings
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from ..harness import DaemonThread, cursor_row, event_ids, notices, settings_for, wait_until

pytestmark = pytest.mark.engines

# Without the fix the handover asks for the cursor within milliseconds of the stop; with it, it
# waits for the held batch, which the test lets go after this long.
RELEASE_AFTER = 1.0


def test_a_handover_right_after_an_audit_line_leaves_an_id_cursor_and_a_cache_loss_a_gap(
    tmp_path: Path,
) -> None:
    clock = {"now": 1_764_000_000.0}
    with NtfyEmulator(
        EmulatorConfig(
            keepalive_interval=1.0,
            clock=lambda: clock["now"],
            cache_duration=1000.0,
            manager_interval=None,
        )
    ).running() as emu:
        config = settings_for(emu.url, tmp_path, ntfy_cache_duration="1000s")
        running = DaemonThread(config).start()
        try:
            daemon = running.daemon
            assert daemon is not None
            emu.wait_for_subscribers(1)
            # Lead as a node does: its stop is the handover (no reorder window, no full drain).
            daemon.holding = Holding(
                term=1,
                node="test",
                before=None,
                may_act=lambda: True,
                lapse=lambda: None,
                view=dict,
            )
            target: list[str] = []
            written, release, asked = threading.Event(), threading.Event(), threading.Event()
            flush = daemon.journal.flush_sync

            def held_flush() -> bool:
                done = flush()
                if target and not release.is_set() and target[0] in event_ids(tmp_path):
                    written.set()  # the audit line is on disk; the event loop has not heard
                    release.wait(30)
                return done

            settle = daemon.writer.settle_cursor

            async def watched_settle(*, at_once: bool = False, whole: bool = False) -> None:
                if whole:
                    asked.set()  # the handover takes the cursor now
                await settle(at_once=at_once, whole=whole)

            daemon.journal.flush_sync = held_flush  # type: ignore[method-assign]
            daemon.writer.settle_cursor = watched_settle  # type: ignore[method-assign]
            target.append(emu.publish("alerts", "recorded, then lost with the cache")["id"])
            assert written.wait(30), "the event's audit line was never written"
            stopper = threading.Thread(target=running.stop)
            stopper.start()
            asked.wait(RELEASE_AFTER)
            release.set()
            stopper.join(30)
            assert not stopper.is_alive()
        finally:
            release.set()
            running.stop()
        assert cursor_row(tmp_path) == ("id", target[0])

        # The server restarts without its cache; the next leader asks after the cursor message.
        restart_after_a_cache_loss(emu, clock, config, tmp_path)


def test_a_stop_after_only_backfilled_events_leaves_an_id_cursor_and_a_cache_loss_a_gap(
    tmp_path: Path,
) -> None:
    """Kills the time cursor a first start left when all it recorded came from its start-up
    poll (alerts published in the half minute before it joined; none since): DESIGN.md section 3
    says a graceful stop leaves an id cursor once any event was recorded. With the join time as
    the cursor, a restart after ntfy lost its cache resumed by time: no probe, so the alert
    lost meanwhile went unnoticed, and the owner was not told. The newest cached event of the
    poll is now the cursor when no live one is: every event the cache held before it was in
    that poll, so nothing before it is left unread."""
    # The server's clock 10 s behind this one: the alerts come before the join's second (the
    # stream, since the join, does not replay them) and inside the poll's half minute.
    clock = {"now": time.time() - 10}
    config_emu = EmulatorConfig(
        keepalive_interval=1.0, clock=lambda: clock["now"], cache_duration=1000.0
    )
    with NtfyEmulator(config_emu).running() as emu:
        before = [emu.publish("alerts", f"before the join {n}")["id"] for n in range(2)]
        config = settings_for(emu.url, tmp_path, ntfy_cache_duration="1000s")
        with DaemonThread(config) as running:
            daemon = running.daemon
            assert daemon is not None
            # Both from the poll, not from the stream.
            wait_until(lambda: daemon.counters.extra.get("backfill_new") == 2, what="the poll")
            assert set(before) <= set(event_ids(tmp_path))
        assert cursor_row(tmp_path) == ("id", before[-1])

        # ntfy restarts without its cache, a minute on; what it held is gone with it.
        restart_after_a_cache_loss(emu, clock, config, tmp_path)


def restart_after_a_cache_loss(
    emu: NtfyEmulator, clock: dict[str, float], config: Settings, tmp_path: Path
) -> None:
    """ntfy loses its cache a minute on (the server's clock, `clock`), one alert is published,
    and the daemon starts again: it records that alert and tells the owner of the gap, from the
    last frame it saw to the oldest message the server still holds."""
    last_seen = clock["now"]
    clock["now"] += 60
    emu.faults.evict(None)
    kept = emu.publish("alerts", "published after the loss")
    with DaemonThread(config):
        wait_until(lambda: kept["id"] in event_ids(tmp_path), what="recording again")
        wait_until(lambda: notices(tmp_path, "gap"), what="the gap notice")
    (gap,) = notices(tmp_path, "gap")
    assert gap["window_start"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(last_seen))
    assert gap["window_end"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(clock["now"]))
