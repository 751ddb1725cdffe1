"""`events[].profile` of a recorded event (rules/event_profile.py): what keyed it when it was
recorded, never what the profiles would say now."""

from __future__ import annotations

from typing import Any

import pytest

from ntfy_intake.rules import event_profile, incidents

from .. import publishers


class _Message:
    """A message as the wire hands it to the batch (incidents.Alert)."""

    def __init__(self, topic: str, payload: dict[str, Any]) -> None:
        self.id, self.time, self.topic = "gatusgatus01", 1_764_470_000, topic
        self.title: str | None = payload.get("title")
        self.message: str = payload.get("message", "")
        self.effective_priority: int = payload.get("priority", 3)
        self.tags: tuple[str, ...] = tuple(payload.get("tags", ()))


def recorded(message: _Message, incident_key: str) -> str | None:
    return event_profile.recorded(
        event_id=message.id,
        time=message.time,
        topic=message.topic,
        title=message.title,
        message=message.message,
        priority=message.effective_priority,
        tags=message.tags,
        incident_key=incident_key,
    )


# A topic named as its publisher: the title rule's key then starts with the profile's name too.
@pytest.mark.parametrize("topic", ["alerts", "gatus"])
@pytest.mark.parametrize("profiles", [True, False], ids=["auto", "off"])
def test_the_payloads_profile_is_what_keyed_the_event_when_recorded(
    topic: str, profiles: bool
) -> None:
    message = _Message(topic, publishers.GATUS_FIRING)
    signal = incidents.signal_of(message, profiles=profiles)  # as the batch recorded it
    assert recorded(message, signal.key) == ("gatus" if profiles else None)


def test_an_update_joined_to_another_incident_names_no_profile() -> None:
    message = _Message("alerts", publishers.GATUS_RESOLVED)
    assert recorded(message, "alerts:the first message's title") is None
