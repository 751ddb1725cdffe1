"""Silences: the owner's "not now" for a topic or an incident, folded from audit records.

Pure: no I/O, no clock reads. A silence is two audit records at most (DESIGN.md section 10):

    {"kind": "silence", "silence_id": "sil_...", "scope": "topic"|"incident", "target": T,
     "until": <RFC 3339>, "reason": "..."}
    {"kind": "silence_end", "silence_id": "sil_..."}

Folding them (`Silences.apply`, called by `CadenceState.apply`) gives the set that holds at any
moment; `match` answers whether an owner message about an incident (on some topics) is silenced.
A silence ends by itself at `until`, or earlier by its `silence_end` record. While one holds,
events are recorded and triage still happens: only triage owner messages are held back (reason
`silenced`); operational notices never are.

A silence lasts at most `MAX_SPAN` (24 h): the cadence keeps (and start-up reads) records for
`Policy.retention`, at least a 26 h local day, so a silence's record is always read back.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

Scope = Literal["topic", "incident"]
SCOPES: tuple[Scope, ...] = ("topic", "incident")
MAX_SPAN = 24 * 3600.0
MIN_SPAN = 60.0
MAX_TARGET = 400
MAX_REASON = 200
_ID = re.compile(r"sil_[0-9a-z]{1,40}")
_SPAN = re.compile(r"\s*(\d{1,6})\s*(s|m|h|d)\s*")
_UNIT = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class SilenceError(ValueError):
    """A silence that cannot be made: the message says which field and why."""


@dataclass(frozen=True, slots=True)
class Silence:
    silence_id: str
    scope: Scope
    target: str
    since: float
    until: float
    reason: str

    def holds(self, now: float) -> bool:
        return self.since <= now < self.until

    def to_json(self, now: float) -> dict[str, Any]:
        return {
            "id": self.silence_id,
            "scope": self.scope,
            "target": self.target,
            "since": _iso(self.since),
            "until": _iso(self.until),
            "remaining_s": max(0, round(self.until - now)),
            "reason": self.reason,
        }


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_span(text: str) -> float:
    """`2h`, `30m`, `90s`, `1d` -> seconds, within [MIN_SPAN, MAX_SPAN]."""
    found = _SPAN.fullmatch(text)
    if found is None:
        raise SilenceError("for: a duration like 30m, 2h or 1d")
    span = int(found.group(1)) * _UNIT[found.group(2)]
    if not MIN_SPAN <= span <= MAX_SPAN:
        raise SilenceError("for: between 1m and 24h")
    return span


def check(scope: str, target: str, reason: str) -> tuple[Scope, str, str]:
    """The fields of a new silence, validated: (scope, target, reason)."""
    if scope not in SCOPES:
        raise SilenceError("scope: 'topic' or 'incident'")
    target = target.strip()
    if not target or len(target) > MAX_TARGET or not target.isprintable():
        raise SilenceError(f"target: 1-{MAX_TARGET} printable characters")
    reason = " ".join(reason.split())
    if len(reason) > MAX_REASON or not reason.isprintable():
        raise SilenceError(f"reason: at most {MAX_REASON} printable characters")
    return scope, target, reason


def valid_id(value: str) -> bool:
    return _ID.fullmatch(value) is not None


def silence_fields(
    silence_id: str, scope: Scope, target: str, until: float, reason: str
) -> dict[str, Any]:
    """The fields of a `silence` record (stage them with `kind="silence"` at its start)."""
    fields: dict[str, Any] = {
        "silence_id": silence_id,
        "scope": scope,
        "target": target,
        "until": _iso_ms(until),
    }
    if reason:
        fields["reason"] = reason
    return fields


def _iso_ms(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _parse(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return None if moment.tzinfo is None else moment.timestamp()


class Silences:
    """Every silence folded so far, by id; expired ones are dropped by `prune`."""

    __slots__ = ("_by_id",)

    def __init__(self, by_id: dict[str, Silence] | None = None) -> None:
        self._by_id = by_id or {}

    def fork(self) -> Silences:
        return Silences(dict(self._by_id))

    def __len__(self) -> int:
        return len(self._by_id)

    def apply(self, record: Mapping[str, Any], ts: float) -> bool:
        """Fold one `silence` or `silence_end` record whose `ts` is `ts`; False if malformed."""
        silence_id = record.get("silence_id")
        if not isinstance(silence_id, str) or not valid_id(silence_id):
            return False
        if record.get("kind") == "silence_end":
            found = self._by_id.get(silence_id)
            if found is not None and found.until > ts:
                self._by_id[silence_id] = Silence(
                    found.silence_id, found.scope, found.target, found.since, ts, found.reason
                )
            return found is not None
        scope, target = record.get("scope"), record.get("target")
        until = _parse(record.get("until"))
        reason = record.get("reason", "")
        if (
            scope not in SCOPES
            or not isinstance(target, str)
            or not target
            or until is None
            or not isinstance(reason, str)
        ):
            return False
        until = min(until, ts + MAX_SPAN)
        self._by_id.setdefault(silence_id, Silence(silence_id, scope, target, ts, until, reason))
        return True

    def prune(self, now: float) -> None:
        self._by_id = {k: v for k, v in self._by_id.items() if v.until > now}

    def active(self, now: float) -> list[Silence]:
        """The silences holding at `now`, the soonest to end first."""
        return sorted(
            (s for s in self._by_id.values() if s.holds(now)), key=lambda s: (s.until, s.silence_id)
        )

    def get(self, silence_id: str) -> Silence | None:
        return self._by_id.get(silence_id)

    def match(self, now: float, incident: str | None, topics: Iterable[str]) -> Silence | None:
        """The silence that holds an owner message about `incident` (on `topics`), if any."""
        wanted = set(topics)
        for silence in self.active(now):
            if silence.scope == "incident" and silence.target == incident:
                return silence
            if silence.scope == "topic" and silence.target in wanted:
                return silence
        return None
