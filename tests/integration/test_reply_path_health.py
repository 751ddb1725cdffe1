"""A reply path that stopped receiving changes the health verdict (DESIGN.md section 13), against
the real daemon (in process), the ntfy emulator and the signal-cli-rest-api stand-in: `/healthz`,
`/metrics` and `ntfy-intake check` (a real subprocess reading the stored snapshot) say degraded
once receiving has failed for `owner.receive_dead_after`, and healthy again after a receive.

`receive_dead_after` is 2 s here (the settings refuse less than 60 s; the rule's edges are
tests/unit/test_health_reply_path.py's, with an injected clock).

Each test is named after the failure it kills.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ntfy_intake.testbed import signal_standin
from ntfy_intake.testbed.emulator import NtfyEmulator

from ..harness import DaemonThread, env_for, settings_for, wait_until

pytestmark = pytest.mark.engines


def health_state(base: str) -> str:
    text = httpx.get(base + "/metrics", timeout=10).text
    return next(
        sample.labels["state"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "ntfy_intake_health_state" and sample.value == 1.0
    )


def check(env: dict[str, str]) -> tuple[int, str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
    full.update(env)
    done = subprocess.run(
        [sys.executable, "-m", "ntfy_intake", "check"],
        env=full,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout + done.stderr


def test_reply_path_dead_past_its_limit_is_degraded_in_check_healthz_and_metrics(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    """Failure mode: signal-cli-rest-api stops answering receives; the owner's acks go unread,
    and every surface a monitor watches keeps saying healthy."""
    with signal_standin.running() as sig:
        overrides = {
            "owner_signal_url": sig.url,
            "owner_signal_number": "+31600000000",
            "owner_recipients": "+31600000001",
            "owner_receive": "poll",
            "owner_receive_every": "1s",
        }
        env = env_for(emu.url, tmp_path / "state", **overrides)
        config = settings_for(emu.url, tmp_path / "state", **overrides)
        config = dataclasses.replace(
            config, owner=dataclasses.replace(config.owner, receive_dead_after=2.0)
        )
        with DaemonThread(config) as running:
            wait_until(lambda: running.daemon is not None and running.daemon.http_port)
            assert running.daemon is not None
            base = f"http://127.0.0.1:{running.daemon.http_port}"
            emu.wait_for_subscribers(1, timeout=30)
            wait_until(lambda: health_state(base) == "live", timeout=30, what="live")
            sig.faults.down()
            wait_until(lambda: health_state(base) == "degraded", timeout=30, what="degraded")
            answer = httpx.get(base + "/healthz", timeout=10)
            assert answer.status_code == 503
            assert answer.json()["status"] == "degraded" and answer.json()["intake"] == "live"
            assert "owner replies over Signal not received" in answer.json()["reason"]
            # check reads the snapshot the daemon stores every few seconds.
            wait_until(lambda: check(env)[0] == 1, timeout=30, what="check unhealthy")
            code, line = check(env)
            assert code == 1 and "degraded: owner replies over Signal" in line
            sig.faults.down(False)
            wait_until(lambda: health_state(base) == "live", timeout=30, what="live again")
            assert httpx.get(base + "/healthz", timeout=10).status_code == 200
            wait_until(lambda: check(env)[0] == 0, timeout=30, what="check healthy again")
