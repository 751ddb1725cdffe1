"""The agent hears of the owner's ack on the feed (DESIGN.md section 13: "an entry on the feed's
`incident_info` channel"), written in the ack's own transaction. In process, the Signal stand-in
on a real socket, both engines, time injected.

Each test is named after the failure it kills.
"""

# ruff: noqa: F811 - the fixtures of test_owner_replies are imported by name, then requested
from __future__ import annotations

import json
from typing import Any

import pytest

from ntfy_intake.flow.owner import OwnerSender
from ntfy_intake.flow.owner_replies import OwnerReplies
from ntfy_intake.store import feed

from .test_owner_replies import (  # noqa: F401
    OWNER,
    SENDER,
    World,
    conn,
    incident,
    shared_signal,
    signal,
    world,
)

pytestmark = pytest.mark.engines


def info_entries(world: World) -> list[dict[str, Any]]:
    rows = world.conn.execute(
        "SELECT seq, delivery_key, sender, payload FROM feed_entries"
        " WHERE channel = 'incident_info' ORDER BY seq"
    ).fetchall()
    return [{"seq": r[0], "delivery_key": r[1], "sender": r[2], **json.loads(r[3])} for r in rows]


def owner_types(world: World, *replies_text: str, about: str = "alerts:disk") -> None:
    async def scenario(sender: OwnerSender, replies: OwnerReplies) -> None:
        await sender.run_once()
        sent = [m for m in world.signal.messages() if m.message == f"about {about}"][-1]
        for text in replies_text:
            world.signal.inbox.inject(SENDER, OWNER, text, quote=sent.timestamp)
        await replies.run_once()

    world.run(scenario)


def test_ack_reaches_a_pulling_agent_on_the_incident_info_channel(world: World) -> None:
    """Failure mode: the feed has no `incident_info` entry for an ack, so an agent that pulls
    learns of it only from a later request that may never come, and keeps escalating."""
    assert world.message("d1", "alerts:disk") == "queued"
    assert world.message("c1", "alerts:cpu") == "queued"
    owner_types(world, "ack")
    [entry] = info_entries(world)
    assert entry["schema"] == feed.OWNER_ACK_SCHEMA
    assert (entry["incident"], entry["acknowledged"], entry["version"]) == ("alerts:disk", True, 1)
    assert (entry["delivery_key"], entry["message"], entry["via"]) == ("d1", "notify:d1", "signal")
    assert entry["sender"] == "ntfy-intake"
    assert feed.head_of(world.conn, feed.INFO_CHANNEL) == 1


def test_ack_repeated_in_one_episode_is_one_feed_entry_and_a_new_episode_another(
    world: World,
) -> None:
    assert world.message("d1", "alerts:disk") == "queued"
    owner_types(world, "ack", "ACK please")
    assert len(info_entries(world)) == 1
    assert [r["result"] for r in world.records("owner_reply")] == ["acknowledged"] * 2
    # Resolved, then fired again: the ack ended; the owner is told again and acks again.
    incident(world.conn, "alerts:disk", status="resolved", version=2)
    incident(world.conn, "alerts:disk", status="firing", version=3)
    assert world.message("d2", "alerts:disk") == "queued"
    world.signal.reset()
    owner_types(world, "ack")
    assert [e["version"] for e in info_entries(world)] == [1, 3]


def test_ack_that_changes_nothing_writes_no_entry(world: World) -> None:
    """A stranger's ack, or a reply that matches no incident, tells the agent nothing."""
    assert world.message("d1", "alerts:disk") == "queued"

    async def scenario(sender: OwnerSender, replies: OwnerReplies) -> None:
        await sender.run_once()
        [sent] = world.signal.messages()
        world.signal.inbox.inject(SENDER, "+31699999999", "ack", quote=sent.timestamp)
        world.signal.inbox.inject(SENDER, OWNER, "ack", quote=123)
        await replies.run_once()

    world.run(scenario)
    assert info_entries(world) == []
