"""Scheduled delivery: when a `Delay`/`At`/`In` value says a message falls due.

Pure: the current time comes in as an argument. Invariants owned here (ntfy `util.ParseFutureTime`
and `parsePublishParams`, ntfy-spec.md section 6.2):
- a value is tried as a Unix time (an integer not in the past), then as a duration (Go syntax, or
  `<n> d|day(s)|h|hour(s)|m|min(s)|minute(s)|s|sec(s)|second(s)`, spaces allowed, lowercase
  first letter);
  ntfy's third form, natural language ("tomorrow, 10am"), is not understood here: 400 40004;
- the due time, in whole seconds, must be at least 10 s and at most 3 days ahead
  (40005 too small, 40006 too large), compared as ntfy does, on truncated Unix seconds.
"""

from __future__ import annotations

import re

from ntfy_intake.emulator.params import go_trim
from ntfy_intake.emulator.since import parse_go_duration, parse_go_int64
from ntfy_intake.emulator.wire import NtfyError

DELAY_MIN_S = 10
DELAY_MAX_S = 3 * 24 * 3600
_NS_PER_S = 1_000_000_000
_DAY_AWARE = re.compile(
    r"(\d+)\s*(d|days?|h|hours?|m|mins?|minutes?|s|secs?|seconds?)", re.ASCII | re.IGNORECASE
)
_UNIT_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_LINK = "https://ntfy.sh/docs/publish/#scheduled-delivery"
DELAY_CANNOT_PARSE = NtfyError(40004, 400, "invalid delay parameter: unable to parse delay", _LINK)
DELAY_TOO_SMALL = NtfyError(
    40005, 400, "invalid delay parameter: too small, please refer to the docs", _LINK
)
DELAY_TOO_LARGE = NtfyError(
    40006, 400, "invalid delay parameter: too large, please refer to the docs", _LINK
)
DELAY_NO_CACHE = NtfyError(40002, 400, "cannot disable cache for delayed message")


def due_time(value: str, now_ns: int) -> int:
    """The Unix second a delayed message is delivered at, or the NtfyError ntfy answers."""
    due_ns = _parse_future_ns(go_trim(value), now_ns)
    if due_ns is None:
        raise DELAY_CANNOT_PARSE
    due = due_ns // _NS_PER_S
    if due < (now_ns + DELAY_MIN_S * _NS_PER_S) // _NS_PER_S:
        raise DELAY_TOO_SMALL
    if due > (now_ns + DELAY_MAX_S * _NS_PER_S) // _NS_PER_S:
        raise DELAY_TOO_LARGE
    return due


def _parse_future_ns(value: str, now_ns: int) -> int | None:
    try:
        unix = parse_go_int64(value)
    except ValueError:
        pass
    else:
        if unix >= now_ns // _NS_PER_S:
            return unix * _NS_PER_S
    duration = _parse_day_aware_duration(value)
    return None if duration is None else now_ns + duration


def _parse_day_aware_duration(value: str) -> int | None:
    """ntfy's util.ParseDuration in nanoseconds: Go's syntax, else `<n><unit>` with days."""
    try:
        return parse_go_duration(value)
    except ValueError:
        pass
    match = _DAY_AWARE.fullmatch(value)
    if match is None:
        return None
    # The pattern ignores case but ntfy then switches on the unit's first letter as written,
    # so "2 DAYS" matches and is still refused (checked against a real server).
    unit = _UNIT_S.get(match.group(2)[0])
    return None if unit is None else int(match.group(1)) * unit * _NS_PER_S
