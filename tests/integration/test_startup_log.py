"""Start-up says which server and topics it subscribes to (and never the token)."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from ..harness import DaemonThread, settings_for

pytestmark = pytest.mark.one_engine("a log line at start-up; no storage")


def test_start_up_logs_the_server_and_topics_it_subscribes_to(tmp_path: Path) -> None:
    token = "tk_" + "s" * 29
    with NtfyEmulator(EmulatorConfig(keepalive_interval=1.0)).running() as emu:
        config = settings_for(emu.url, tmp_path, ntfy_token=token)
        with capture_logs() as logs, DaemonThread(config):
            emu.wait_for_subscribers(1)
    (line,) = [entry for entry in logs if entry["event"] == "intake.subscribing"]
    assert line["detail"].startswith(
        f"subscribing to {emu.url}/alerts,backups/json for 2 topic(s) alerts, backups "
        "(token: yes) since "
    )
    assert all(token not in str(entry) for entry in logs)
