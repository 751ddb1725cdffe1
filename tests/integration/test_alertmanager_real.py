"""A real Alertmanager (v0.35.0, built from its Go module by scripts/build-alertmanager) fires and
resolves one group through the emulator's `?template=alertmanager`, as a homelab wires it: the
webhook receiver's URL is `<ntfy>/<topic>?template=alertmanager` (ntfy's docs, >= 2.14).

What these kill: the emulator ignored `?template=alertmanager` (not a boolean, so not its "not
implemented" refusal either) and published Alertmanager's raw JSON as the message, which no
profile recognises (seen failing on the code before templates.py); and, end to end, a group's firing and its resolve must be one
incident whose resolve is recorded once, even when the daemon is killed with SIGKILL between
them and again after the resolve.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from ..alertmanager import rfc3339, running_alertmanager
from ..harness import daemon_process, env_for, event_ids, query, wait_until

LABELS = {"alertname": "NodeDown", "instance": "nas:9100", "severity": "critical"}
ANNOTATIONS = {"summary": "nas is down"}
SOURCE = "http://prometheus:9090/graph?g0.expr=up+%3D%3D+0"


def expected(status: str, starts: datetime, ends: str) -> tuple[str, str]:
    """ntfy's alertmanager.yml for one alert (see tests/emulator/test_templates.py)."""
    mark = "🚨 Alert" if status == "firing" else "✅ Resolved"
    return (
        f"{mark}: NodeDown",
        f"Status: {status.title()}\nReceiver: ntfy\nAlert: NodeDown\nInstance: nas:9100\n"
        f"Severity: critical\nStarts at: {rfc3339(starts)}Ends at: {ends}\n"
        f"Summary: nas is down\nSource: {SOURCE}",
    )


def rendered(emu: NtfyEmulator) -> list[tuple[str, str]]:
    return [(m.get("title", ""), m["message"]) for m in emu.messages("alerts")]


@pytest.mark.slow
@pytest.mark.one_engine("the publishing side only: no daemon, no store")
def test_alertmanager_fires_and_resolves_one_group_through_the_template(tmp_path: Path) -> None:
    with (
        NtfyEmulator(EmulatorConfig(keepalive_interval=1.0)).running() as emu,
        running_alertmanager(tmp_path / "am", f"{emu.url}/alerts?template=alertmanager") as am,
    ):
        starts = datetime.now(UTC) - timedelta(minutes=1)
        am.post_alert(LABELS, ANNOTATIONS, starts)
        wait_until(lambda: len(rendered(emu)) == 1, timeout=30, what="the firing notification")
        ends = datetime.now(UTC) - timedelta(seconds=1)
        am.post_alert(LABELS, ANNOTATIONS, starts, ends_at=ends)
        wait_until(lambda: len(rendered(emu)) == 2, timeout=30, what="the resolved notification")
        time.sleep(2.5)  # two more group intervals: nothing else is sent for this group
        messages = rendered(emu)
        log = am.log()
    assert messages == [
        expected("firing", starts, "0001-01-01T00:00:00Z"),
        expected("resolved", starts, rfc3339(ends)),
    ], log
    assert "Notify success" in log and "integration=webhook" in log


def kill9(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


@pytest.mark.engines
def test_one_incident_resolved_once_across_kill9_of_the_daemon(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with (
        NtfyEmulator(EmulatorConfig(keepalive_interval=1.0)).running() as emu,
        running_alertmanager(tmp_path / "am", f"{emu.url}/alerts?template=alertmanager") as am,
    ):
        env = env_for(emu.url, state)
        starts = datetime.now(UTC) - timedelta(minutes=1)
        with daemon_process(env) as proc:
            emu.wait_for_subscribers(1, timeout=30)
            am.post_alert(LABELS, ANNOTATIONS, starts)
            wait_until(lambda: len(event_ids(state)) == 1, timeout=30, what="the firing recorded")
            kill9(proc)
        # The resolve arrives while the daemon is dead: ntfy keeps it for the catch-up.
        am.post_alert(LABELS, ANNOTATIONS, starts, ends_at=datetime.now(UTC))
        wait_until(lambda: len(rendered(emu)) == 2, timeout=30, what="the resolve published")
        with daemon_process(env) as proc:
            emu.wait_for_subscribers(1, timeout=30)
            wait_until(lambda: len(event_ids(state)) == 2, timeout=30, what="the resolve recorded")
            kill9(proc)
        # Once more from the same cursor: nothing is recorded twice. The killed daemon's stream
        # may still count as a subscriber: wait for this one's own subscribe, or the SIGTERM
        # can land before its handler is installed (exit -15 on a busy box).
        subscribes = len(emu.subscribe_log)
        with daemon_process(env) as proc:
            wait_until(lambda: len(emu.subscribe_log) > subscribes, 30, "its own subscribe")
            time.sleep(2)  # a catch-up and a keepalive or two
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
    ids = event_ids(state)
    assert sorted(ids) == sorted(m["id"] for m in emu.messages("alerts"))
    assert query(state, "SELECT key, status, events FROM incidents") == [
        ("alertmanager:alerts:nodedown", "resolved", 2)
    ]
    assert query(state, "SELECT count(*) FROM inbox") == [(2,)]
