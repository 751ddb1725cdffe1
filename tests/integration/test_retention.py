"""Retention prunes history, never what intake, the relay or an agent still needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from ntfy_intake.store import db, feed, inbox, retention

from ..conftest import make_message, owner_queue
from ..harness import store_of

pytestmark = pytest.mark.engines

DAY = 86400.0
NOW = 1_764_470_000.0


def record(
    conn: db.Connection, event_id: str, at: float, debounce: float = 0.0, title: str = "x"
) -> None:
    queue = owner_queue(debounce=debounce)
    inbox.record_batch(
        conn,
        [make_message(event_id, title=title, time=int(at))],  # ntfy's time: when it was recorded
        at,
        queue=queue,
        relay_enabled=True,
    )


def ids(conn: db.Connection) -> set[str]:
    return {row[0] for row in conn.execute("SELECT event_id FROM inbox")}


def test_inbox_keeps_ids_for_twice_the_cache_duration_and_at_least_a_week(
    store: db.Connection,
) -> None:
    record(store, "old000000001", NOW - 8 * DAY, title="old")
    record(store, "recent000001", NOW - 6 * DAY, title="recent")
    retention.prune(store, NOW, cache_duration=12 * 3600)
    assert ids(store) == {"recent000001"}
    assert retention.inbox_retention(5 * DAY) == 10 * DAY


def test_events_of_a_request_still_collecting_are_never_pruned(store: db.Connection) -> None:
    record(store, "collecting01", NOW - 9 * DAY, debounce=100 * DAY, title="slow")
    retention.prune(store, NOW, cache_duration=12 * 3600)
    assert ids(store) == {"collecting01"}


def test_dead_rows_stay_for_redrive_and_settled_history_goes(store: db.Connection) -> None:
    record(store, "delivered001", NOW - 40 * DAY, title="a")
    record(store, "dead00000001", NOW - 40 * DAY, title="b")
    store.execute(
        "UPDATE outbox SET state = 'delivered', settled_at = ? WHERE delivery_key = 'tri_delivered001'",
        (NOW - 40 * DAY,),
    )
    store.execute(
        "UPDATE outbox SET state = 'dead', settled_at = ? WHERE delivery_key = 'tri_dead00000001'",
        (NOW - 40 * DAY,),
    )
    pruned = retention.prune(store, NOW, cache_duration=12 * 3600)
    assert pruned.outbox == 1
    assert [r[0] for r in store.execute("SELECT delivery_key FROM outbox")] == ["tri_dead00000001"]


def test_feed_keeps_its_newest_entry_so_the_head_never_goes_back(
    store: db.Connection, tmp_path: Path
) -> None:
    path = store_of(tmp_path)
    with feed.FeedStore.open(path) as posts:
        for n in range(3):
            posts.post("triage", {"n": n}, sender="test", summary=f"n{n}", now=NOW - 40 * DAY)
        head = posts.head("triage")
    retention.prune(store, NOW, cache_duration=12 * 3600)
    with feed.FeedStore.open(path) as after:
        assert after.head("triage") == head == 3
        assert after.post("triage", {"n": 3}, sender="test", summary="n3").seq == 4


def test_forward_clock_jump_never_prunes_ids_the_server_still_holds(
    store: db.Connection,
) -> None:
    """Issue 12, finding 6: the local clock jumped 8 days ahead; ntfy still holds the ids (its
    newest frame time says so), so a full replay would record them a second time."""
    record(store, "held00000001", NOW, title="held")  # ntfy time NOW, expires NOW + 12 h
    jumped = NOW + 8 * DAY
    assert retention.prune(store, jumped, cache_duration=12 * 3600).inbox == 0
    assert ids(store) == {"held00000001"}
