"""A Signal reply acts on the firing its message showed (DESIGN.md section 13), as the fallback
topic's Ack button does (flow/owner_buttons.py): each sent message keeps its incident's version
with its Signal timestamp (store/owner_replies.py), a reply's ack of a message whose firing is
over acknowledges nothing and says so, and the version survives a rebuild from the audit log.
The signal-cli-rest-api stand-in on a real socket, both engines, time injected.

Each test is named after the failure it kills.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ntfy_intake.flow.owner import OwnerSender
from ntfy_intake.flow.owner_replies import OwnerReplies
from ntfy_intake.rules import owner_replies as rules
from ntfy_intake.store import audit, db, migrations, rebuild
from ntfy_intake.store import owner_replies as store
from ntfy_intake.testbed.signal_standin import SignalHandle

from ..owner_bed import OWNER, SENDER
from .test_owner_replies import World, incident

pytestmark = pytest.mark.engines


@pytest.fixture
def world(conn: db.Connection, tmp_path: Path, signal: SignalHandle) -> World:
    incident(conn, "alerts:disk")
    return World(conn, tmp_path, signal)


def refire(world: World) -> None:
    """The incident resolves and fires again: its version moves twice (rules/incidents.merge)."""
    incident(world.conn, "alerts:disk", status="resolved", version=2)
    incident(world.conn, "alerts:disk", status="firing", version=3)


def replies_sent(world: World, before: int) -> list[str]:
    return [m.message for m in world.signal.messages()[before:]]


def test_quoted_ack_of_an_old_message_is_refused_and_the_new_one_can_be_acked(
    world: World,
) -> None:
    """Failure mode: the owner acks last night's message after the incident fired again and
    is told nothing (or that it worked), so he believes the new firing acknowledged; or the
    refusal leaves him no way to ack the new one."""
    assert world.message("d1", "alerts:disk") == "queued"

    async def scenario(sender: OwnerSender, replies: OwnerReplies) -> None:
        await sender.run_once()
        [old] = world.signal.messages()
        refire(world)
        world.signal.inbox.inject(SENDER, OWNER, "ack", quote=old.timestamp)
        await replies.run_once()
        await sender.run_once()  # the refusal
        assert world.message("d2", "alerts:disk") == "queued"  # the new firing reaches him
        await sender.run_once()
        new = world.signal.messages()[-1]
        assert new.message == "about alerts:disk"
        world.clock.t += 1.0
        world.signal.inbox.inject(SENDER, OWNER, "ack", quote=new.timestamp)
        await replies.run_once()
        await sender.run_once()  # the confirmation

    world.run(scenario)
    said = [m.message for m in world.signal.messages()]
    assert said[1] == rules.ack_refused("alerts:disk", "quote")
    assert said[1].startswith("alerts:disk fired again (or got worse) since the message you")
    assert said[-1].startswith("Acknowledged alerts:disk")
    refused, acked = world.records("owner_reply")
    assert (refused["result"], refused["matched"], refused["key"]) == (
        "firing_over",
        "quote",
        "notify:d1",
    )
    assert (acked["result"], acked["key"]) == ("acknowledged", "notify:d2")
    assert world.message("d3", "alerts:disk") == "suppressed"


def test_unquoted_ack_whose_newest_message_showed_an_ended_firing_acks_nothing(
    world: World,
) -> None:
    """Failure mode: "ack" without a quote takes the newest message of the hour, which is
    about the firing before; the one on now, which no message has shown yet, is acked."""
    assert world.message("d1", "alerts:disk") == "queued"

    async def scenario(sender: OwnerSender, replies: OwnerReplies) -> None:
        await sender.run_once()
        incident(world.conn, "alerts:disk", severity=5, version=2)  # got worse
        world.signal.inbox.inject(SENDER, OWNER, "ack")
        await replies.run_once()
        await sender.run_once()

    world.run(scenario)
    assert world.signal.messages()[-1].message == rules.ack_refused("alerts:disk", "newest")
    [line] = world.records("owner_reply")
    assert (line["result"], line["matched"]) == ("firing_over", "newest")
    assert world.message("d2", "alerts:disk") == "queued"


def test_quoted_silence_of_an_old_message_still_silences_and_says_it_fired_again(
    world: World,
) -> None:
    """A silence names the incident, not a firing (the Silence button's too): refusing it would
    leave the owner woken by the very alert he asked two hours of quiet from."""
    assert world.message("d1", "alerts:disk") == "queued"

    async def scenario(sender: OwnerSender, replies: OwnerReplies) -> None:
        await sender.run_once()
        [old] = world.signal.messages()
        refire(world)
        world.signal.inbox.inject(SENDER, OWNER, "silence 2h", quote=old.timestamp)
        await replies.run_once()
        await sender.run_once()

    world.run(scenario)
    words = world.signal.messages()[-1].message
    assert words.startswith("Silenced alerts:disk until ")
    assert "fired again (or got worse) since that message" in words
    assert world.message("d2", "alerts:disk") == "suppressed"


def test_quoted_ack_of_a_message_sent_after_the_severity_rose_acts(world: World) -> None:
    """Failure mode: the firing is judged from when the message was queued, not from when it
    went out: a message held back until after the severity rose shows the firing on now, and
    its ack is refused."""
    assert world.message("d1", "alerts:disk") == "queued"
    incident(world.conn, "alerts:disk", severity=5, version=2)  # before the send

    async def scenario(sender: OwnerSender, replies: OwnerReplies) -> None:
        await sender.run_once()
        [sent] = world.signal.messages()
        world.signal.inbox.inject(SENDER, OWNER, "ack", quote=sent.timestamp)
        await replies.run_once()

    world.run(scenario)
    [row] = world.conn.execute("SELECT key, incident_version FROM owner_signal_sent").fetchall()
    assert (str(row[0]), int(row[1])) == ("notify:d1", 2)
    assert [r["result"] for r in world.records("owner_reply")] == ["acknowledged"]
    assert world.message("d2", "alerts:disk") == "suppressed"


def test_quoted_ack_of_a_message_sent_before_versions_were_kept_acts_as_before(
    world: World,
) -> None:
    """Failure mode: a message sent by the version before this one (no incident version
    stored) can no longer be acknowledged at all."""
    assert world.message("d1", "alerts:disk") == "queued"

    async def scenario(sender: OwnerSender, replies: OwnerReplies) -> None:
        await sender.run_once()
        [sent] = world.signal.messages()
        with db.write_txn(world.conn):
            world.conn.execute("UPDATE owner_signal_sent SET incident_version = NULL")
        world.signal.inbox.inject(SENDER, OWNER, "ack", quote=sent.timestamp)
        await replies.run_once()

    world.run(scenario)
    assert [r["result"] for r in world.records("owner_reply")] == ["acknowledged"]


def test_rebuilt_store_still_refuses_a_quoted_ack_of_a_message_whose_firing_ended(
    conn: db.Connection, tmp_path: Path
) -> None:
    """Failure mode: after the database is rebuilt from the audit log, the Signal timestamps
    come back without the firing their message showed, and a quoted ack of last night's
    message acknowledges the firing on now. The lines as the writer and the owner sender
    stage them; the rebuilt store on the test's engine."""
    now = 1_764_470_000.0
    first = db.connect(tmp_path / "first.sqlite3")
    migrations.apply(first)
    lines: list[tuple[str, dict[str, object]]] = [
        ("event", {"event_id": "e1", "status": "firing", "outcome": "triage_requested"}),
        ("owner_message", {"key": "notify:d1", "result": "sent", "signal_ts": 111}),
        ("event", {"event_id": "e2", "status": "resolved", "outcome": "recorded"}),
        ("event", {"event_id": "e3", "status": "firing", "outcome": "recorded"}),
        ("owner_message", {"key": "notify:d1", "result": "sent", "signal_ts": 222}),
    ]
    for n, (kind, fields) in enumerate(lines):
        extra: dict[str, object] = {}
        if kind == "event":
            extra = {"incident": "alerts:disk", "severity": 4, "reason": "r", "time": n}
            if fields["outcome"] == "triage_requested":
                extra["delivery_key"] = "d1"
        else:
            extra = {"message_kind": "triage", "channel": "signal", "text": "about alerts:disk"}
        with db.write_txn(first):
            audit.stage(first, kind, now + n, **fields, **extra)
    with audit.AuditLog(tmp_path / "audit", lambda: now) as log:
        audit.flush(first, log)
    first.close()
    summary = rebuild.from_audit(
        conn, tmp_path / "audit", now + 10, debounce=0.0, relay_enabled=True, feed_append=None
    )
    assert summary is not None
    assert store.message_for_signal_ts(conn, 111) == ("notify:d1", 1)
    assert store.message_for_signal_ts(conn, 222) == ("notify:d1", 3)  # a retry after it
    state = store.incident_state(conn, "alerts:disk")
    assert state == (4, "firing", 3)
    assert rules.firing_over(1, state[1], state[2])
    assert not rules.firing_over(3, state[1], state[2])
