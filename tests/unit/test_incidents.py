from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from ntfy_intake import incidents
from ntfy_intake.frames import Message, decode_line


def msg(
    event_id: str,
    time: int,
    *,
    title: str | None = "Disk  FULL",
    message: str = "x",
    priority: int | None = None,
) -> Message:
    obj: dict[str, object] = {
        "id": event_id,
        "time": time,
        "expires": time + 100,
        "event": "message",
        "topic": "alerts",
        "message": message,
    }
    if title is not None:
        obj["title"] = title
    if priority is not None:
        obj["priority"] = priority
    frame = decode_line(json.dumps(obj).encode(), frozenset({"alerts"}))
    assert isinstance(frame, Message)
    return frame


def test_key_is_topic_and_normalised_title() -> None:
    assert incidents.signal_of(msg("a" * 12, 1, title="  Disk \n FULL ")).key == "alerts:disk full"


def test_key_falls_back_to_message_text() -> None:
    assert (
        incidents.signal_of(msg("a" * 12, 1, title=None, message="Backup   stale")).key
        == "alerts:backup stale"
    )


def test_envelope_sets_key_severity_status() -> None:
    body = json.dumps({"incident": "nas/disk", "severity": 5, "status": "resolved"})
    signal = incidents.signal_of(msg("a" * 12, 1, message=body, priority=2))
    assert (signal.key, signal.severity, signal.status, signal.envelope) == (
        "nas/disk",
        5,
        "resolved",
        True,
    )


def test_forged_envelope_fields_are_ignored_not_trusted() -> None:
    body = json.dumps({"incident": "nas/disk", "severity": True, "status": "pwned"})
    signal = incidents.signal_of(msg("a" * 12, 1, message=body, priority=2))
    assert (signal.severity, signal.status) == (2, "firing")


def test_severity_defaults_to_priority_three() -> None:
    assert incidents.signal_of(msg("a" * 12, 1)).severity == 3


events = st.lists(
    st.tuples(st.integers(1, 50), st.integers(1, 5), st.sampled_from(["firing", "resolved"])),
    min_size=1,
    max_size=8,
)


@given(events, st.randoms())
def test_merge_is_order_independent(spec: list[tuple[int, int, str]], rnd) -> None:  # type: ignore[no-untyped-def]
    messages = []
    for n, (time, prio, status) in enumerate(spec):
        body = json.dumps({"incident": "k", "severity": prio, "status": status})
        messages.append(msg(f"{n:012d}", time, message=body))

    def fold(order: list[Message]) -> tuple[object, ...]:
        state = None
        for m in order:
            state = incidents.merge(state, incidents.signal_of(m), m)
        assert state is not None
        return (
            state.severity,
            state.status,
            state.status_at,
            state.first_seen,
            state.last_seen,
            state.events,
        )

    shuffled = list(messages)
    rnd.shuffle(shuffled)
    assert fold(messages) == fold(shuffled)
