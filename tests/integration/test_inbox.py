"""The inbox transaction against a real SQLite file: dedup, conflict, quarantine, rollback."""

from __future__ import annotations

import json
import sqlite3

import pytest

from ntfy_intake.errors import InjectedFault
from ntfy_intake.flow.pipeline import append_triage_entry
from ntfy_intake.rules.notices import Notice
from ntfy_intake.store import audit, db, device_actions, inbox, outbox
from ntfy_intake.store.owner_queue import OwnerQueue
from ntfy_intake.wire.frames import Junk, decode_line

from ..conftest import make_message, owner_queue

NOW = 1_764_470_100.0

TABLES = (
    "inbox",
    "incidents",
    "outbox",
    "outbox_events",
    "quarantine",
    "audit_journal",
    "owner_outbox",
    "feed_entries",
)


def outbox_release(conn: sqlite3.Connection, now: float) -> list[str]:
    with db.write_txn(conn):
        return outbox.release_due(conn, now, relay_enabled=True, feed_append=None)


def counts(conn: sqlite3.Connection) -> dict[str, int]:
    return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}


def record(conn: sqlite3.Connection, frames, queue=None, **kw):  # type: ignore[no-untyped-def]
    queue = queue or _queues.setdefault(conn, owner_queue())
    return inbox.record_batch(conn, frames, NOW, queue=queue, relay_enabled=True, **kw)


# One cadence state per store (keyed by the connection itself, which this keeps alive, so a
# later test's connection can never inherit it).
_queues: dict[sqlite3.Connection, OwnerQueue] = {}


def test_identical_replay_is_a_duplicate_with_no_second_outcome(store: sqlite3.Connection) -> None:
    first = record(store, [make_message("aaaaaaaaaaa1")])
    again = record(store, [make_message("aaaaaaaaaaa1")])
    assert (first.recorded, again.recorded, again.duplicates) == (1, 0, 1)
    assert counts(store)["inbox"] == 1
    assert (
        store.execute(
            'SELECT count(*) FROM audit_journal WHERE line LIKE \'%"kind":"event"%\''
        ).fetchone()[0]
        == 1
    )
    assert [c.event_id for c in again.candidates] == ["aaaaaaaaaaa1"]


def test_same_id_different_body_is_a_conflict_in_quarantine(store: sqlite3.Connection) -> None:
    record(store, [make_message("aaaaaaaaaaa1", message="one")])
    result = record(store, [make_message("aaaaaaaaaaa1", message="two")])
    assert (result.conflicts, result.candidates) == (1, [])
    reason = store.execute("SELECT reason FROM quarantine").fetchone()[0]
    assert reason.startswith("conflict")
    assert store.execute("SELECT raw FROM inbox").fetchone()[0].find('"one"') > 0


def test_duplicate_within_one_batch_is_recorded_once(store: sqlite3.Connection) -> None:
    result = record(store, [make_message("aaaaaaaaaaa1"), make_message("aaaaaaaaaaa1")])
    assert (result.recorded, result.duplicates) == (1, 1)


def test_bad_frame_is_quarantined_once_however_often_replayed(store: sqlite3.Connection) -> None:
    junk = Junk('{"event":"message","id":"x"}', "'id' is not 12 characters of [A-Za-z0-9]")
    record(store, [junk])
    record(store, [junk])
    row = store.execute("SELECT count, reason FROM quarantine").fetchone()
    assert tuple(row) == (2, junk.reason)
    assert (
        store.execute(
            "SELECT count(*) FROM audit_journal WHERE line LIKE '%quarantine%'"
        ).fetchone()[0]
        == 1
    )


def test_fault_before_commit_leaves_every_table_untouched(store: sqlite3.Connection) -> None:
    record(store, [make_message("aaaaaaaaaaa1")])
    before = counts(store)
    frames = [
        make_message("bbbbbbbbbbb2", title="Other"),
        make_message("aaaaaaaaaaa1", message="conflicting"),
        Junk("junk", "not JSON"),
        Notice("gap", "text", key="gap:x"),
    ]
    with pytest.raises(InjectedFault):
        record(store, frames, before_commit=db.fail_before_commit)
    assert counts(store) == before
    incident = store.execute("SELECT events, version FROM incidents").fetchone()
    assert tuple(incident) == (1, 1)


def test_burst_joins_one_request_while_its_debounce_window_is_open(
    store: sqlite3.Connection,
) -> None:
    queue = owner_queue(debounce=60.0)
    result = record(
        store, [make_message("aaaaaaaaaaa1"), make_message("bbbbbbbbbbb2", priority=4)], queue=queue
    )
    outcomes = [tuple(r) for r in store.execute("SELECT outcome, reason FROM inbox ORDER BY seq")]
    assert outcomes == [("triage_requested", "new_incident"), ("joined", "debounce")]
    assert result.released == []  # still collecting until the window closes
    released = outbox_release(store, NOW + 60.0)
    assert released == ["tri_aaaaaaaaaaa1"]
    payload = json.loads(store.execute("SELECT payload FROM outbox").fetchone()[0])
    assert [e["id"] for e in payload["events"]] == ["aaaaaaaaaaa1", "bbbbbbbbbbb2"]
    assert payload["incident"]["severity"] == 4  # the request carries what joined it


def test_repeat_within_cooldown_is_suppressed_and_audited(store: sqlite3.Connection) -> None:
    result = record(store, [make_message("aaaaaaaaaaa1")])
    assert result.released == ["tri_aaaaaaaaaaa1"]
    record(store, [make_message("bbbbbbbbbbb2")])
    row = store.execute(
        "SELECT outcome, reason, delivery_key FROM inbox WHERE event_id = 'bbbbbbbbbbb2'"
    ).fetchone()
    assert tuple(row) == ("suppressed", "cooldown", None)


def test_escalation_opens_a_new_request(store: sqlite3.Connection) -> None:
    record(store, [make_message("aaaaaaaaaaa1", priority=3)])
    record(store, [make_message("bbbbbbbbbbb2", priority=5)])
    reasons = [
        r[0] for r in store.execute("SELECT reason FROM outbox ORDER BY created_at, delivery_key")
    ]
    assert sorted(reasons) == ["escalation", "new_incident"]


def test_released_request_writes_its_feed_entry_in_the_same_transaction(
    store: sqlite3.Connection,
) -> None:
    record(store, [make_message("aaaaaaaaaaa1")], feed_append=append_triage_entry)
    row = store.execute("SELECT channel, seq, delivery_key FROM feed_entries").fetchone()
    assert tuple(row) == ("triage", 1, "tri_aaaaaaaaaaa1")


def test_audit_records_carry_event_outcome_and_delivery_key(
    store: sqlite3.Connection, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    record(store, [make_message("aaaaaaaaaaa1")])
    with audit.AuditLog(tmp_path / "audit", lambda: NOW) as log:
        assert audit.flush(store, log) == 2
    line, release = list(audit.read_records(tmp_path / "audit"))
    assert release["kind"] == "release" and release["delivery_key"] == "tri_aaaaaaaaaaa1"
    assert release["payload"]["events"][0]["id"] == "aaaaaaaaaaa1"  # rebuild needs the payload
    assert line["kind"] == "event" and line["event_id"] == "aaaaaaaaaaa1"
    assert line["expires"] == 1_764_470_000 + 43200 and len(line["sha256"]) == 64
    assert line["outcome"] == "triage_requested" and line["delivery_key"] == "tri_aaaaaaaaaaa1"
    assert line["v"] == 1 and line["seq"] == 1 and line["incident"] == "alerts:disk full"


def _frame(obj: dict[str, object]) -> object:
    return decode_line(json.dumps(obj).encode(), frozenset({"alerts", "backups"}))


def test_triage_payload_keeps_what_publishers_send_and_never_a_null_title(
    store: sqlite3.Connection,
) -> None:
    """Click, actions, attachment, icon and markdown reach the agent; a titleless alert has no
    `title` key (never null); a UnifiedPush base64 body reaches it decoded."""
    action = {
        "id": "abcdefghij",
        "action": "view",
        "label": "Open",
        "url": "https://nas/",
        "clear": False,
    }
    rich = {
        "id": "richrichric1",
        "time": 1_764_470_000,
        "expires": 1_764_513_200,
        "event": "message",
        "topic": "alerts",
        "title": "Disk",
        "message": "**sda1** at 97%",
        "click": "https://nas.example/",
        "icon": "https://nas.example/i.png",
        "actions": [action],
        "attachment": {"name": "df.txt", "url": "https://nas.example/df.txt"},
        "content_type": "text/markdown",
    }
    plain = {
        "id": "plainplain01",
        "time": 1_764_470_001,
        "expires": 1_764_513_201,
        "event": "message",
        "topic": "backups",
        "message": "//4AYmlu",
        "encoding": "base64",
    }
    record(store, [_frame(rich), _frame(plain)])
    (key_rich,), (key_plain,) = (
        store.execute("SELECT delivery_key FROM outbox_events WHERE event_id = ?", (i,)).fetchone()
        for i in ("richrichric1", "plainplain01")
    )
    (rich_event,) = outbox.build_payload(store, key_rich)[0]["events"]
    (plain_event,) = outbox.build_payload(store, key_plain)[0]["events"]
    for name in ("click", "icon", "actions", "attachment", "content_type", "title"):
        assert rich_event[name] == rich[name], name
    assert "title" not in plain_event
    assert plain_event["message"] == "\ufffd\ufffd\x00bin"
    assert None not in rich_event.values() and None not in plain_event.values()


@pytest.mark.sqlite_only(reason="SQLite's planner, named by INDEXED BY; PostgreSQL plans by cost")
def test_unlinked_probe_reads_the_partial_index_not_every_recorded_message(
    store: sqlite3.Connection,
) -> None:
    """Once per batch the inbox asks whether any delete/clear waits for its message. Planned on
    `inbox_sequence` that walked every message ever recorded: a long replay went quadratic."""
    record(store, [make_message(f"aaaaaaaaa{i:03d}") for i in range(20)])
    plan = " ".join(
        str(row[3]) for row in store.execute("EXPLAIN QUERY PLAN " + device_actions.UNLINKED_PROBE)
    )
    assert "inbox_unlinked" in plan, plan
    old = "SELECT 1 FROM inbox WHERE incident_key = '' AND sequence_id IS NOT NULL LIMIT 1"
    old_plan = " ".join(str(row[3]) for row in store.execute("EXPLAIN QUERY PLAN " + old))
    assert "inbox_unlinked" not in old_plan  # what the probe was: a scan of inbox_sequence


def test_lone_surrogate_in_a_message_reaches_the_triage_payload_as_valid_text(
    store: sqlite3.Connection,
) -> None:
    """The inbox keeps the raw frame byte-exact (escapes and all); the payload, read back from
    it, must still obey the decode boundary's rule: valid UTF-8 for any agent and any writer."""
    line = (
        '{"id":"surrogate001","time":1764470000,"expires":1764513200,"event":"message",'
        '"topic":"alerts","title":"Disk \\ud83d","message":"full \\udc00",'
        '"actions":[{"action":"view","label":"\\ud83d","url":"https://x/"}]}'
    )
    record(store, [decode_line(line.encode(), frozenset({"alerts"}))])
    (key,) = store.execute(
        "SELECT delivery_key FROM outbox_events WHERE event_id = 'surrogate001'"
    ).fetchone()
    (event,) = outbox.build_payload(store, key)[0]["events"]
    assert (event["title"], event["message"]) == ("Disk \ufffd", "full \ufffd")
    assert event["actions"][0]["label"] == "\ufffd"
    json.dumps(event, ensure_ascii=False).encode("utf-8")  # any UTF-8 writer accepts it
