"""rules/topic_access.py: which refusals are probed topic by topic, which topics leave the
stream, and when a refused topic is tried again (an injected clock and rng, no sleeping)."""

from __future__ import annotations

import pytest

from ntfy_intake.rules import notices, topic_access
from ntfy_intake.rules.topic_access import Probe, TopicAccess

ALLOWED, REFUSED, STOP, UNKNOWN = Probe.ALLOWED, Probe.REFUSED, Probe.STOP, Probe.UNKNOWN


@pytest.mark.parametrize(
    ("status", "code", "probed"),
    [
        (403, 40301, True),  # ntfy with auth-file: one topic not readable refuses the whole path
        # ntfy authenticates before it looks at topics: a 401 is never about one topic, and a
        # probe per topic would spend its authentication budget (30, then one a minute)
        (401, 40101, False),
        (400, 40009, True),  # a topic ntfy will not serve
        (400, 40008, False),  # the cursor, not a topic
        (400, None, False),
        (429, 42901, False),
        (500, 50001, False),
        (502, None, False),
    ],
)
def test_which_refusals_are_probed_topic_by_topic(
    status: int, code: int | None, probed: bool
) -> None:
    assert topic_access.per_topic(status, code) is probed


@pytest.mark.parametrize(
    ("status", "code", "probe"),
    [
        (200, None, ALLOWED),
        (403, 40301, REFUSED),
        (400, 40009, REFUSED),
        (401, 40101, STOP),
        (429, 42901, UNKNOWN),
        (500, 50001, UNKNOWN),
        (400, 40008, UNKNOWN),
        (None, None, UNKNOWN),
    ],
)
def test_a_probe_answer_is_classified(status: int | None, code: int | None, probe: Probe) -> None:
    assert topic_access.classify(status, code) is probe


def access(*topics: str) -> TopicAccess:
    return TopicAccess(topics or ("alerts", "backups", "nas"), rng=lambda: 1.0, base=10.0, cap=80.0)


@pytest.mark.parametrize(
    ("probes", "dropped"),
    [
        ([("alerts", ALLOWED), ("backups", REFUSED), ("nas", ALLOWED)], ["backups"]),
        ([("alerts", REFUSED), ("backups", REFUSED), ("nas", ALLOWED)], ["alerts", "backups"]),
        # every topic refused: nothing to split, the whole subscribe is refused as before
        ([("alerts", REFUSED), ("backups", REFUSED), ("nas", REFUSED)], []),
        # a credential refusal is the same for every topic: never split on it
        ([("alerts", ALLOWED), ("backups", REFUSED), ("nas", STOP)], []),
        # a probe that failed otherwise says nothing: the topic stays
        ([("alerts", UNKNOWN), ("backups", REFUSED), ("nas", UNKNOWN)], ["backups"]),
        ([("alerts", ALLOWED), ("backups", ALLOWED), ("nas", ALLOWED)], []),
    ],
)
def test_only_the_topics_whose_own_probe_was_refused_leave_the_stream(
    probes: list[tuple[str, Probe]], dropped: list[str]
) -> None:
    assert access().split(probes) == dropped


def test_a_refused_topic_is_retried_on_its_own_backoff_and_streams_again_when_readmitted() -> None:
    rules = access()
    rules.refuse("backups", 403, 40301, "forbidden", since=1_700_000_000, episode="e1", now=100.0)
    assert rules.streamed() == ("alerts", "nas")
    # rng 1.0: the full step, base 10 doubling to the cap 80
    assert rules.next_due() == 110.0
    assert rules.due(109.9) == [] and rules.due(110.0) == ["backups"]
    waits = []
    now = 110.0
    for _ in range(5):
        rules.still_refused("backups", now)
        due = rules.next_due()
        assert due is not None
        waits.append(due - now)
        now = due
    assert waits == [20.0, 40.0, 80.0, 80.0, 80.0]
    refusal = rules.readmit("backups")
    assert refusal.since == 1_700_000_000 and refusal.episode == "e1"
    assert rules.streamed() == ("alerts", "backups", "nas")
    assert rules.next_due() is None


def test_a_probe_round_that_split_nothing_is_not_repeated_on_every_reconnect() -> None:
    rules = access()
    assert rules.probe_due(0.0)
    rules.probed_nothing(0.0)
    assert not rules.probe_due(9.9) and rules.probe_due(10.0)
    rules.probed_nothing(10.0)
    assert not rules.probe_due(29.9) and rules.probe_due(30.0)
    rules.connected()  # a stream opened: the next refusal is probed at once
    assert rules.probe_due(30.0)


def test_topics_keep_their_configured_order_whatever_order_they_were_refused_in() -> None:
    rules = access()
    rules.refuse("nas", 403, None, "forbidden", since=1, episode="a", now=0.0)
    rules.refuse("alerts", 403, None, "forbidden", since=1, episode="b", now=0.0)
    assert rules.streamed() == ("backups",)
    rules.readmit("nas")
    assert rules.streamed() == ("backups", "nas")


def test_topic_refused_notice_names_the_topic_and_is_keyed_per_episode() -> None:
    first = notices.topic_refused("backups", 403, 40301, "forbidden", "alerts", "1764470000")
    again = notices.topic_refused("backups", 403, 40301, "forbidden", "alerts", "1764470000")
    later = notices.topic_refused("backups", 403, 40301, "forbidden", "alerts", "1764480000")
    assert first.key == again.key == "topic_refused:backups:1764470000"
    assert later.key != first.key
    assert "'backups'" in first.text and "40301: forbidden" in first.text
    assert first.fields["topic"] == "backups"


@pytest.mark.parametrize(
    ("server_time", "day"),
    [(1_764_460_799, "2025-11-29"), (1_764_460_800, "2025-11-30"), (0, "1970-01-01")],
)
def test_unreplayable_notice_is_keyed_by_topic_and_utc_day(server_time: int, day: str) -> None:
    assert notices.utc_day(server_time) == day
    notice = notices.unreplayable("gatus", day)
    assert notice.key == f"unreplayable:gatus:{day}"
    assert "Cache: no" in notice.text and "'gatus'" in notice.text
