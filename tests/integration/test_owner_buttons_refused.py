"""The fallback topic refusing the buttons must not cost the owner the message: ntfy answers 400
40018 for an `Actions` header it cannot parse (a `public_url` it reads differently, a server
version with other rules), and the message itself is what the owner needs."""

from __future__ import annotations

import asyncio

import pytest

from .test_owner_buttons import World, emu, world

pytestmark = pytest.mark.engines

__all__ = ["emu", "world"]


def test_actions_header_refused_by_ntfy_still_delivers_the_message_without_buttons(
    world: World,
) -> None:
    async def unparsable(key: str) -> dict[str, str]:
        return {"Actions": "frobnicate, Ack, http://127.0.0.1:1/x"}

    world.sender.buttons = unparsable
    assert world.message("d1", "alerts:disk") == "queued"
    world.send()
    [published] = [m for m in world.published() if "alerts:disk" in m.get("message", "")]
    assert "actions" not in published
    asyncio.run(world.flush())
    sent = [
        r for r in world.records("owner_message") if r.get("key") == "notify:d1" and "channel" in r
    ]
    assert [(r.get("channel"), r.get("result")) for r in sent] == [("ntfy", "sent")], sent


def test_message_ntfy_refuses_for_itself_is_still_dead_not_retried_forever(world: World) -> None:
    """The retry without buttons is for the buttons only: a 400 that has nothing to do with
    them (here a topic ntfy refuses) still settles the message as dead, once."""

    async def none(key: str) -> dict[str, str]:
        return {}

    world.sender.buttons = none
    world.topic = "docs"  # reserved by ntfy: 400 40010 whatever the headers
    world.sender.owner = world.sender.owner.__class__(
        signal_url=None, signal_number=None, recipients=(), fallback_topic="docs"
    )
    assert world.message("d2", "alerts:disk") == "queued"
    world.send()
    reason = world.reason("notify:d2")
    assert reason is not None and "permanent" in reason, reason
