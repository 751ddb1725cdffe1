"""Expectations (rules/expectations.py), with an injected clock: a window missed once gives one
notice, a second look changes nothing, the next arrival gives one `back` notice; several
missed windows are ONE episode (one notice, keyed by the window start: the last arrival), and a
restart folding the same audit records owes nothing new."""

from __future__ import annotations

from typing import Any

import pytest

from ntfy_intake.rules import expectations as ex
from ntfy_intake.rules.expectations import Expectation, State

T0 = 1_780_000_000  # 2026-05-28T20:26:40Z, whole seconds as ntfy's times are
BACKUP = Expectation("nightly-backup", "backups", every=86400.0, grace=3600.0)
KUMA = Expectation("kuma", "alerts", every=60.0, grace=0.0, title=ex.normalize_title("web  UP"))


def arrival(topic: str, at: float, incident: str | None = None) -> dict[str, Any]:
    return {
        "ts": ex.instant(at + 1).replace("Z", ".000Z"),
        "kind": "event",
        "event_id": f"e{at}",
        "incident": incident or f"{topic}:backup done",
        "severity": 3,
        "status": "firing",
        "outcome": "triage_requested",
        "reason": "new_incident",
        "topic": topic,
        "time": int(at),
    }


def notice_record(item: ex.Due) -> dict[str, Any]:
    """The `notice` audit record the owner queue writes for `item`'s notice."""
    record = {
        "kind": "notice",
        "notice": ex.NOTICE_MISSED if item.kind == "missed" else ex.NOTICE_BACK,
        "key": item.key,
        "expectation": item.expectation.name,
        "window_start": ex.instant(item.window_start),
    }
    if item.arrived is not None:
        record["arrived"] = ex.instant(item.arrived)
    return record


def tell(state: State, now: float, log: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """What a watch does at `now`: record each owed notice (its audit record) and fold it."""
    said = []
    for item in ex.due(state, now):
        log.append(notice_record(item))
        ex.told(state, item)
        said.append((item.key, item.kind))
    return said


def test_a_window_missed_once_gives_one_notice_then_one_back() -> None:
    state = State.empty([BACKUP], started=T0 - 10)
    log: list[dict[str, Any]] = [arrival("backups", T0)]
    ex.fold(state, log[0])
    deadline = T0 + 86400 + 3600
    assert ex.next_check(state) == deadline
    assert tell(state, deadline - 1, log) == []
    key = "expect:nightly-backup:2026-05-28T20:26:40Z"
    assert tell(state, deadline, log) == [(key, "missed")]
    # Further windows pass: the same episode, nothing more (and no timer: an arrival wakes it).
    assert tell(state, deadline + 5 * 86400, log) == []
    assert ex.next_check(state) is None
    back = arrival("backups", deadline + 6 * 86400)
    log.append(back)
    ex.fold(state, back)
    assert tell(state, deadline + 6 * 86400, log) == [(f"{key}:back", "back")]
    assert tell(state, deadline + 6 * 86400 + 1, log) == []
    # The next episode is counted from the arrival that ended this one.
    assert ex.next_check(state) == deadline + 6 * 86400 + 86400 + 3600


def test_a_restart_folding_the_same_records_owes_nothing_new() -> None:
    """A kill -9 after the missed notice was recorded: the fold of the audit log says told."""
    log: list[dict[str, Any]] = [arrival("backups", T0)]
    first = State.empty([BACKUP], started=T0)
    ex.fold(first, log[0])
    missed_at = T0 + 86400 + 3600
    assert len(tell(first, missed_at, log)) == 1
    again = State.empty([BACKUP], started=missed_at + 100)  # a later start, another anchor
    for record in log:
        ex.fold(again, record)
    assert tell(again, missed_at + 200, log) == []
    # The arrival, then a kill -9 before the back notice was recorded: owed once after the
    # restart, under the key the first process would have used.
    back = arrival("backups", missed_at + 300)
    log.append(back)
    restarted = State.empty([BACKUP], started=missed_at + 400)
    for record in log:
        ex.fold(restarted, record)
    owed = tell(restarted, missed_at + 400, log)
    assert owed == [("expect:nightly-backup:2026-05-28T20:26:40Z:back", "back")]
    # ...and folding every record again (the live feed overlapping the start-up read) owes
    # nothing: a `missed` read after its `back` does not reopen the episode.
    for record in log:
        ex.fold(restarted, record)
    assert ex.due(restarted, missed_at + 500) == []


def test_never_heard_from_counts_from_the_start_and_stays_one_episode_across_starts() -> None:
    log: list[dict[str, Any]] = []
    state = State.empty([KUMA], started=T0 + 0.7)
    assert ex.next_check(state) == T0 + 60
    (item,) = ex.due(state, T0 + 60)
    assert item.heard is False and item.key == f"expect:kuma:{ex.instant(T0)}"
    tell(state, T0 + 60, log)
    later = State.empty([KUMA], started=T0 + 500)
    for record in log:
        ex.fold(later, record)
    assert ex.due(later, T0 + 10_000) == []


@pytest.mark.parametrize(
    ("record", "counts"),
    [
        (arrival("alerts", T0 + 5, "alerts:web up [uptime-kuma]"), True),
        (arrival("alerts", T0 + 5, "alerts:WEB   Up"), True),
        (arrival("alerts", T0 + 5, "alerts:web down [uptime-kuma]"), False),  # the title
        (arrival("backups", T0 + 5, "backups:web up"), False),  # another topic
        ({**arrival("alerts", T0 + 5, "alerts:web up"), "event": "message_delete"}, False),
        ({**arrival("alerts", T0 + 5, "alerts:web up"), "kind": "owner_message"}, False),
        ({**arrival("alerts", T0 - 5, "alerts:web up")}, False),  # older than the last
    ],
)
def test_what_counts_as_an_arrival(record: dict[str, Any], counts: bool) -> None:
    state = State.empty([KUMA], started=T0 - 100)
    ex.fold(state, arrival("alerts", T0, "alerts:web up"))
    ex.fold(state, record)
    assert (ex.next_check(state) == T0 + 5 + 60) is counts


def test_publication_time_not_recording_time_fills_a_window() -> None:
    """A message published in time but replayed after downtime is not missed."""
    state = State.empty([KUMA], started=T0)
    late = arrival("alerts", T0 + 50, "alerts:web up")
    late["ts"] = ex.instant(T0 + 3000).replace("Z", ".000Z")
    ex.fold(state, late)
    assert ex.next_check(state) == T0 + 110
    without_time = {k: v for k, v in late.items() if k != "time"}
    other = State.empty([KUMA], started=T0)
    ex.fold(other, without_time)
    assert ex.next_check(other) == T0 + 3000 + 60


def test_rows_say_waiting_or_missed() -> None:
    state = State.empty([BACKUP, KUMA], started=T0)
    ex.fold(state, arrival("backups", T0))
    rows = {row.name: row for row in ex.rows(state, T0 + 61)}
    assert rows["nightly-backup"].state == "waiting"
    assert rows["nightly-backup"].due_at == T0 + 90000
    assert rows["kuma"].state == "missed" and rows["kuma"].missed_since == T0
