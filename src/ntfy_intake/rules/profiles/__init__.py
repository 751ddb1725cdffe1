"""Publisher profiles (DESIGN.md section 12): a message recognised from the wire alone.

Each module knows one publisher's exact ntfy payloads (cited from its public source in its
docstring and in tests/unit/test_profiles.py) and maps one onto the envelope's model: incident
key, status `firing`/`resolved`, severity, plus the profile's name. `match` asks them in turn.
The payloads do not overlap (each profile checks the title's form and the tags or body that
come with it), so at most one can claim a message; one that fits none is left to the title rule
as before. Pure: plain values in, a `base.Match` or None out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ntfy_intake.rules.profiles import (
    alertmanager,
    alertmanager_ntfy,
    base,
    gatus,
    grafana,
    healthchecks,
    uptime_kuma,
)

Match = base.Match
Profile = Callable[[str, str | None, str, int, Sequence[str]], base.Match | None]
# In this order; alertmanager-ntfy last, as it is the only one that also needs the title rule.
PROFILES: tuple[tuple[str, Profile], ...] = (
    (uptime_kuma.NAME, uptime_kuma.match),
    (gatus.NAME, gatus.match),
    (healthchecks.NAME, healthchecks.match),
    (alertmanager.NAME, alertmanager.match),
    (grafana.NAME, grafana.match),
    (alertmanager_ntfy.NAME, alertmanager_ntfy.match),
)
NAMES: tuple[str, ...] = tuple(name for name, _ in PROFILES)
_BEFORE_THE_BRIDGE = tuple(profile for _, profile in PROFILES[:-1])
SETTINGS = ("auto", "off")  # ntfy.profiles


def match(
    topic: str,
    title: str | None,
    message: str,
    priority: int,
    tags: Sequence[str],
    *,
    first_line: Callable[[str], str] | None = None,
) -> base.Match | None:
    """The first profile that recognises this message, or None. `first_line`: the title
    rule's key of a titleless body (see alertmanager_ntfy.match)."""
    for profile in _BEFORE_THE_BRIDGE:
        found = profile(topic, title, message, priority, tags)
        if found is not None:
            return found
    return alertmanager_ntfy.match(topic, title, message, priority, tags, first_line=first_line)
