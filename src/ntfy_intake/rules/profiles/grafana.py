"""Grafana's webhook contact point rendered by ntfy itself (`?template=grafana`, ntfy >= 2.14).

What ntfy makes of it (binwiederhier/ntfy, server/templates/grafana.yml): the title is `🚨 `
and Grafana's `title` while the payload's status is firing, `✅ ` and that title once resolved;
the body is Grafana's `message`, cut to 2000 characters. Grafana's default title
(grafana/alerting, templates/default_template.go, `__subject`) is `[FIRING:<n>] <group label
values> (<other common label values>)`, `[FIRING:<n>, RESOLVED:<m>] ...` while part of the
group is resolved, and `[RESOLVED] ...` once all is. No tags; priority as the URL asks, else 3.

Key: the title after its status bracket (the group's labels), which firing and resolve share.
A custom Grafana title (or the template's "Alert firing" fallback) names no group and is left
to the title rule.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ntfy_intake.rules.profiles import base

NAME = "grafana"
_FIRING = re.compile(r"🚨 \[FIRING:\d+(?:, RESOLVED:\d+)?\] (?P<group>.*\S)", re.DOTALL)
_RESOLVED = re.compile(r"✅ \[RESOLVED\] (?P<group>.*\S)", re.DOTALL)


def match(
    topic: str, title: str | None, message: str, priority: int, tags: Sequence[str]
) -> base.Match | None:
    if title is None or tags:
        return None
    text = title.strip()
    status: base.Status = "firing"
    found = _FIRING.fullmatch(text)
    if found is None:
        status = "resolved"
        found = _RESOLVED.fullmatch(text)
        if found is None:
            return None
    return base.Match(NAME, base.key(NAME, topic, found["group"]), status, base.clamp(priority))
