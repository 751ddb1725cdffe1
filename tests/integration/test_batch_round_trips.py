"""The inbox transaction asked in as few waits as its reads allow (issue 23, second round), with
the same outcome on both engines: its reads asked together where one does not need another's
answer, the delete/clears a batch's messages name linked in one statement with no probe, the
payloads of requests released together read ahead, the next release time answered with COMMIT."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ntfy_intake.flow.pipeline import append_info_entry, append_triage_entry
from ntfy_intake.rules import batch_plan
from ntfy_intake.store import db, inbox, inbox_batch, outbox
from ntfy_intake.wire.frames import DeviceAction, decode_line

from ..conftest import TOPICS, make_message, owner_queue
from .test_write_pipeline import answers_waited

pytestmark = pytest.mark.engines

NOW = 1_764_470_100.0

# A live event's batch on PostgreSQL: the known ids and sequences (with the transaction's
# opening), the incidents they name, the due requests with what their payloads are built from,
# and COMMIT; the feed's entry is one INSERT whose answer comes with COMMIT (store/feed.py).
# Before: 21, then 7, then 5 (the release's keys and their payloads were two waits), then 4
# (the incidents were asked once the known ids and sequences were read).
LIVE_BATCH_WAITS = 3


def _delete(event_id: str, sequence: str, time: int) -> DeviceAction:
    line = {"id": event_id, "time": time, "event": "message_delete", "topic": "alerts"}
    frame = decode_line(json.dumps({**line, "sequence_id": sequence}).encode(), TOPICS)
    assert isinstance(frame, DeviceAction), frame
    return frame


def test_a_live_events_batch_waits_for_its_reads_and_commit_only(store: db.Connection) -> None:
    queue = owner_queue()
    with answers_waited(store) as waited:
        result = inbox.record_batch(
            store,
            [make_message("aaaaaaaaaaa1")],
            NOW,
            queue=queue,
            relay_enabled=True,
            feed_append=append_triage_entry,
        )
    assert (result.recorded, len(result.released)) == (1, 1)
    assert (result.release_known, result.next_release) == (True, None)  # nothing collecting
    if db.is_postgres(store):
        assert waited[0] <= LIVE_BATCH_WAITS
    (payload,) = store.execute("SELECT payload FROM outbox").fetchone()
    assert [e["id"] for e in json.loads(payload)["events"]] == ["aaaaaaaaaaa1"]


def test_an_update_under_a_new_title_joins_its_sequences_incident_read_after(
    store: db.Connection,
) -> None:
    """The incidents are asked before the sequences are read: an update whose title changed
    names, through its sequence, an incident its own signal does not. That one is read in one
    wait more, and the update joins it, as before."""
    queue = owner_queue()
    inbox.record_batch(store, [make_message("seqhead00001")], NOW, queue=queue, relay_enabled=True)
    line = {"id": "seqnext00001", "time": 1_764_470_001, "event": "message", "topic": "alerts"}
    line |= {"title": "Disk fine", "message": "ok", "sequence_id": "seqhead00001"}
    renamed = decode_line(json.dumps(line).encode(), TOPICS)
    with answers_waited(store) as waited:
        inbox.record_batch(store, [renamed], NOW + 1, queue=queue, relay_enabled=True)
    keys = store.execute("SELECT event_id, incident_key FROM inbox ORDER BY seq").fetchall()
    assert [tuple(row) for row in keys] == [
        ("seqhead00001", "alerts:disk full"),
        ("seqnext00001", "alerts:disk full"),
    ]
    if db.is_postgres(store):
        assert waited[0] == LIVE_BATCH_WAITS + 1


def test_a_live_event_joining_an_open_window_waits_no_more_than_a_new_one(
    store: db.Connection,
) -> None:
    """A burst's later events join the request an earlier batch opened: whether that request
    still collects was read on its own once the join was decided, one wait more per batch of
    a burst. It is read with the first reads now (the open debounce windows)."""
    queue = owner_queue(debounce=60.0)
    inbox.record_batch(store, [make_message("burst0000001")], NOW, queue=queue, relay_enabled=True)
    with answers_waited(store) as waited:
        result = inbox.record_batch(
            store, [make_message("burst0000002")], NOW + 1, queue=queue, relay_enabled=True
        )
    (outcome,) = store.execute(
        "SELECT outcome FROM inbox WHERE event_id = 'burst0000002'"
    ).fetchone()
    assert (outcome, result.recorded) == ("joined", 1)
    if db.is_postgres(store):
        assert waited[0] <= LIVE_BATCH_WAITS


def test_writing_a_batchs_plan_waits_for_no_answer(store: db.Connection) -> None:
    """Store reads what the batch needs, the planner decides, store writes: the write asks the
    server nothing it waits for. A junk frame's and a conflict's quarantine each waited for
    the row's count (RETURNING) to know whether to audit it; the quarantine's rows are read
    with the batch's reads now. Junk, a conflict, a late delete and a new message here."""
    queue = owner_queue()
    inbox.record_batch(store, [make_message("seqaaaaaaa01")], NOW, queue=queue, relay_enabled=True)
    junk = decode_line(b"not json at all", TOPICS)
    conflict = make_message("seqaaaaaaa01", message="another body")
    late = _delete("dddddddddd01", "seqaaaaaaa01", 1_764_470_001)
    frames = [junk, conflict, late, make_message("aaaaaaaaaaa9", title="New one")]
    with db.write_txn(store) as txn:
        planner = batch_plan.Planner(queue.policy, NOW + 1)
        answers = inbox_batch.read(store, planner, frames, notes=True)
        plan = inbox_batch.decide(planner, answers, queue.fork_for(txn), frames)
        statements: list[str] = []
        if not db.is_postgres(store):
            store.set_trace_callback(statements.append)  # type: ignore[union-attr]
        with answers_waited(store) as waited:
            result = inbox_batch.write(
                txn, plan, answers, NOW + 1, queue=queue, note_append=append_info_entry
            )
        if not db.is_postgres(store):
            store.set_trace_callback(None)  # type: ignore[union-attr]
    assert (result.recorded, result.conflicts, result.quarantined) == (2, 1, 2)
    assert waited[0] == 0
    assert statements or db.is_postgres(store)  # SQLite's trace saw the write
    assert [s for s in statements if s.lstrip().upper().startswith("SELECT")] == []
    (count,) = store.execute("SELECT count(*) FROM feed_entries").fetchone()
    assert count >= 1  # the late delete's note


def test_a_junk_frame_costs_a_live_batch_no_wait(store: db.Connection) -> None:
    queue = owner_queue()
    inbox.record_batch(
        store, [decode_line(b"not json", TOPICS)], NOW, queue=queue, relay_enabled=True
    )
    frames = [decode_line(b"not json", TOPICS), make_message("aaaaaaaaaaa1")]
    with answers_waited(store) as waited:
        result = inbox.record_batch(store, frames, NOW + 1, queue=queue, relay_enabled=True)
    assert (result.recorded, result.quarantined) == (1, 0)  # audited once, the first time
    if db.is_postgres(store):
        assert waited[0] <= LIVE_BATCH_WAITS


def test_the_next_release_is_read_in_the_batch_as_the_batch_left_it(store: db.Connection) -> None:
    queue = owner_queue(debounce=60.0)
    result = inbox.record_batch(
        store, [make_message("aaaaaaaaaaa1")], NOW, queue=queue, relay_enabled=True
    )
    assert result.released == []
    assert (result.release_known, result.next_release) == (True, NOW + 60.0)
    assert outbox.next_release_at(store) == NOW + 60.0


def test_deletes_before_their_messages_are_linked_when_the_messages_come_in_one_batch(
    store: db.Connection,
) -> None:
    """Three delete/clears wait for their messages; one batch records two of them (and a message
    of a third sequence nothing waits for): both are linked, the third delete stays unlinked."""
    queue = owner_queue()
    deletes = [_delete(f"dddddddddd0{i}", f"seqaaaaaaa0{i}", 1_764_470_001) for i in range(3)]
    inbox.record_batch(store, deletes, NOW, queue=queue, relay_enabled=True)
    messages = [
        make_message("seqaaaaaaa00", title="Disk full"),
        make_message("seqaaaaaaa01", title="UPS on battery"),
        make_message("seqaaaaaaa09", title="Nobody waits"),
    ]
    inbox.record_batch(store, messages, NOW + 1, queue=queue, relay_enabled=True)
    linked = dict(
        store.execute(
            "SELECT event_id, incident_key FROM inbox WHERE event = 'message_delete'"
        ).fetchall()
    )
    assert linked == {
        "dddddddddd00": "alerts:disk full",
        "dddddddddd01": "alerts:ups on battery",
        "dddddddddd02": "",
    }


def test_requests_released_together_each_get_their_own_payload(store: db.Connection) -> None:
    """More requests than are read ahead at once (outbox._READ_AHEAD) close their windows in one
    release: each one's frozen payload is the one built for it alone, its feed entry too."""
    count = outbox._READ_AHEAD + 6
    queue = owner_queue(debounce=30.0)
    events = [
        make_message(f"aaaaaaaa{i:04d}", title=f"incident {i}", message=f"event {i}")
        for i in range(count)
    ]
    inbox.record_batch(store, events, NOW, queue=queue, relay_enabled=True)
    with db.write_txn(store), answers_waited(store) as waited:
        released = outbox.release_due(
            store, NOW + 31, relay_enabled=True, feed_append=append_triage_entry
        )
    assert len(released) == count
    if db.is_postgres(store):
        assert waited[0] == 2  # one per read-ahead step; before: the keys first, then 2
    for key in released:
        (stored,) = store.execute(
            "SELECT payload FROM outbox WHERE delivery_key = ?", (key,)
        ).fetchone()
        assert json.loads(stored) == outbox.build_payload(store, key)[0]
        (entry,) = store.execute(
            "SELECT payload FROM feed_entries WHERE delivery_key = ?", (key,)
        ).fetchone()
        assert json.loads(entry) == json.loads(stored)
    titles = {
        json.loads(p)["events"][0]["title"] for (p,) in store.execute("SELECT payload FROM outbox")
    }
    assert titles == {f"incident {i}" for i in range(count)}


def test_a_batch_of_duplicates_reads_no_incident(
    store: db.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restart's overlap backfill is mostly duplicates: asking their incidents before knowing
    they are duplicates (as a live batch does) doubled such a batch's time on PostgreSQL."""
    queue = owner_queue()
    events = [make_message(f"dup{i:09d}", title=f"probe {i}") for i in range(40)]
    inbox.record_batch(store, events, NOW, queue=queue, relay_enabled=True)
    asked: list[set[str]] = []
    original = inbox_batch._ask_incidents

    def spy(conn: db.Connection, keys: list[str]) -> Any:
        asked.append(set(keys))
        return original(conn, keys)

    monkeypatch.setattr(inbox_batch, "_ask_incidents", spy)
    result = inbox.record_batch(store, events, NOW + 1, queue=queue, relay_enabled=True)
    assert result.duplicates == 40
    assert set().union(*asked) == set()


def test_due_requests_are_read_on_their_indexes_before_the_tables_are_analyzed(
    store: db.Connection,
) -> None:
    """PostgreSQL's release read (one statement): a plan joining the whole inbox and every
    request's events (a hash join over seq scans, what a planner without statistics chose for
    an IN over the due requests) read 20k rows per live release on a big inbox."""
    if not db.is_postgres(store):
        pytest.skip("the plan of PostgreSQL's one-statement release read")
    events = [make_message(f"big{i:09d}", title=f"probe {i}") for i in range(2000)]
    for start in range(0, len(events), 500):
        chunk = events[start : start + 500]
        inbox.record_batch(store, chunk, NOW, queue=owner_queue(), relay_enabled=True)
    collecting = make_message("collect00001", title="collecting")
    inbox.record_batch(
        store, [collecting], NOW, queue=owner_queue(debounce=60.0), relay_enabled=True
    )
    plan = "\n".join(
        row[0] for row in store.execute("EXPLAIN " + outbox._DUE_PG, (NOW + 61, 64)).fetchall()
    )
    assert "Seq Scan on inbox" not in plan and "Seq Scan on outbox_events" not in plan, plan


def test_a_batchs_reads_are_one_statement_text_whatever_its_size(
    store: db.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each read named its values with one placeholder per value: a new statement text for
    every batch size, parsed anew by the driver (psycopg caches none over 4 KB) and planned anew
    by the server. A third of a 300-duplicate batch's CPU was that parsing."""
    if not db.is_postgres(store):
        pytest.skip("spies PostgreSQL's driver; SQLite reads the same statements")
    texts: dict[int, set[str]] = {}
    real = type(store).execute

    def spy(self: Any, sql: str, *args: Any, **kwargs: Any) -> Any:
        texts.setdefault(size, set()).add(sql)
        return real(self, sql, *args, **kwargs)

    monkeypatch.setattr(type(store), "execute", spy)
    for size in (3, 40):
        events = [make_message(f"size{size:03d}{i:05d}", title=f"t {i}") for i in range(size)]
        planner = batch_plan.Planner(owner_queue().policy, NOW)
        inbox_batch.read(store, planner, events, notes=True)
    assert texts[3] == texts[40]


def test_a_batch_larger_than_any_parameter_limit_records_and_repeats_whole(
    store: db.Connection,
) -> None:
    queue = owner_queue()
    events = [make_message(f"wide{i:08d}", title=f"wide {i}") for i in range(1200)]
    first = inbox.record_batch(store, events, NOW, queue=queue, relay_enabled=True)
    again = inbox.record_batch(store, events, NOW + 1, queue=queue, relay_enabled=True)
    assert (first.recorded, again.duplicates) == (1200, 1200)


def test_an_incident_whose_key_holds_a_nul_is_found_by_its_next_event(
    store: db.Connection,
) -> None:
    """A title with a NUL names an incident whose key holds it. SQLite's json_each cut the
    looked-up key at the NUL, and PostgreSQL stores it as U+FFFD and answered under that key:
    either way the batch took a known incident for a new one and wrote over its count."""
    queue = owner_queue()
    for n in range(3):
        line = {"id": f"nultitle{n:04d}", "time": 1_764_470_000 + n, "event": "message"}
        line |= {"topic": "alerts", "title": "disk\u0000full", "message": f"event {n}"}
        frame = decode_line(json.dumps(line).encode(), TOPICS)
        inbox.record_batch(store, [frame], NOW + n, queue=queue, relay_enabled=True)
    (events,) = store.execute("SELECT events FROM incidents").fetchone()
    assert events == 3
