"""Escalation when the agent is silent: the pure rule (rules/escalation.py) and its own daily cap
in the cadence fold (rules/cadence.py, rules/owner_cap.py). Injected clock: `now` arguments.

Each test is named after the failure it kills.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from ntfy_intake import settings
from ntfy_intake.errors import ConfigError
from ntfy_intake.rules import cadence, cadence_records, escalation
from ntfy_intake.rules.timestamps import rfc3339

T0 = 1_764_470_000.0  # 2025-11-30T02:33:20Z
POLICY = escalation.Policy(after=600.0, min_severity=4)


def request(key: str = "tri_a", **changes: object) -> escalation.Pending:
    base = escalation.Pending(
        delivery_key=key,
        released_at=T0,
        incident_key="nas:disk",
        topic="alerts",
        title="Disk full on nas",
        severity=5,
        first_seen=T0 - 300,
        last_seen=T0 - 10,
        events=3,
        delivered=False,
        escalated=False,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "changes", "now", "due"),
    [
        ("not yet", {}, T0 + 599.999, False),
        ("exactly at escalate_after", {}, T0 + 600, True),
        ("long past", {}, T0 + 5000, True),
        ("the agent answered", {"delivered": True}, T0 + 5000, False),
        ("already escalated", {"escalated": True}, T0 + 5000, False),
        ("below the minimum severity", {"severity": 3}, T0 + 5000, False),
        ("at the minimum severity", {"severity": 4}, T0 + 600, True),
    ],
)
def test_escalation_due_exactly_when_the_contract_says(
    name: str, changes: dict[str, object], now: float, due: bool
) -> None:
    plan = escalation.plan(POLICY, [request(**changes)], now)
    assert (len(plan.due) == 1) is due, name


def test_escalation_off_at_zero_never_escalates() -> None:
    plan = escalation.plan(escalation.Policy(after=0.0), [request()], T0 + 10**6)
    assert plan == escalation.Plan((), None)


def test_next_due_is_the_earliest_waiting_request_not_a_polling_tick() -> None:
    waiting = [
        request("tri_late", released_at=T0 + 100),
        request("tri_soon", released_at=T0 + 20),
        request("tri_low", released_at=T0, severity=2),  # never: no wake-up for it
        request("tri_done", released_at=T0 + 1, delivered=True),
    ]
    plan = escalation.plan(POLICY, waiting, T0 + 30)
    assert plan.due == ()
    assert plan.next_due == T0 + 620
    # Nothing eligible: no due instant at all (the caller waits for a release, not a tick).
    assert escalation.plan(POLICY, waiting[2:], T0).next_due is None


def test_due_requests_come_oldest_release_first_and_leave_the_rest_waiting() -> None:
    plan = escalation.plan(
        POLICY,
        [
            request("tri_b", released_at=T0 + 5),
            request("tri_a"),
            request("tri_c", released_at=T0 + 900),
        ],
        T0 + 700,
    )
    assert [r.delivery_key for r in plan.due] == ["tri_a", "tri_b"]
    assert plan.next_due == T0 + 1500


def test_escalation_key_is_one_per_request() -> None:
    assert escalation.key_for("tri_a") == "escalate:tri_a"


def test_message_names_topic_title_severity_times_and_count() -> None:
    text = escalation.message(request(), T0 + 720)
    assert text == (
        "[alerts] Disk full on nas (severity 5) - triage agent silent for 12m."
        " First seen 2025-11-30 02:28 UTC, last 2025-11-30 02:33 UTC, 3 events."
    )


def test_message_strips_terminal_controls_and_bidi_from_the_title() -> None:
    text = escalation.message(
        request(title="\x1b]0;pwned\x07Disk\u202e full\r\nFAKE: all clear", topic="al\x1b[31merts"),
        T0 + 600,
    )
    assert "\x1b" not in text and "\u202e" not in text and "\n" not in text and "\r" not in text
    assert text.startswith("[alerts] Disk full FAKE: all clear (severity 5)")


def test_message_never_exceeds_300_characters_whatever_the_title() -> None:
    text = escalation.message(request(title="x" * 5000, topic="t" * 500), T0 + 600)
    assert len(text) <= escalation.MESSAGE_LIMIT
    assert "(severity 5)" in text  # the title is cut, not the facts after it


def test_message_without_a_title_names_the_incident() -> None:
    assert escalation.message(request(title=""), T0).startswith("[alerts] nas:disk (severity 5)")


# -- the escalation cap, folded from the audit log -------------------------------------------------


def fold(records: list[dict[str, object]], policy: cadence.Policy) -> cadence.CadenceState:
    state = cadence.CadenceState.empty(policy)
    for record in records:
        state.apply(record)
    return state


def escalation_record(key: str, at: float) -> dict[str, object]:
    return cadence_records.owner_record(key, at, message_kind="escalation", result="queued")


def triage_record(key: str, at: float) -> dict[str, object]:
    return cadence_records.owner_record(key, at, message_kind="triage", result="queued")


def test_escalation_daily_cap_holds_after_a_replay_of_the_audit_log() -> None:
    policy = cadence.Policy(daily_cap=10, escalate_daily_cap=2)
    state = fold([escalation_record(f"escalate:tri_{i}", T0 + i) for i in range(2)], policy)
    decision = state.decide_escalation(policy, T0 + 10)
    assert (decision.allowed, decision.reason) == (False, "escalate_daily_cap")
    # The next local day starts a fresh count.
    assert state.decide_escalation(policy, T0 + 86_400).allowed


def test_escalations_do_not_eat_the_triage_cap_nor_triage_replies_the_escalation_cap() -> None:
    policy = cadence.Policy(daily_cap=2, escalate_daily_cap=2)
    escalations = fold([escalation_record(f"escalate:tri_{i}", T0 + i) for i in range(2)], policy)
    assert escalations.decide_owner_message(policy, T0 + 10).allowed
    triage = fold([triage_record(f"notify:tri_{i}", T0 + i) for i in range(2)], policy)
    assert not triage.decide_owner_message(policy, T0 + 10).allowed
    assert triage.decide_escalation(policy, T0 + 10).allowed


def test_silence_holds_an_escalation_as_it_holds_a_triage_reply() -> None:
    policy = cadence.Policy()
    silence = {
        "ts": rfc3339(T0),
        "kind": "silence",
        "silence_id": "sil_1",
        "scope": "incident",
        "target": "nas:disk",
        "until": rfc3339(T0 + 3600),
        "reason": "test",
    }
    state = fold([silence], policy)
    assert not state.decide_owner_message(policy, T0 + 60, incident="nas:disk").allowed
    decision = state.decide_escalation(policy, T0 + 60, incident="nas:disk")
    assert (decision.allowed, decision.reason) == (False, "silenced")


def test_acknowledged_incident_gets_no_escalation() -> None:
    policy = cadence.Policy()
    decision = cadence.CadenceState.empty(policy).decide_escalation(
        policy, T0, incident="nas:disk", acknowledged=True
    )
    assert (decision.allowed, decision.reason) == (False, "acknowledged")


# -- the settings ----------------------------------------------------------------------------------

BASE_ENV = {"NTFY_INTAKE_NTFY_URL": "http://127.0.0.1:2586", "NTFY_INTAKE_NTFY_TOPICS": "alerts"}


def load_with(**overrides: str) -> settings.Settings:
    env = BASE_ENV | {f"NTFY_INTAKE_RELAY_{k.upper()}": v for k, v in overrides.items()}
    return settings.load(None, env)


def test_escalation_settings_default_to_the_contract() -> None:
    relay = load_with().relay
    assert (relay.escalate_after, relay.escalate_min_severity, relay.escalate_daily_cap) == (
        600.0,
        4,
        5,
    )
    assert load_with(escalate_after="0s").relay.escalate_after == 0.0


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("escalate_min_severity", "0", "from 1 to 5"),
        ("escalate_min_severity", "6", "from 1 to 5"),
        ("escalate_daily_cap", "-1", "at least 0"),
        ("escalate_after", "-5s", ""),
    ],
)
def test_escalation_settings_out_of_range_stop_start_up_naming_the_key(
    key: str, value: str, why: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_with(**{key: value})
    assert str(info.value).startswith(f"config error: relay.{key}")
    assert why in str(info.value)


@pytest.mark.parametrize(
    ("records", "wakes"),
    [
        ([{"kind": "event", "delivery_key": "tri_new", "severity": 5}], True),
        ([{"kind": "event", "delivery_key": "tri_known", "severity": 5}], False),
        ([{"kind": "event", "delivery_key": "tri_new", "severity": 3}], False),
        ([{"kind": "event", "outcome": "duplicate", "severity": 5}], False),
        ([{"kind": "event", "delivery_key": "tri_new", "severity": "5"}], False),
        (
            [
                {"kind": "event", "delivery_key": "tri_known", "severity": 5},
                {"kind": "event", "delivery_key": "tri_rose", "severity": 4},
            ],
            True,
        ),
        ([], False),
    ],
)
def test_an_event_joining_a_known_request_does_not_wake_the_escalator(
    records: list[dict[str, object]], wakes: bool
) -> None:
    """Failure mode: every committed batch woke the escalator for a candidates query on the
    database thread the writer shares, a read per live event on the hot path."""
    assert escalation.brings_news(records, frozenset({"tri_known"}), min_severity=4) is wakes
