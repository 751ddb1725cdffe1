"""The inbox batch decided: what a batch of events writes, from what the store read. Pure.

A batch goes in three steps (docs/architecture.md tells the flow of an event):
1. the store reads what the batch needs: `Planner.asks` names it (the ids already recorded, the
   incident of every sequence the events name, the open debounce windows, for a delete/clear
   where its message's request stands, and, for a live batch, its incidents ahead), and
   `Planner.still_needed` the incidents those answers lead to (an update under a new title);
2. the planner decides, frame by frame in delivery order (`message`, `action`, `ignored`,
   `aside` for what is not an event): inbox rows, incident upserts, triage requests opened, the
   audit records (one shape: rules/cadence_records.py) folded into the cadence state as they
   are made (`CadenceState.apply`, the fold a replay of the audit log runs);
3. the store writes the `Plan` (store/inbox_batch.py) and reads nothing for it.

No I/O, no clock: `now` is an argument. The frame types are the wire's; this module reads them
through the protocols below, so the rules stay below the wire (test_layout).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from ntfy_intake.rules import cadence, cadence_records, incidents, timestamps

Record = dict[str, Any]  # one audit record (rules/cadence_records.py)

# An id rebuilt from an audit line that predates `sha256`: its body is unknown, so a replay of
# it counts as a duplicate (the safe direction: it already has its one outcome).
REBUILT_UNKNOWN_SHA256 = "unknown"
CONFLICT = "conflict: id already recorded with a different body"

# A batch of at most this many messages (a live one) asks its incidents with its first reads;
# a larger one (a backfill's overlap, a replay: mostly duplicates on a restart) once it knows
# which of its events are new, so a duplicate costs no incident read.
SPECULATE_AT_MOST = 8

# ntfy >= 2.16's device actions, in the words an agent reads (a kind `frames.DEVICE_ACTIONS`
# gains must be worded here: tests/unit/test_batch_plan.py holds the two together).
DEVICE_ACTION_SCHEMA = "ntfy-intake.device-action/1"
DEVICE_ACTION_WORDS = {
    "message_delete": "removed from devices",
    "message_clear": "read and dismissed on a device",
}


class Arrival(Protocol):
    """What every recorded event carries (the wire's Message, DeviceAction and Ignored)."""

    @property
    def id(self) -> str: ...
    @property
    def time(self) -> int | None: ...
    @property
    def expires(self) -> int | None: ...
    @property
    def topic(self) -> str: ...
    @property
    def raw(self) -> str: ...
    @property
    def raw_sha256(self) -> str: ...
    @property
    def cached(self) -> bool: ...


class Alert(incidents.Alert, Arrival, Protocol):
    """A `message` event (frames.Message)."""

    @property
    def time(self) -> int: ...
    @property
    def sequence_id(self) -> str | None: ...
    @property
    def sequence(self) -> str: ...


class Action(Arrival, Protocol):
    """A `message_delete` or `message_clear` (frames.DeviceAction)."""

    @property
    def kind(self) -> str: ...
    @property
    def time(self) -> int: ...
    @property
    def sequence_id(self) -> str: ...


class Unknown(Arrival, Protocol):
    """An event of a kind the daemon does not know (frames.Ignored)."""

    @property
    def kind(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Candidate:
    """An event whose outcome is now durable in SQLite: a possible resume point once audited."""

    index: int  # position of the frame in the batch
    event_id: str
    message_time: int
    cached: bool


class Asks(NamedTuple):
    """What the store reads before the batch is decided, all of it in one wait."""

    ids: list[str]  # are these recorded already (with their body's hash)?
    sequences: list[str]  # the incident of the messages recorded under these sequence ids
    incidents: list[str]  # these incidents, ahead (a live batch: `SPECULATE_AT_MOST`)
    windows: bool  # the delivery keys of the requests still collecting (any message asks)
    actions: list[str]  # for these sequence ids, the latest message's request and its state


@dataclass(slots=True)
class Answers:
    """What the store read for `Asks` (and `still_needed`)."""

    known: dict[str, str] = field(default_factory=dict)  # event id -> body hash
    # (topic, sequence id) -> incident key of the first message recorded under it
    sequences: dict[tuple[str, str], str] = field(default_factory=dict)
    incidents: dict[str, incidents.IncidentState | None] = field(default_factory=dict)
    windows: set[str] = field(default_factory=set)  # delivery keys of requests collecting
    # (topic, sequence id) -> (delivery key, outbox state) of its latest recorded message
    requests: dict[tuple[str, str], tuple[str | None, str | None]] = field(default_factory=dict)
    # Hashes of raw lines the quarantine holds already (asked for the batch's junk and
    # conflicts): a line's first quarantine is audited once, not once per replay of it.
    quarantined: set[str] = field(default_factory=set)
    # Whether a delete/clear may wait for its message (SQLite asks; True: assume one may).
    unlinked: bool = True


class InboxRow(NamedTuple):
    """One inbox row, its columns in the order store/inbox_batch.py inserts them."""

    event_id: str
    topic: str
    time: int
    expires: int | None
    raw: str
    raw_sha256: str
    incident_key: str
    severity: int
    outcome: str
    reason: str
    delivery_key: str | None
    received_at: float
    event: str
    sequence_id: str | None


class Request(NamedTuple):
    """A triage request opened by the batch: collecting until `due_at`."""

    delivery_key: str
    incident_key: str
    reason: str
    due_at: float


class Conflict(NamedTuple):
    """A known id with a different body: the store quarantines the event (reason `CONFLICT`)."""

    event: Arrival


class Note(NamedTuple):
    """A delete/clear of a message whose request already went out: information for agents."""

    event_id: str
    payload: dict[str, object]
    summary: str


def device_note(
    incident: str,
    *,
    kind: object,
    event_id: str,
    sequence_id: object,
    topic: object,
    time: object,
    delivery_key: str | None,
) -> Note:
    """The `incident_info` entry of a delete/clear that came after its request went out
    (`delivery_key` None: its message joined none): what the planner writes live and a rebuild
    writes again."""
    payload: dict[str, object] = {
        "schema": DEVICE_ACTION_SCHEMA,
        "incident": incident,
        "event": kind,
        "id": event_id,
        "sequence_id": sequence_id,
        "topic": topic,
        "time": time,
        "delivery_key": delivery_key,
    }
    return Note(event_id, payload, f"{incident}: {kind} of {sequence_id}")


class Aside(NamedTuple):
    """Something the store writes in its frame's place, outside the decided rows: a conflict or
    a note of the planner's, or an item the store handed over (`Planner.aside`: a junk frame, a
    notice). `at`: how many of the plan's records come before it (a notice's own records go
    there in `BatchResult.records`)."""

    item: object
    at: int


@dataclass(slots=True)
class Plan:
    """Everything a batch writes, decided (module docstring)."""

    state: cadence.CadenceState  # the cadence state with every record below folded in
    rows: list[InboxRow] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    # (incident key, topic, sequence id) of sequences first recorded in this batch: a
    # delete/clear that came before its message is linked to them.
    links: list[tuple[str, str, str]] = field(default_factory=list)
    unlinked: bool = True  # any delete/clear waits for its message: the links are written
    attach: list[tuple[str, str]] = field(default_factory=list)  # (delivery key, event id)
    incidents: dict[str, incidents.IncidentState] = field(default_factory=dict)
    records: list[Record] = field(default_factory=list)  # the events' audit records, in order
    asides: list[Aside] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)
    recorded: int = 0
    duplicates: int = 0
    conflicts: int = 0


class Planner:
    """One batch's decisions (module docstring). Built per batch; `plan` is what it decided."""

    def __init__(
        self, policy: cadence.Policy, now: float, *, speculate_at_most: int = SPECULATE_AT_MOST
    ) -> None:
        self.policy = policy
        self.now = now
        self.speculate_at_most = speculate_at_most
        self.signals: dict[str, incidents.Signal] = {}  # by event id, of the events it records
        self.asked: set[str] = set()  # incident keys asked of the store so far
        self.events: list[Arrival] = []
        self.messages: list[Alert] = []
        self.speculated = False
        self.ts = timestamps.rfc3339(now)  # every record of the batch shares it
        self.answers = Answers()
        self.plan = Plan(cadence.CadenceState.empty(policy))
        self.sequences: dict[tuple[str, str], str] = {}
        self.windows: set[str] = set()

    # -- step 1: what the store reads ----------------------------------------------------------

    def asks(
        self, events: Sequence[Arrival], messages: Sequence[Alert], actions: Sequence[Action]
    ) -> Asks:
        """The first reads: `events` all of the batch's events, `messages` and `actions` those
        of them that are messages and delete/clears. A live batch asks its incidents ahead,
        before it knows which messages are duplicates: one wait fewer."""
        self.events = list(events)
        self.messages = list(messages)
        self.speculated = len(self.messages) <= self.speculate_at_most
        if self.speculated:
            self._sign(self.messages, ahead=True)
        ahead = sorted({signal.key for signal in self.signals.values()})
        self.asked.update(ahead)
        named = {m.sequence for m in self.messages} | {a.sequence_id for a in actions}
        return Asks(
            ids=[e.id for e in events],
            sequences=sorted(named),
            incidents=ahead,
            windows=bool(self.messages),
            actions=sorted({a.sequence_id for a in actions}),
        )

    def still_needed(self, answers: Answers) -> list[str]:
        """The incidents the first answers lead to that were not asked yet: those of the new
        messages (a batch too large to ask ahead) and those an update names through its
        sequence. None for a batch of duplicates."""
        for event_id in answers.known:  # duplicates and conflicts decide nothing
            self.signals.pop(event_id, None)
        if not self.speculated:
            self._sign(m for m in self.messages if m.id not in answers.known)
        keys = {signal.key for signal in self.signals.values()}
        for message in self.messages:
            joined = answers.sequences.get((message.topic, message.sequence))
            if joined is not None and message.id in self.signals:
                keys.add(joined)
        wanted = sorted(keys - self.asked)
        self.asked.update(wanted)
        return wanted

    def conflicts(self, answers: Answers) -> list[Arrival]:
        """The events whose id is recorded with another body (`_seen`'s rule): the store asks
        whether the quarantine holds them already, with `still_needed`'s incidents."""
        conflicting: list[Arrival] = []
        for event in self.events:
            known = answers.known.get(event.id)
            if known is not None and known not in (event.raw_sha256, REBUILT_UNKNOWN_SHA256):
                conflicting.append(event)
        return conflicting

    def _sign(self, messages: Iterable[Alert], *, ahead: bool = False) -> None:
        """The signal of each message, by id (a repeated id: its first). `ahead`: before the
        duplicates are known, so a value that breaks `signal_of` is left for `message` to meet
        (a duplicate never does: it must not fail the batch)."""
        profiles = self.policy.profiles
        for message in messages:
            if message.id in self.signals:
                continue
            try:
                self.signals[message.id] = incidents.signal_of(message, profiles=profiles)
            except Exception:
                if not ahead:
                    raise

    # -- step 2: the decisions, frame by frame -------------------------------------------------

    def start(self, answers: Answers, state: cadence.CadenceState) -> None:
        """Decide on `answers` (every incident `asks` and `still_needed` named, read) and fold
        the records into `state`, a fork the caller adopts once its transaction committed."""
        self.answers = answers
        self.plan = Plan(state, unlinked=answers.unlinked)
        self.sequences = dict(answers.sequences)
        self.windows = set(answers.windows)
        self.known = dict(answers.known)

    def message(self, index: int, message: Alert) -> None:
        """A `message`: its incident merged, its cadence decided, its row and record."""
        event_id = message.id
        if event_id in self.known and self._seen(index, message):
            return
        self.known[event_id] = message.raw_sha256
        now, plan = self.now, self.plan
        signal = self.signals.get(event_id) or incidents.signal_of(
            message, profiles=self.policy.profiles
        )
        key = signal.key
        sequence = (message.topic, message.sequence_id or event_id)
        joined = self.sequences.get(sequence)
        if joined is None:
            self.sequences[sequence] = key
            plan.links.append((key, sequence[0], sequence[1]))
        elif joined != key:
            # An update (or the original, after its update): one sequence, one incident.
            signal = signal._replace(key=joined)
            key = joined
        before = plan.incidents.get(key) or self._stored(key)
        after = incidents.merge(before, signal, message)
        plan.incidents[key] = after
        view = cadence.IncidentView(key, after.severity, after.status, before is None)
        decision = plan.state.decide_event(self.policy, view, event_id, now)
        if decision.outcome == "joined" and decision.delivery_key not in self.windows:
            # Never join a request whose payload is already frozen: open a fresh one.
            decision = cadence.reopen(self.policy, event_id, now)
        delivery_key = decision.delivery_key
        if decision.outcome == "triage_requested":
            assert delivery_key is not None and decision.due_at is not None
            plan.requests.append(Request(delivery_key, key, decision.reason, decision.due_at))
            self.windows.add(delivery_key)
        if delivery_key is not None:
            plan.attach.append((delivery_key, event_id))
        plan.rows.append(
            InboxRow(
                event_id,
                message.topic,
                message.time,
                message.expires,
                message.raw,
                message.raw_sha256,
                key,
                signal.severity,
                decision.outcome,
                decision.reason,
                delivery_key,
                now,
                "message",
                sequence[1],
            )
        )
        record = cadence_records.event_record(
            decision,
            view,
            event_id,
            now,
            ts=self.ts,
            topic=message.topic,
            time=message.time,
            expires=message.expires,
            sequence_id=message.sequence_id,
            sha256=message.raw_sha256,
            profile=signal.profile,
        )
        plan.state.apply(record)
        plan.records.append(record)
        plan.recorded += 1
        plan.candidates.append(Candidate(index, event_id, message.time, message.cached))

    def action(self, index: int, event: Action) -> None:
        """A delete/clear: outcome `noted`, linked to the incident of the message it names (one
        that comes first stays unlinked until that message is recorded: `Plan.links`). It
        changes no incident and no request: a person tapping a notification never silences
        triage. One whose message's request already went out reaches agents as a `Note`."""
        sequence = event.sequence_id
        incident = self.sequences.get((event.topic, sequence), "")
        reason = f"{event.kind}: message {sequence} {DEVICE_ACTION_WORDS[event.kind]}"
        if not self._noted(index, event, event.kind, incident, sequence, "noted", reason):
            return
        if not incident:
            self.plan.unlinked = True  # its message may come later in this batch
            return
        note = self._late_note(event, incident)
        if note is not None:
            self.plan.asides.append(Aside(note, len(self.plan.records)))
            # Its audit line says so, with the request it reached ("": none; a None is dropped
            # from a line), which the line cannot be folded back to: a rebuild restores the
            # entry from it (store/rebuild.py).
            self.plan.records[-1]["info_for"] = note.payload["delivery_key"] or ""

    def ignored(self, index: int, event: Unknown) -> None:
        """An event of a kind the daemon does not know: outcome `ignored`, never junk."""
        reason = f"unknown event kind {event.kind!r}"
        self._noted(index, event, event.kind, "", None, "ignored", reason)

    def aside(self, item: object) -> None:
        """Something the store writes in this frame's place (a junk frame, a notice)."""
        self.plan.asides.append(Aside(item, len(self.plan.records)))

    def _noted(
        self,
        index: int,
        event: Action | Unknown,
        kind: str,
        incident: str,
        sequence: str | None,
        outcome: str,
        reason: str,
    ) -> bool:
        """The row and record of an event that decides nothing; False for a known id."""
        if self._seen(index, event):
            return False
        plan, time = self.plan, event.time
        plan.rows.append(
            InboxRow(
                event.id,
                event.topic,
                time or 0,
                event.expires,
                event.raw,
                event.raw_sha256,
                incident,
                0,
                outcome,
                reason,
                None,
                self.now,
                kind,
                sequence,
            )
        )
        record = cadence_records.action_record(
            self.ts,
            event.id,
            kind,
            incident=incident,
            sequence_id=sequence,
            outcome=outcome,
            reason=reason,
            topic=event.topic,
            time=time,
            expires=event.expires,
        )
        plan.state.apply(record)  # passed by: it carries no severity or status
        plan.records.append(record)
        plan.recorded += 1
        if time is not None:
            plan.candidates.append(Candidate(index, event.id, time, event.cached))
        return True

    def _late_note(self, event: Action, incident: str) -> Note | None:
        """A delete/clear of a message whose request is no longer collecting (or that joined
        none): one still collecting lists it in its payload instead (outbox.build_payload)."""
        where = self.answers.requests.get((event.topic, event.sequence_id))
        if where is None or where[1] == "collecting":
            return None
        return device_note(
            incident,
            kind=event.kind,
            event_id=event.id,
            sequence_id=event.sequence_id,
            topic=event.topic,
            time=event.time,
            delivery_key=where[0],
        )

    def _seen(self, index: int, event: Arrival) -> bool:
        """Known id: a duplicate (a resume candidate again) or a conflict (quarantined)."""
        known = self.known.get(event.id)
        if known is None:
            self.known[event.id] = event.raw_sha256
            return False
        plan = self.plan
        if known in (event.raw_sha256, REBUILT_UNKNOWN_SHA256):
            plan.duplicates += 1
            if event.time is not None:
                plan.candidates.append(Candidate(index, event.id, event.time, event.cached))
        else:
            plan.conflicts += 1
            plan.asides.append(Aside(Conflict(event), len(plan.records)))
        return True

    def _stored(self, key: str) -> incidents.IncidentState | None:
        try:
            return self.answers.incidents[key]
        except KeyError:
            raise LookupError(f"incident {key!r} was not read for the batch") from None
