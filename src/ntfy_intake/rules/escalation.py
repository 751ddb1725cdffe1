"""Escalation when the triage agent is silent: which released requests are due, when the next
one falls due, and the owner message the daemon builds for one itself (DESIGN.md section 13).

Pure: plain values and a `now` argument, no I/O, no clock reads. A request is due once
`escalate_after` has passed since its release without a 2xx from the agent, its incident's
severity is at least `min_severity`, and no escalation was recorded for it yet (the caller folds
that from the audit log / the owner outbox's unique key `escalate:<delivery_key>`).

The message carries only what the daemon knows about the incident: its topic, its title
(sanitized: it came from whoever published the alert), severity, first and last seen and the
event count, flattened and cut to `MESSAGE_LIMIT` characters.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ntfy_intake.rules import sanitize
from ntfy_intake.rules.durations import format_duration
from ntfy_intake.rules.timestamps import local_day, quantize, window_end

MESSAGE_LIMIT = 300
KEY_PREFIX = "escalate:"
# Requests older than this (past their own escalate_after) are not looked at again: after an
# upgrade, last month's dead requests must not all escalate at once.
HORIZON = 24 * 3600.0
UPCOMING_SHOWN = 5  # the status and console list this many not-yet-due escalations
_TITLE_LIMIT = 120  # leaves room for the fixed parts whatever the topic's length
_TOPIC_LIMIT = 64


@dataclass(frozen=True, slots=True)
class Policy:
    after: float = 600.0  # seconds after release without a 2xx; 0 = escalation off
    min_severity: int = 4
    # The agent feed alone (no relay): the handle whose ack on `triage` counts as the answer.
    feed_handle: str | None = None

    @property
    def enabled(self) -> bool:
        return self.after > 0


def configured(
    after: float, min_severity: int, *, relay: bool, feed_handle: str | None
) -> Policy | None:
    """The escalation policy the settings ask for, or None when nothing escalates: a relay's
    requests wait for its 2xx; without one, only a named feed handle gives something to wait
    for (its ack), since an agent that pulls is not pushed anything that could fail."""
    if after <= 0 or not (relay or feed_handle):
        return None
    return Policy(after, min_severity, None if relay else feed_handle)


@dataclass(frozen=True, slots=True)
class Pending:
    """A released triage request as the store sees it."""

    delivery_key: str
    released_at: float
    incident_key: str
    topic: str
    title: str
    severity: int
    first_seen: float
    last_seen: float
    events: int
    delivered: bool  # the agent answered 2xx (no escalation, ever)
    escalated: bool  # an `escalate:<delivery_key>` owner message is already recorded


@dataclass(frozen=True, slots=True)
class Plan:
    due: tuple[Pending, ...]  # escalate these now, oldest release first
    next_due: float | None  # the earliest instant a not-yet-due candidate falls due


def brings_news(
    records: Iterable[Mapping[str, Any]], known: Container[str], min_severity: int
) -> bool:
    """Whether a committed batch can bring an escalation forward: an event of a request the
    loop has not seen among its candidates, at or above the minimum severity (a new request,
    or one whose severity just rose past it). An event joining a known request moves no due
    instant, so the loop is not woken for it: a live event then costs the escalator nothing."""
    for record in records:
        key = record.get("delivery_key")
        severity = record.get("severity")
        if (
            isinstance(key, str)
            and key not in known
            and isinstance(severity, int)
            and severity >= min_severity
        ):
            return True
    return False


def key_for(delivery_key: str) -> str:
    """The owner outbox key of a request's escalation: one per request, forever."""
    return KEY_PREFIX + delivery_key


def due_at(policy: Policy, request: Pending) -> float:
    """When `request` falls due, on the audit log's millisecond grid."""
    return window_end(request.released_at, policy.after)


def eligible(policy: Policy, request: Pending) -> bool:
    """Whether `request` can ever escalate (whatever the time)."""
    return (
        policy.enabled
        and not request.delivered
        and not request.escalated
        and request.severity >= policy.min_severity
    )


def plan(policy: Policy, requests: Iterable[Pending], now: float) -> Plan:
    """Which of `requests` are due at `now`, and when the next of the rest falls due (None:
    nothing to wait for; the caller sleeps until a request is released or delivered)."""
    moment = quantize(now)
    due: list[Pending] = []
    next_due: float | None = None
    for request in requests:
        if not eligible(policy, request):
            continue
        at = due_at(policy, request)
        if at <= moment:
            due.append(request)
        elif next_due is None or at < next_due:
            next_due = at
    due.sort(key=lambda r: (r.released_at, r.delivery_key))
    return Plan(tuple(due), next_due)


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def message(request: Pending, now: float, *, feed_handle: str | None = None) -> str:
    """The owner message for `request`: one line, sanitized, at most `MESSAGE_LIMIT` characters.
    `feed_handle`: the policy's (the agent feed alone): nothing was pushed to an agent that
    could stay silent, so the message says what was waited for, the agent's ack on the feed."""
    # Whole minutes past the first (10m, 1h12m), whole seconds below it (a short escalate_after).
    seconds = max(0, int(quantize(now) - request.released_at))
    waited = format_duration(seconds if seconds < 60 else seconds // 60 * 60)
    why = (
        f"triage agent silent for {waited}"
        if feed_handle is None
        else f"triage agent has not taken it from the feed for {waited}"
    )
    text = (
        f"[{sanitize.one_line(request.topic or '-', _TOPIC_LIMIT)}]"
        f" {sanitize.one_line(request.title or request.incident_key or '-', _TITLE_LIMIT)}"
        f" (severity {int(request.severity)}) - {why}."
        f" First seen {_clock(request.first_seen)}, last {_clock(request.last_seen)},"
        f" {int(request.events)} event{'s' if request.events != 1 else ''}."
    )
    return sanitize.one_line(text, MESSAGE_LIMIT)


@dataclass(frozen=True, slots=True)
class Recorded:
    """An escalation the owner outbox holds: its key, state (pending, sent, dead, suppressed),
    when it was decided, why it was held (None when it was let through) and its incident."""

    key: str
    state: str
    created_at: float
    reason: str | None
    incident: str | None


@dataclass(frozen=True, slots=True)
class Overview:
    """Escalations apart from the agent's messages, for `status` and the console."""

    today: int  # let through on `now`'s calendar day: what `escalate_daily_cap` counts
    held_today: int  # held on that day (the cap, a silence, an ack, a maintenance window)
    last: Recorded | None  # the newest, whatever became of it
    upcoming: tuple[tuple[Pending, float], ...]  # not yet due, with when, soonest first


def overview(
    policy: Policy,
    timezone: str,
    recorded: Iterable[Recorded],
    pending: Iterable[Pending],
    now: float,
) -> Overview:
    """The day's count against the cap as the cadence counts it (decided on `now`'s calendar day
    in `timezone`, let through), the newest escalation, and the requests that will escalate if
    the agent stays silent, with their due instants (those due already are being recorded)."""
    today_day = local_day(now, timezone)
    today = held = 0
    last: Recorded | None = None
    for row in recorded:
        if local_day(row.created_at, timezone) == today_day:
            if row.state == "suppressed":
                held += 1
            else:
                today += 1
        if last is None or (row.created_at, row.key) > (last.created_at, last.key):
            last = row
    upcoming = sorted(
        ((request, due_at(policy, request)) for request in pending if eligible(policy, request)),
        key=lambda item: (item[1], item[0].delivery_key),
    )
    return Overview(today, held, last, tuple(upcoming[:UPCOMING_SHOWN]))
