"""Pure incident logic: which incident an event belongs to, and how incident state merges.

Incident key: the `incident` field of a JSON envelope in the message body when present, else
`<topic>:<title>` with the title lower-cased and whitespace collapsed. With no title, the first
line of the message, normalized by `normalise_first_line`: the values that change from one
alert to the next (standalone numbers, percentages, sizes, durations, timestamps, IP addresses,
hex ids) are masked, digits inside words are kept. So `disk 91% full` and `disk 95% full` are one
incident, `nas1 down` and `nas2 down` two. Severity: the envelope's, else the ntfy priority
(default 3).

Merging is order-independent: severity is the maximum seen while firing, and the status follows
the event with the greatest (time, id), so two events applied in either order give one state.
The price: ntfy's `time` has one-second resolution and ids are random, so between a "firing"
and a "resolved" published within the same second, which one wins is arbitrary (but the same on
every replay). Publishers that flip status faster than once a second should leave a second
between the two events.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Literal, NamedTuple, Protocol

from ntfy_intake.rules import profiles as publisher_profiles
from ntfy_intake.rules import sanitize


class Alert(Protocol):
    """What the incident rules read of a decoded ntfy message (`frames.Message` is one)."""

    @property
    def id(self) -> str: ...
    @property
    def time(self) -> int: ...
    @property
    def topic(self) -> str: ...
    @property
    def title(self) -> str | None: ...
    @property
    def message(self) -> str: ...
    @property
    def effective_priority(self) -> int: ...
    @property
    def tags(self) -> tuple[str, ...]: ...


Status = Literal["firing", "resolved"]
KEY_LIMIT = 200
_WHITESPACE = re.compile(r"\s+")

# A value stands alone when no word character (or a word then "-" or ".", as in `host-10` or
# `v1.2`) touches it on either side: `sda1`, `nas2`, `web-01`, `v1.2` stay as they are.
_START = r"(?<![\w.])(?<!\w-)"
_END = r"(?![\w])(?![.-]\w)"
_NUM = r"\d+(?:[.,]\d+)*"
_LONG_DURATION_UNITS = r"ns|us|µs|ms|secs?|seconds?|mins?|minutes?|hrs?|hours?|days?|wks?|weeks?"
_DURATION_UNITS = _LONG_DURATION_UNITS + r"|s|m|h|d|w"
_SIZE_UNITS = r"[kmgtpe]i?b|bytes?|b|[kmgtpe]"
_MASKS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(f"{_START}(?:{pattern}){_END}"), placeholder)
    for pattern, placeholder in (
        # Timestamps first: they contain numbers, colons and dashes the later rules would split.
        (
            r"\d{4}-\d{2}-\d{2}(?:[t ]\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?"
            r"(?:z|[+-]\d{2}:?\d{2})?)?",
            "<time>",
        ),
        (r"\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?: ?[ap]m)?", "<time>"),
        (
            r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]* \d{1,2}(?:,? \d{4})?",
            "<time>",
        ),
        (r"\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?(?:/\d{1,2})?", "<ip>"),
        (r"(?=[0-9a-f:]*\d)(?=(?:[0-9a-f]*:){2})[0-9a-f:]{3,}(?:/\d{1,3})?", "<ip>"),
        (r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<hex>"),
        (r"0x[0-9a-f]+|(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,}", "<hex>"),
        (_NUM + r" ?%", "<pct>"),
        (rf"(?:{_NUM}(?:{_DURATION_UNITS}))+|{_NUM} (?:{_LONG_DURATION_UNITS})", "<dur>"),
        (rf"{_NUM}(?:{_SIZE_UNITS})|{_NUM} (?:[kmgtpe]i?b|bytes?)", "<size>"),
        (r"[-+]?" + _NUM, "<n>"),
    )
)


# NamedTuples, not frozen dataclasses: one of each is built per recorded event, ~3x cheaper.
class Signal(NamedTuple):
    """What one event says about its incident."""

    key: str
    severity: int
    status: Status
    envelope: bool  # the key came from a JSON envelope
    profile: str | None = None  # the publisher profile that gave key, status and severity


class IncidentState(NamedTuple):
    key: str
    severity: int
    status: Status
    status_at: tuple[int, str]  # (time, event id) of the event that set the status
    first_seen: int
    last_seen: int
    events: int
    version: int


def normalise_title(text: str) -> str:
    return _WHITESPACE.sub(" ", text).strip().lower()[:KEY_LIMIT]


def normalise_first_line(text: str) -> str:
    """The incident key part of a titleless message: its first non-blank line, lower-cased,
    whitespace collapsed, changing values masked (`<n>`, `<pct>`, `<size>`, `<dur>`, `<time>`,
    `<ip>`, `<hex>`), digits inside words kept."""
    line = next((part for part in text.splitlines() if part.strip()), "")
    # Bounded before masking: a 5 MiB one-line body costs no more than a short one.
    line = _WHITESPACE.sub(" ", line[: KEY_LIMIT * 4]).strip().lower()
    for pattern, placeholder in _MASKS:
        line = pattern.sub(placeholder, line)
    return line[:KEY_LIMIT]


def signal_of(message: Alert, *, profiles: bool = True) -> Signal:
    """`profiles`: the setting `ntfy.profiles` ("auto" is True): an envelope wins, then a
    publisher profile (rules/profiles), then the title rule."""
    envelope = _envelope(message.message)
    severity = message.effective_priority
    status: Status = "firing"
    if envelope is not None:
        key = envelope.get("incident")
        if isinstance(key, str) and key.strip():
            env_severity = envelope.get("severity")
            if isinstance(env_severity, int) and not isinstance(env_severity, bool):
                severity = min(5, max(1, env_severity))
            env_status = envelope.get("status")
            if env_status in ("firing", "resolved"):
                status = env_status
            return Signal(normalise_title(key), severity, status, envelope=True)
    if profiles:
        found = publisher_profiles.match(
            message.topic,
            message.title,
            message.message,
            severity,
            message.tags,
            first_line=normalise_first_line,
        )
        if found is not None:
            return Signal(found.key, found.severity, found.status, False, found.profile)
    title = message.title
    if title is not None:
        titled = (
            _titled_key(message.topic, title)
            if len(title) <= _CACHED_TITLE
            else _titled_key.__wrapped__(message.topic, title)
        )
        if titled is not None:
            return Signal(titled, severity, status, envelope=False)
    key = normalise_first_line(message.message)
    return Signal(f"{message.topic}:{key}", severity, status, envelope=False)


# A backlog repeats a few titles many times: their keys are cached (short titles only, so the
# cache stays small whatever publishers send).
_CACHED_TITLE = 256


@functools.lru_cache(maxsize=1024)
def _titled_key(topic: str, title: str) -> str | None:
    """The key of a message with this title, or None when the title is blank."""
    return f"{topic}:{normalise_title(title)}" if title.strip() else None


def _envelope(body: str) -> dict[str, Any] | None:
    if "{" not in body:  # the common case, without copying the body
        return None
    stripped = body.strip()
    if not stripped.startswith("{"):
        return None
    try:
        obj = json.loads(stripped)
    except (ValueError, RecursionError):
        return None
    # The envelope is a decode boundary too: its strings are made valid UTF-8 here.
    return sanitize.valid_utf8(obj) if isinstance(obj, dict) else None


def merge(before: IncidentState | None, signal: Signal, message: Alert) -> IncidentState:
    """Fold one event into its incident. Commutative for events of one firing episode."""
    stamp = (message.time, message.id)
    # Positional arguments (key, severity, status, status_at, first_seen, last_seen, events,
    # version): one state is built per recorded event.
    if before is None:
        return IncidentState(
            signal.key, signal.severity, signal.status, stamp, message.time, message.time, 1, 1
        )
    newer = stamp > before.status_at
    status = signal.status if newer else before.status
    severity = max(before.severity, signal.severity)
    changed = severity != before.severity or status != before.status
    return IncidentState(
        before.key,
        severity,
        status,
        stamp if newer else before.status_at,
        min(before.first_seen, message.time),
        max(before.last_seen, message.time),
        before.events + 1,
        before.version + 1 if changed else before.version,
    )
