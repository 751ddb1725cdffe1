"""The alertmanager-ntfy bridge (alexbakker/alertmanager-ntfy), one ntfy message per alert.

What it sends (internal/server/server.go, util.go, README.md and config.example.yml): the body
is the rendered description template, the title the rendered title template, whose documented
default is `{{ if eq .Status "resolved" }}Resolved: {{ end }}<summary annotation>`; when the
description renders empty the title goes in the body and no title is sent. Tags are the
configured ones (the README's: `rotating_light` when firing, `+1` when resolved) plus, unless
turned off, every label as a tag `<name> = <value>`. Priority: the configured expression (the
README's: `urgent` while firing, `default` once resolved).

Two shapes, two keys:
- labels as tags (an `alertname = ...` tag): every message of the alert carries its full label
  set, Alertmanager's own identity of an alert, so firing and resolve both key on it;
- no label tags: only the resolve can be told apart (the `Resolved: ` prefix and a resolve tag),
  and it keys exactly as the title rule keyed its firing (`<topic>:<summary>`), so it resolves
  the incident the firing opened.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ntfy_intake.rules.profiles import base

NAME = "alertmanager-ntfy"
_PREFIXED = re.compile(r"\s*Resolved: ")
_LABEL_TAG = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*) = (?P<value>.*)", re.DOTALL)
# The resolve tags the bridge's own README, example config and NixOS module configure.
RESOLVE_TAGS = frozenset({"+1", "white_check_mark", "heavy_check_mark", "green_circle"})


def match(
    topic: str,
    title: str | None,
    message: str,
    priority: int,
    tags: Sequence[str],
    *,
    first_line: Callable[[str], str] | None = None,
) -> base.Match | None:
    """`first_line` is the title rule's key of a titleless body (rules.incidents passes its
    `normalise_first_line`; this package cannot import it back): without it, a titleless
    resolve without label tags is not claimed."""
    # Every message meets this profile last: the cheap tests on the tags come first.
    labels = None
    for tag in tags:
        if " = " in tag:
            labels = _labels(tags)
            break
    if labels is None and RESOLVE_TAGS.isdisjoint(tags):
        return None
    # Matched, not stripped: a titleless body may be megabytes long.
    prefixed = _PREFIXED.match(title if title is not None else message)
    if labels is not None:
        status: base.Status = "firing" if prefixed is None else "resolved"
        return base.Match(NAME, base.key(NAME, topic, labels), status, base.clamp(priority))
    if prefixed is None:
        return None
    rest = prefixed.string[prefixed.end() :]
    if title is not None:
        part = base.title_part(rest)
    elif first_line is not None:
        part = first_line(rest)
    else:
        return None
    if not part:
        return None
    return base.Match(NAME, f"{topic}:{part}", "resolved", base.clamp(priority))


def _labels(tags: Sequence[str]) -> str | None:
    """`alertname{name=value,...}` from the label tags, sorted, or None without an alertname."""
    pairs = sorted(
        (found["name"], found["value"].strip())
        for found in map(_LABEL_TAG.fullmatch, tags)
        if found is not None
    )
    alertname = next((value for name, value in pairs if name == "alertname"), None)
    if not alertname:
        return None
    rest = ",".join(f"{name}={value}" for name, value in pairs if name != "alertname")
    return f"{alertname}{{{rest}}}"
