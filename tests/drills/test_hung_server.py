"""A server that accepts the connection and then never answers, as a real subprocess.

Regression test for a wedge found while building the drill (fixed in intake.py by bounding the
wait for response headers and letting stop interrupt a connect in flight).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from ..harness import daemon_process, env_for, event_ids, stream_sinces, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.one_engine("a reconnect to a hung server; the store is only where events land"),
]


def test_reconnect_to_a_server_that_never_answers_is_not_wedged_forever(tmp_path: Path) -> None:
    """Failure mode: the stream was opened with no read timeout, so the wait for the status line
    had no bound and the keepalive watchdog only starts once headers arrived. A reconnect that
    lands while the server is hung (the emulator's `silence`; a zombie proxy in real life) never
    returned, not even after the server recovered, and SIGTERM could not stop the daemon either
    (the drain awaited the stuck reader). With a time or `all` cursor there is no gap probe
    before the stream, so one keepalive timeout is enough to get there."""
    state = tmp_path / "state"
    problems = []
    with NtfyEmulator(EmulatorConfig(keepalive_interval=1.0)).running() as emu:
        env = env_for(emu.url, state, ntfy_keepalive_timeout="1500ms")
        with daemon_process(env) as proc:
            emu.wait_for_subscribers(1, timeout=30)
            assert stream_sinces(emu.subscribe_log)[0] is not None  # the join-time cursor
            emu.faults.silence(True)
            # The watchdog drops the zombie stream and reconnects into the silence ...
            wait_until(lambda: len(stream_sinces(emu.subscribe_log)) >= 2, timeout=10)
            emu.faults.silence(False)  # ... and the server is healthy again.
            event = emu.publish("alerts", "after the outage", title="after")
            try:
                wait_until(lambda: event["id"] in event_ids(state), timeout=8, what="recorded")
            except AssertionError as exc:
                problems.append(f"intake wedged: {exc}")
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(8)
            except Exception:
                problems.append("SIGTERM did not stop the daemon within 8 s")
    assert problems == []
