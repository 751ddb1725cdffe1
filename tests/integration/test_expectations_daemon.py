"""`[[expect]]` against a real daemon subprocess and the emulator, on both engines: a publisher
that goes quiet past `every + grace` gives the owner ONE notice, which a kill -9 and restart
(and, on SQLite, a rebuild of the database from the audit log) do not repeat; the next message
gives one `back` notice. `every = "3s"`: real time, kept short.

Failure mode it kills: nothing noticed a publisher that stopped publishing (issue 34).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ntfy_intake.testbed.emulator import NtfyEmulator

from .. import harness
from ..harness import daemon_process, env_for, event_ids, notices, query, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.engines]

EXPECT = """
[[expect]]
name = "nightly-backup"
topic = "backups"
title = "backup finished"
every = "3s"
grace = "1s"
"""
# Long enough for the restarted daemon's watch to have looked (start-up, the replay caught up,
# then a whole window): a repeat would have been recorded by then.
LOOK = 7.0


def expect_rows(state: Path) -> list[tuple[str, str]]:
    return query(
        state, "SELECT key, kind FROM owner_outbox WHERE key LIKE 'expect:%' ORDER BY created_at"
    )


def kill9(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def test_a_quiet_publisher_gives_one_notice_across_kill9_and_one_when_back(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    config = tmp_path / "config.toml"
    config.write_text(EXPECT)
    env = env_for(emu.url, state, cadence_debounce="0s", config=str(config))
    with daemon_process(env) as proc:
        emu.wait_for_subscribers(1, timeout=30)
        first = emu.publish("backups", "3 GB in 2m", title="Backup finished")["id"]
        # Another topic and another title are not the backup: they do not fill its window.
        emu.publish("alerts", "backup finished", title="Backup finished")
        emu.publish("backups", "disk is slow", title="NAS slow")
        wait_until(lambda: first in event_ids(state), timeout=20)
        # The journal follows the commit: the outbox row can be seen before the notice's line.
        wait_until(
            lambda: len(notices(state, "expect_missed")) == 1, timeout=30, what="the missed notice"
        )
        assert len(expect_rows(state)) == 1
        (missed,) = notices(state, "expect_missed")
        assert missed["expectation"] == "nightly-backup"
        assert missed["key"] == f"expect:nightly-backup:{missed['window_start']}"
        kill9(proc)
    with daemon_process(env) as proc:
        emu.wait_for_subscribers(1, timeout=30)
        time.sleep(LOOK)
        assert proc.poll() is None
        assert len(notices(state, "expect_missed")) == 1
        assert [kind for _, kind in expect_rows(state)] == ["notice"]
        kill9(proc)
    if harness.DATABASE is None:  # a rebuild: the database gone, the audit log kept
        for name in ("intake.sqlite3", "intake.sqlite3-wal", "intake.sqlite3-shm"):
            (state / name).unlink(missing_ok=True)
    with daemon_process(env) as proc:
        emu.wait_for_subscribers(1, timeout=30)
        time.sleep(LOOK)
        assert len(notices(state, "expect_missed")) == 1
        again = emu.publish("backups", "3 GB in 3m", title="Backup  finished")["id"]
        wait_until(lambda: again in event_ids(state), timeout=20)
        wait_until(lambda: len(notices(state, "expect_back")) == 1, timeout=20, what="back")
        (back,) = notices(state, "expect_back")
        assert back["key"] == f"{missed['key']}:back"
        assert back["window_start"] == missed["window_start"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    keys = [key for key, _ in expect_rows(state)]
    assert keys == [missed["key"], back["key"]]
    assert len(notices(state, "expect_missed")) == 1
