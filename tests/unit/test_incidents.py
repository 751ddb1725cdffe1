from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ntfy_intake.rules import incidents
from ntfy_intake.wire.frames import Message, decode_line


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


def key_of(body: str, topic_title: str | None = None) -> str:
    return incidents.signal_of(msg("a" * 12, 1, title=topic_title, message=body)).key


def test_titleless_alerts_differing_only_in_a_percentage_are_one_incident() -> None:
    assert key_of("disk 91% full") == key_of("disk 95% full") == "alerts:disk <pct> full"
    assert key_of("nas: /dev/sda1 at 97%") == key_of("nas: /dev/sda1 at 98 %")


def test_digits_inside_words_keep_titleless_incidents_apart() -> None:
    assert key_of("nas1 down") == "alerts:nas1 down"
    assert key_of("nas2 down") == "alerts:nas2 down"
    assert key_of("/dev/sda1 failing") != key_of("/dev/sdb1 failing")
    assert key_of("host-10 down") != key_of("host-11 down")
    assert key_of("v1.2.3 released") == "alerts:v1.2.3 released"


@pytest.mark.parametrize(
    ("first", "second", "key"),
    [
        ("free 12.5 GB", "free 3 GiB", "free <size>"),
        ("free 512MB", "free 1.5TB", "free <size>"),
        ("backup took 3h12m", "backup took 45 min", "backup took <dur>"),
        ("uptime 30s", "uptime 2d", "uptime <dur>"),
        ("2025-11-30T07:53:35Z cron failed", "2025-12-01 08:00 cron failed", "<time> cron failed"),
        ("at 07:53:35 cron failed", "at 23:01 cron failed", "at <time> cron failed"),
        ("ping 10.0.0.5: 100% loss", "ping 192.168.1.20:8080: 40% loss", "ping <ip>: <pct> loss"),
        ("fe80::1 unreachable", "2001:db8::42 unreachable", "<ip> unreachable"),
        ("job 3f2a9bc1 failed", "job 0x1f failed", "job <hex> failed"),
        (
            "container 550e8400-e29b-41d4-a716-446655440000 died",
            "container 6ba7b810-9dad-11d1-80b4-00c04fd430c8 died",
            "container <hex> died",
        ),
        ("load 3.52 on web-01", "load 12 on web-01", "load <n> on web-01"),
        ("cpu=93% port 8080", "cpu=7% port 443", "cpu=<pct> port <n>"),
        ("upgrade 1,024 packages", "upgrade 5 packages", "upgrade <n> packages"),
    ],
)
def test_changing_values_are_masked_in_the_titleless_key(first: str, second: str, key: str) -> None:
    assert key_of(first) == key_of(second) == f"alerts:{key}"


def test_titleless_key_is_the_first_non_blank_line_only() -> None:
    assert key_of("  \nsmart: sda1 reallocated 197\ndetails follow 42") == (
        "alerts:smart: sda1 reallocated <n>"
    )


def test_a_title_is_used_as_it_is_without_masking() -> None:
    assert key_of("whatever 5", topic_title="Disk 91% FULL") == "alerts:disk 91% full"


def test_a_huge_one_line_body_gives_a_bounded_key() -> None:
    key = key_of("a1" * 2_500_000 + " 97%")
    assert len(key) <= len("alerts:") + incidents.KEY_LIMIT
