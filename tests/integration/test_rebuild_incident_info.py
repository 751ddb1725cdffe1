"""The feed's `incident_info` channel across a rebuild from the audit log (DESIGN.md sections 4
and 13): a delete/clear of a message whose triage request already went out, and the owner's
ack, reach the agent on that channel; when the store is lost and rebuilt from the audit log
the agent finds the same entries, in the same order, under the same seqs. The real daemon on
both engines, the emulator (ntfy 2.16+ deletes and clears), the reference triage receiver
asking to tell the owner, the signal-cli-rest-api stand-in serving his reply; the feed read
over the daemon's own HTTP surface, as an agent reads it.

Each test is named after the failure it kills.
"""

# ruff: noqa: F811 - the fixture `sig` is imported by name, then requested
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest

from ntfy_intake.store import audit, db, migrations, rebuild
from ntfy_intake.testbed.emulator import NtfyEmulator
from ntfy_intake.testbed.receiver import ReceiverHandle
from ntfy_intake.testbed.signal_standin import SignalHandle

from ..harness import DaemonThread, query, wait_until, wipe_store
from .test_owner_loop_rebuild import OWNER, SENDER, config, reply, sig  # noqa: F401

pytestmark = pytest.mark.engines

INFO = "incident_info"
TOKEN = "agent-token-7Qx2-rebuild-feed-0042"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def base(daemon: DaemonThread) -> str:
    """The daemon's HTTP surface, once it listens (after start-up's own work)."""
    running = daemon.daemon
    assert running is not None
    wait_until(lambda: running.http_port is not None, timeout=30, what="the HTTP surface")
    return f"http://127.0.0.1:{running.http_port}"


def feed(daemon: DaemonThread, path: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{base(daemon)}{path}", headers=AUTH, timeout=10)
    answer.raise_for_status()
    entries = answer.json()
    assert isinstance(entries, list)
    return entries


def ack(daemon: DaemonThread, handle: str, seq: int) -> None:
    answer = httpx.post(
        f"{base(daemon)}/v1/feed/{handle}/ack",
        json={"channel": INFO, "seq": seq},
        headers=AUTH,
        timeout=10,
    )
    answer.raise_for_status()


def history(daemon: DaemonThread, handle: str, channel: str = INFO) -> list[dict[str, Any]]:
    """The whole channel as a handle that never read it sees it (it joins at the start)."""
    return feed(daemon, f"/v1/feed/{handle}?channel={channel}&at=start")


def same_entries(after: list[dict[str, Any]], before: list[dict[str, Any]]) -> None:
    """Equal but for `created_at`, which the audit log keeps to the millisecond."""
    assert [{**e, "created_at": None} for e in after] == [{**e, "created_at": None} for e in before]
    for rebuilt, live in zip(after, before, strict=True):
        assert math.isclose(rebuilt["created_at"], live["created_at"], abs_tol=0.0011)


def test_rebuild_restores_incident_info_entries_with_their_seqs(
    emu: NtfyEmulator, tmp_path: Path, triage: ReceiverHandle, sig: SignalHandle
) -> None:
    """Failure mode: the store is lost and rebuilt from the audit log; the triage entries come
    back but the `incident_info` channel comes back empty, so the agent never learns that the
    owner acknowledged the incident or that its message was deleted, keeps escalating, and a
    cursor it holds on the channel points past entries that are no longer there (the next
    entry written takes seq 1 again, one the agent already acked)."""
    state = tmp_path / "state"
    settings_ = config(emu, state, triage, sig, http_token=TOKEN)
    with DaemonThread(settings_) as first:
        emu.wait_for_subscribers(1, timeout=30)
        original = emu.publish("alerts", "Disk full number 1", title="Disk full", priority=5)["id"]
        wait_until(
            lambda: query(state, "SELECT state FROM outbox") == [("delivered",)],
            timeout=30,
            what="the triage request delivered",
        )
        httpx.delete(f"{emu.url}/alerts/{original}").raise_for_status()
        wait_until(lambda: len(history(first, "probe1")) == 1, timeout=30, what="the delete")
        reply(sig, "Disk full", "ack", "Acknowledged")
        httpx.put(f"{emu.url}/alerts/{original}/clear").raise_for_status()
        wait_until(lambda: len(history(first, "probe2")) == 3, timeout=30, what="the clear")
        history(first, "agent")  # the agent reads the channel
        ack(first, "agent", 1)  # the agent handled the delete
        before = history(first, "reader")
        triage_before = history(first, "reader", "triage")
    assert [e["payload"].get("event") or e["payload"]["schema"] for e in before] == [
        "message_delete",
        "ntfy-intake.owner-ack/1",
        "message_clear",
    ]
    assert [e["seq"] for e in before] == [1, 2, 3]
    wipe_store(state)
    with DaemonThread(settings_) as second:
        emu.wait_for_subscribers(1, timeout=30)
        wait_until(
            lambda: len(history(second, "waiter", "triage")) == 1, timeout=30, what="the rebuild"
        )
        after = history(second, "reader")
        # The agent resumes from the seq it holds, as its cursor cannot be known.
        resumed = feed(second, f"/v1/feed/agent?channel={INFO}&after=1&limit=100")
        triage_after = history(second, "reader", "triage")
        # The owner acks again in the same episode: one entry per episode, as live.
        confirmations = sum(m.message.startswith("Acknowledged") for m in sig.messages())
        sent = next(m for m in sig.messages() if "Disk full" in m.message)
        sig.inbox.inject(SENDER, OWNER, "ack", quote=sent.timestamp)
        wait_until(
            lambda: (
                sum(m.message.startswith("Acknowledged") for m in sig.messages()) > confirmations
            ),
            timeout=30,
            what="the second ack's confirmation",
        )
        again = history(second, "reader2")
    same_entries(after, before)
    same_entries(resumed, before[1:])
    assert [e["seq"] for e in triage_after] == [e["seq"] for e in triage_before]
    assert [e["seq"] for e in again] == [1, 2, 3]


# -- the fold, from the lines as the writer and the owner's paths stage them -------------------

NOW = 1_764_470_000.0


def write_log(tmp_path: Path, lines: list[tuple[str, dict[str, Any]]]) -> Path:
    """`lines` staged one transaction each, in order, and flushed to the audit files."""
    first = db.connect(tmp_path / "first.sqlite3")
    migrations.apply(first)
    for n, (kind, fields) in enumerate(lines):
        with db.write_txn(first):
            audit.stage(first, kind, NOW + n, **fields)
    with audit.AuditLog(tmp_path / "audit", lambda: NOW) as log:
        audit.flush(first, log)
    first.close()
    return tmp_path / "audit"


def event(event_id: str, status: str, outcome: str = "recorded", **extra: Any) -> Any:
    fields = {"event_id": event_id, "incident": "alerts:disk", "severity": 4, "status": status}
    return "event", {**fields, "outcome": outcome, "reason": "r", "time": int(NOW), **extra}


def action(event_id: str, kind: str, **extra: Any) -> Any:
    """What cadence_records.action_record writes for a delete/clear of message e1."""
    fields = {"event_id": event_id, "event": kind, "incident": "alerts:disk", "sequence_id": "e1"}
    return "event", {**fields, "outcome": "noted", "reason": kind, "topic": "alerts", **extra}


def ack_line(**extra: Any) -> Any:
    fields = {"command": "ack", "result": "acknowledged", "key": "notify:d1"}
    return "owner_reply", {**fields, "incident": "alerts:disk", **extra}


def info_rows(conn: db.Connection) -> list[dict[str, Any]]:
    rows = conn.execute(
        "SELECT seq, delivery_key, summary, idempotency_key, created_at, payload"
        " FROM feed_entries WHERE channel = 'incident_info' ORDER BY seq"
    ).fetchall()
    names = ("seq", "delivery_key", "summary", "idempotency_key", "created_at")
    return [{**dict(zip(names, r[:5], strict=True)), "payload": json.loads(r[5])} for r in rows]


def test_rebuild_of_a_log_from_before_info_for_restores_its_acks_and_skips_its_notes(
    conn: db.Connection, tmp_path: Path
) -> None:
    """Failure mode: a log written before delete/clear lines said which request they reached
    (`info_for`) stops the rebuild, or gets entries made up for them (the request and whether
    it was still collecting were read from the lost database); or an ack repeated in one
    episode comes back twice, and one of a later firing at the wrong version."""
    released = {"delivery_key": "d1", "payload": {"schema": "x"}, "summary": "alerts:disk"}
    audit_dir = write_log(
        tmp_path,
        [
            event("e1", "firing", "triage_requested", delivery_key="d1", sequence_id="e1"),
            ("release", released),
            action("e2", "message_delete", time=int(NOW) + 1, info_for="d1"),
            ack_line(matched="quote", envelope_ts=1, confirmed=True),
            ack_line(matched="quote", envelope_ts=2, confirmed=True),  # the same episode
            action("e3", "message_clear"),  # written before `info_for` existed
            event("e4", "resolved"),
            event("e5", "firing"),
            ack_line(via="button", matched="token"),
            action("e6", "message_clear", info_for=""),  # its message joined no request
        ],
    )
    summary = rebuild.from_audit(
        conn, audit_dir, NOW + 60, debounce=0.0, relay_enabled=True, feed_append=None
    )
    assert summary is not None and summary.feed_entries == 4
    delete, first_ack, second_ack, clear = info_rows(conn)
    assert {k: v for k, v in delete.items() if k != "payload"} == {
        "seq": 1,
        "delivery_key": "e2",
        "summary": "alerts:disk: message_delete of e1",
        "idempotency_key": "e2",
        "created_at": NOW + 2,
    }
    assert delete["payload"] == {
        "schema": "ntfy-intake.device-action/1",
        "incident": "alerts:disk",
        "event": "message_delete",
        "id": "e2",
        "sequence_id": "e1",
        "topic": "alerts",
        "time": int(NOW) + 1,
        "delivery_key": "d1",
    }
    assert (first_ack["seq"], first_ack["idempotency_key"]) == (2, "ack:alerts:disk:1")
    assert (first_ack["delivery_key"], first_ack["created_at"]) == ("d1", NOW + 3)
    assert first_ack["payload"] == {
        "schema": "ntfy-intake.owner-ack/1",
        "incident": "alerts:disk",
        "acknowledged": True,
        "version": 1,
        "at": "2025-11-30T02:33:23Z",
        "via": "signal",
        "message": "notify:d1",
        "delivery_key": "d1",
    }
    assert (second_ack["seq"], second_ack["idempotency_key"]) == (3, "ack:alerts:disk:3")
    assert (second_ack["payload"]["version"], second_ack["payload"]["via"]) == (3, "button")
    assert (clear["seq"], clear["idempotency_key"], clear["summary"]) == (
        4,
        "e6",
        "alerts:disk: message_clear of e1",
    )
    assert clear["payload"]["delivery_key"] is None and clear["payload"]["time"] is None
