"""Silences are a fold over audit records: made, ended, expired, rebuilt, and matched."""

from __future__ import annotations

import pytest

from ntfy_intake.rules import cadence, silences, timestamps

T0 = 1_780_000_000.0
POLICY = cadence.Policy(daily_cap=100)


def silence_record(
    now: float, span: float, *, scope: str = "topic", target: str = "nas", sid: str = "sil_a"
) -> dict[str, object]:
    return {
        "ts": timestamps.rfc3339(now),
        "kind": "silence",
        **silences.silence_fields(sid, scope, target, now + span, "maintenance"),  # type: ignore[arg-type]
    }


def test_silenced_topic_suppresses_a_triage_owner_message_with_reason_silenced() -> None:
    state = cadence.CadenceState.empty(POLICY)
    state.apply(silence_record(T0, 3600))
    decision = state.decide_owner_message(POLICY, T0 + 10, incident="x", topics=("nas",))
    assert (decision.allowed, decision.reason) == (False, "silenced")
    other = state.decide_owner_message(POLICY, T0 + 10, incident="x", topics=("web",))
    assert other.allowed


def test_silence_expiring_by_itself_lets_messages_through_again() -> None:
    state = cadence.CadenceState.empty(POLICY)
    state.apply(silence_record(T0, 120, scope="incident", target="nas:down"))
    assert not state.decide_owner_message(POLICY, T0 + 119, incident="nas:down").allowed
    assert state.decide_owner_message(POLICY, T0 + 120, incident="nas:down").allowed


def test_ended_silence_no_longer_holds_after_a_replay_of_the_same_records() -> None:
    records = [
        silence_record(T0, 3600),
        {"ts": timestamps.rfc3339(T0 + 60), "kind": "silence_end", "silence_id": "sil_a"},
    ]
    state = cadence.CadenceState.empty(POLICY)
    for record in records:
        state.apply(record)
    assert state.silences.active(T0 + 61) == []
    assert len(state.silences.active(T0 + 30)) == 1


def test_silence_survives_a_fork_and_rehydrate_from_the_same_records() -> None:
    state = cadence.CadenceState.empty(POLICY)
    state.apply(silence_record(T0, 3600))
    again = cadence.CadenceState.empty(POLICY)
    again.apply(silence_record(T0, 3600))
    again.prune(T0 + 100)
    assert [s.silence_id for s in state.fork().silences.active(T0 + 100)] == ["sil_a"]
    assert [s.silence_id for s in again.silences.active(T0 + 100)] == ["sil_a"]


@pytest.mark.parametrize(
    "record",
    [
        {"kind": "silence", "silence_id": "bad id", "scope": "topic", "target": "x"},
        {"kind": "silence", "silence_id": "sil_b", "scope": "host", "target": "x"},
        {"kind": "silence", "silence_id": "sil_b", "scope": "topic", "target": 3},
        {"kind": "silence", "silence_id": "sil_b", "scope": "topic", "target": "x", "until": 5},
        {"kind": "silence_end", "silence_id": None},
    ],
)
def test_malformed_silence_record_is_ignored_never_raises(record: dict[str, object]) -> None:
    state = cadence.CadenceState.empty(POLICY)
    state.apply({"ts": timestamps.rfc3339(T0), **record})
    assert len(state.silences) == 0


def test_silence_longer_than_the_cadence_retention_is_refused() -> None:
    with pytest.raises(silences.SilenceError):
        silences.parse_span("25h")
    with pytest.raises(silences.SilenceError):
        silences.parse_span("soon")
    assert silences.parse_span("2h") == 7200.0
    assert POLICY.retention >= silences.MAX_SPAN


def test_forged_until_far_in_the_future_is_capped_to_the_longest_span() -> None:
    state = cadence.CadenceState.empty(POLICY)
    state.apply(silence_record(T0, 10 * 86400))
    (held,) = state.silences.active(T0)
    assert held.until == T0 + silences.MAX_SPAN
