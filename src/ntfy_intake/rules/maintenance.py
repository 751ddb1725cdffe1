"""Maintenance windows: recurring hours in which owner messages about matching incidents are held
back (DESIGN.md section 13), the weekly "Sunday-night backup" a silence (at most 24 h, made by a
person) cannot cover.

Pure: no I/O, no clock reads; `now_utc` is an aware datetime argument. The windows are parsed
values (settings/maintenance.py validates the `[[maintenance]]` entries into `Window`s).

Matching. A window names `topics` and/or `incidents` patterns, matched with `fnmatch.fnmatchcase`
(shell-style, case-sensitive: `*` any run of characters, `?` one character, `[seq]` / `[!seq]`
one character in / not in seq; `/` and `:` are ordinary characters). An owner message matches when
one of its topics matches a topic pattern, or its incident key matches an incident pattern.

Time. A window opens on each of its `days` (local days in its `timezone`) at `start` and closes at
`end`; `end` at or before `start` (`from 23:00 to 02:00`) closes the next day: a window crossing
midnight belongs to the day it starts, so `days = ["sun"]` with `23:00-02:00` holds from Sunday
23:00 to Monday 02:00, and not from Sunday 00:00 to 02:00. `to = "24:00"` is the end of the day.

Daylight saving: each edge is the FIRST instant at which the local wall clock reads that time or
later. So:
- an edge in the skipped hour (02:30 on a spring-forward night in Europe/Amsterdam, which goes
  from 02:00 straight to 03:00) is the instant of the jump (03:00 CEST): a window 01:30-03:30
  lasts 1 h of real time that night, a window 02:15-02:45 does not open at all, and one from
  02:30 opens when the clock jumps (as cron runs a job whose minute was skipped);
- an edge in the repeated hour (02:30 on a fall-back night, which reads 02:00-03:00 twice) is
  its first pass: a window 01:30-03:30 lasts 3 h of real time, a window 02:15-02:45 holds
  during the first pass only.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

DAY_NAMES: tuple[str, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
END_OF_DAY = 24 * 60  # `to = "24:00"`
REASON_PREFIX = "maintenance:"


@dataclass(frozen=True, slots=True)
class Window:
    """One `[[maintenance]]` entry, validated: `start` and `end` are minutes after local midnight
    (`end` may be END_OF_DAY), `days` weekday numbers (0 = Monday)."""

    name: str
    topics: tuple[str, ...]
    incidents: tuple[str, ...]
    days: frozenset[int]
    start: int
    end: int
    timezone: str

    @property
    def reason(self) -> str:
        """The reason an owner message held back by this window is suppressed with."""
        return REASON_PREFIX + self.name

    def matches(self, topic: str | None, incident_key: str | None) -> bool:
        if topic is not None and any(fnmatch.fnmatchcase(topic, p) for p in self.topics):
            return True
        return incident_key is not None and any(
            fnmatch.fnmatchcase(incident_key, p) for p in self.incidents
        )

    def span(self, day: date) -> tuple[datetime, datetime]:
        """The UTC instants this window opens and closes for the occurrence starting on local
        `day` (whether or not `day` is one of its days)."""
        zone = ZoneInfo(self.timezone)
        last = self.end if self.end > self.start else self.end + END_OF_DAY
        opens = _first_reading(_wall(day, self.start), zone)
        closes = _first_reading(_wall(day, last), zone)
        return opens, max(opens, closes)

    def holding_span(self, now_utc: datetime) -> tuple[datetime, datetime] | None:
        """The occurrence holding at `now_utc` (opens <= now < closes), if any."""
        today = now_utc.astimezone(ZoneInfo(self.timezone)).date()
        # Only yesterday's occurrence can still hold (a window is at most a day long).
        for day in (today - timedelta(days=1), today):
            if day.weekday() not in self.days:
                continue
            opens, closes = self.span(day)
            if opens <= now_utc < closes:
                return opens, closes
        return None

    def holds(self, now_utc: datetime) -> bool:
        return self.holding_span(now_utc) is not None

    def next_opening(self, now_utc: datetime) -> datetime | None:
        """The first instant after `now_utc` at which an occurrence opens (None: never opens in
        the next eight days, e.g. wholly inside skipped hours, which cannot recur every day)."""
        today = now_utc.astimezone(ZoneInfo(self.timezone)).date()
        for ahead in range(9):
            day = today + timedelta(days=ahead)
            if day.weekday() in self.days:
                opens, closes = self.span(day)
                if opens > now_utc and closes > opens:
                    return opens
        return None

    def describe(self) -> str:
        """`sun 01:00-04:00 Europe/Amsterdam`, for `status` and the console."""
        names = ",".join(DAY_NAMES[d] for d in sorted(self.days))
        days = "daily" if len(self.days) == 7 else names
        return f"{days} {clock_text(self.start)}-{clock_text(self.end)} {self.timezone}"


def clock_text(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def _wall(day: date, minutes: int) -> datetime:
    """The naive local wall-clock reading `minutes` after `day`'s midnight (may roll over)."""
    return datetime.combine(day, time()) + timedelta(minutes=minutes)


def _first_reading(wall: datetime, zone: ZoneInfo) -> datetime:
    """The first UTC instant at which the local clock in `zone` reads `wall` or later."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if first.astimezone(zone).replace(tzinfo=None) == wall:
        return first  # the reading exists (fold=0 is its first pass when it is repeated)
    # Skipped by a jump forward: fold=1 reads it with the offset after the jump (an instant
    # before the jump), fold=0 with the one before (after the jump). The jump lies between;
    # the local reading is monotonic there, so bisect on whole seconds.
    low = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    high = first
    if low > high:
        low, high = high, low
    while (high - low) > timedelta(seconds=1):
        middle = low + (high - low) / 2
        middle = middle.replace(microsecond=0)
        if middle.astimezone(zone).replace(tzinfo=None) >= wall:
            high = middle
        else:
            low = middle
    return high


def active(
    windows: Iterable[Window], *, topic: str | None, incident_key: str | None, now_utc: datetime
) -> Window | None:
    """The first window (in configuration order) matching `topic` or `incident_key` that holds
    at `now_utc`, if any."""
    for window in windows:
        if window.matches(topic, incident_key) and window.holds(now_utc):
            return window
    return None


def holding(
    windows: Iterable[Window],
    *,
    topics: Iterable[str],
    incident_key: str | None,
    now_utc: datetime,
) -> Window | None:
    """`active` for an owner message about `incident_key` whose events came on `topics`: the
    first window (in configuration order) holding it by its incident key or any of its topics."""
    wanted = tuple(topics)
    for window in windows:
        if (
            window.matches(None, incident_key) or any(window.matches(t, None) for t in wanted)
        ) and window.holds(now_utc):
            return window
    return None


def at(now: float) -> datetime:
    """A unix time as the aware UTC datetime the rules take."""
    return datetime.fromtimestamp(now, UTC)
