"""The day's escalations on `/metrics` (DESIGN.md section 13): `ntfy_intake_escalations_today`
and `ntfy_intake_escalations_held_today`, the counts `status` shows, scraped from the real
daemon over its socket. Both engines: the counts are a store read.

Each test is named after the failure it kills.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from ntfy_intake import settings
from ntfy_intake.testbed import signal_standin
from ntfy_intake.testbed.emulator import NtfyEmulator
from ntfy_intake.testbed.receiver import ReceiverHandle

from ..harness import DaemonThread, env_for, wait_until

pytestmark = pytest.mark.engines


def sample(text: str, name: str) -> float | None:
    found = re.search(rf"^ntfy_intake_{name} (\S+)$", text, re.MULTILINE)
    return None if found is None else float(found.group(1))


def test_escalations_of_the_day_are_on_metrics_not_only_in_status(
    emu: NtfyEmulator, tmp_path: Path, triage: ReceiverHandle
) -> None:
    """Failure mode: the monitoring that scrapes /metrics cannot see that the daemon has been
    escalating (the agent silent) or how near the day's cap it is; only `status` says so."""
    triage.faults.fail_next(100_000, status=503)  # the agent is silent throughout
    with signal_standin.running() as sig:
        config = settings.load(
            None,
            env_for(
                emu.url,
                tmp_path / "state",
                cadence_debounce="0s",
                relay_url=triage.url,
                relay_max_attempts="1000",
                relay_escalate_after="1s",
                owner_signal_url=sig.url,
                owner_signal_number="+31600000000",
                owner_recipients="+31600000001",
            ),
        )
        with DaemonThread(config) as running:
            wait_until(lambda: running.daemon is not None and running.daemon.http_port)
            assert running.daemon is not None
            url = f"http://127.0.0.1:{running.daemon.http_port}/metrics"
            emu.wait_for_subscribers(1, timeout=30)
            before = httpx.get(url, timeout=10).text
            emu.publish("alerts", "nas disk at 99%", title="Disk full on nas", priority=5)
            wait_until(
                lambda: sample(httpx.get(url, timeout=10).text, "escalations_today") == 1.0,
                timeout=45,
                what="the escalation counted on /metrics",
            )
            after = httpx.get(url, timeout=10).text
    assert sample(before, "escalations_today") == 0.0
    assert sample(after, "escalations_held_today") == 0.0
    assert "# TYPE ntfy_intake_escalations_today gauge" in after


def test_no_escalation_gauges_while_escalation_is_off(emu: NtfyEmulator, tmp_path: Path) -> None:
    """Failure mode: a zero that reads as "no escalation today" where nothing could escalate
    (no relay nor feed handle): a dashboard would show a healthy 0 for a loop that is off."""
    config = settings.load(None, env_for(emu.url, tmp_path / "state"))
    with DaemonThread(config) as running:
        wait_until(lambda: running.daemon is not None and running.daemon.http_port)
        assert running.daemon is not None
        emu.wait_for_subscribers(1, timeout=30)
        text = httpx.get(f"http://127.0.0.1:{running.daemon.http_port}/metrics", timeout=10).text
    assert "ntfy_intake_events_recorded_total" in text  # the scrape is the daemon's
    assert "escalations_today" not in text and "escalations_held_today" not in text
