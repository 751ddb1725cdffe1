"""Publisher profiles end to end: each publisher's own publish (tests/publishers.py) posted to
the emulator over HTTP, read by the real daemon.

The failures these kill: Uptime Kuma's Up opened a second incident and a second triage request;
a Gatus resolve and a healthchecks "up" joined their incident as still firing; Alertmanager's and
Grafana's (through ntfy's templates) and the alertmanager-ntfy bridge's resolves the same.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from .. import publishers
from ..harness import DaemonThread, audit_records, event_ids, query, settings_for, wait_until

pytestmark = pytest.mark.one_engine("which incident a publish lands on is a rule; no storage")


def incidents_of(state: Path) -> dict[str, tuple[int, str, int]]:
    return {
        key: (severity, status, events)
        for key, severity, status, events in query(
            state, "SELECT key, severity, status, events FROM incidents"
        )
    }


def test_each_publishers_resolve_resolves_its_incident_with_no_second_triage_request(
    tmp_path: Path,
) -> None:
    with (
        NtfyEmulator(EmulatorConfig(keepalive_interval=1.0)).running() as emu,
        DaemonThread(settings_for(emu.url, tmp_path)),
    ):
        emu.wait_for_subscribers(1)
        sent = publishers.publish_all(emu.url, templates=False)
        wait_until(lambda: len(event_ids(tmp_path)) == sent, what="every event recorded")
    assert incidents_of(tmp_path) == publishers.JSON_EXPECTED
    # One triage request per incident: each resolve joined its firing's (within the debounce).
    requests = query(tmp_path, "SELECT incident_key, reason FROM outbox ORDER BY incident_key")
    assert requests == [(key, "new_incident") for key in sorted(publishers.JSON_EXPECTED)]
    events = [r for r in audit_records(tmp_path) if r["kind"] == "event"]
    by_incident: dict[str, list[dict[str, Any]]] = {}
    for record in events:
        by_incident.setdefault(record["incident"], []).append(record)
    assert set(by_incident) == set(publishers.JSON_EXPECTED)
    for records in by_incident.values():
        assert [r["outcome"] for r in records] == ["triage_requested", "joined"]
        assert records[0]["delivery_key"] == records[1]["delivery_key"]


def test_alertmanager_grafana_and_the_bridge_resolve_their_incidents(tmp_path: Path) -> None:
    with (
        NtfyEmulator(EmulatorConfig(keepalive_interval=1.0)).running() as emu,
        DaemonThread(settings_for(emu.url, tmp_path)),
    ):
        emu.wait_for_subscribers(1)
        publishers.publish_templated_and_bridged(emu.url, "firing")
        time.sleep(1.1)  # ntfy's one-second times: the resolve must be the later event
        publishers.publish_templated_and_bridged(emu.url, "resolved")
        wait_until(lambda: len(event_ids(tmp_path)) == 8, what="eight recorded events")
    assert incidents_of(tmp_path) == publishers.TEMPLATED_EXPECTED
    requests = query(tmp_path, "SELECT incident_key FROM outbox")
    assert sorted(key for (key,) in requests) == sorted(publishers.TEMPLATED_EXPECTED)
