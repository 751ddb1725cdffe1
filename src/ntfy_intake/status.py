"""`status` and `check`: what the store and the daemon's last health snapshot say, read-only.

Healthy-quiet and dead-quiet look the same from the event count; they differ in frame age:
ntfy sends a frame at least every keepalive interval, so a fresh frame means the subscription
is alive even when nothing is happening.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from ntfy_intake import audit
from ntfy_intake.settings import Settings

# A health snapshot older than this means the daemon is not running (it writes one every 2 s).
SNAPSHOT_STALE_AFTER = 15.0


def collect(conn: sqlite3.Connection, settings: Settings, now: float) -> dict[str, Any]:
    def scalar(sql: str, *params: object) -> Any:
        return conn.execute(sql, params).fetchone()[0]

    row = conn.execute("SELECT value FROM kv WHERE name = 'health'").fetchone()
    health: dict[str, Any] = json.loads(row[0]) if row else {}
    cursor = conn.execute("SELECT kind, value, updated_at FROM cursor WHERE id = 1").fetchone()
    snapshot_age = now - float(health["updated_at"]) if "updated_at" in health else None
    running = (
        snapshot_age is not None
        and snapshot_age <= SNAPSHOT_STALE_AFTER
        and health.get("state") != "stopped"
    )
    frame_age = None
    if health.get("last_frame_wall") is not None:
        frame_age = round(now - float(health["last_frame_wall"]), 1)
    event_age = None
    if health.get("last_event_wall") is not None:
        event_age = round(now - float(health["last_event_wall"]), 1)
    else:
        last = scalar("SELECT max(received_at) FROM inbox")
        event_age = None if last is None else round(now - float(last), 1)
    state = _intake_state(running, frame_age, settings)
    dead_keys = [
        r[0]
        for r in conn.execute(
            "SELECT delivery_key FROM outbox WHERE state = 'dead' ORDER BY created_at LIMIT 50"
        )
    ]
    return {
        "daemon": {
            "running": running,
            "pid": health.get("pid") if running else None,
            "snapshot_age_s": None if snapshot_age is None else round(snapshot_age, 1),
        },
        "intake": {
            "state": state,
            "last_frame_age_s": frame_age,
            "last_event_age_s": event_age,
            "cursor": None if cursor is None else f"{cursor[0]}:{cursor[1]}",
            "cursor_age_s": None if cursor is None else round(now - float(cursor[2]), 1),
            "connections": health.get("connections", 0),
            "watchdog_drops": health.get("watchdog_drops", 0),
            "last_error": health.get("last_error"),
            "topics": list(settings.ntfy.topics),
        },
        "inbox": {
            "events": scalar("SELECT count(*) FROM inbox"),
            "incidents": scalar("SELECT count(*) FROM incidents"),
        },
        "quarantine": {"count": scalar("SELECT count(*) FROM quarantine")},
        "latch": bool(health.get("latch", False)) if running else False,
        "audit": {
            "unflushed": scalar(
                "SELECT count(*) FROM audit_journal WHERE seq > ?", audit.flushed_seq(conn)
            ),
        },
        "relay": {
            "enabled": settings.relay.url is not None,
            "collecting": scalar("SELECT count(*) FROM outbox WHERE state = 'collecting'"),
            "pending": scalar("SELECT count(*) FROM outbox WHERE state IN ('pending', 'leased')"),
            "delivered": scalar("SELECT count(*) FROM outbox WHERE state = 'delivered'"),
            "dead": scalar("SELECT count(*) FROM outbox WHERE state = 'dead'"),
            "dead_keys": dead_keys,
        },
        "owner": {
            "pending": scalar(
                "SELECT count(*) FROM owner_outbox WHERE state IN ('pending', 'leased')"
            ),
            "sent": scalar("SELECT count(*) FROM owner_outbox WHERE state = 'sent'"),
            "suppressed": scalar("SELECT count(*) FROM owner_outbox WHERE state = 'suppressed'"),
            "dead": scalar("SELECT count(*) FROM owner_outbox WHERE state = 'dead'"),
        },
    }


def _intake_state(running: bool, frame_age: float | None, settings: Settings) -> str:
    if not running:
        return "dead"
    if frame_age is not None and frame_age <= settings.ntfy.keepalive_timeout:
        return "live"
    if frame_age is not None and frame_age > settings.ntfy.dead_after:
        return "dead"
    return "reconnecting"


def healthy(report: dict[str, Any]) -> tuple[bool, str]:
    """The `check` verdict for container health checks."""
    if not report["daemon"]["running"]:
        return False, "daemon is not running (no fresh health snapshot)"
    if report["latch"]:
        return False, "audit latch is set: restart advised"
    state = report["intake"]["state"]
    if state != "live":
        return False, f"intake is {state} (last frame {report['intake']['last_frame_age_s']} s ago)"
    return True, "live"


def render(report: dict[str, Any]) -> str:
    intake = report["intake"]
    relay = report["relay"]
    verdict = {
        "live": "healthy (frames fresh)",
        "reconnecting": "RECONNECTING",
        "dead": "DEAD",
    }[intake["state"]]
    rows = [
        ("intake", f"{verdict}"),
        ("daemon", "running" if report["daemon"]["running"] else "not running"),
        ("last frame", _age(intake["last_frame_age_s"])),
        ("last event", _age(intake["last_event_age_s"])),
        ("cursor", str(intake["cursor"])),
        ("connections", f"{intake['connections']} (watchdog drops {intake['watchdog_drops']})"),
        ("events recorded", str(report["inbox"]["events"])),
        ("incidents", str(report["inbox"]["incidents"])),
        ("quarantine", str(report["quarantine"]["count"])),
        ("audit latch", "SET (restart advised)" if report["latch"] else "clear"),
        ("audit unflushed", str(report["audit"]["unflushed"])),
        (
            "relay",
            ("on" if relay["enabled"] else "off (feed only)")
            + f": pending {relay['pending']}, delivered {relay['delivered']}, dead {relay['dead']}",
        ),
        (
            "owner outbox",
            f"pending {report['owner']['pending']}, sent {report['owner']['sent']}, "
            f"capped {report['owner']['suppressed']}, undeliverable {report['owner']['dead']}",
        ),
    ]
    if intake["last_error"]:
        rows.append(("last error", str(intake["last_error"])))
    if relay["dead_keys"]:
        rows.append(("dead keys", " ".join(relay["dead_keys"])))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 120:
        return f"{seconds:.1f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min ago"
    return f"{seconds / 3600:.1f} h ago"
