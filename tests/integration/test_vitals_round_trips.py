"""The health snapshot every 2 s in few round trips (issue 23, fourth round): on PostgreSQL its
queue counts were one statement each, seven waits on the one database thread, which a live
event arriving meanwhile queued behind. The counts are the same on both engines."""

from __future__ import annotations

import pytest

from ntfy_intake.store import db, outbox, vitals_state

from .test_write_pipeline import answers_waited

pytestmark = pytest.mark.engines


def test_the_snapshots_queue_counts_are_two_round_trips_not_one_per_count(
    store: db.Connection,
) -> None:
    with db.write_txn(store):
        for n, state in enumerate(["collecting", "pending", "leased", "dead", "dead"]):
            key = f"triage_{n}"
            outbox.create(store, key, f"alerts:{key}", "new_incident", 0.0, float(n))
            store.execute("UPDATE outbox SET state = ? WHERE delivery_key = ?", (state, key))
    with answers_waited(store) as waited:
        counts = vitals_state.queue_counts(store)
    assert {k: v for k, v in counts.items() if k.startswith("relay_")} == {
        "relay_collecting": 1,
        "relay_pending": 2,
        "relay_dead": 2,
    }
    assert (counts["owner_pending"], counts["owner_suppressed_total"]) == (0, 0)
    assert counts["feed_head"] == {}
    if db.is_postgres(store):
        assert waited[0] == 2  # before: 6
