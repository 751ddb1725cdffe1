"""docs/publishing.md's Apprise examples, published for real: each lands on the incident the
guide says it does."""

from __future__ import annotations

import json
import time
from pathlib import Path

import apprise
import pytest

from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from ..harness import DaemonThread, event_ids, query, settings_for, wait_until

pytestmark = pytest.mark.one_engine("which incident a publish lands on is a rule; no storage")


def publish(url: str, body: str, title: str | None = None) -> None:
    sender = apprise.Apprise()  # one per message: Apprise throttles repeats on one instance
    assert sender.add(url)
    assert sender.notify(body=body, title=title or "")


def test_the_guides_apprise_examples_land_on_the_incidents_it_promises(tmp_path: Path) -> None:
    with NtfyEmulator(EmulatorConfig(keepalive_interval=1.0)).running() as emu:
        topic = f"ntfy://{emu.url.removeprefix('http://')}/alerts"
        with DaemonThread(settings_for(emu.url, tmp_path)):
            emu.wait_for_subscribers(1)
            publish(topic, "nas: /dev/sda1 at 97%")
            publish(topic, "nas: /dev/sda1 at 98%")  # the same titleless incident
            publish(topic, "nas1 down")
            publish(topic, "nas2 down")  # digits inside words: another incident
            publish(f"{topic}?priority=high", "nas: /dev/sda1 at 97%", title="Disk almost full")
            firing = {"incident": "ups/battery", "severity": 5, "status": "firing"}
            publish(topic, json.dumps(firing), title="UPS on battery")
            time.sleep(1.1)  # the guide's advice: a second between firing and resolved
            resolved = {"incident": "ups/battery", "severity": 2, "status": "resolved"}
            publish(topic, json.dumps(resolved), title="UPS on mains")
            wait_until(lambda: len(event_ids(tmp_path)) == 7, what="seven recorded alerts")
    incidents = {
        key: (severity, status, events)
        for key, severity, status, events in query(
            tmp_path, "SELECT key, severity, status, events FROM incidents"
        )
    }
    assert incidents == {
        "alerts:nas: /dev/sda1 at <pct>": (3, "firing", 2),
        "alerts:nas1 down": (3, "firing", 1),
        "alerts:nas2 down": (3, "firing", 1),
        "alerts:disk almost full": (4, "firing", 1),
        "ups/battery": (5, "resolved", 2),
    }
