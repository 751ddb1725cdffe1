"""Uptime Kuma's ntfy notification provider.

What it sends (louislam/uptime-kuma, server/notification-providers/ntfy.js): a JSON publish whose
title is the monitor's name, a space, `Down` or `Up`, and ` [Uptime-Kuma]`; its tags start with
`red_circle` (down) or `green_circle` (up), followed by the monitor's own tags (`name` or
`name: value`). Down is sent at the provider's priority plus one (at most 5) or its "down"
priority; Up at the provider's priority (default 4). A test or certificate notice has no Down/Up
word and the `test_tube` tag: it is not an incident state and no profile claims it.

Recognised only when the title's word and the first tag agree (a person typing "web Down
[Uptime-Kuma]" without the tag is left to the title rule). A custom title template (Uptime
Kuma 2's "use template") is not recognised: the owner changed the wire.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ntfy_intake.rules.profiles import base

NAME = "uptime-kuma"
_TITLE = re.compile(r"(?P<monitor>.*\S) (?P<state>Down|Up) \[Uptime-Kuma\]", re.DOTALL)
_STATES: dict[str, tuple[str, base.Status]] = {
    "Down": ("red_circle", "firing"),
    "Up": ("green_circle", "resolved"),
}


def match(
    topic: str, title: str | None, message: str, priority: int, tags: Sequence[str]
) -> base.Match | None:
    # The suffix first: most titles are not Uptime Kuma's, and this costs no regex.
    if title is None or not tags or not title.endswith(" [Uptime-Kuma]"):
        return None
    found = _TITLE.fullmatch(title)
    if found is None:
        return None
    tag, status = _STATES[found["state"]]
    if tags[0] != tag:
        return None
    return base.Match(NAME, base.key(NAME, topic, found["monitor"]), status, base.clamp(priority))
