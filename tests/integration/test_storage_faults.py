"""Storage, clock and hostile-value faults (issue 12): each test is named after the failure it kills.

Nothing a publisher, a receiver, the disk or the clock does may stop intake or break exactly-once.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from ntfy_intake import audit, db, inbox, incidents, rebuild, receiver
from ntfy_intake import notices as notices_module
from ntfy_intake.daemon import migrations
from ntfy_intake.emulator import EmulatorConfig, NtfyEmulator
from ntfy_intake.frames import Message, decode_line

from ..conftest import TOPICS, make_message, owner_queue
from ..harness import DaemonThread, event_ids, notices, query, settings_for, wait_until

NOW = 1_764_470_100.0
SURROGATE_BODY = '{"incident":"disk \\ud83d","severity":5,"status":"firing"}'


def frame_line(event_id: str, message: str, **extra: object) -> bytes:
    obj: dict[str, object] = {
        "id": event_id,
        "time": 1_764_470_000,
        "expires": 1_764_513_200,
        "event": "message",
        "topic": "alerts",
        "message": message,
        **extra,
    }
    return json.dumps(obj).encode()


def outcomes(conn: sqlite3.Connection) -> dict[str, list[str]]:
    """event id -> the outcomes of its `event` records in the journal (exactly one expected)."""
    found: dict[str, list[str]] = {}
    for (line,) in conn.execute("SELECT line FROM audit_journal ORDER BY seq"):
        record = json.loads(line)
        if record.get("kind") == "event":
            found.setdefault(record["event_id"], []).append(record["outcome"])
    return found


def test_lone_surrogate_in_message_does_not_stop_intake(store: sqlite3.Connection) -> None:
    """Finding 1: a valid ASCII body that JSON-decodes to a lone surrogate killed the writer."""
    hostile = decode_line(frame_line("surrogate001", SURROGATE_BODY), TOPICS)
    assert isinstance(hostile, Message)
    queue = owner_queue()
    result = inbox.record_batch(
        store, [hostile, make_message("ordinary0001")], NOW, queue=queue, relay_enabled=True
    )
    queue.commit(result.records)
    assert result.recorded == 2
    assert outcomes(store) == {
        "surrogate001": ["triage_requested"],
        "ordinary0001": ["triage_requested"],
    }
    key = store.execute("SELECT incident_key FROM inbox WHERE event_id = 'surrogate001'").fetchone()
    assert key[0] == "disk \ufffd"


def test_lone_surrogate_in_frame_strings_is_replaced_and_raw_kept(
    store: sqlite3.Connection,
) -> None:
    """Finding 1 at the frame level: every decoded string is valid UTF-8, the raw is unchanged."""
    line = (
        b'{"id":"surrogate002","time":1764470000,"expires":1764513200,"event":"message",'
        b'"topic":"alerts","title":"t \\udc00","message":"m \\ud83d","tags":["\\udfff"]}'
    )
    frame = decode_line(line, TOPICS)
    assert isinstance(frame, Message)
    assert (frame.title, frame.message, frame.tags) == ("t \ufffd", "m \ufffd", ("\ufffd",))
    assert json.loads(frame.raw) == json.loads(line)  # the raw keeps the original escapes
    queue = owner_queue()
    result = inbox.record_batch(store, [frame], NOW, queue=queue, relay_enabled=True)
    assert result.recorded == 1
    raw = store.execute("SELECT raw FROM inbox").fetchone()[0]
    assert "\\udc00" in raw and "\\ud83d" in raw


def test_event_whose_processing_fails_is_quarantined_and_intake_goes_on(
    store: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 1's backstop: a value that still breaks processing costs one event, not intake."""
    real = incidents.signal_of

    def explode(message: Message) -> incidents.Signal:
        if message.id == "poisoned0001":
            raise UnicodeEncodeError("utf-8", "\ud83d", 0, 1, "surrogates not allowed")
        return real(message)

    monkeypatch.setattr(incidents, "signal_of", explode)
    queue = owner_queue()
    batch = [
        make_message("before000001"),
        make_message("poisoned0001"),
        make_message("after0000001"),
    ]
    result = inbox.record_batch(store, batch, NOW, queue=queue, relay_enabled=True)
    queue.commit(result.records)
    assert outcomes(store) == {
        "before000001": ["triage_requested"],
        "poisoned0001": ["quarantined"],
        "after0000001": ["suppressed"],  # cooldown: debounce is 0 here
    }
    row = store.execute(
        "SELECT outcome, reason FROM inbox WHERE event_id = 'poisoned0001'"
    ).fetchone()
    assert row[0] == "quarantined" and "UnicodeEncodeError" in row[1]
    assert {c.event_id for c in result.candidates} == {
        "before000001",
        "poisoned0001",
        "after0000001",
    }
    # A replay of the poisoned event is a duplicate: no second outcome, no second failure.
    again = inbox.record_batch(
        store, [make_message("poisoned0001")], NOW, queue=queue, relay_enabled=True
    )
    assert (again.recorded, again.duplicates) == (0, 1)
    assert outcomes(store)["poisoned0001"] == ["quarantined"]


# -- the real daemon against the bundled ntfy-compatible server -----------------------------------


@pytest.fixture
def emu() -> Iterator[NtfyEmulator]:
    with NtfyEmulator(EmulatorConfig(keepalive_interval=1.0)).running() as emulator:
        yield emulator


def publish(emu: NtfyEmulator, n: int, prefix: str) -> list[str]:
    return [emu.publish("alerts", f"{prefix} {i}", title=f"{prefix} {i}")["id"] for i in range(n)]


def assert_exactly_once(state: Path, ids: list[str]) -> None:
    counts = Counter(event_ids(state))
    assert {i: counts[i] for i in ids} == dict.fromkeys(ids, 1)
    assert all(c == 1 for c in counts.values()), counts


def test_audit_file_deleted_while_running_loses_no_record(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    """Finding 4: writes went on to the deleted inode, status stayed healthy, and after a restart
    most events had no audit line and were never replayed."""
    config = settings_for(emu.url, tmp_path)
    with DaemonThread(config) as running:
        emu.wait_for_subscribers(1)
        first = publish(emu, 5, "before")
        wait_until(lambda: set(first) <= set(event_ids(tmp_path)), what="first batch audited")
        for path in audit.log_files(tmp_path / "audit"):
            path.unlink()
        second = publish(emu, 5, "after")
        wait_until(lambda: set(second) <= set(event_ids(tmp_path)), what="second batch audited")
        assert running.daemon is not None and not running.daemon.failed
    assert_exactly_once(tmp_path, first + second)
    assert len(notices(tmp_path, "audit_file_replaced")) == 1
    with DaemonThread(config):
        third = publish(emu, 3, "restart")
        wait_until(lambda: set(third) <= set(event_ids(tmp_path)), what="after restart")
    assert_exactly_once(tmp_path, first + second + third)


class ShiftedClock:
    """The wall clock plus an offset the test moves (debounce windows close without sleeping)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def outbox_state(state: Path, event_id: str) -> tuple[str, int] | None:
    rows = query(
        state,
        "SELECT o.state, o.attempts FROM outbox o JOIN outbox_events e"
        " ON e.delivery_key = o.delivery_key WHERE e.event_id = ?",
        event_id,
    )
    return (str(rows[0][0]), int(rows[0][1])) if rows else None


def audited_keys(state: Path) -> set[str]:
    return {
        str(r["delivery_key"])
        for r in audit.read_records(state / "audit")
        if r["kind"] == "event" and r.get("delivery_key")
    }


def test_missing_database_beside_an_audit_log_is_rebuilt_not_a_first_start(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    """Finding 5: a deleted intake.sqlite3 was a fresh install: events published meanwhile were
    lost (first_start=now) and seq restarted at 1. Requests collecting, pending and dead when it
    went must each be delivered exactly once by key after the rebuild."""
    state = tmp_path / "state"
    clock = ShiftedClock()
    with receiver.running(tmp_path / "receiver.sqlite3") as triage:
        config = settings_for(
            emu.url, state, relay_url=triage.url, relay_max_attempts="50", cadence_debounce="10s"
        )
        with DaemonThread(config, clock=clock):
            emu.wait_for_subscribers(1)
            delivered = emu.publish("alerts", "a", title="Incident A")["id"]
            wait_until(lambda: outbox_state(state, delivered) is not None)
            clock.offset += 11
            wait_until(lambda: outbox_state(state, delivered) == ("delivered", 1))
            triage.faults.reject_next(400)
            dead = emu.publish("alerts", "b", title="Incident B")["id"]
            wait_until(lambda: outbox_state(state, dead) is not None)
            clock.offset += 11
            wait_until(lambda: (outbox_state(state, dead) or ("",))[0] == "dead")
            triage.faults.fail_next(100_000)
            pending = emu.publish("alerts", "c", title="Incident C")["id"]
            wait_until(lambda: outbox_state(state, pending) is not None)
            clock.offset += 11
            wait_until(lambda: (outbox_state(state, pending) or ("", 0))[1] >= 1)
            collecting = emu.publish("alerts", "d", title="Incident D")["id"]
            wait_until(lambda: outbox_state(state, collecting) == ("collecting", 0))
            wait_until(lambda: collecting in event_ids(state), what="D audited")
        seq_before = max(int(r["seq"]) for r in audit.read_records(state / "audit"))
        for name in ("intake.sqlite3", "intake.sqlite3-wal", "intake.sqlite3-shm"):
            (state / name).unlink(missing_ok=True)
        while triage.faults.take_injected() is not None:
            pass
        meanwhile = emu.publish("alerts", "e", title="Incident E")["id"]
        with DaemonThread(config, clock=clock) as running:
            wait_until(lambda: meanwhile in event_ids(state), what="E recorded")
            clock.offset += 11
            wait_until(
                lambda: len(receiver.receipts(triage.db_path)) == len(audited_keys(state)),
                what="every request delivered",
            )
            assert running.daemon is not None and not running.daemon.failed
        everything = [delivered, dead, pending, collecting, meanwhile]
        assert_exactly_once(state, everything)
        receipts = receiver.receipts(triage.db_path)
        assert sorted(r.key for r in receipts) == sorted(audited_keys(state))
        by_key = {r.key: r for r in receipts}
        first_key = query(state, "SELECT delivery_key FROM inbox WHERE event_id = ?", delivered)
        assert by_key[first_key[0][0]].repeats == 0  # audited as delivered: not sent again
    records = list(audit.read_records(state / "audit"))
    assert [r["kind"] for r in records].count("rebuilt_from_audit") == 1
    assert len(notices(state, "rebuilt_from_audit")) == 1
    seqs = [int(r["seq"]) for r in records]
    assert len(seqs) == len(set(seqs)) and min(s for s in seqs if s > seq_before) == seq_before + 1


def test_rebuild_restores_owner_messages_with_their_text_and_state(tmp_path: Path) -> None:
    """Finding 5: owner messages come back from the audit log; not audited as sent = pending."""
    first = db.connect(tmp_path / "first.sqlite3")
    db.migrate(first, migrations())
    queue = owner_queue(daily_cap=1)
    with db.write_txn(first):
        _, records = queue.triage_message(first, "agent:one", "reply \ud83d one", NOW)
    queue.commit(records)
    with db.write_txn(first):
        _, records = queue.triage_message(first, "agent:two", "over the cap", NOW)
    queue.commit(records)
    with db.write_txn(first):
        queue.notice(first, notices_module.gap("c", "s", "e"), NOW)
    with audit.AuditLog(tmp_path / "audit", lambda: NOW) as log:
        audit.flush(first, log)
    first.close()
    second = db.connect(tmp_path / "second.sqlite3")
    db.migrate(second, migrations())
    assert rebuild.is_empty(second)
    summary = rebuild.from_audit(
        second, tmp_path / "audit", NOW, debounce=0.0, relay_enabled=True, feed_append=None
    )
    assert summary is not None and summary.owner_messages == 3
    rows = {
        r[0]: (r[1], r[2], r[3])
        for r in second.execute("SELECT key, kind, text, state FROM owner_outbox")
    }
    assert rows["agent:one"] == ("triage", "reply \ufffd one", "pending")
    assert rows["agent:two"] == ("triage", "over the cap", "suppressed")
    assert rows["gap:c"][0::2] == ("notice", "pending")
    second.close()
