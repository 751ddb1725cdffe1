"""`status` and `check`: what the store and the daemon's last health snapshot say, read-only.

Healthy-quiet and dead-quiet look the same from the event count; they differ in frame age:
ntfy sends a frame at least every keepalive interval, so a fresh frame means the subscription
is alive even when nothing is happening. The verdict itself comes from `health.assess`, the same
model the daemon uses for /healthz, /metrics and systemd's STATUS line. What the store holds is
read by `store.summary.read`: this module only words it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ntfy_intake.flow import escalator
from ntfy_intake.rules import escalation, expectations, health, maintenance, readiness
from ntfy_intake.rules.durations import format_duration
from ntfy_intake.settings import Settings
from ntfy_intake.store import audit, db, escalations, expect_fold, leadership, nodes, summary

# A health snapshot older than this means the daemon is not running (it stores one when it
# changes, and an unchanged one every 10 s: runtime/vitals.SNAPSHOT_REFRESH_S).
SNAPSHOT_STALE_AFTER = 30.0


def collect(conn: db.Connection, settings: Settings, now: float) -> dict[str, Any]:
    found = summary.read(conn)
    snapshot = found.snapshot
    cursor = found.cursor
    snapshot_age = now - float(snapshot["updated_at"]) if "updated_at" in snapshot else None
    running = (
        snapshot_age is not None
        and snapshot_age <= SNAPSHOT_STALE_AFTER
        and snapshot.get("state") != "stopped"
    )
    assessed = health.assess(
        snapshot,
        now,
        health.Limits(settings.ntfy.keepalive_timeout, settings.ntfy.dead_after),
        running=running,
        snapshot_age=snapshot_age or 0.0,
    )
    event_age = None
    if snapshot.get("last_event_wall") is not None:
        event_age = round(now - float(snapshot["last_event_wall"]), 1)
    elif found.last_received_at is not None:
        event_age = round(now - found.last_received_at, 1)
    relay = found.outbox
    owner = found.owner
    return {
        "health": assessed.as_dict(),
        "daemon": {
            "running": running,
            "pid": snapshot.get("pid") if running else None,
            "snapshot_age_s": None if snapshot_age is None else round(snapshot_age, 1),
            "http_port": snapshot.get("http_port") if running else None,
            "http_error": snapshot.get("http_error") if running else None,
            # The node whose daemon wrote the snapshot: on a standby's box, the leader's.
            "node": (snapshot.get("cluster") or {}).get("node") if running else None,
        },
        "intake": {
            "state": str(assessed.intake),
            "last_frame_age_s": assessed.last_frame_age_s,
            "last_event_age_s": event_age,
            "cursor": None if cursor is None else f"{cursor.kind}:{cursor.value}",
            "cursor_age_s": None if cursor is None else round(now - cursor.updated_at, 1),
            "connections": snapshot.get("connections", 0),
            "watchdog_drops": snapshot.get("watchdog_drops", 0),
            "last_error": assessed.last_error,
            "last_error_age_s": assessed.last_error_age_s,
            "last_error_current": assessed.error_current,
            "topics": list(settings.ntfy.topics),
        },
        "inbox": {"events": found.events, "incidents": found.incidents},
        "quarantine": {"count": found.quarantined},
        "latch": bool(snapshot.get("latch", False)) if running else False,
        "audit": {"unflushed": found.unflushed},
        "relay": {
            "enabled": settings.relay.url is not None,
            "collecting": relay.collecting,
            "next_release_in_s": None
            if relay.next_release_at is None
            else round(max(0.0, relay.next_release_at - now), 1),
            "pending": relay.pending,
            "delivered": relay.delivered,
            "dead": relay.dead,
            "dead_keys": relay.dead_keys,
        },
        "owner": {
            "pending": owner.pending,
            "sent": owner.sent,
            "suppressed": owner.suppressed,
            "dead": owner.dead,
        },
        "owner_receive": _owner_receive(settings, snapshot if running else {}, now),
        "escalations": _escalations(conn, settings, now),
        "cluster": _cluster(conn, settings),
        "maintenance": _maintenance(settings, now),
        "expectations": _expectations(conn, settings, now, snapshot.get("started_at")),
    }


def _escalations(conn: db.Connection, settings: Settings, now: float) -> dict[str, Any]:
    """The daemon's own messages when the agent is silent (DESIGN.md section 13), apart from
    the agent's: the day's count against `relay.escalate_daily_cap`, how many were held, the
    newest, and the requests that escalate next if the agent stays silent."""
    relay = settings.relay
    policy = escalator.policy_for(relay)
    found: dict[str, Any] = {
        "enabled": policy is not None,
        "after": format_duration(relay.escalate_after),
        "min_severity": relay.escalate_min_severity,
        "cap": relay.escalate_daily_cap,
        "feed_handle": None if policy is None else policy.feed_handle,
    }
    if policy is None:
        return found
    debounce = settings.cadence.debounce
    # Two days back covers today in any zone, whatever the offset.
    view = escalation.overview(
        policy,
        settings.cadence.timezone,
        escalations.recorded(conn, since=now - 2 * 86400),
        escalations.candidates(
            conn,
            since=now - escalation.HORIZON - policy.after - debounce,
            min_severity=policy.min_severity,
            debounce=debounce,
            feed_handle=policy.feed_handle,
        ),
        now,
    )
    last = view.last
    return {
        **found,
        "today": view.today,
        "held_today": view.held_today,
        "last": None
        if last is None
        else {
            "key": last.key,
            "incident": last.incident,
            "state": last.state,
            "reason": last.reason,
            "at": _utc(_moment(last.created_at)),
        },
        "upcoming": [
            {
                "delivery_key": request.delivery_key,
                "incident": request.incident_key,
                "severity": request.severity,
                "due": _utc(_moment(due)),
                "due_in_s": round(max(0.0, due - now), 1),
            }
            for request, due in view.upcoming
        ],
    }


def _owner_receive(settings: Settings, snapshot: dict[str, Any], now: float) -> dict[str, Any]:
    """The reply path from the phone (`owner.receive`) as the running daemon last stored it:
    its mode, how long since a receive succeeded, failures this run and the last one's line
    (an exception's type and text, never a message's). Nothing but the mode when off or when
    no daemon runs."""
    mode = settings.owner.receive
    seen = snapshot.get("owner_receive") if mode != "off" else None
    if not isinstance(seen, dict):
        return {"mode": mode, "running": False}
    last_ok, since = seen.get("last_ok"), seen.get("failing_since")
    return {
        "mode": mode,
        "running": True,
        "last_ok_age_s": None if last_ok is None else round(max(0.0, now - float(last_ok)), 1),
        "failures": int(seen.get("failures") or 0),
        "last_error": seen.get("last_error"),
        "failing_for_s": None if since is None else round(max(0.0, now - float(since)), 1),
    }


def _expectations(
    conn: db.Connection, settings: Settings, now: float, started: object
) -> list[dict[str, Any]]:
    """The `[[expect]]` entries in file order, folded from the audit log as the daemon folds
    them: the last arrival, when the window is missed, and whether it is."""
    if not settings.expect:
        return []
    since = float(started) if isinstance(started, int | float) else now
    state, _ = expect_fold.load(
        settings.state.audit_dir,
        settings.expect,
        now=now,
        started=since,
        conn=conn,
        folded_above=audit.flushed_seq(conn),
    )
    return [
        {
            "name": row.name,
            "topic": row.topic,
            "title": row.title,
            "every": format_duration(row.every),
            "grace": format_duration(row.grace),
            "last": None if row.last is None else _utc(_moment(row.last)),
            "due": _utc(_moment(row.due_at)),
            "missed": row.state == "missed",
            "since": None if row.missed_since is None else _utc(_moment(row.missed_since)),
        }
        for row in expectations.rows(state, now)
    ]


def _moment(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def _maintenance(settings: Settings, now: float) -> list[dict[str, Any]]:
    """The `[[maintenance]]` windows in file order: which holds now (until when), and when each
    other opens next (RFC 3339 UTC)."""
    moment = maintenance.at(now)
    windows = []
    for window in settings.maintenance:
        span = window.holding_span(moment)
        opens = window.next_opening(moment)
        windows.append(
            {
                "name": window.name,
                "when": window.describe(),
                "topics": list(window.topics),
                "incidents": list(window.incidents),
                "active": span is not None,
                "until": None if span is None else _utc(span[1]),
                "next": None if opens is None else _utc(opens),
            }
        )
    return windows


def _utc(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%MZ")


def _cluster(conn: db.Connection, settings: Settings) -> dict[str, Any] | None:
    """This node's role as the leadership row shows it (PostgreSQL; None on one box)."""
    if not db.is_postgres(conn):
        return None
    try:
        row = leadership.read(conn)
    except db.ERRORS:
        row = None  # no lease table yet: no daemon of this version has started
    if row is None:
        return None  # no node ever led: nothing to say but what the daemon's snapshot says
    me = settings.cluster.node
    fresh = row is not None and not row.expired
    try:
        seen = nodes.read_all(conn)
    except db.ERRORS:
        seen = []  # no node table yet: no daemon of this version has started
    c = settings.cluster
    verdict = readiness.judge(
        seen,
        me=me,
        leader=(row.node, row.instance) if fresh else None,
        probe_every=c.probe_every,
        yield_after=c.yield_after,
    )
    return {
        "node": me,
        "role": "leader" if fresh and row is not None and row.node == me else "standby",
        "term": None if row is None else row.term,
        "leader": row.node if fresh and row is not None else None,
        "lease_age_s": None
        if row is None
        else round(settings.cluster.lease_ttl - row.remaining, 1),
        # Readiness (DESIGN.md section 11): the same model the daemons' surfaces read.
        "ready": verdict.ready,
        "not_ready": verdict.reason,
        "intake_live": verdict.intake_live,
        "problems": list(verdict.problems),
        "nodes": [_node(n, row if fresh else None) for n in seen],
    }


def _node(seen: readiness.NodeSeen, lease: Any) -> dict[str, Any]:
    leads = lease is not None and (lease.node, lease.instance) == (seen.node, seen.instance)
    return {
        "node": seen.node,
        "role": "leader" if leads else "standby",
        "ready": seen.ready,
        "reason": seen.reason,
        "version": seen.version,
        "seen_age_s": round(seen.seen_age_s, 1),
        "intake": seen.intake,
        "intake_age_s": None if seen.intake_age_s is None else round(seen.intake_age_s, 1),
    }


def healthy(report: dict[str, Any]) -> tuple[bool, str]:
    """The `check` verdict for container health checks: the health model's one line."""
    cluster = report.get("cluster")
    if cluster is not None and cluster["role"] == "standby":
        # A standby does none of the leader's work: it is well while some node leads and the
        # work is in hand (rules/readiness.judge: this node ready, the leader's intake not
        # stalled with nobody to take over).
        if cluster["leader"] is None:
            return False, f"standby: no node leads (lease {_lease(cluster)})"
        if cluster.get("problems"):
            return False, "standby: " + "; ".join(cluster["problems"])
        return True, f"standby: node {cluster['leader']!r} leads (term {cluster['term']})"
    verdict = report["health"]
    line = verdict["state"]
    if verdict["reasons"]:
        line += ": " + "; ".join(verdict["reasons"])
    elif report["intake"]["last_frame_age_s"] is not None:
        line += f" (last frame {health.ago(report['intake']['last_frame_age_s'])})"
    return bool(verdict["healthy"]), line


_VERDICTS = {
    "live": "live (frames fresh, subscription up)",
    "degraded": "DEGRADED (intake live, something around it is not)",
    "reconnecting": "RECONNECTING",
    "dead": "DEAD",
    "latched": "LATCHED (audit log not writable: restart advised)",
}


def render(report: dict[str, Any]) -> str:
    intake = report["intake"]
    relay = report["relay"]
    verdict = report["health"]
    rows = [("health", _VERDICTS.get(verdict["state"], verdict["state"]))]
    rows.extend(("  why", reason) for reason in verdict["reasons"])
    rows += [
        ("intake", intake["state"]),
        ("daemon", _daemon(report["daemon"])),
        ("last frame", health.ago(intake["last_frame_age_s"])),
        ("last event", health.ago(intake["last_event_age_s"])),
        ("cursor", str(intake["cursor"])),
        ("connections", f"{intake['connections']} (watchdog drops {intake['watchdog_drops']})"),
        ("events recorded", str(report["inbox"]["events"])),
        ("incidents", str(report["inbox"]["incidents"])),
        ("quarantine", str(report["quarantine"]["count"])),
        ("audit latch", "SET (restart advised)" if report["latch"] else "clear"),
        ("audit unflushed", str(report["audit"]["unflushed"])),
        ("relay", ("on" if relay["enabled"] else "off (feed only)") + f": {_relay(relay)}"),
        (
            "owner outbox",
            f"pending {report['owner']['pending']}, sent {report['owner']['sent']}, "
            f"suppressed {report['owner']['suppressed']}, dead {report['owner']['dead']}",
        ),
    ]
    rows.append(("owner replies", _receive_line(report.get("owner_receive"))))
    rows += _escalation_rows(report.get("escalations"))
    if intake["last_error"]:
        when = health.ago(intake["last_error_age_s"])
        if intake["last_error_age_s"] is None:
            when = "time unknown"
        later = "" if intake["last_error_current"] else ", frames have arrived since"
        rows.append(("last error", f"{intake['last_error']} ({when}{later})"))
    if relay["dead_keys"]:
        rows.append(("dead keys", " ".join(relay["dead_keys"])))
    rows += _maintenance_rows(report.get("maintenance") or [])
    rows += _expectation_rows(report.get("expectations") or [])
    if report.get("cluster") is not None:
        cluster = report["cluster"]
        rows[1:1] = [
            ("cluster", _cluster_line(cluster)),
            *(("  problem", text) for text in cluster.get("problems", [])),
            *(("  node", _node_line(n)) for n in cluster.get("nodes", [])),
        ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)


def _maintenance_rows(windows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """`maintenance  1 of 2 holding now`, then one `  window` line each."""
    if not windows:
        return [("maintenance", "no windows")]
    holding = sum(1 for w in windows if w["active"])
    rows = [("maintenance", f"{holding} of {len(windows)} holding now")]
    for w in windows:
        what = ", ".join([*w["topics"], *(f"incident {p}" for p in w["incidents"])])
        if w["active"]:
            state = f"HOLDING until {w['until']}"
        else:
            state = f"next {w['next']}" if w["next"] else "does not open in the next week"
        rows.append(("  window", f"{w['name']!r} {w['when']} ({what}): {state}"))
    return rows


def _escalation_rows(found: dict[str, Any] | None) -> list[tuple[str, str]]:
    """`escalations  1 of 5 today (2 held), after 10m at severity >= 4`, the last one and one
    `  due` line per request that escalates next."""
    if found is None:
        return []
    if not found["enabled"]:
        return [("escalations", "off (no relay nor relay.escalate_handle, or escalate_after 0s)")]
    held = f" ({found['held_today']} held)" if found["held_today"] else ""
    handle = found.get("feed_handle")
    waits = "silent" if handle is None else f"without an ack by feed handle {handle!r}"
    rows = [
        (
            "escalations",
            f"{found['today']} of {found['cap']} today{held},"
            f" after {found['after']} {waits} at severity >= {found['min_severity']}",
        )
    ]
    last = found["last"]
    if last is not None:
        why = f": {last['reason']}" if last["reason"] else ""
        about = last["incident"] or last["key"]
        rows.append(("  last", f"{last['at']} {about} ({last['state']}{why})"))
    for item in found["upcoming"]:
        rows.append(
            (
                "  due",
                f"{item['incident']} (severity {item['severity']}) at {item['due']}"
                f" (in {health.ago(item['due_in_s']).removesuffix(' ago')})"
                " unless the agent answers",
            )
        )
    return rows


def _expectation_rows(entries: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """`expectations  1 of 2 missed`, then one `  expect` line each (none: no line at all)."""
    if not entries:
        return []
    missed = sum(1 for e in entries if e["missed"])
    rows = [("expectations", f"{missed} of {len(entries)} missed")]
    for e in entries:
        what = e["topic"] + (f" title {e['title']!r}" if e["title"] else "")
        heard = f"last {e['last']}" if e["last"] else "nothing heard yet"
        state = f"MISSED since {e['since']}" if e["missed"] else f"due by {e['due']}"
        rows.append(("  expect", f"{e['name']!r} every {e['every']} ({what}): {heard}; {state}"))
    return rows


def _receive_line(receive: dict[str, Any] | None) -> str:
    """`poll: last receive 3.0 s ago, 2 failures (last: ConnectError: ...)`."""
    if receive is None or receive["mode"] == "off":
        return "off"
    if not receive["running"]:
        return f"{receive['mode']}: daemon not running"
    age = receive["last_ok_age_s"]
    text = f"{receive['mode']}: " + (
        "no receive has succeeded yet" if age is None else f"last receive {health.ago(age)}"
    )
    if receive["failing_for_s"] is not None:
        text += f", FAILING since {health.ago(receive['failing_for_s'])}"
    text += f", {receive['failures']} failures this run"
    if receive["last_error"] and receive["failing_for_s"] is not None:
        text += f" (last: {receive['last_error']})"
    return text


def _daemon(daemon: dict[str, Any]) -> str:
    if not daemon["running"]:
        return "not running"
    where = f" on node {daemon['node']!r}" if daemon.get("node") else ""
    text = f"running{where} (pid {daemon['pid']})"
    if daemon.get("http_error"):
        return text + f", HTTP surface down: {daemon['http_error']}"
    if daemon.get("http_port"):
        return text + f", HTTP on port {daemon['http_port']}"
    return text


def _relay(relay: dict[str, Any]) -> str:
    collecting = f"collecting {relay['collecting']}"
    if relay["collecting"] and relay["next_release_in_s"] is not None:
        collecting += f" (debounce window, next release in {relay['next_release_in_s']:.0f} s)"
    return (
        f"{collecting}, pending {relay['pending']}, delivered {relay['delivered']}, "
        f"dead {relay['dead']}"
    )


def _cluster_line(cluster: dict[str, Any]) -> str:
    role = f"{cluster['role']} (node {cluster['node']!r})"
    if cluster["leader"] is None:
        return f"{role}; no node leads, lease {_lease(cluster)}"
    return f"{role}; leader {cluster['leader']!r}, term {cluster['term']}, lease {_lease(cluster)}"


def _node_line(node: dict[str, Any]) -> str:
    """`'pi' leader, ready, version 0.1.0, seen 3.0 s ago, intake live since 12.0 min ago`."""
    ready = "ready" if node["ready"] else f"NOT READY: {node['reason'] or 'no reason given'}"
    held = "" if node["intake_age_s"] is None else f" since {health.ago(node['intake_age_s'])}"
    return (
        f"{node['node']!r} {node['role']}, {ready}, version {node['version']},"
        f" seen {health.ago(node['seen_age_s'])}, intake {node['intake']}{held}"
    )


def _lease(cluster: dict[str, Any]) -> str:
    age = cluster["lease_age_s"]
    return "never taken" if age is None else f"renewed {health.ago(age)}"
