"""Gatus's ntfy alerting provider.

What it sends (TwiN/gatus, alerting/provider/ntfy/ntfy.go): a JSON publish titled `Gatus: ` and
the endpoint's display name (`group/name` when the endpoint has a group), at the provider's
configured priority (default 3), with exactly one tag: `rotating_light` when triggered (`x` in
Gatus v4), `white_check_mark` when resolved. The body opens with "An alert has been triggered due
to having failed N time(s) in a row" or "An alert has been resolved after passing successfully N
time(s) in a row", then the alert's description and condition results.

Recognised only when title, tag and the body's opening sentence all agree.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ntfy_intake.rules.profiles import base

NAME = "gatus"
_TITLE = re.compile(r"Gatus: (?P<endpoint>.*\S)", re.DOTALL)
_TRIGGERED = re.compile(r"An alert has been triggered due to having failed \d+ time\(s\) in a row")
_RESOLVED = re.compile(r"An alert has been resolved after passing successfully \d+ time\(s\)")
_FIRING_TAGS = frozenset({"rotating_light", "x"})


def match(
    topic: str, title: str | None, message: str, priority: int, tags: Sequence[str]
) -> base.Match | None:
    if title is None or len(tags) != 1:
        return None
    found = _TITLE.fullmatch(title)
    if found is None:
        return None
    status: base.Status
    if tags[0] in _FIRING_TAGS and _TRIGGERED.match(message):
        status = "firing"
    elif tags[0] == "white_check_mark" and _RESOLVED.match(message):
        status = "resolved"
    else:
        return None
    return base.Match(NAME, base.key(NAME, topic, found["endpoint"]), status, base.clamp(priority))
