"""Replies from the phone to an escalation (DESIGN.md section 13): the daemon's own message about
a request the agent left unanswered (key `escalate:<delivery_key>`) is about that request's
incident, so a reply quoting it acts on the incident as one quoting the agent's message does.
In process, the Signal stand-in on a real socket, both engines, time injected.

Each test is named after the failure it kills.
"""

# ruff: noqa: F811 - the fixtures of test_owner_replies are imported by name, then requested
from __future__ import annotations

import pytest

from ntfy_intake.flow.owner import OwnerSender
from ntfy_intake.flow.owner_replies import OwnerReplies
from ntfy_intake.store import db

from .test_owner_replies import (  # noqa: F401
    OWNER,
    SENDER,
    World,
    conn,
    request,
    shared_signal,
    signal,
    world,
)

pytestmark = pytest.mark.engines


def escalate(world: World, delivery_key: str, incident_key: str) -> str:
    """The escalator's decision for an unanswered request: 'queued' or 'suppressed'."""
    with db.write_txn(world.conn) as txn:
        result, _ = world.queue.escalation(
            txn,
            f"escalate:{delivery_key}",
            f"[alerts] about {incident_key} - triage agent silent for 10m.",
            world.clock(),
            incident=incident_key,
            topics=("alerts",),
        )
    return result


def quote_escalation(world: World, text: str, other: str = "c1") -> None:
    async def scenario(sender: OwnerSender, replies: OwnerReplies) -> None:
        await sender.run_once()
        sent = next(m for m in world.signal.messages() if "triage agent silent" in m.message)
        # A newer message about the other incident: only the quote points at the escalation.
        world.message(other, "alerts:cpu")
        await sender.run_once()
        world.signal.inbox.inject(SENDER, OWNER, text, quote=sent.timestamp)
        assert await replies.run_once() == 1
        await sender.run_once()

    world.run(scenario)


def test_quoted_ack_on_an_escalation_acknowledges_its_incident(world: World) -> None:
    """Failure mode: the reply quotes `escalate:<key>`, which names no incident where only
    `notify:` keys are known, so the owner gets the help text and keeps being messaged."""
    request(world.conn, "d1", "alerts:disk")
    assert escalate(world, "d1", "alerts:disk") == "queued"
    quote_escalation(world, "ack")
    [reply] = world.records("owner_reply")
    assert (reply["result"], reply["incident"], reply["key"]) == (
        "acknowledged",
        "alerts:disk",
        "escalate:d1",
    )
    # Both kinds of later owner message about the incident are held; the other incident's not.
    assert world.message("d2", "alerts:disk") == "suppressed"
    assert world.reason("notify:d2") == "acknowledged"
    request(world.conn, "d3", "alerts:disk")
    assert escalate(world, "d3", "alerts:disk") == "suppressed"
    assert world.reason("escalate:d3") == "acknowledged"
    assert world.message("c2", "alerts:cpu") == "queued"


def test_quoted_silence_and_details_on_an_escalation_apply_to_its_incident(
    world: World,
) -> None:
    request(world.conn, "d1", "alerts:disk")
    assert escalate(world, "d1", "alerts:disk") == "queued"
    quote_escalation(world, "silence 2h")
    [made] = world.records("silence")
    assert (made["scope"], made["target"]) == ("incident", "alerts:disk")
    request(world.conn, "d2", "alerts:disk")
    assert escalate(world, "d2", "alerts:disk") == "suppressed"
    assert world.reason("escalate:d2") == "silenced"
    quote_escalation(world, "details", other="c2")
    assert [r["result"] for r in world.records("owner_reply")] == ["silenced", "details"]
    assert world.records("owner_reply")[1]["incident"] == "alerts:disk"
