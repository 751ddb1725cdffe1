"""Expectations: a dead-man switch per publisher (DESIGN.md section 12). A nightly backup job that
died, or an Uptime Kuma that never retries a failed send, is silent; so is a quiet homelab. An
`[[expect]]` entry says how often a topic (optionally: a title) must be heard from, so that the
owner's silence means something again.

Pure: no I/O, no clock reads; `now` is an argument. The state is folded from audit records
(`fold`), the same records at start-up (store/expect_fold.py reads them) and live (what the
writer committed), so it is rebuilt alike after a restart, a rebuild and a failover.

The rule, per expectation (`every`, `grace`):
- an arrival is an `event` record of a message (not a delete/clear: a person tapping a
  notification is not the publisher) on the expectation's topic whose incident key holds the
  `title` substring; its instant is ntfy's publication `time` (a message replayed after downtime
  still fills the window it was published in), else the record's `ts`;
- the window opens at the last arrival (at `started`, the daemon's start, while none is known);
  when nothing arrives by window start + every + grace, one `missed` notice is due, keyed
  `expect:<name>:<window start>`;
- ONE notice per episode, not one per window: a job dead for a week gives one notice, then one
  `back` notice (key `expect:<name>:<window start>:back`) when a matching message arrives again,
  which closes the episode; the next one opens at that arrival. A reminder every window would
  teach the owner to ignore it (and the per-kind notice limit would cut it off anyway). The
  window start names the episode: the same after a restart (it is an audited arrival, or an
  audited notice), so recording it again is a no-op in the owner outbox;
- the notices' own audit records (`notice` with `expectation` and `window_start`) are folded
  too: an episode already told is not told again, even when its last arrival is older than the
  audit files read at start.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from ntfy_intake.rules.timestamps import parse_ts

KEY_PREFIX = "expect:"
NOTICE_MISSED = "expect_missed"
NOTICE_BACK = "expect_back"
Kind = Literal["missed", "back"]


def normalize_title(text: str) -> str:
    """As the incident key holds a title: lower-cased, whitespace collapsed."""
    return re.sub(r"\s+", " ", text.strip().lower())


@dataclass(frozen=True, slots=True)
class Expectation:
    """One `[[expect]]` entry, validated (settings/expectations.py). `title`: normalized
    (`normalize_title`), matched as a substring of the incident key; None: any message."""

    name: str
    topic: str
    every: float
    grace: float = 0.0
    title: str | None = None

    @property
    def deadline(self) -> float:
        """How long after a window's start it is missed."""
        return self.every + self.grace

    def arrival(self, record: Mapping[str, Any]) -> float | None:
        """The instant `record` is an arrival for this expectation at, None when it is not one."""
        if record.get("kind") != "event" or "event" in record or record.get("topic") != self.topic:
            return None
        if self.title is not None:
            incident = record.get("incident")
            if not isinstance(incident, str) or self.title not in normalize_title(incident):
                return None
        published = record.get("time")
        if isinstance(published, int | float) and not isinstance(published, bool):
            return float(int(published))
        at = parse_ts(record.get("ts"))
        # Whole seconds, as ntfy's times and the keys are: a window start read back from a
        # notice's key compares equal to the arrival it came from.
        return None if at is None else float(int(at))


@dataclass(slots=True)
class Watch:
    """What the audit records say of one expectation."""

    last: float | None = None  # the newest arrival
    told: float | None = None  # the window start of the episode told missed, not yet back
    closed: float | None = None  # the window start of the newest episode told back


@dataclass(slots=True)
class State:
    expectations: tuple[Expectation, ...]
    started: float  # the anchor while no arrival is known
    watches: dict[str, Watch] = field(default_factory=dict)

    @classmethod
    def empty(cls, expectations: Iterable[Expectation], started: float) -> State:
        found = tuple(expectations)
        return cls(found, float(int(started)), {e.name: Watch() for e in found})


@dataclass(frozen=True, slots=True)
class Due:
    """A notice owed now."""

    key: str
    kind: Kind
    expectation: Expectation
    window_start: float
    arrived: float | None  # the arrival that ended the episode (`back`), else None
    heard: bool = True  # False: the window opened at the daemon's start, no arrival known


def window_start(state: State, expectation: Expectation) -> float:
    watch = state.watches[expectation.name]
    return state.started if watch.last is None else watch.last


def missed_key(name: str, start: float) -> str:
    return f"{KEY_PREFIX}{name}:{instant(start)}"


def back_key(name: str, start: float) -> str:
    return f"{missed_key(name, start)}:back"


def fold(state: State, record: Mapping[str, Any]) -> None:
    """Fold one audit record in, in recorded order; folding a record again changes nothing
    (start-up reads may overlap the live feed): arrivals keep the newest, and an episode's
    `missed` read again after its `back` does not reopen it."""
    kind = record.get("kind")
    if kind == "event":
        for expectation in state.expectations:
            at = expectation.arrival(record)
            watch = state.watches[expectation.name]
            if at is not None and (watch.last is None or at > watch.last):
                watch.last = at
        return
    if kind != "notice" or record.get("notice") not in (NOTICE_MISSED, NOTICE_BACK):
        return
    found = state.watches.get(str(record.get("expectation")))
    start = parse_ts(record.get("window_start"))
    if found is None or start is None:
        return  # an expectation removed from the config since
    watch = found
    if record.get("notice") == NOTICE_MISSED:
        if watch.closed is None or start > watch.closed:
            watch.told = start if watch.told is None else max(watch.told, start)
    else:
        watch.closed = start if watch.closed is None else max(watch.closed, start)
        if watch.told is not None and watch.told <= start:
            watch.told = None
        # The arrival that ended it, even when it is older than the audit files read.
        arrived = parse_ts(record.get("arrived"))
        if arrived is not None and (watch.last is None or arrived > watch.last):
            watch.last = arrived


def due(state: State, now: float) -> list[Due]:
    """The notices owed at `now`, in configuration order."""
    owed: list[Due] = []
    for expectation in state.expectations:
        watch = state.watches[expectation.name]
        if watch.told is not None:
            if watch.last is not None and watch.last > watch.told:
                key = back_key(expectation.name, watch.told)
                owed.append(Due(key, "back", expectation, watch.told, watch.last))
            continue
        start = window_start(state, expectation)
        if now >= start + expectation.deadline:
            key = missed_key(expectation.name, start)
            owed.append(Due(key, "missed", expectation, start, None, watch.last is not None))
    return owed


def next_check(state: State) -> float | None:
    """When the next `missed` falls due (None: every expectation is in a told episode, waiting
    for an arrival, which the live feed brings). A `back` is due at once, on the arrival."""
    times = [
        window_start(state, e) + e.deadline
        for e in state.expectations
        if state.watches[e.name].told is None
    ]
    return min(times) if times else None


def told(state: State, item: Due) -> None:
    """`item`'s notice was recorded (committed): as folding its audit record would."""
    fold(
        state,
        {
            "kind": "notice",
            "notice": NOTICE_MISSED if item.kind == "missed" else NOTICE_BACK,
            "expectation": item.expectation.name,
            "window_start": instant(item.window_start),
            "arrived": None if item.arrived is None else instant(item.arrived),
        },
    )


@dataclass(frozen=True, slots=True)
class Row:
    """One expectation as `status` and the console show it."""

    name: str
    topic: str
    title: str | None
    every: float
    grace: float
    last: float | None
    due_at: float
    state: Literal["waiting", "missed"]
    missed_since: float | None


def rows(state: State, now: float) -> list[Row]:
    found: list[Row] = []
    for e in state.expectations:
        watch = state.watches[e.name]
        start = window_start(state, e)
        missed = watch.told is not None or now >= start + e.deadline
        since = watch.told if watch.told is not None else (start if missed else None)
        found.append(
            Row(
                e.name,
                e.topic,
                e.title,
                e.every,
                e.grace,
                watch.last,
                start + e.deadline,
                "missed" if missed else "waiting",
                since,
            )
        )
    return found


def instant(at: float) -> str:
    """Whole seconds (ntfy's times are): `2026-12-06T01:00:00Z`, the same from every reader."""
    return datetime.fromtimestamp(int(at), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
