"""Publisher profiles end to end: each publisher's own JSON publish (as its public source sends
it, see tests/unit/test_profiles.py) posted to the emulator over HTTP, read by the real daemon.

The failures these kill: Uptime Kuma's Up opened a second incident and a second triage request;
a Gatus resolve and a healthchecks "up" joined their incident as still firing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from ..harness import DaemonThread, audit_records, event_ids, query, settings_for, wait_until

pytestmark = pytest.mark.one_engine("which incident a publish lands on is a rule; no storage")

# Uptime Kuma (server/notification-providers/ntfy.js): Down at the provider's priority + 1.
KUMA_DOWN = {
    "topic": "alerts",
    "title": "web Down [Uptime-Kuma]",
    "message": "Connection refused",
    "priority": 5,
    "tags": ["red_circle", "lan"],
    "actions": [{"action": "view", "label": "Open web", "url": "http://web.lan"}],
}
KUMA_UP = {
    "topic": "alerts",
    "title": "web Up [Uptime-Kuma]",
    "message": "200 - OK",
    "priority": 4,
    "tags": ["green_circle", "lan"],
}
# Gatus (alerting/provider/ntfy/ntfy.go, v5).
GATUS_FIRING = {
    "topic": "alerts",
    "title": "Gatus: core/api",
    "message": "An alert has been triggered due to having failed 3 time(s) in a row\n"
    "🔴 [STATUS] == 200",
    "tags": ["rotating_light"],
    "priority": 3,
}
GATUS_RESOLVED = {
    "topic": "alerts",
    "title": "Gatus: core/api",
    "message": "An alert has been resolved after passing successfully 5 time(s) in a row\n"
    "🟢 [STATUS] == 200",
    "tags": ["white_check_mark"],
    "priority": 3,
}
# healthchecks (hc/integrations/ntfy/transport.py).
HC_DOWN = {
    "topic": "backups",
    "priority": 5,
    "title": "Nightly backup is DOWN",
    "message": "Reason: success signal did not arrive on time, grace time passed.",
    "markdown": True,
    "tags": ["red_circle"],
}
HC_UP = {
    "topic": "backups",
    "priority": 3,
    "title": "Nightly backup is UP",
    "message": "The downtime lasted 1 hour, 30 minutes.",
    "markdown": True,
    "tags": ["green_circle"],
}


def publish(url: str, payload: dict[str, Any]) -> None:
    """As these publishers do: a JSON body POSTed to the server's root URL."""
    reply = httpx.post(url, json=payload, timeout=10)
    assert reply.status_code == 200, reply.text


def test_each_publishers_resolve_resolves_its_incident_with_no_second_triage_request(
    tmp_path: Path,
) -> None:
    with (
        NtfyEmulator(EmulatorConfig(keepalive_interval=1.0)).running() as emu,
        DaemonThread(settings_for(emu.url, tmp_path)),
    ):
        emu.wait_for_subscribers(1)
        for payload in (KUMA_DOWN, GATUS_FIRING, HC_DOWN):
            publish(emu.url, payload)
        time.sleep(1.1)  # ntfy's one-second times: the resolve must be the later event
        for payload in (KUMA_UP, GATUS_RESOLVED, HC_UP):
            publish(emu.url, payload)
        wait_until(lambda: len(event_ids(tmp_path)) == 6, what="six recorded events")
    incidents = {
        key: (severity, status, events)
        for key, severity, status, events in query(
            tmp_path, "SELECT key, severity, status, events FROM incidents"
        )
    }
    assert incidents == {
        "uptime-kuma:alerts:web": (5, "resolved", 2),
        "gatus:alerts:core/api": (3, "resolved", 2),
        "healthchecks:backups:nightly backup": (5, "resolved", 2),
    }
    # One triage request per incident: each resolve joined its firing's (within the debounce).
    requests = query(tmp_path, "SELECT incident_key, reason FROM outbox ORDER BY incident_key")
    assert requests == [
        ("gatus:alerts:core/api", "new_incident"),
        ("healthchecks:backups:nightly backup", "new_incident"),
        ("uptime-kuma:alerts:web", "new_incident"),
    ]
    events = [r for r in audit_records(tmp_path) if r["kind"] == "event"]
    by_incident: dict[str, list[dict[str, Any]]] = {}
    for record in events:
        by_incident.setdefault(record["incident"], []).append(record)
    assert set(by_incident) == set(incidents)
    for records in by_incident.values():
        assert [r["outcome"] for r in records] == ["triage_requested", "joined"]
        assert records[0]["delivery_key"] == records[1]["delivery_key"]


def _alertmanager_webhook(status: str) -> dict[str, Any]:
    """Alertmanager's webhook body (version 4), one alert in the group."""
    return {
        "version": "4",
        "groupKey": '{}:{alertname="DiskFull"}',
        "status": status,
        "receiver": "ntfy",
        "groupLabels": {"alertname": "DiskFull"},
        "commonLabels": {"alertname": "DiskFull", "instance": "nas:9100", "severity": "warning"},
        "commonAnnotations": {"summary": "disk 91% full"},
        "externalURL": "http://alertmanager:9093",
        "alerts": [
            {
                "status": status,
                "labels": {"alertname": "DiskFull", "instance": "nas:9100", "severity": "warning"},
                "annotations": {"summary": "disk 91% full"},
                "startsAt": "2026-12-06T10:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-12-06T10:05:00Z",
                "generatorURL": "http://prometheus:9090/graph",
                "fingerprint": "3f2a9bc1d4e5f607",
            }
        ],
    }


def _grafana_webhook(status: str) -> dict[str, Any]:
    """Grafana's webhook contact point body, with Grafana's default title."""
    title = (
        "[FIRING:1] HighCPU homelab (nas)"
        if status == "firing"
        else "[RESOLVED] HighCPU homelab (nas)"
    )
    return {
        "receiver": "ntfy",
        "status": status,
        "orgId": 1,
        "alerts": [],
        "groupLabels": {"alertname": "HighCPU", "grafana_folder": "homelab"},
        "commonLabels": {"alertname": "HighCPU", "grafana_folder": "homelab", "host": "nas"},
        "externalURL": "http://grafana:3000/",
        "version": "1",
        "groupKey": '{}:{alertname="HighCPU"}',
        "truncatedAlerts": 0,
        "title": title,
        "state": "alerting" if status == "firing" else "ok",
        "message": f"**{status.title()}**\n\nValue: B=97\nLabels:\n - alertname = HighCPU\n",
    }


def _bridge(url: str, title: str, body: str, priority: str, tags: list[str]) -> None:
    """As alertmanager-ntfy publishes: headers, the description as the body."""
    headers = {"X-Title": title, "X-Tags": ",".join(tags), "X-Priority": priority}
    reply = httpx.post(f"{url}/alerts", content=body.encode(), headers=headers, timeout=10)
    assert reply.status_code == 200, reply.text


def test_alertmanager_grafana_and_the_bridge_resolve_their_incidents(tmp_path: Path) -> None:
    labels = ["alertname = NodeDown", "instance = pi:9100"]
    with (
        NtfyEmulator(EmulatorConfig(keepalive_interval=1.0)).running() as emu,
        DaemonThread(settings_for(emu.url, tmp_path)),
    ):
        emu.wait_for_subscribers(1)
        for status in ("firing", "resolved"):
            for template, body in (
                ("alertmanager", _alertmanager_webhook(status)),
                ("grafana", _grafana_webhook(status)),
            ):
                reply = httpx.post(f"{emu.url}/alerts?template={template}", json=body, timeout=10)
                assert reply.status_code == 200, reply.text
            if status == "firing":
                _bridge(
                    emu.url,
                    "Node pi down",
                    "no scrape for 5m",
                    "urgent",
                    ["rotating_light", *labels],
                )
                _bridge(emu.url, "Disk full on nas", "tank", "high", ["rotating_light"])
                time.sleep(1.1)  # ntfy's one-second times: the resolve must be the later event
            else:
                _bridge(
                    emu.url,
                    "Resolved: Node pi down",
                    "no scrape for 5m",
                    "default",
                    ["+1", *labels],
                )
                _bridge(emu.url, "Resolved: Disk full on nas", "tank", "default", ["+1"])
        wait_until(lambda: len(event_ids(tmp_path)) == 8, what="eight recorded events")
    incidents = {
        key: (severity, status, events)
        for key, severity, status, events in query(
            tmp_path, "SELECT key, severity, status, events FROM incidents"
        )
    }
    assert incidents == {
        "alertmanager:alerts:diskfull": (4, "resolved", 2),  # the warning label raises 3 to 4
        "grafana:alerts:highcpu homelab (nas)": (3, "resolved", 2),
        "alertmanager-ntfy:alerts:nodedown{instance=pi:9100}": (5, "resolved", 2),
        "alerts:disk full on nas": (4, "resolved", 2),  # keyed by its title; resolved by the bridge
    }
    requests = query(tmp_path, "SELECT incident_key FROM outbox")
    assert sorted(key for (key,) in requests) == sorted(incidents)
