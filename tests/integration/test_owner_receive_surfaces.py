"""The reply path from the owner's phone in the health model's surfaces, against the real daemon
(in process), the ntfy emulator and the signal-cli-rest-api stand-in: `/metrics` and the
console's overview say when a receive last succeeded and count the failures while the stand-in
is down (`status` reads the same snapshot: tests/unit/test_status_owner_receive.py)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ntfy_intake.testbed import signal_standin
from ntfy_intake.testbed.emulator import NtfyEmulator

from ..harness import DaemonThread, settings_for, wait_until

pytestmark = pytest.mark.engines

TOKEN = "owner-receive-console-token-9Kq2Lm4Xz7"


def samples(base: str) -> dict[str, float]:
    text = httpx.get(base + "/metrics", timeout=10).text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def receive_line(base: str) -> str:
    with httpx.Client(base_url=base, follow_redirects=False, timeout=10) as client:
        form = client.get("/console/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf is not None
        answer = client.post("/console/login", data={"csrf": csrf.group(1), "token": TOKEN})
        assert answer.status_code == 303, answer.text
        page = client.get("/console/").text
    found = re.search(r'<p id="owner-receive">(.*?)</p>', page)
    assert found is not None, page
    return found.group(1)


def test_metrics_and_console_show_a_reply_path_that_stopped_receiving(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    with signal_standin.running() as sig:
        config = settings_for(
            emu.url,
            tmp_path / "state",
            http_token=TOKEN,
            owner_signal_url=sig.url,
            owner_signal_number="+31600000000",
            owner_recipients="+31600000001",
            owner_receive="poll",
            owner_receive_every="1s",
        )
        with DaemonThread(config) as running:
            wait_until(lambda: running.daemon is not None and running.daemon.http_port)
            assert running.daemon is not None
            base = f"http://127.0.0.1:{running.daemon.http_port}"
            age = "ntfy_intake_owner_receive_last_ok_age_seconds"
            failures = "ntfy_intake_owner_receive_failures_total"
            wait_until(lambda: age in samples(base), timeout=20, what="a receive")
            first = samples(base)
            assert first[age] < 10 and first[failures] == 0
            wait_until(lambda: "poll, last receive" in receive_line(base), timeout=20)
            assert "failing" not in receive_line(base)
            sig.faults.down()
            wait_until(lambda: samples(base)[failures] >= 2, timeout=20, what="failures")
            # The snapshot the console reads is stored every 2 s.
            wait_until(lambda: "<strong>failing</strong>" in receive_line(base), timeout=20)
            assert samples(base)[age] >= 1.0  # no success since the stand-in went down
            sig.faults.down(False)
            wait_until(lambda: "failing" not in receive_line(base), timeout=20, what="recovery")
            assert samples(base)[age] < 10
