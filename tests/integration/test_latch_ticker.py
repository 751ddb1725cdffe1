"""The audit log latching before the cursor's first save (DESIGN.md section 4): the cursor stays
frozen, and the daemon goes on recording.

Failure mode it kills: the ticker died of it. The first event's line was durable, so its cursor
settled once the reorder window passed; the save was refused (latched) and stayed due at "never
saved + the save interval", -inf; rules/ticks' gather then raised ValueError, the ticker task
ended and the daemon exited 1 (the standby drill's audit_full round, 4 of 20 runs).
"""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path

import pytest

from ntfy_intake.testbed.emulator import NtfyEmulator

from ..harness import DaemonThread, cursor_row, event_ids, query, settings_for, wait_until

WINDOW_S = 3.0  # the reorder window: room to trip the latch before the first save


def test_a_latch_before_the_first_cursor_save_leaves_the_ticker_running(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("/dev/full is not available")
    config = settings_for(emu.url, tmp_path, ntfy_reorder_window=f"{WINDOW_S:g}s")
    with DaemonThread(config) as running:
        assert running.daemon is not None
        emu.wait_for_subscribers(1)
        before = cursor_row(tmp_path)
        first = emu.publish("alerts", "disk 91%", title="Disk")["id"]
        published = time.monotonic()
        wait_until(lambda: first in event_ids(tmp_path), what="the first event's audit line")
        # The disk fills: the day's file becomes one whose every write fails with ENOSPC (the
        # log reopens a file replaced under it).
        day = dt.datetime.now(dt.UTC).strftime("audit-%Y-%m-%d.jsonl")
        full = tmp_path / "audit" / "full.tmp"
        full.symlink_to("/dev/full")
        os.replace(full, tmp_path / "audit" / day)
        second = emu.publish("alerts", "disk 95%", title="Disk")["id"]
        wait_until(lambda: running.daemon is not None and running.daemon.latched, what="latch")
        assert time.monotonic() - published < WINDOW_S, "latched after the window: no repro"
        assert cursor_row(tmp_path) == before
        # Past the first event's window, the ticker's passes with the save refused: the daemon
        # still records.
        time.sleep(WINDOW_S + 1.0)
        third = emu.publish("alerts", "disk 99%", title="Disk")["id"]
        wait_until(
            lambda: (
                query(
                    tmp_path, "SELECT count(*) FROM inbox WHERE event_id IN (?, ?)", second, third
                )
                == [(2,)]
            ),
            what="events recorded after the latch",
        )
        assert cursor_row(tmp_path) == before  # frozen for the life of the process
