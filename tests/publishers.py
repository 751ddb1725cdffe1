"""Each publisher's own publish, as its public source sends it (see tests/unit/test_profiles.py
for the citations), for the end-to-end tests on the emulator and on the real ntfy server.

`publish_all` sends every publisher's firing, waits past ntfy's one-second `time` resolution,
then every resolve; `EXPECTED` is what the daemon must make of them: one incident each, resolved
(key: severity, status, events).
"""

from __future__ import annotations

import time
from typing import Any

import httpx

# Uptime Kuma (server/notification-providers/ntfy.js): JSON to the server's root URL; Down at
# the provider's priority + 1.
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
JSON_FIRINGS = (KUMA_DOWN, GATUS_FIRING, HC_DOWN)
JSON_RESOLVES = (KUMA_UP, GATUS_RESOLVED, HC_UP)
JSON_EXPECTED = {
    "uptime-kuma:alerts:web": (5, "resolved", 2),
    "gatus:alerts:core/api": (3, "resolved", 2),
    "healthchecks:backups:nightly backup": (5, "resolved", 2),
}

_LABELS = ["alertname = NodeDown", "instance = pi:9100"]
TEMPLATED_EXPECTED = {
    "alertmanager:alerts:diskfull": (4, "resolved", 2),  # the warning label raises 3 to 4
    "grafana:alerts:highcpu homelab (nas)": (3, "resolved", 2),
    "alertmanager-ntfy:alerts:nodedown{instance=pi:9100}": (5, "resolved", 2),
    "alerts:disk full on nas": (4, "resolved", 2),  # keyed by its title; resolved by the bridge
}
EXPECTED = {**JSON_EXPECTED, **TEMPLATED_EXPECTED}


def publish_json(url: str, payload: dict[str, Any]) -> None:
    """As Uptime Kuma, Gatus and healthchecks do: a JSON body POSTed to the server's root."""
    reply = httpx.post(url, json=payload, timeout=10)
    assert reply.status_code == 200, reply.text


def alertmanager_webhook(status: str) -> dict[str, Any]:
    """Alertmanager's webhook body (version 4), one alert in the group."""
    labels = {"alertname": "DiskFull", "instance": "nas:9100", "severity": "warning"}
    return {
        "version": "4",
        "groupKey": '{}:{alertname="DiskFull"}',
        "status": status,
        "receiver": "ntfy",
        "groupLabels": {"alertname": "DiskFull"},
        "commonLabels": labels,
        "commonAnnotations": {"summary": "disk 91% full"},
        "externalURL": "http://alertmanager:9093",
        "alerts": [
            {
                "status": status,
                "labels": labels,
                "annotations": {"summary": "disk 91% full"},
                "startsAt": "2026-12-06T10:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-12-06T10:05:00Z",
                "generatorURL": "http://prometheus:9090/graph",
                "fingerprint": "3f2a9bc1d4e5f607",
            }
        ],
    }


def grafana_webhook(status: str) -> dict[str, Any]:
    """Grafana's webhook contact point body, with Grafana's default title."""
    bracket = "[FIRING:1]" if status == "firing" else "[RESOLVED]"
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
        "title": f"{bracket} HighCPU homelab (nas)",
        "state": "alerting" if status == "firing" else "ok",
        "message": f"**{status.title()}**\n\nValue: B=97\nLabels:\n - alertname = HighCPU\n",
    }


def publish_templated(url: str, template: str, body: dict[str, Any]) -> None:
    """A webhook pointed at ntfy with `?template=` (ntfy >= 2.14 renders it)."""
    reply = httpx.post(f"{url}/alerts?template={template}", json=body, timeout=10)
    assert reply.status_code == 200, reply.text


def bridge(url: str, title: str, body: str, priority: str, tags: list[str]) -> None:
    """As alertmanager-ntfy publishes: headers, the description as the body."""
    headers = {"X-Title": title, "X-Tags": ",".join(tags), "X-Priority": priority}
    reply = httpx.post(f"{url}/alerts", content=body.encode(), headers=headers, timeout=10)
    assert reply.status_code == 200, reply.text


def publish_templated_and_bridged(url: str, status: str) -> None:
    for template, webhook in (("alertmanager", alertmanager_webhook), ("grafana", grafana_webhook)):
        publish_templated(url, template, webhook(status))
    if status == "firing":
        bridge(url, "Node pi down", "no scrape for 5m", "urgent", ["rotating_light", *_LABELS])
        bridge(url, "Disk full on nas", "tank", "high", ["rotating_light"])
    else:
        bridge(url, "Resolved: Node pi down", "no scrape for 5m", "default", ["+1", *_LABELS])
        bridge(url, "Resolved: Disk full on nas", "tank", "default", ["+1"])


def publish_all(url: str, *, templates: bool = True) -> int:
    """Every firing, a pause past ntfy's one-second times, every resolve; how many were sent."""
    for payload in JSON_FIRINGS:
        publish_json(url, payload)
    if templates:
        publish_templated_and_bridged(url, "firing")
    time.sleep(1.1)  # the resolve must be the later event (DESIGN.md section 4)
    for payload in JSON_RESOLVES:
        publish_json(url, payload)
    if templates:
        publish_templated_and_bridged(url, "resolved")
    return 2 * len(JSON_FIRINGS) + (8 if templates else 0)
