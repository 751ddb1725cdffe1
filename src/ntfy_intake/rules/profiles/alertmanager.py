"""Alertmanager's webhook rendered by ntfy itself (`?template=alertmanager`, ntfy >= 2.14).

What ntfy makes of it (binwiederhier/ntfy, server/templates/alertmanager.yml): the title is
`🚨 Alert: <alertname>` while the group fires and `✅ Resolved: <alertname>` once it is resolved
(the first alert's `alertname` label); the body opens with `Status: Firing` or `Status: Resolved`
and `Receiver: <receiver>`, then per alert `Alert:`, `Instance:`, `Severity: <severity label>`,
`Starts at:` and the summary and description annotations. No tags; the priority is whatever the
webhook URL asks for (`&priority=`), else ntfy's default 3.

Key: the alertname, so a group's firing and its resolve meet (ntfy's title names nothing finer).
Severity: the higher of the ntfy priority and the alerts' `severity` labels (`critical` 5,
`warning` 4, others add nothing), so a critical alert is never triaged as routine.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ntfy_intake.rules.profiles import base

NAME = "alertmanager"
_TITLE = re.compile(r"(?P<mark>🚨 Alert|✅ Resolved): (?P<alertname>.*\S)", re.DOTALL)
_STATUS: dict[str, tuple[base.Status, str]] = {
    "🚨 Alert": ("firing", "Firing"),
    "✅ Resolved": ("resolved", "Resolved"),
}
_SEVERITY_LINE = re.compile(r"^Severity: (\S+)$", re.MULTILINE)
LABEL_SEVERITY = {"critical": 5, "warning": 4}


def match(
    topic: str, title: str | None, message: str, priority: int, tags: Sequence[str]
) -> base.Match | None:
    if title is None or tags:
        return None
    found = _TITLE.fullmatch(title.strip())
    if found is None:
        return None
    status, word = _STATUS[found["mark"]]
    # The body's first two lines are the template's own: a person's "🚨 Alert: x" has neither.
    if not message.lstrip().startswith(f"Status: {word}\nReceiver: "):
        return None
    severity = max(
        [priority]
        + [LABEL_SEVERITY.get(label.lower(), 0) for label in _SEVERITY_LINE.findall(message)]
    )
    return base.Match(NAME, base.key(NAME, topic, found["alertname"]), status, base.clamp(severity))
