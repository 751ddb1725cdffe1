"""The cadence engine: debounce, cooldown, escalation, the daily owner cap, notice rate limits.

Pure: no I/O, no clock reads; `now` is a unix time argument. The state is a fold over audit
records and nothing else, so the audit log is the only cadence store (DESIGN.md section 4):

    decision = state.decide_event(policy, incident, event_id, now)   # never mutates
    record = cadence_records.event_record(decision, incident, event_id, now, topic=...)
    state.apply(record)                                             # fold the record it wrote

The inbox batch does exactly this per message (rules/batch_plan.py), and a replay of the audit
log folds the same records with the same `apply`: one fold for both.

Replaying the same records into `CadenceState.empty()` rebuilds the same state (`rehydrate.py`
does that at startup). The rules, the record shapes and the time rounding are in docs/cadence.md.

Time: the engine works on the audit log's millisecond grid (rules/timestamps.py): `decide_*`
truncate `now` the same way before comparing, and every window end is `window_end(start, span)`.
The records it writes and folds are rules/cadence_records.py.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from ntfy_intake.rules import maintenance as _maintenance
from ntfy_intake.rules import silences as _silences
from ntfy_intake.rules.owner_cap import OwnerCap

# Names, not the module: the fold calls them once per record, as it did when they lived here.
from ntfy_intake.rules.timestamps import local_day, parse_ts, quantize, rfc3339, window_end

Outcome = Literal["triage_requested", "joined", "suppressed"]
Status = Literal["firing", "resolved"]
MessageKind = Literal["triage", "notice", "escalation"]

# The longest local calendar day in the current tz database rules (Antarctica/Troll falls back
# two hours: a 26 h day). The daily cap needs every queued message of the current local day.
LOCAL_DAY_SPAN = 26 * 3600.0
_STATUSES = ("firing", "resolved")
_OUTCOMES = ("triage_requested", "joined", "suppressed")
# What folding one record did to the indexes (see `CadenceState.apply`).
_REJECTED = "rejected"  # malformed: nothing changed
_IN_PLACE = "in_place"  # entries changed where they stand
_REORDERED = "reordered"  # an entry was added or moved to the end
# A `ts` outside these years is malformed (and could not be formatted back or given a local day).


@dataclass(frozen=True, slots=True)
class Policy:
    debounce: float = 120.0  # seconds a new triage request collects further events of its incident
    cooldown: float = 3600.0  # after a request, repeats are suppressed unless escalating/flipping
    daily_cap: int = 10  # owner messages of kind "triage" per calendar day in `timezone`
    timezone: str = "UTC"
    notice_limit: int = 6  # operational notices per kind per `notice_window`
    # The daemon's own messages when the agent is silent (rules/escalation.py), per calendar
    # day in `timezone`: a cap of their own, apart from `daily_cap`.
    escalate_daily_cap: int = 5
    notice_window: float = 3600.0
    # `[[maintenance]]` windows (rules/maintenance.py): triage owner messages they hold are
    # suppressed with reason `maintenance:<name>`.
    maintenance: tuple[_maintenance.Window, ...] = ()
    # `ntfy.profiles` ("auto" is True): whether the batch asks the publisher profiles for a
    # message's key (rules/batch_plan.py). A replay keys by the audit line's recorded key.
    profiles: bool = True

    @property
    def retention(self) -> float:
        """How far back any decision can look: the state keeps this much, startup reads it."""
        return max(
            self.debounce, self.cooldown, self.notice_window, LOCAL_DAY_SPAN, _silences.MAX_SPAN
        )


# IncidentView and Decision are NamedTuples, not frozen dataclasses: one of each is built per
# recorded event, ~3x cheaper.
class IncidentView(NamedTuple):
    """The merged incident after this event (`incidents.merge` computes it)."""

    key: str
    severity: int
    status: Status
    is_new: bool  # the first event ever seen for this key


class Decision(NamedTuple):
    outcome: Outcome
    reason: str
    delivery_key: str | None = None  # new request: tri_<event id>; joined: the open request's
    due_at: float | None = None  # when the request's debounce window closes


@dataclass(frozen=True, slots=True)
class OwnerDecision:
    allowed: bool
    reason: str | None = None  # "daily_cap" | "rate_limited" when not allowed

    @property
    def result(self) -> str:
        """The `result` of the owner_message record that audits this decision."""
        return "queued" if self.allowed else "suppressed"


class _Request(NamedTuple):
    """The latest triage request of one incident, as the audit log recorded it (a NamedTuple:
    one is built per folded event, several times cheaper than a frozen dataclass)."""

    delivery_key: str
    opened_at: float
    severity: int  # what the request carries: max over the records that opened or joined it
    status: Status  # the incident's status at the last record that opened or joined it
    last_seen: float


def delivery_key_for(event_id: str) -> str:
    """Stable and deterministic: the event that opened the request names it, forever."""
    return f"tri_{event_id}"


def debounce_end(opened_at: float, debounce: float) -> float:
    """When a triage request opened at `opened_at` stops collecting: the one place the debounce
    window is computed (a decision, a reopened window, a request rebuilt from the audit log),
    so every reader of a window agrees to the millisecond on when it closed."""
    return window_end(opened_at, debounce)


class CadenceState:
    """Everything cadence remembers, rebuilt by folding audit records with `apply`.

    Entries are pruned by `apply` once the record clock (the greatest `ts` folded so far) has
    left their retention window (`Policy.retention` of the policy given to `empty`), and by
    `prune(now)`. No decision ever depends on a pruned entry.
    """

    __slots__ = ("_clock", "_incidents", "_owner", "_retention", "_silences")

    def __init__(
        self,
        retention: float,
        clock: float | None,
        incidents: OrderedDict[str, _Request],
        owner: OwnerCap,
        silences: _silences.Silences | None = None,
    ) -> None:
        self._retention = retention
        self._clock = clock
        self._incidents = incidents  # by incident key, oldest request first
        self._owner = owner  # the owner messages counted for the cap and the notice limits
        self._silences = silences or _silences.Silences()  # the owner's silences (silences.py)

    @classmethod
    def empty(cls, policy: Policy | None = None) -> CadenceState:
        """A state that keeps what `policy` can need (its `retention`; the default policy's if None)."""
        return cls((policy or Policy()).retention, None, OrderedDict(), OwnerCap())

    def fork(self) -> CadenceState:
        """An independent copy (entries are immutable, so this copies only the indexes)."""
        return CadenceState(
            self._retention,
            self._clock,
            OrderedDict(self._incidents),
            self._owner.fork(),
            self._silences.fork(),
        )

    def owner_view(self) -> CadenceState:
        """A copy of the owner's side alone (the counted owner messages and the silences, no
        incidents): what `OwnerQueue.view` publishes for readers in other threads. Costs what a
        day's owner messages and the silences hold, however many incidents the state tracks."""
        return CadenceState(
            self._retention, self._clock, OrderedDict(), self._owner.fork(), self._silences.fork()
        )

    @property
    def size(self) -> int:
        """Entries held in memory (incidents, counted owner messages, counted notices)."""
        return len(self._incidents) + self._owner.size

    # -- the fold --------------------------------------------------------------------------------

    def apply(self, record: Mapping[str, Any]) -> None:
        """Fold one audit record. Irrelevant kinds and malformed records are ignored, never raise.

        A well-formed `event` or `owner_message` record also advances the record clock, which
        drives pruning; nothing else does.
        """
        kind = record.get("kind")
        if kind not in ("event", "owner_message"):
            if kind in ("silence", "silence_end"):
                ts = parse_ts(record.get("ts"))
                if ts is not None:
                    self._silences.apply(record, ts)
            return
        ts = parse_ts(record.get("ts"))
        if ts is None:
            return
        if kind == "event":
            folded = self._apply_event(
                record.get("incident"),
                record.get("severity"),
                record.get("status"),
                record.get("outcome"),
                record.get("delivery_key"),
                ts,
            )
        else:
            folded = _REORDERED if self._owner.apply(record, ts) else _REJECTED
        self._advance(folded, ts)

    def _advance(self, folded: str, ts: float) -> None:
        if folded is _REJECTED:
            return
        advanced = self._clock is None or ts > self._clock
        if advanced:
            self._clock = ts
        # Most events of a replay join or are suppressed under a request at the same clock: they
        # change an entry where it stands, and the last sweep (at this clock) left every front
        # alive, so sweeping again would find nothing.
        if advanced or folded is _REORDERED:
            self._sweep(everything=False)

    def _apply_event(
        self,
        key: Any,  # the record's values, checked here before they are trusted
        severity: Any,
        status: Any,
        outcome: Any,
        delivery_key: Any,
        ts: float,
    ) -> str:
        if (
            type(key) is not str
            or not key
            or type(severity) is not int
            or status not in _STATUSES
            or outcome not in _OUTCOMES
            or (outcome != "suppressed" and type(delivery_key) is not str)
        ):
            return _REJECTED
        entry = self._incidents.get(key)
        if outcome == "triage_requested":
            self._incidents.pop(key, None)  # re-insert at the end: the dict stays in request order
            self._incidents[key] = _Request(delivery_key, ts, severity, status, ts)
            return _REORDERED
        if entry is None:
            pass  # joined or suppressed under a request older than the state remembers
        elif outcome == "joined":
            if delivery_key == entry.delivery_key:
                self._incidents[key] = _Request(
                    entry.delivery_key,
                    entry.opened_at,
                    max(entry.severity, severity),
                    status,
                    max(entry.last_seen, ts),
                )
        else:
            self._incidents[key] = _Request(
                entry.delivery_key,
                entry.opened_at,
                entry.severity,
                entry.status,
                max(entry.last_seen, ts),
            )
        return _IN_PLACE

    def prune(self, now: float) -> None:
        """Advance the clock to `now` and drop every entry outside its retention window."""
        moment = quantize(now)
        if self._clock is None or moment > self._clock:
            self._clock = moment
        self._sweep(everything=True)

    def _alive(self, ts: float) -> bool:
        return self._clock is None or self._clock < window_end(ts, self._retention)

    def _sweep(self, *, everything: bool) -> None:
        # Records arrive in time order, so expired entries sit at the front of each index; a full
        # sweep also catches the few a clock step left behind.
        if everything:
            self._incidents = OrderedDict(
                (k, v) for k, v in self._incidents.items() if self._alive(v.opened_at)
            )
        else:
            while self._incidents:
                key, entry = next(iter(self._incidents.items()))
                if self._alive(entry.opened_at):
                    break
                del self._incidents[key]
        self._owner.sweep(self._alive, everything=everything)
        if everything and self._clock is not None:
            self._silences.prune(self._clock)

    # -- decisions (never mutate) ----------------------------------------------------------------

    def decide_event(
        self, policy: Policy, incident: IncidentView, event_id: str, now: float
    ) -> Decision:
        moment = quantize(now)
        entry = self._incidents.get(incident.key)
        if entry is not None:
            due = debounce_end(entry.opened_at, policy.debounce)
            if moment < due:
                return Decision("joined", "debounce", entry.delivery_key, due)
            if moment < window_end(entry.opened_at, policy.cooldown):
                if incident.status != entry.status:
                    reason = "resolved" if incident.status == "resolved" else "reopened"
                elif incident.status == "firing" and incident.severity > entry.severity:
                    reason = "escalation"
                else:
                    return Decision("suppressed", "cooldown")
                return _new_request(policy, reason, event_id, moment)
        # No request within the cooldown: a fresh episode.
        if incident.is_new:
            reason = "new_incident"
        elif incident.status == "resolved":
            reason = "resolved"
        else:
            reason = "repeat"
        return _new_request(policy, reason, event_id, moment)

    def decide_owner_message(
        self,
        policy: Policy,
        now: float,
        *,
        incident: str | None = None,
        topics: tuple[str, ...] = (),
        acknowledged: bool = False,
        capped: bool = True,
    ) -> OwnerDecision:
        """A triage reply to the owner: allowed, suppressed while a silence holds its incident
        or one of its topics, while the owner's ack holds its incident (`acknowledged`: the
        store knows, store/owner_replies.ack_holds), or suppressed past the day's cap."""
        if self._silences.match(quantize(now), incident, topics) is not None:
            return OwnerDecision(False, "silenced")
        if acknowledged:
            return OwnerDecision(False, "acknowledged")
        if policy.maintenance:
            window = _maintenance.holding(
                policy.maintenance,
                topics=topics,
                incident_key=incident,
                now_utc=_maintenance.at(quantize(now)),
            )
            if window is not None:
                return OwnerDecision(False, window.reason)
        if capped and self.triage_messages_today(policy, now) >= policy.daily_cap:
            return OwnerDecision(False, "daily_cap")
        return OwnerDecision(True)

    def decide_escalation(
        self,
        policy: Policy,
        now: float,
        *,
        incident: str | None = None,
        topics: tuple[str, ...] = (),
        acknowledged: bool = False,
    ) -> OwnerDecision:
        """The daemon's own message for a silent agent: silences, the owner's ack and
        maintenance windows hold it as they hold a triage reply; its own daily cap, not the
        triage one, limits it."""
        held = self.decide_owner_message(
            policy,
            now,
            incident=incident,
            topics=topics,
            acknowledged=acknowledged,
            capped=False,
        )
        if not held.allowed:
            return held
        if self.escalations_today(policy, now) >= policy.escalate_daily_cap:
            return OwnerDecision(False, "escalate_daily_cap")
        return OwnerDecision(True)

    def escalations_today(self, policy: Policy, now: float) -> int:
        """Queued escalation owner messages on `now`'s calendar day in `policy.timezone`."""
        today = local_day(quantize(now), policy.timezone)
        return self._owner.escalations_on_day(today, policy.timezone)

    def decide_notice(self, policy: Policy, notice: str, now: float) -> OwnerDecision:
        """An operational notice: a per-kind rate limit, never the daily cap."""
        moment = quantize(now)
        recent = self._owner.notices_within(notice, moment, policy.notice_window)
        if recent >= policy.notice_limit:
            return OwnerDecision(False, "rate_limited")
        return OwnerDecision(True)

    @property
    def silences(self) -> _silences.Silences:
        """The owner's silences, as folded (read-only by convention: change them by records)."""
        return self._silences

    def triage_messages_today(self, policy: Policy, now: float) -> int:
        """Queued triage owner messages on `now`'s calendar day in `policy.timezone`."""
        today = local_day(quantize(now), policy.timezone)
        return self._owner.triage_on_day(today, policy.timezone)

    def snapshot(self) -> dict[str, Any]:
        """A canonical JSON-able view of what is alive at the record clock."""
        return {
            "clock": None if self._clock is None else rfc3339(self._clock),
            "incidents": {
                key: {
                    "delivery_key": entry.delivery_key,
                    "opened_at": rfc3339(entry.opened_at),
                    "severity": entry.severity,
                    "status": entry.status,
                    "last_seen": rfc3339(entry.last_seen),
                }
                for key, entry in sorted(self._incidents.items())
                if self._alive(entry.opened_at)
            },
            **self._owner.snapshot(self._alive),
        }


def reopen(policy: Policy, event_id: str, now: float) -> Decision:
    """A join whose request no longer collects (its payload is frozen): a fresh request instead.
    Only a wall clock stepping backwards gets here, as the state saw the window still open."""
    return _new_request(policy, "window_closed", event_id, quantize(now))


def _new_request(policy: Policy, reason: str, event_id: str, moment: float) -> Decision:
    return Decision(
        "triage_requested",
        reason,
        delivery_key_for(event_id),
        debounce_end(moment, policy.debounce),
    )
