"""`ntfy-intake demo`: the whole pipeline on loopback, in a temp dir, with no setup.

A bundled ntfy-compatible server, the daemon, and the reference triage receiver run in this
process; sample alerts are published; the demo prints what happened to each (its recorded
outcome, and the delivery of its triage request) straight from the audit log, then exits 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ntfy_intake import settings
from ntfy_intake.rules.sanitize import one_line
from ntfy_intake.runtime import logs
from ntfy_intake.runtime.daemon import Daemon
from ntfy_intake.store import audit
from ntfy_intake.testbed import receiver, signal_standin
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator
from ntfy_intake.wire import signing

SAMPLES: list[dict[str, Any]] = [
    {
        "topic": "alerts",
        "title": "Disk almost full",
        "message": "nas: /dev/sda1 at 97%",
        "priority": 4,
        "tags": ["warning"],
    },
    {
        "topic": "alerts",
        "title": "Disk  almost FULL",
        "message": "nas: /dev/sda1 at 98%",
        "priority": 4,
    },
    {
        "topic": "backups",
        "title": "Backup stale",
        "message": "restic: last snapshot 30 h ago",
        "priority": 3,
    },
    {
        "topic": "alerts",
        "title": "NAS unreachable",
        "message": "ping nas.lan: 100% packet loss",
        "priority": 5,
        "tags": ["rotating_light"],
    },
    {
        "topic": "alerts",
        "title": "UPS on battery",
        "message": json.dumps({"incident": "ups/battery", "severity": 5, "status": "firing"}),
        "priority": 5,
    },
    {
        "topic": "alerts",
        "title": "UPS on mains",
        "message": json.dumps({"incident": "ups/battery", "severity": 2, "status": "resolved"}),
        "priority": 2,
    },
    {
        "topic": "alerts",
        "title": "Disk almost full",
        "message": "nas: \x1b[31m/dev/sda1\x1b[0m at 99%",
        "priority": 5,
    },
]
TIMEOUT = 30.0


def run(*, extra_alerts: int = 0) -> int:
    logs.configure(level=logging.WARNING)  # the table below is the output; warnings still show
    # One fresh Standard Webhooks secret on both sides: the receiver refuses unsigned requests.
    secret = signing.new_secret(secrets.token_bytes(32))
    with tempfile.TemporaryDirectory(prefix="ntfy-intake-demo-") as tmp:
        state = Path(tmp)
        with (
            NtfyEmulator(
                # The demo publishes --alerts in a burst: ntfy's request limit (60) is off.
                EmulatorConfig(keepalive_interval=5.0, request_limit=False, subscription_limit=None)
            ).running() as emu,
            receiver.running(
                state / "receiver.sqlite3", secret=signing.parse_secret(secret)
            ) as triage,
            signal_standin.running() as signal,
        ):
            config = settings.load(
                None,
                {
                    "NTFY_INTAKE_NTFY_URL": emu.url,
                    "NTFY_INTAKE_NTFY_TOPICS": "alerts,backups",
                    "NTFY_INTAKE_NTFY_KEEPALIVE_INTERVAL": "5s",
                    "NTFY_INTAKE_NTFY_REORDER_WINDOW": "500ms",
                    "NTFY_INTAKE_STATE_DIR": str(state / "state"),
                    "NTFY_INTAKE_RELAY_URL": triage.url,
                    "NTFY_INTAKE_RELAY_SECRET": secret,
                    "NTFY_INTAKE_CADENCE_DEBOUNCE": "1s",
                    "NTFY_INTAKE_HTTP_LISTEN": "127.0.0.1:0",
                    # A cap of one owner message a day, so the demo shows one capped.
                    "NTFY_INTAKE_CADENCE_DAILY_CAP": "1",
                    "NTFY_INTAKE_OWNER_SIGNAL_URL": signal.url,
                    "NTFY_INTAKE_OWNER_SIGNAL_NUMBER": "+31600000000",
                    "NTFY_INTAKE_OWNER_RECIPIENTS": "+31600000001",
                },
            )
            print(f"ntfy-compatible server  {emu.url}")
            print(f"triage receiver         {triage.url} (signed deliveries only)")
            print(f"Signal stand-in         {signal.url}/v2/send (daily cap: 1)")
            print(f"state directory         {config.state.dir}")
            alerts = SAMPLES + [
                {
                    "topic": "alerts",
                    "title": f"Generated alert {n}",
                    "message": f"synthetic #{n}",
                    "priority": 3,
                }
                for n in range(extra_alerts)
            ]
            published = asyncio.run(_drive(config, emu, alerts, signal))
            report = _report(config.state.audit_dir, published)
            report += "\n\n" + _owner_report(config.state.audit_dir, signal)
        print(report)
    return 0


async def _drive(
    config: settings.Settings,
    emu: NtfyEmulator,
    alerts: list[dict[str, Any]],
    signal: signal_standin.SignalHandle,
) -> list[dict[str, Any]]:
    daemon = Daemon(config)
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop))
    await _until(lambda: daemon.health.state == "live", "the daemon to connect")
    published = []
    start = int(time.time())
    for n, alert in enumerate(alerts):
        # One second apart in ntfy time, so "which came last" never depends on the random ids
        # that break ties between events of the same second.
        published.append(emu.publish(**alert, time=start + n))
        await asyncio.sleep(0.05)
    ids = {m["id"] for m in published}

    def settled() -> bool:
        records = list(audit.read_records(config.state.audit_dir))
        events = {r["event_id"] for r in records if r["kind"] == "event"}
        keys = {
            r["delivery_key"] for r in records if r["kind"] == "event" and r.get("delivery_key")
        }
        delivered = {
            r["delivery_key"]
            for r in records
            if r["kind"] == "delivery" and r["result"] == "delivered"
        }
        owner = [
            r for r in records if r["kind"] == "owner_message" and r.get("message_kind") == "triage"
        ]
        queued = {r["key"] for r in owner if r["result"] == "queued"}
        done = {r["key"] for r in owner if r["result"] in ("sent", "dead")}
        return (
            ids <= events
            and keys <= delivered
            and queued <= done
            and len(signal.messages()) >= len(queued)
        )

    await _until(settled, "every alert to be recorded, delivered and reported")
    stop.set()
    await task
    return published


async def _until(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"demo: timed out waiting for {what}")
        await asyncio.sleep(0.05)


def _report(audit_dir: Path, published: Sequence[Mapping[str, Any]]) -> str:
    records = list(audit.read_records(audit_dir))
    events = {r["event_id"]: r for r in records if r["kind"] == "event"}
    deliveries: dict[str, str] = {}
    for r in records:
        if r["kind"] == "delivery":
            deliveries[r["delivery_key"]] = f"{r['result']} (attempt {r['attempt']})"
    lines = [
        "",
        "alert                             outcome            incident                  triage request",
    ]
    for message in published:
        event = events.get(message["id"], {})
        key = event.get("delivery_key")
        delivery = f"{key} -> {deliveries.get(key, 'pending')}" if key else "-"
        title = one_line(str(message.get("title", "")), 32)
        lines.append(
            f"{title:<33} {event.get('outcome', 'MISSING'):<18} {one_line(str(event.get('incident', '')), 25):<25} {delivery}"
        )
    counts: dict[str, int] = {}
    for r in records:
        if r["kind"] == "event":
            counts[r["event_id"]] = counts.get(r["event_id"], 0) + 1
    exact = all(counts.get(m["id"]) == 1 for m in published)
    lines.append("")
    lines.append(
        f"{len(published)} alerts published, {len(events)} recorded, "
        f"{sum(1 for r in records if r['kind'] == 'delivery' and r['result'] == 'delivered')} triage requests delivered; "
        f"exactly one audit record per alert: {'yes' if exact else 'NO'}"
    )
    return "\n".join(lines)


def _owner_report(audit_dir: Path, signal: signal_standin.SignalHandle) -> str:
    records = [r for r in audit.read_records(audit_dir) if r["kind"] == "owner_message"]
    lines = ["owner messages (the triage agent's replies, through the daily cap)"]
    for r in records:
        if r.get("message_kind") != "triage" or r["result"] not in ("queued", "suppressed"):
            continue
        verdict = (
            "queued -> Signal" if r["result"] == "queued" else f"SUPPRESSED ({r.get('reason')})"
        )
        lines.append(f"  {r['key']:<28} {verdict}")
    for message in signal.messages():
        lines.append(f"  Signal received: {one_line(message.message, 90)}")
    return "\n".join(lines)
