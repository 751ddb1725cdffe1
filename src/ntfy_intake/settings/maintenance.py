"""`[[maintenance]]`: recurring maintenance windows (DESIGN.md section 13; the rule is
rules/maintenance.py). Read from the config file only (an array of tables has no environment
twin), every problem of every entry reported at once, each named `maintenance[N].key` (N counts
from 0 in file order).

    [[maintenance]]
    name = "backup"
    topics = ["nas*"]              # fnmatch patterns, case-sensitive; and/or
    incidents = ["backup:*"]       # patterns on the incident key
    days = ["sun"]                 # mon..sun, or "daily"
    from = "01:00"
    to = "04:00"                   # at or before `from`: the next day; "24:00": end of day
    timezone = "Europe/Amsterdam"  # default: cadence.timezone
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import time
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ntfy_intake.errors import ConfigError
from ntfy_intake.rules.maintenance import DAY_NAMES, END_OF_DAY, Window
from ntfy_intake.settings import tables
from ntfy_intake.settings.sources import _type_name as _type

SECTION = "maintenance"
KEYS = ("name", "topics", "incidents", "days", "from", "to", "timezone")
MAX_PATTERN = 400
MAX_WINDOWS = 64
# A topic pattern: topic characters (settings.schema.TOPIC_RE) and fnmatch's own.
_TOPIC_PATTERN = re.compile(r"[-_A-Za-z0-9*?\[\]!]{1,64}")
_CLOCK = re.compile(r"([0-9]{2}):([0-9]{2})")
# `fail(key, problem)`: one problem of the entry being read.
_Fail = Callable[[str, str], None]


def parse(
    raw: object, *, default_timezone: str, topics: Sequence[str] = ()
) -> tuple[tuple[Window, ...], list[ConfigError]]:
    """The windows of the `maintenance` value of a TOML document, and every problem found.
    `topics`: `ntfy.topics` when known; a topic pattern matching none of them is refused (a
    typo there would page the owner every week the window was meant to cover)."""
    return tables.read(
        SECTION,
        raw,
        keys=KEYS,
        most=MAX_WINDOWS,
        noun="windows",
        name_says="it names the window on the console and in the reason",
        entry=lambda table, at, name: _entry(table, at, name, default_timezone, topics),
    )


def _entry(
    entry: Mapping[str, object],
    at: tables.At,
    name: str | None,
    default_timezone: str,
    known_topics: Sequence[str],
) -> Window | None:
    fail = at.fail
    read = at.count
    topics = _patterns(entry, "topics", fail)
    incidents = _patterns(entry, "incidents", fail)
    for pattern in topics:
        if not _TOPIC_PATTERN.fullmatch(pattern):
            fail("topics", f"{pattern!r} is not a topic pattern (A-Z a-z 0-9 - _ and * ? [ ] !)")
        elif known_topics and not any(fnmatch.fnmatchcase(t, pattern) for t in known_topics):
            fail("topics", f"{pattern!r} matches none of ntfy.topics")
    if not topics and not incidents and at.count == read:
        fail("topics", "give topic or incident patterns (or both): what the window holds")
    days = _days(entry.get("days"), fail)
    start = _clock(entry.get("from"), "from", fail)
    end = _clock(entry.get("to"), "to", fail)
    if start is not None and start == END_OF_DAY:
        fail("from", "24:00 is only for `to` (the end of the day): use 00:00")
        start = None
    if start is not None and end is not None and start == end:
        fail("to", 'must differ from `from` (a whole day is from = "00:00", to = "24:00")')
    timezone = _timezone(entry.get("timezone", default_timezone), fail)
    if at.count:
        return None
    assert name is not None and days is not None and start is not None and end is not None
    assert timezone is not None
    return Window(name, topics, incidents, days, start, end, timezone)


def _patterns(entry: Mapping[str, object], key: str, fail: _Fail) -> tuple[str, ...]:
    raw = entry.get(key)
    if raw is None:
        return ()
    if not isinstance(raw, list):
        hint = f' like ["{raw}"]' if isinstance(raw, str) and raw.isprintable() else ""
        fail(key, f"expected a list of patterns{hint}, got {_type(raw)}")
        return ()
    found: list[str] = []
    for position, item in enumerate(raw):
        if not isinstance(item, str):
            fail(key, f"item {position}: expected a string, got {_type(item)}")
        elif not item or len(item) > MAX_PATTERN or not item.isprintable():
            fail(
                key,
                f"item {position}: 1-{MAX_PATTERN} printable characters, got {tables.show(item)}",
            )
        elif item in found:
            fail(key, f"{item!r} is listed twice")
        else:
            found.append(item)
    return tuple(found)


def _days(raw: object, fail: _Fail) -> frozenset[int] | None:
    expected = f'"daily" or a list of day names ({", ".join(DAY_NAMES)})'
    if raw is None:
        fail("days", f"required: {expected}")
        return None
    if isinstance(raw, str):
        if raw.strip().lower() == "daily":
            return frozenset(range(7))
        fail("days", f'expected {expected}, like ["{raw}"] for one day; got {tables.show(raw)}')
        return None
    if not isinstance(raw, list) or not raw:
        fail("days", f"expected {expected}, got {_type(raw) if raw != [] else 'an empty list'}")
        return None
    days: set[int] = set()
    for position, item in enumerate(raw):
        name = item.strip().lower() if isinstance(item, str) else None
        if name == "daily":
            days.update(range(7))
        elif name is not None and name in _DAY_SPELLINGS:
            days.add(DAY_NAMES.index(name[:3]))
        else:
            shown = tables.show(item) if isinstance(item, str) else _type(item)
            fail("days", f"item {position}: expected one of {', '.join(DAY_NAMES)}, got {shown}")
            return None
    return frozenset(days)


# "sun" and "sunday" both; anything else is a typo worth refusing.
_DAY_SPELLINGS = frozenset(
    [*DAY_NAMES, "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
)


def _clock(raw: object, key: str, fail: _Fail) -> int | None:
    """`HH:MM` -> minutes after midnight; `to` may be 24:00. A TOML local time (01:00:00)
    counts when it has no seconds."""
    if raw is None:
        fail(key, 'required: a time of day like "01:30"')
        return None
    if isinstance(raw, time):
        if raw.second or raw.microsecond:
            fail(key, f"whole minutes only, got {raw.isoformat()}")
            return None
        return raw.hour * 60 + raw.minute
    found = _CLOCK.fullmatch(raw.strip()) if isinstance(raw, str) else None
    if found is None:
        shown = tables.show(raw) if isinstance(raw, str) else _type(raw)
        fail(key, f'expected a time of day HH:MM like "01:30", got {shown}')
        return None
    hours, minutes = int(found.group(1)), int(found.group(2))
    if (hours, minutes) == (24, 0):
        return END_OF_DAY
    if hours > 23 or minutes > 59:
        fail(key, f"no such time of day: {found.group(0)!r} (00:00 to 23:59, or 24:00)")
        return None
    return hours * 60 + minutes


def _timezone(raw: object, fail: _Fail) -> str | None:
    if not isinstance(raw, str) or not raw.strip():
        fail("timezone", f"expected an IANA time zone name like Europe/Amsterdam, got {_type(raw)}")
        return None
    try:
        ZoneInfo(raw)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        fail(
            "timezone",
            f"unknown time zone {tables.show(raw)}, expected a name like Europe/Amsterdam",
        )
        return None
    return raw
