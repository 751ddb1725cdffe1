"""The cadence engine: rule tables, then properties of the fold (replay, restarts, bounded size)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ntfy_intake.rules.cadence import CadenceState, Decision, IncidentView, OwnerDecision, Policy
from ntfy_intake.rules.cadence_records import event_record, owner_record
from ntfy_intake.rules.timestamps import local_day, parse_ts, quantize, rfc3339, window_end

BASE = 1_764_470_000.0  # 2025-11-30T02:33:20Z, on the millisecond grid
POLICY = Policy(debounce=120, cooldown=3600, daily_cap=2, notice_limit=2, notice_window=60)
F, R = "firing", "resolved"
TR, J, S = "triage_requested", "joined", "suppressed"


def at(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


# -- the harness: a tiny incident model (max severity, latest status) driving the engine ---------


@dataclass
class Run:
    """Decide + apply, the way the inbox transaction and the relay will."""

    policy: Policy
    state: CadenceState = field(init=False)
    incidents: dict[str, tuple[int, str]] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    decisions: list[Decision | OwnerDecision] = field(default_factory=list)
    serial: int = 0

    def __post_init__(self) -> None:
        self.state = CadenceState.empty(self.policy)

    def view(self, key: str, severity: int, status: str) -> IncidentView:
        before = self.incidents.get(key)
        merged = severity if before is None else max(before[0], severity)
        self.incidents[key] = (merged, status)
        return IncidentView(key, merged, status, is_new=before is None)  # type: ignore[arg-type]

    def event(self, now: float, key: str, severity: int = 3, status: str = F) -> Decision:
        self.serial += 1
        event_id = f"e{self.serial}"
        incident = self.view(key, severity, status)
        decision = self.state.decide_event(self.policy, incident, event_id, now)
        self._record(decision, event_record(decision, incident, event_id, now, topic="alerts"))
        return decision

    def owner(self, now: float) -> OwnerDecision:
        self.serial += 1
        decision = self.state.decide_owner_message(self.policy, now)
        key = f"notify:tri_e{self.serial}"
        record = owner_record(
            key, now, message_kind="triage", result=decision.result, reason=decision.reason
        )
        self._record(decision, record)
        return decision

    def notice(self, now: float, kind: str) -> OwnerDecision:
        self.serial += 1
        decision = self.state.decide_notice(self.policy, kind, now)
        record = owner_record(
            f"{kind}:{self.serial}",
            now,
            message_kind="notice",
            notice=kind,
            result=decision.result,
            reason=decision.reason,
        )
        self._record(decision, record)
        return decision

    def _record(self, decision: Decision | OwnerDecision, record: dict[str, Any]) -> None:
        self.state.apply(record)
        self.records.append(record)
        self.decisions.append(decision)


def replay(records: list[dict[str, Any]], policy: Policy) -> CadenceState:
    state = CadenceState.empty(policy)
    for seq, record in enumerate(records, 1):
        # Through JSON and the file envelope, as rehydration will see it.
        state.apply(json.loads(json.dumps({"v": 1, "seq": seq, **record})))
    return state


# -- event rules -------------------------------------------------------------------------------

# Each step: (seconds after BASE, merged severity, status, expected outcome, expected reason).
EVENT_TABLE: list[tuple[str, list[tuple[float, int, str, str, str]]]] = [
    ("new incident opens a request", [(0, 3, F, TR, "new_incident")]),
    (
        "a burst joins the open window, whatever its severity",
        [(0, 3, F, TR, "new_incident"), (30, 5, F, J, "debounce"), (119.999, 5, R, J, "debounce")],
    ),
    (
        "the window closes at due_at exactly",
        [(0, 3, F, TR, "new_incident"), (120, 3, F, S, "cooldown")],
    ),
    (
        "now is truncated to the millisecond: 119.9996 s is still inside",
        [(0, 3, F, TR, "new_incident"), (119.9996, 3, F, J, "debounce")],
    ),
    (
        "escalation after the window, inside the cooldown",
        [
            (0, 3, F, TR, "new_incident"),
            (300, 4, F, TR, "escalation"),
            (410, 4, F, J, "debounce"),
            (420, 4, F, S, "cooldown"),
        ],
    ),
    (
        "escalation is measured against what the request carried (joined severity)",
        [(0, 3, F, TR, "new_incident"), (60, 5, F, J, "debounce"), (300, 5, F, S, "cooldown")],
    ),
    ("same severity in the cooldown", [(0, 3, F, TR, "new_incident"), (900, 3, F, S, "cooldown")]),
    (
        "firing -> resolved in the cooldown",
        [(0, 3, F, TR, "new_incident"), (300, 3, R, TR, "resolved")],
    ),
    (
        "resolved -> firing in the cooldown",
        [(0, 3, F, TR, "new_incident"), (300, 3, R, TR, "resolved"), (600, 3, F, TR, "reopened")],
    ),
    (
        "a resolution that joined the window is what the request said",
        [(0, 3, F, TR, "new_incident"), (60, 3, R, J, "debounce"), (300, 3, R, S, "cooldown")],
    ),
    (
        "no escalation while resolved",
        [(0, 3, F, TR, "new_incident"), (300, 3, R, TR, "resolved"), (900, 5, R, S, "cooldown")],
    ),
    (
        "an escalation restarts the cooldown",
        [
            (0, 3, F, TR, "new_incident"),
            (3000, 4, F, TR, "escalation"),
            (3700, 4, F, S, "cooldown"),
        ],
    ),
    (
        "the cooldown ends a millisecond before its end",
        [
            (0, 3, F, TR, "new_incident"),
            (3599.999, 3, F, S, "cooldown"),
            (3600, 3, F, TR, "repeat"),
        ],
    ),
    (
        "after the cooldown a resolution is a fresh request",
        [(0, 3, F, TR, "new_incident"), (7200, 3, R, TR, "resolved")],
    ),
    (
        "a repeat opens its own window",
        [(0, 3, F, TR, "new_incident"), (3600, 3, F, TR, "repeat"), (3601, 3, F, J, "debounce")],
    ),
]


@pytest.mark.parametrize(("name", "steps"), EVENT_TABLE, ids=[row[0] for row in EVENT_TABLE])
def test_event_rules(name: str, steps: list[tuple[float, int, str, str, str]]) -> None:
    run = Run(POLICY)
    opened: Decision | None = None
    for offset, severity, status, outcome, reason in steps:
        now = BASE + offset
        decision = run.event(now, "disk", severity, status)
        assert (decision.outcome, decision.reason) == (outcome, reason), (name, offset)
        if outcome == TR:
            assert decision.delivery_key == f"tri_e{run.serial}"
            assert decision.due_at == window_end(quantize(now), POLICY.debounce)
            opened = decision
        elif outcome == J:
            assert opened is not None
            assert (decision.delivery_key, decision.due_at) == (opened.delivery_key, opened.due_at)
        else:
            assert (decision.delivery_key, decision.due_at) == (None, None)


def test_due_at_is_on_the_millisecond_grid_the_log_records() -> None:
    decision = Run(POLICY).event(BASE + 0.1234567, "disk")
    assert decision.due_at == parse_ts(rfc3339(BASE + 0.123 + 120))


def test_zero_debounce_releases_at_once_and_the_cooldown_still_holds() -> None:
    run = Run(Policy(debounce=0))
    assert run.event(BASE, "disk").outcome == TR
    assert run.event(BASE, "disk").outcome == S


def test_known_incident_without_state_is_a_repeat_or_a_resolution() -> None:
    state = CadenceState.empty()
    firing = IncidentView("disk", 3, "firing", is_new=False)
    resolved = IncidentView("disk", 3, "resolved", is_new=False)
    assert state.decide_event(POLICY, firing, "e1", BASE).reason == "repeat"
    assert state.decide_event(POLICY, resolved, "e1", BASE).reason == "resolved"


def test_remembered_cooldown_wins_over_is_new() -> None:
    # An inbox rebuilt from scratch says "new"; the audit log remembers the request.
    run = Run(POLICY)
    run.event(BASE, "disk")
    again = IncidentView("disk", 3, "firing", is_new=True)
    assert run.state.decide_event(POLICY, again, "e9", BASE + 600).reason == "cooldown"


def test_backlog_after_downtime_becomes_one_request_per_incident() -> None:
    run = Run(POLICY)
    keys = ["disk", "backup", "cert", "load"]
    decisions = [
        (key, run.event(BASE + 0.01 * i, key, severity=1 + i % 5))
        for i, key in enumerate(keys * 50)
    ]
    requests = {key: d.delivery_key for key, d in decisions if d.outcome == TR}
    assert len(requests) == len(keys)
    assert Counter(d.outcome for _, d in decisions) == {TR: 4, J: 196}
    assert all(d.delivery_key == requests[key] for key, d in decisions)


def test_decisions_do_not_mutate_and_fork_is_independent() -> None:
    run = Run(POLICY)
    run.event(BASE, "disk")
    before = run.state.snapshot()
    fork = run.state.fork()
    run.state.decide_event(POLICY, IncidentView("cpu", 3, "firing", True), "x", BASE + 1)
    run.state.decide_owner_message(POLICY, BASE + 1)
    run.state.decide_notice(POLICY, "gap", BASE + 1)
    assert run.state.snapshot() == before
    decision = fork.decide_event(POLICY, IncidentView("cpu", 3, "firing", True), "x", BASE + 1)
    fork.apply(event_record(decision, IncidentView("cpu", 3, "firing", True), "x", BASE + 1))
    fork.apply(owner_record("n:1", BASE + 1, message_kind="notice", notice="gap", result="queued"))
    assert run.state.snapshot() == before  # a rolled-back transaction's fork is simply dropped
    assert set(fork.snapshot()["incidents"]) == {"cpu", "disk"}


# -- the daily cap, in the configured time zone ------------------------------------------------

# (time zone, [(instant, expected allowed)]) with daily_cap = 2.
CAP_TABLE: list[tuple[str, str, list[tuple[str, bool]]]] = [
    (
        "UTC day",
        "UTC",
        [
            ("2025-01-15T22:00:00Z", True),
            ("2025-01-15T22:30:00Z", True),
            ("2025-01-15T23:30:00Z", False),
            ("2025-01-15T23:59:59.999Z", False),
            ("2025-01-16T00:00:00Z", True),
        ],
    ),
    (
        "Amsterdam midnight is 23:00Z in winter",
        "Europe/Amsterdam",
        [
            ("2025-01-15T22:00:00Z", True),
            ("2025-01-15T22:30:00Z", True),
            ("2025-01-15T22:59:59.999Z", False),
            # 400 microseconds before midnight truncates to .999: still yesterday.
            ("2025-01-15T22:59:59.999600Z", False),
            ("2025-01-15T23:00:00Z", True),
        ],
    ),
    (
        "Amsterdam 2025-10-26 is 25 hours long (CEST -> CET)",
        "Europe/Amsterdam",
        [
            ("2025-10-25T22:00:00Z", True),  # 00:00 local, day 26
            ("2025-10-26T12:00:00Z", True),
            ("2025-10-26T22:59:59.999Z", False),  # 23:59:59.999 local, 25 h after midnight
            ("2025-10-26T23:00:00Z", True),  # 00:00 local, day 27
        ],
    ),
    (
        "Amsterdam 2025-03-30 is 23 hours long (CET -> CEST)",
        "Europe/Amsterdam",
        [
            ("2025-03-29T22:59:59.999Z", True),  # 23:59:59.999 local, day 29
            ("2025-03-29T23:00:00Z", True),  # 00:00 local, day 30
            ("2025-03-30T12:00:00Z", True),
            ("2025-03-30T21:59:59.999Z", False),
            ("2025-03-30T22:00:00Z", True),  # 00:00 local, day 31
        ],
    ),
]


@pytest.mark.parametrize(("name", "zone", "steps"), CAP_TABLE, ids=[row[0] for row in CAP_TABLE])
def test_daily_cap(name: str, zone: str, steps: list[tuple[str, bool]]) -> None:
    run = Run(Policy(daily_cap=2, timezone=zone))
    for instant, allowed in steps:
        decision = run.owner(at(instant))
        expected = OwnerDecision(True) if allowed else OwnerDecision(False, "daily_cap")
        assert decision == expected, (name, instant)
    assert run.records[-1]["result"] == "queued"


def test_suppressed_owner_messages_are_audited_and_do_not_count() -> None:
    run = Run(Policy(daily_cap=1))
    run.owner(BASE)
    run.owner(BASE + 1)
    assert [r["result"] for r in run.records] == ["queued", "suppressed"]
    assert run.records[1]["reason"] == "daily_cap"
    assert run.state.triage_messages_today(run.policy, BASE + 2) == 1


def test_zero_cap_suppresses_every_triage_message() -> None:
    assert Run(Policy(daily_cap=0)).owner(BASE) == OwnerDecision(False, "daily_cap")


# -- notices -----------------------------------------------------------------------------------

# (seconds after BASE, kind, expected allowed) with notice_limit = 2 per 60 s and daily_cap = 0.
NOTICE_TABLE: list[tuple[float, str, bool]] = [
    (0, "gap", True),
    (10, "gap", True),
    (20, "gap", False),  # third of its kind within 60 s
    (20, "latch", True),  # other kinds are unaffected
    (59.999, "gap", False),
    (60, "gap", True),  # the first one left the window (rate-limited ones never counted)
    (61, "gap", False),
    (70, "gap", True),
]


def test_notice_rate_limit_per_kind_never_the_daily_cap() -> None:
    run = Run(Policy(daily_cap=0, notice_limit=2, notice_window=60))
    run.owner(BASE)  # the cap is already exhausted
    for offset, kind, allowed in NOTICE_TABLE:
        decision = run.notice(BASE + offset, kind)
        expected = OwnerDecision(True) if allowed else OwnerDecision(False, "rate_limited")
        assert decision == expected, (offset, kind)


# -- records and the fold ----------------------------------------------------------------------


def test_event_record_shape() -> None:
    incident = IncidentView("disk", 4, "firing", True)
    decision = Decision(TR, "new_incident", "tri_e1", BASE + 120)
    record = event_record(decision, incident, "e1", BASE + 0.0125, topic="alerts", title=None)
    assert record == {
        "ts": "2025-11-30T02:33:20.012Z",
        "kind": "event",
        "event_id": "e1",
        "incident": "disk",
        "severity": 4,
        "status": "firing",
        "outcome": TR,
        "reason": "new_incident",
        "delivery_key": "tri_e1",
        "topic": "alerts",
    }
    suppressed = event_record(Decision(S, "cooldown"), incident, "e2", BASE)
    assert "delivery_key" not in suppressed
    with pytest.raises(ValueError, match="outcome"):
        event_record(decision, incident, "e1", BASE, outcome="joined")


def test_owner_record_shape() -> None:
    record = owner_record(
        "gap:1",
        BASE,
        message_kind="notice",
        notice="gap",
        result="suppressed",
        reason="rate_limited",
    )
    assert record == {
        "ts": "2025-11-30T02:33:20.000Z",
        "kind": "owner_message",
        "key": "gap:1",
        "message_kind": "notice",
        "notice": "gap",
        "result": "suppressed",
        "reason": "rate_limited",
    }


OPENED = {
    "ts": "2025-11-30T02:33:20.000Z",
    "kind": "event",
    "incident": "disk",
    "severity": 3,
    "status": "firing",
    "outcome": TR,
    "delivery_key": "tri_e1",
}


@pytest.mark.parametrize(
    "record",
    [
        {**OPENED, "ts": "yesterday"},
        {**OPENED, "ts": "2025-11-30T02:33:20"},  # no offset
        {**OPENED, "ts": 1764470000},
        {**OPENED, "ts": "0001-01-01T00:00:00+14:00"},
        {**OPENED, "severity": True},
        {**OPENED, "severity": "3"},
        {**OPENED, "status": "burning"},
        {**OPENED, "incident": ""},
        {**OPENED, "incident": ["disk"]},
        {k: v for k, v in OPENED.items() if k != "delivery_key"},
        {**OPENED, "kind": "delivery"},
        {**OPENED, "kind": ["event"]},
        {"kind": "owner_message", "ts": OPENED["ts"], "key": 5, "result": "queued"},
        {
            "kind": "owner_message",
            "ts": OPENED["ts"],
            "key": "k",
            "result": "queued",
            "message_kind": "sms",
        },
        {
            "kind": "owner_message",
            "ts": OPENED["ts"],
            "key": "k",
            "result": "queued",
            "message_kind": "notice",
        },
        {},
    ],
)
def test_malformed_or_irrelevant_records_are_ignored(record: dict[str, Any]) -> None:
    state = CadenceState.empty()
    state.apply(record)
    assert state.snapshot() == CadenceState.empty().snapshot()


@pytest.mark.parametrize(
    "record",
    [
        {"kind": "owner_message", "ts": OPENED["ts"], "key": "k", "result": "sent"},
        {"kind": "owner_message", "ts": OPENED["ts"], "key": "k", "result": "failed"},
        {**OPENED, "outcome": J, "delivery_key": "tri_e0"},  # its request is older than the state
        {**OPENED, "outcome": S},
    ],
)
def test_well_formed_records_that_change_nothing_only_advance_the_clock(
    record: dict[str, Any],
) -> None:
    state = CadenceState.empty()
    state.apply(record)
    assert state.snapshot() == {**CadenceState.empty().snapshot(), "clock": OPENED["ts"]}


def test_owner_messages_without_message_kind_count_as_triage() -> None:
    # What relay.py wrote before message_kind existed: counting it is the safe side of the cap.
    state = CadenceState.empty()
    state.apply(
        {"ts": OPENED["ts"], "kind": "owner_message", "key": "notify:x", "result": "queued"}
    )
    state.apply(
        {"ts": OPENED["ts"], "kind": "owner_message", "key": "notify:x", "result": "queued"}
    )
    assert state.triage_messages_today(POLICY, BASE) == 1  # one key counts once


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
record_like = st.fixed_dictionaries(
    {},
    optional={
        "kind": st.sampled_from(["event", "owner_message", "notice"]) | json_values,
        "ts": st.sampled_from([OPENED["ts"], "2099-01-01T00:00:00Z", "9999-12-31T23:59:59+00:00"])
        | json_values,
        "incident": st.sampled_from(["disk", ""]) | json_values,
        "severity": st.integers(-5, 10) | json_values,
        "status": st.sampled_from([F, R]) | json_values,
        "outcome": st.sampled_from([TR, J, S]) | json_values,
        "delivery_key": st.just("tri_e1") | json_values,
        "key": st.just("k") | json_values,
        "message_kind": st.sampled_from(["triage", "notice"]) | json_values,
        "notice": st.just("gap") | json_values,
        "result": st.sampled_from(["queued", "suppressed"]) | json_values,
    },
)


@settings(max_examples=300, deadline=None)
@given(st.lists(record_like, max_size=8))
def test_apply_never_raises_and_the_state_stays_usable(records: list[dict[str, Any]]) -> None:
    state = CadenceState.empty()
    for record in records:
        state.apply(record)
    json.dumps(state.snapshot())
    view = IncidentView("disk", 3, "firing", False)
    state.decide_event(POLICY, view, "e", BASE)
    state.decide_owner_message(POLICY, BASE)
    state.decide_notice(POLICY, "gap", BASE)
    state.prune(BASE)


@given(st.floats(min_value=0, max_value=4_000_000_000, allow_nan=False))
def test_quantize_is_exactly_what_the_audit_log_records(now: float) -> None:
    assert quantize(now) == parse_ts(rfc3339(now))
    assert quantize(quantize(now)) == quantize(now)


# -- properties over whole runs ----------------------------------------------------------------

policies = st.builds(
    Policy,
    debounce=st.sampled_from([0.0, 1.5, 120.0]),
    cooldown=st.sampled_from([0.0, 60.0, 3600.0]),
    daily_cap=st.integers(0, 3),
    timezone=st.sampled_from(["UTC", "Europe/Amsterdam", "Pacific/Chatham", "America/St_Johns"]),
    notice_limit=st.integers(0, 2),
    notice_window=st.sampled_from([1.0, 60.0, 3600.0]),
)
starts = st.sampled_from(
    [
        BASE + 0.1234567,
        at("2025-10-26T00:30:00.0004Z"),  # Amsterdam falls back at 01:00Z
        at("2025-03-29T22:59:59.9995Z"),  # a millisecond before Amsterdam's shortest day
        at("2025-12-31T23:59:59Z"),
    ]
)
gaps = st.sampled_from(
    [
        *(0.0, 0.0004, 0.0006, 0.001, 0.5, 1.0, 1.4999, 59.9996, 60.0, 119.9995, 120.0),
        *(600.0, 3599.9999, 3600.0, 7200.0, 43200.0, 86400.0, 93600.0),
    ]
)
operations = st.one_of(
    st.tuples(
        st.just("event"),
        st.sampled_from(["disk", "backup", "cert"]),
        st.integers(1, 5),
        st.sampled_from([F, R]),
    ),
    st.tuples(st.just("owner")),
    st.tuples(st.just("notice"), st.sampled_from(["gap", "latch"])),
)
scripts = st.lists(st.tuples(gaps, operations), max_size=40)


def perform(run: Run, now: float, operation: tuple[Any, ...]) -> None:
    if operation[0] == "event":
        run.event(now, operation[1], operation[2], operation[3])
    elif operation[0] == "owner":
        run.owner(now)
    else:
        run.notice(now, operation[1])


def timeline(start: float, script: list[tuple[float, tuple[Any, ...]]]) -> list[float]:
    times, now = [], start
    for gap, _ in script:
        now += gap
        times.append(now)
    return times


def rehydrate(run: Run, now: float) -> CadenceState:
    """What a restart at `now` rebuilds: only records inside the retention window, pruned."""
    recent = [
        r
        for r in run.records
        if quantize(now) < window_end(parse_ts(r["ts"]) or 0.0, run.policy.retention)
    ]
    state = replay(recent, run.policy)
    state.prune(now)
    return state


@settings(max_examples=200, deadline=None)
@given(policies, starts, scripts)
def test_replaying_the_audit_records_rebuilds_the_same_state(
    policy: Policy, start: float, script: list[tuple[float, tuple[Any, ...]]]
) -> None:
    run = Run(policy)
    for now, (_, operation) in zip(timeline(start, script), script, strict=True):
        perform(run, now, operation)
    assert replay(run.records, policy).snapshot() == run.state.snapshot()


@settings(max_examples=200, deadline=None)
@given(policies, starts, scripts, st.sets(st.integers(0, 39)))
def test_restarts_change_no_decision_and_never_exceed_the_cap(
    policy: Policy,
    start: float,
    script: list[tuple[float, tuple[Any, ...]]],
    restarts: set[int],
) -> None:
    times = timeline(start, script)
    steady, restarted = Run(policy), Run(policy)
    for index, (now, (_, operation)) in enumerate(zip(times, script, strict=True)):
        perform(steady, now, operation)
        if index in restarts:
            # A new process: nothing survives but the audit log it reads back.
            restarted.state = rehydrate(restarted, now)
            full = replay(restarted.records, policy)
            full.prune(now)
            assert restarted.state.snapshot() == full.snapshot()
        perform(restarted, now, operation)
    assert restarted.decisions == steady.decisions
    assert restarted.records == steady.records
    per_day = Counter(
        local_day(parse_ts(r["ts"]) or 0.0, policy.timezone)
        for r in restarted.records
        if r["kind"] == "owner_message"
        and r["message_kind"] == "triage"
        and r["result"] == "queued"
    )
    assert all(count <= policy.daily_cap for count in per_day.values())


@settings(max_examples=200, deadline=None)
@given(policies, starts, scripts)
def test_state_holds_only_what_its_retention_window_needs(
    policy: Policy, start: float, script: list[tuple[float, tuple[Any, ...]]]
) -> None:
    run = Run(policy)
    for now, (_, operation) in zip(timeline(start, script), script, strict=True):
        perform(run, now, operation)
        alive = [
            r
            for r in run.records
            if quantize(now) < window_end(parse_ts(r["ts"]) or 0.0, policy.retention)
        ]
        snapshot = run.state.snapshot()
        held = (
            len(snapshot["incidents"])
            + len(snapshot["triage_messages"])
            + sum(len(keys) for keys in snapshot["notices"].values())
        )
        assert run.state.size == held  # nothing expired lingers in memory
        assert held <= len(alive)


def test_a_month_of_steady_traffic_keeps_the_state_small() -> None:
    policy = Policy()
    run = Run(policy)
    for minute in range(30 * 24 * 60):
        now = BASE + 60 * minute
        run.event(now, f"incident-{minute}")  # a new incident every minute, for a month
        if minute % 30 == 0:
            run.owner(now)
            run.notice(now, "gap")
        if len(run.records) > 500:
            run.records.clear()  # the harness keeps no history; the state is what is measured
    per_minute_in_window = policy.retention / 60
    assert run.state.size <= per_minute_in_window * 1.1


# Times far enough apart to leave the retention window (26 h), in any order: clock steps back too.
_SWEEP_TIMES = [BASE + offset for offset in (0.0, 1.0, 120.0, 50_000.0, 100_000.0, 200_000.0)]
_folded_records = st.one_of(
    st.builds(
        lambda ts, incident, outcome, key, severity, status: event_record(
            Decision(outcome, "r", None if outcome == S else key),
            IncidentView(incident, severity, status, False),
            "e1",
            ts,
        ),
        st.sampled_from(_SWEEP_TIMES),
        st.sampled_from(["disk", "cpu", "net"]),
        st.sampled_from([TR, J, S]),
        st.sampled_from(["tri_a", "tri_b"]),
        st.integers(1, 5),
        st.sampled_from([F, R]),
    ),
    st.builds(
        lambda ts, key, notice: owner_record(
            key,
            ts,
            message_kind="notice" if notice else "triage",
            notice=notice,
            result="queued",
        ),
        st.sampled_from(_SWEEP_TIMES),
        st.sampled_from(["k1", "k2", "k3"]),
        st.sampled_from([None, "gap"]),
    ),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_folded_records, max_size=20))
def test_a_fold_that_skips_the_sweep_leaves_nothing_a_sweep_would_remove(
    records: list[dict[str, Any]],
) -> None:
    """`apply` sweeps only when the clock moved or an entry was added or moved: after every
    record, sweeping a copy again must find nothing to drop (else a dead entry could decide)."""
    state = CadenceState.empty()
    for record in records:
        state.apply(record)
        swept = state.fork()
        swept._sweep(everything=False)  # what `apply` used to do after every record
        assert swept.size == state.size
        assert swept.snapshot() == state.snapshot()
