"""What every profile returns, and the one way profiles spell an incident key.

A profile reads plain values of one ntfy message (topic, title, body, ntfy priority, tags) and
either recognises its publisher's exact payload, giving the envelope's model (incident key,
status, severity) and its own name, or returns None. Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import re
from typing import Literal, NamedTuple

Status = Literal["firing", "resolved"]
KEY_LIMIT = 200  # as rules.incidents.KEY_LIMIT: a key never grows with what a publisher sends
_WHITESPACE = re.compile(r"\s+")


class Match(NamedTuple):
    """A message a profile recognised, as the envelope would have said it."""

    profile: str
    key: str
    status: Status
    severity: int


def name_part(text: str) -> str:
    """A monitored thing's name as a key part: whitespace collapsed, lower-cased (as a title
    is in the title rule), so a firing and its resolve meet whatever spacing they carry."""
    return _WHITESPACE.sub(" ", text).strip().lower()


def title_part(title: str) -> str:
    """The title rule's key part of a title (rules.incidents.normalise_title, which this
    package cannot import: incidents imports it). tests/unit/test_profiles.py holds them equal."""
    return name_part(title)[:KEY_LIMIT]


def key(profile: str, topic: str, name: str) -> str:
    """`<profile>:<topic>:<name>`: the topic scopes a name the way it scopes a title, so two
    Uptime Kuma instances publishing to two topics never share an incident."""
    return f"{profile}:{topic}:{name_part(name)}"[:KEY_LIMIT]


def clamp(severity: int) -> int:
    return min(5, max(1, severity))
