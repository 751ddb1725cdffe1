"""healthchecks.io's ntfy integration.

What it sends (healthchecks/healthchecks, hc/integrations/ntfy/transport.py and
templates/ntfy_title.html; hc/api/transports.py in older releases): a JSON publish titled with
the check's name (its UUID when unnamed), ` is `, and the new status upper-cased (`DOWN`, `UP`);
exactly one tag, `red_circle` for down and `green_circle` otherwise; the channel's priority for
down, its "priority up" for up (0 means "do not send", so a sent message is 1..5).

Recognised only when the title's status word and the single tag agree.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ntfy_intake.rules.profiles import base

NAME = "healthchecks"
_TITLE = re.compile(r"(?P<check>.*\S) is (?P<state>DOWN|UP)", re.DOTALL)
_STATES: dict[str, tuple[str, base.Status]] = {
    "DOWN": ("red_circle", "firing"),
    "UP": ("green_circle", "resolved"),
}


def match(
    topic: str, title: str | None, message: str, priority: int, tags: Sequence[str]
) -> base.Match | None:
    # The single tag first: most messages fail it, and it costs no regex.
    if title is None or len(tags) != 1 or tags[0] not in ("red_circle", "green_circle"):
        return None
    found = _TITLE.fullmatch(title.strip())
    if found is None:
        return None
    tag, status = _STATES[found["state"]]
    if tags[0] != tag:
        return None
    return base.Match(NAME, base.key(NAME, topic, found["check"]), status, base.clamp(priority))
