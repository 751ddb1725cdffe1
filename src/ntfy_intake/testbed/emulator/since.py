"""The `since` parameter, parsed exactly as ntfy's `parseSince` does (ntfy-spec.md section 2.1).

Pure: no clock, no I/O; the caller passes `now_ns`. Invariants owned here:
- the order of attempts is empty, `all`/`latest`/`none` (case-sensitive), a valid 12-character id, a
  decimal int64 (Unix seconds, negative allowed), a Go duration (`time.ParseDuration` syntax, so
  `1d` is rejected); anything else raises `InvalidSince` (HTTP 400, code 40008);
- a marker is a (time, id) pair compared by value, like ntfy's `sinceMarker`: a timestamp of 0 *is*
  the "all" marker and a timestamp of 1 *is* the "none" marker (`since=1` returns nothing).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MESSAGE_ID_LENGTH = 12
_MESSAGE_ID = re.compile(r"[A-Za-z0-9]{12}", re.ASCII)
_INT64 = re.compile(r"[+-]?[0-9]+", re.ASCII)
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_NS_PER_S = 1_000_000_000

# time.ParseDuration's unit table: both micro signs are accepted.
_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,
    "\u03bcs": 1_000,
    "ms": 1_000_000,
    "s": _NS_PER_S,
    "m": 60 * _NS_PER_S,
    "h": 3600 * _NS_PER_S,
}


class InvalidSince(ValueError):
    """The since parameter is not empty, a keyword, an id, a timestamp or a Go duration."""


@dataclass(frozen=True)
class Since:
    """ntfy's `sinceMarker`: an inclusive lower time bound, or a cursor id, or `latest`."""

    time: int
    id: str = ""

    def is_all(self) -> bool:
        return self == ALL

    def is_none(self) -> bool:
        return self == NONE

    def is_latest(self) -> bool:
        return self == LATEST

    def is_id(self) -> bool:
        return self.id not in ("", "latest")


ALL = Since(0)
NONE = Since(1)
LATEST = Since(0, "latest")


def valid_message_id(value: str) -> bool:
    """Exactly 12 characters from [A-Za-z0-9] (ntfy `validMessageID`)."""
    return _MESSAGE_ID.fullmatch(value) is not None


def parse_since(value: str, *, poll: bool, now_ns: int) -> Since:
    """Turn an already-read (and trimmed) since value into a marker, or raise `InvalidSince`."""
    if value == "":
        return ALL if poll else NONE
    if value == "all":
        return ALL
    if value == "latest":
        return LATEST
    if value == "none":
        return NONE
    if valid_message_id(value):
        return Since(0, value)
    try:
        return Since(parse_go_int64(value))
    except ValueError:
        pass
    try:
        duration_ns = parse_go_duration(value)
    except ValueError:
        raise InvalidSince(value) from None
    # Go computes now.Add(-1 * d); for d = math.MinInt64 the negation wraps around to itself.
    offset = -duration_ns if duration_ns != _INT64_MIN else _INT64_MIN
    return Since((now_ns + offset) // _NS_PER_S)


def parse_go_int64(value: str) -> int:
    """`strconv.ParseInt(value, 10, 64)`: ASCII digits with an optional sign, no underscores."""
    if _INT64.fullmatch(value) is None:
        raise ValueError(f"not a base-10 integer: {value!r}")
    number = int(value)
    if not _INT64_MIN <= number <= _INT64_MAX:
        raise ValueError(f"out of int64 range: {value!r}")
    return number


def parse_go_duration(value: str) -> int:
    """`time.ParseDuration` in nanoseconds: `[-+]?([0-9]*(\\.[0-9]*)?[a-z]+)+`, or a bare `0`.

    Raises ValueError for anything Go rejects, including overflow beyond int64 nanoseconds.
    """
    rest = value
    negative = False
    if rest[:1] in ("-", "+"):
        negative = rest[0] == "-"
        rest = rest[1:]
    if rest == "0":
        return 0
    if rest == "":
        raise ValueError(f"invalid duration {value!r}")
    total = 0
    while rest:
        whole, rest, has_whole = _leading_digits(rest)
        fraction, scale, has_fraction = 0, 1, False
        if rest.startswith("."):
            fraction, scale, rest, has_fraction = _leading_fraction(rest[1:])
        if not (has_whole or has_fraction):
            raise ValueError(f"invalid duration {value!r}")
        unit_end = 0
        while unit_end < len(rest) and not (rest[unit_end] == "." or "0" <= rest[unit_end] <= "9"):
            unit_end += 1
        unit = _UNITS_NS.get(rest[:unit_end])
        if unit is None:
            raise ValueError(f"missing or unknown unit in duration {value!r}")
        rest = rest[unit_end:]
        if whole > (1 << 63) // unit:
            raise ValueError(f"invalid duration {value!r}")
        part = whole * unit
        if fraction:
            # Go adds float64(f) * (float64(unit) / scale), truncated to an integer.
            part += int(float(fraction) * (float(unit) / scale))
        total += part
        if part > 1 << 63 or total > 1 << 63:
            raise ValueError(f"invalid duration {value!r}")
    if negative:
        return -total
    if total > _INT64_MAX:
        raise ValueError(f"invalid duration {value!r}")
    return total


def _leading_digits(text: str) -> tuple[int, str, bool]:
    """Consume [0-9]*; overflow past 1<<63 is an error, as in Go's `leadingInt`."""
    index = 0
    number = 0
    while index < len(text) and "0" <= text[index] <= "9":
        number = number * 10 + ord(text[index]) - ord("0")
        if number > 1 << 63:
            raise ValueError("duration overflow")
        index += 1
    return number, text[index:], index > 0


def _leading_fraction(text: str) -> tuple[int, int, str, bool]:
    """Consume the digits after '.'; digits past int64 precision are read but ignored."""
    index = 0
    number = 0
    scale = 1
    overflow = False
    while index < len(text) and "0" <= text[index] <= "9":
        if not overflow:
            candidate = number * 10 + ord(text[index]) - ord("0")
            if number > _INT64_MAX // 10 or candidate > 1 << 63:
                overflow = True
            else:
                number = candidate
                scale *= 10
        index += 1
    return number, scale, text[index:], index > 0
