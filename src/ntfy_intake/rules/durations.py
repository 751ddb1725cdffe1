"""Duration strings for the config file: parse `45s`, `30m`, `1h30m`, `500ms`, `2d`, and format back.

Invariants owned here:
- a duration is one or more `<number><unit>` parts, units from largest to smallest, each at most once
  (`1h30m`, not `30m1h` or `1m30m`); units are `d`, `h`, `m`, `s`, `ms`, lower case;
- a bare number (`45`), a sign, spaces inside, or exponents are refused: the unit is never guessed;
- the result is finite, non-negative and at most `MAX_SECONDS`; whether zero is allowed is the
  caller's rule (a reorder window may be `0s`, a cache duration may not);
- `parse_duration(format_duration(s)) == s` for every whole number of milliseconds in range.
Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

__all__ = ["MAX_SECONDS", "format_duration", "parse_duration"]

# Ten years: long enough for any real setting, short enough that datetime/timedelta arithmetic on it
# can never overflow.
MAX_SECONDS = 10 * 365 * 86400.0

# Milliseconds per unit, largest first (the order a duration must use).
_UNITS: dict[str, int] = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000, "ms": 1}
_RANK = {unit: rank for rank, unit in enumerate(_UNITS)}
# `ms` is tried before `m` so that "500ms" is not read as "500m" followed by junk.
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|d|h|m|s)")
_EXPECTED = "expected a duration like 45s"


def parse_duration(text: str) -> float:
    """Return the number of seconds `text` stands for, or raise ValueError with a one-line reason."""
    stripped = text.strip()
    if not stripped:
        raise ValueError(f"{_EXPECTED}, got an empty string")
    total_ms = Decimal(0)
    last_rank = -1
    pos = 0
    while pos < len(stripped):
        match = _PART.match(stripped, pos)
        if match is None:
            raise ValueError(_invalid(text, pos, stripped))
        number, unit = match.groups()
        rank = _RANK[unit]
        if rank <= last_rank:
            raise ValueError(
                f"{_EXPECTED}, got {_show(text)} (units must go from largest to smallest)"
            )
        last_rank = rank
        total_ms += Decimal(number) * _UNITS[unit]
        pos = match.end()
    seconds = float(total_ms / 1000)
    if not math.isfinite(seconds) or seconds > MAX_SECONDS:
        raise ValueError(f"{_EXPECTED}, got {_show(text)} (longer than the maximum of 3650d)")
    return seconds


def _invalid(text: str, pos: int, stripped: str) -> str:
    if re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", stripped[pos:]):
        return f"{_EXPECTED}, got {_show(text)} (a number needs a unit: ms, s, m, h or d)"
    return f"{_EXPECTED}, got {_show(text)}"


def _show(text: str) -> str:
    """repr() keeps the message on one line; long input is cut so the message stays readable."""
    return repr(text) if len(text) <= 40 else repr(text[:40]) + "..."


def format_duration(seconds: float) -> str:
    """The shortest canonical string for `seconds`, rounded to whole milliseconds (`1h30m`, `0s`)."""
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"cannot format {seconds!r} as a duration")
    remaining = round(seconds * 1000)
    if remaining == 0:
        return "0s"
    parts: list[str] = []
    for unit, size in _UNITS.items():
        count, remaining = divmod(remaining, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
