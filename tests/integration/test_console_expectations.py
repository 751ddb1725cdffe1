"""The console's overview lists each `[[expect]]` entry and says which publisher went quiet, as
`status` does (both read `status.collect`), against the real daemon and the emulator."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import httpx
import pytest

from ntfy_intake.rules.expectations import Expectation
from ntfy_intake.testbed.emulator import NtfyEmulator

from ..harness import DaemonThread, settings_for, wait_until

pytestmark = pytest.mark.engines

TOKEN = "expectations-console-token-4Rt8Wq2Zx6"
QUIET = Expectation("kuma", "alerts", every=2.0, grace=0.0, title="web up")
FINE = Expectation("nightly-backup", "backups", every=86400.0, grace=3600.0)


def overview(base: str) -> str:
    with httpx.Client(base_url=base, follow_redirects=False) as client:
        form = client.get("/console/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf is not None
        answer = client.post("/console/login", data={"csrf": csrf.group(1), "token": TOKEN})
        assert answer.status_code == 303, answer.text
        return client.get("/console/").text


def test_the_overview_names_the_quiet_publisher(emu: NtfyEmulator, tmp_path: Path) -> None:
    config = settings_for(emu.url, tmp_path / "state", http_token=TOKEN)
    config = dataclasses.replace(config, expect=(QUIET, FINE))
    with DaemonThread(config) as running:
        wait_until(lambda: running.daemon is not None and running.daemon.http_port)
        assert running.daemon is not None
        base = f"http://127.0.0.1:{running.daemon.http_port}"
        emu.publish("backups", "done", title="Backup finished")
        wait_until(lambda: "missed</span> <strong>kuma" in overview(base), timeout=20)
        page = overview(base)
        section = page[page.index('id="expectations"') :]
        assert re.search(r"<strong>nightly-backup</strong> every 1d \(grace 1h\)", section)
        assert "nothing heard yet" in section  # kuma
        assert "due by" in section  # the backup was heard from
