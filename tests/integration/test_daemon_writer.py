"""The writer's one trip to the worker thread per batch: commit, then the audit flush.

A transient storage fault anywhere in that trip re-runs it (`Database.run`); these tests try to
make the re-run record something twice or lose it, and check that the crash points still split
the trip where the guarantees need it. Each test is named after the failure it kills.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ntfy_intake.flow import database, intake, journal
from ntfy_intake.flow import writer as writer_module
from ntfy_intake.runtime.daemon import Daemon
from ntfy_intake.store import audit, cursor, db, inbox
from ntfy_intake.testbed.emulator import NtfyEmulator
from ntfy_intake.wire import refusals

from ..conftest import make_message
from ..harness import (
    audit_records,
    daemon_process,
    env_for,
    event_ids,
    query,
    settings_for,
    wait_until,
)

pytestmark = pytest.mark.engines


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    """A recovered daemon whose pipeline steps are driven directly (no ntfy, no tasks)."""
    monkeypatch.setattr(database, "STORAGE_RETRY_BASE", 0.001)
    config = settings_for("http://127.0.0.1:9", tmp_path, cadence_debounce="0s")
    found = Daemon(config)
    found.recover()
    yield found
    shut(found)


def shut(daemon: Daemon) -> None:
    """What the end of `Daemon.run` releases (idempotent): the audit file, the store, the lock."""
    daemon.close()


def failing_first(times: int, fn: Callable[..., Any], error: str) -> Callable[..., Any]:
    """`fn`, raising sqlite3.OperationalError(error) on its first `times` calls."""
    calls = {"n": 0}

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] <= times:
            raise sqlite3.OperationalError(error)
        return fn(*args, **kwargs)

    return wrapper


def received(*ids: str) -> list[intake.Received]:
    return [intake.Received(make_message(i), time.monotonic(), 0) for i in ids]


def event_lines(state: Path) -> Counter[str]:
    return Counter(event_ids(state))


def test_storage_fault_after_the_commit_records_no_event_twice(
    daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flush fails after the batch committed (a full disk; SQLite: the read of the mark,
    PostgreSQL: the read of the rows the files lack; the mark rides the next transaction): the
    re-run of the trip must not record the batch again (as duplicates, or a second line)."""
    step = "mirror" if db.is_postgres(daemon.conn) else "flushed_seq"
    monkeypatch.setattr(
        audit, step, failing_first(2, getattr(audit, step), "database or disk is full")
    )

    asyncio.run(daemon.writer.record(received("fault0000001", "fault0000002")))

    assert event_lines(tmp_path) == {"fault0000001": 1, "fault0000002": 1}
    assert query(tmp_path, "SELECT count(*) FROM inbox") == [(2,)]
    counters = daemon.counters
    assert (counters.recorded, counters.duplicates, counters.batches) == (2, 0, 1)
    assert len(daemon.resume) == 2  # both made durable for the cursor, once each
    assert daemon.storage_wait is None and daemon.storage_episodes == 1
    asyncio.run(daemon.journal.flush_at_stop())  # writes the mark left owed
    assert audit.flushed_seq(daemon.conn) == daemon.journal.last_written_seq  # the mark caught up


def test_flush_mark_lost_with_the_power_writes_no_line_twice_after_restart(
    daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flush's mark commits without an fsync, so a power cut can lose it after the lines
    are in the files: the restart must find them there (by seq), not write them again."""
    monkeypatch.setattr(audit, "_mark_flushed", lambda conn, seq: None)  # never reached disk
    monkeypatch.setattr(audit, "ride", lambda *args: None)  # PostgreSQL: nor the owed mark
    asyncio.run(daemon.writer.record(received("power0000001", "power0000002")))
    asyncio.run(daemon.writer.record(received("power0000003")))
    shut(daemon)
    monkeypatch.undo()
    assert query(tmp_path, "SELECT value FROM kv WHERE name = ?", audit.FLUSHED_KEY) == []

    restarted = Daemon(daemon.settings)
    restarted.recover()
    asyncio.run(restarted.writer.record(received("power0000004", "power0000001")))
    shut(restarted)

    assert event_lines(tmp_path) == {f"power000000{n}": 1 for n in range(1, 5)}
    assert restarted.counters.duplicates == 1


def test_storage_fault_in_the_batch_transaction_loses_no_event(
    daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch's own transaction fails (the lock held by another process): it rolled back
    whole, so the re-run records it once, and the wait ends with the storage episode closed."""
    monkeypatch.setattr(
        inbox,
        "record_batch",
        failing_first(1, inbox.record_batch, "database is locked"),
    )

    asyncio.run(daemon.writer.record(received("locked000001")))

    assert event_lines(tmp_path) == {"locked000001": 1}
    assert (daemon.counters.recorded, daemon.counters.duplicates) == (1, 0)
    assert daemon.storage_wait is None and len(daemon.storage.notices_owed) == 1


def test_storage_fault_at_the_backfill_commit_does_not_double_its_counts(
    daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backfill's totals were summed inside its transaction: a commit that failed (the lock
    held elsewhere) and ran again counted the batch twice in the `backfill` audit record."""
    real = inbox.record_batch
    failed = {"n": 0}

    def locked_at_first_commit(*args: Any, **kwargs: Any) -> Any:
        if failed["n"] == 0:
            failed["n"] += 1

            def locked() -> None:
                raise sqlite3.OperationalError("database is locked")

            kwargs["before_commit"] = locked
        return real(*args, **kwargs)

    monkeypatch.setattr(inbox, "record_batch", locked_at_first_commit)
    owed = cursor.owe_backfill(daemon.conn, 1_764_469_000, None, time.time())
    events: list[Any] = [make_message(f"backfill{n:04d}") for n in range(3)]

    asyncio.run(daemon.writer.record_backfill(intake.Backfilled(owed, events, polled=3)))

    (record,) = [r for r in audit_records(tmp_path) if r["kind"] == "backfill"]
    assert (record["new"], record["duplicate"], record["polled"]) == (3, 0, 3)
    assert event_lines(tmp_path) == {f"backfill{n:04d}": 1 for n in range(3)}


def test_storage_fault_while_tripping_the_latch_still_queues_its_notice(
    daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The latch was set before its notice was written: a transient fault on that write was
    waited out, the re-run saw the latch already set and returned, and the owner never heard."""
    monkeypatch.setattr(
        daemon.owner_queue,
        "notice",
        failing_first(1, daemon.owner_queue.notice, "database is locked"),
    )

    asyncio.run(daemon.database.run(daemon.journal.latch, "audit log write failed: disk full"))

    assert daemon.latched
    assert query(tmp_path, "SELECT count(*) FROM owner_outbox WHERE key LIKE 'latch:%'") == [(1,)]


def test_flush_that_queued_nothing_does_not_wake_the_owner_sender(daemon: Daemon) -> None:
    """Every flush woke the owner sender, which then took the database lock twice per event
    (a claim and a due-time query) in the writer's way; a queued notice must still wake it."""

    async def run() -> tuple[bool, bool]:
        sender = SimpleNamespace(wakeup=asyncio.Event())
        daemon.journal.wake_owner_sender_with(sender.wakeup)
        await daemon.writer.record(received("quiet0000001", "quiet0000002"))
        await daemon.journal.flush()
        after_events = sender.wakeup.is_set()
        await daemon.writer.record_refusal(
            refusals.Refused("credentials", 403, 40301, "forbidden", "alerts", "1")
        )
        return after_events, sender.wakeup.is_set()

    after_events, after_notice = asyncio.run(run())

    assert (after_events, after_notice) == (False, True)


@pytest.mark.parametrize("point", ["after_inbox_commit", "after_audit_write"])
def test_kill9_inside_the_writers_trip_leaves_one_event_line_after_restart(
    emu: NtfyEmulator, tmp_path: Path, point: str
) -> None:
    """The crash points still split the trip: killed between the commit and the flush, the
    database is ahead of the audit log and the restart writes the line; killed after the flush,
    the line is there and the cursor has not moved. Either way exactly one line per event."""
    env = env_for(emu.url, tmp_path)
    with daemon_process(env, extra_env={"NTFY_INTAKE_TEST_CRASH_AT": point}) as proc:
        emu.wait_for_subscribers(1)
        event_id = emu.publish("alerts", "disk full", title="Disk")["id"]
        assert proc.wait(timeout=20) == -signal.SIGKILL
    assert query(tmp_path, "SELECT event_id FROM inbox") == [(event_id,)]
    assert event_lines(tmp_path)[event_id] == (0 if point == "after_inbox_commit" else 1)
    assert query(tmp_path, "SELECT kind FROM cursor") != [("id",)]
    before = backfills(tmp_path)
    with daemon_process(env):
        # The restart's overlap backfill re-reads the event: recorded by then, as a duplicate.
        wait_until(lambda: backfills(tmp_path) > before, timeout=20, what="the restart's backfill")
    assert event_lines(tmp_path) == {event_id: 1}


def backfills(state: Path) -> int:
    return sum(1 for record in audit_records(state) if record["kind"] == "backfill")


def test_cancelled_caller_keeps_the_connection_until_its_thread_is_done(daemon: Daemon) -> None:
    """A caller cancelled while its function ran in the worker thread (intake's watchdog
    cancelling `owe_backfill` stuck behind another process's write lock) let go of the lock at
    once; the ticker's next transaction then began on the same connection mid-transaction
    ("cannot start a transaction within a transaction") and the daemon exited."""
    release = threading.Event()
    running = threading.Event()
    overlapped: list[bool] = []

    def slow() -> None:
        running.set()
        release.wait(5)

    def next_user() -> None:
        overlapped.append(running.is_set() and not release.is_set())

    async def run() -> None:
        first = asyncio.create_task(daemon.database.run(slow))
        while not running.is_set():
            await asyncio.sleep(0.001)
        first.cancel()
        second = asyncio.create_task(daemon.database.run(next_user))
        await asyncio.sleep(0.05)  # the second user would have run by now if the lock were free
        release.set()
        await second
        with pytest.raises(asyncio.CancelledError):
            await first

    asyncio.run(run())

    assert overlapped == [False]


def test_a_mark_no_write_came_to_carry_is_written_by_the_ticker_not_left_behind(
    daemon: Daemon, tmp_path: Path
) -> None:
    """The daemon's flush leaves its mark to ride the next write (on SQLite it had a transaction
    of its own after every batch); when none comes (the daemon idle) the ticker writes it once it
    is `MARK_OWED_AT_MOST` old, not sooner, so back-to-back events never pay for it."""
    asyncio.run(daemon.writer.record(received("idle00000001")))
    top = daemon.journal.last_written_seq
    since = db.owed_since(daemon.conn)
    assert since is not None and audit.flushed_seq(daemon.conn) < top
    asyncio.run(daemon.journal.write_owed_mark(since + journal.MARK_OWED_AT_MOST - 0.01))
    assert audit.flushed_seq(daemon.conn) < top  # too young: a write may still carry it
    asyncio.run(daemon.journal.write_owed_mark(since + journal.MARK_OWED_AT_MOST))
    assert audit.flushed_seq(daemon.conn) == top
    assert db.owed_since(daemon.conn) is None


def frozen_monotonic(monkeypatch: pytest.MonkeyPatch, start: float) -> dict[str, float]:
    """The writer's monotonic clock, set by the test."""
    now = {"t": start}
    monkeypatch.setattr(writer_module, "time", SimpleNamespace(monotonic=lambda: now["t"]))
    return now


def test_a_steady_stream_saves_the_cursor_at_most_once_a_second_not_every_tick(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kills a write transaction every tick (50 ms) while events flow: each one queued on the
    one database thread ahead of the next event's batch (70 in a 3.5 s run of live events on
    PostgreSQL). The cursor lags a little more (never passing an event not durable, and the
    overlap backfill covers far more); a quiet stream's first settle and the drain save at once."""
    now = frozen_monotonic(monkeypatch, 10_000.0)
    window = daemon.settings.ntfy.reorder_window

    def settle_at(at: float, *, at_once: bool = False) -> str | None:
        now["t"] = at
        asyncio.run(daemon.writer.settle_cursor(at_once=at_once))
        saved = stored_cursor(daemon)
        return None if saved is None or saved.kind != "id" else saved.value

    start = now["t"]
    for n, event in enumerate(["steady000001", "steady000002", "steady000003"]):
        item = intake.Received(make_message(event), start + n * 0.1, 0)
        asyncio.run(daemon.writer.record([item]))
    assert settle_at(start + window) == "steady000001"  # quiet before: at once
    assert settle_at(start + window + 0.1) == "steady000001"  # 0.1 s after the last save
    assert settle_at(start + window + 0.9) == "steady000001"
    assert daemon.writer.cursor is not None and daemon.writer.cursor.value == "steady000001"
    assert settle_at(start + window + 1.0) == "steady000003"  # a second on: the newest settled
    item = intake.Received(make_message("steady000004"), start + window + 1.0, 0)
    asyncio.run(daemon.writer.record([item]))
    assert settle_at(start + 2 * window + 1.1, at_once=True) == "steady000004"  # the drain's


def test_a_steady_stream_wakes_the_ticker_to_settle_once_a_save_may_follow_not_per_event(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kills a ticker pass per live event: the settle was due at each event's reorder window
    end, 0.2 s apart at 5 events a second, though the cursor is saved at most once a second.
    The settle is due once a save may follow; the cursor lags no more than it did."""
    now = frozen_monotonic(monkeypatch, 10_000.0)
    window = daemon.settings.ntfy.reorder_window
    start = now["t"]
    for n, event in enumerate(["wake00000001", "wake00000002", "wake00000003"]):
        item = intake.Received(make_message(event), start + n * 0.2, 0)
        asyncio.run(daemon.writer.record([item]))
    now["t"] = start + window
    asyncio.run(daemon.writer.settle_cursor())  # quiet before: wake00000001 saved at once
    assert stored_cursor(daemon) == cursor.Cursor.at_id("wake00000001", 1_764_470_000)
    settle_due = daemon.writer.next_due(now["t"], 0.0)[0]
    # The next event's window ends 0.2 s on; the next save may come 1 s on.
    assert settle_due == start + window + writer_module.CURSOR_SAVE_EVERY


def test_a_cursor_settled_before_ntfy_refused_it_is_not_saved_over_the_reset(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cursor settled but not yet saved (`CURSOR_SAVE_EVERY`) when a 400 drops the cursor must
    not be saved afterwards: the next start would resume from it and be refused again."""
    now = frozen_monotonic(monkeypatch, 10_000.0)
    window = daemon.settings.ntfy.reorder_window
    for n, event in enumerate(["refused00001", "refused00002"]):
        item = intake.Received(make_message(event), now["t"] + n * 0.1, 0)
        asyncio.run(daemon.writer.record([item]))
    now["t"] += window
    asyncio.run(daemon.writer.settle_cursor())  # refused00001 saved
    now["t"] += 0.2
    asyncio.run(daemon.writer.settle_cursor())  # refused00002 settled, held back
    refused = cursor.Cursor.at_id("refused00002", 1)
    asyncio.run(daemon.writer.drop_cursor(refused, '{"code":40008}'))
    now["t"] += 5.0
    asyncio.run(daemon.writer.settle_cursor())
    saved = stored_cursor(daemon)
    assert saved is not None and (saved.kind, saved.value) == ("all", "all")


def stored_cursor(daemon: Daemon) -> cursor.Cursor | None:
    """The cursor the store holds once what is owed is written: live, a settled cursor rides
    the next write (store/cursor.owe), which the ticker makes when no batch comes."""
    audit.write_owed_mark(daemon.conn)
    return cursor.load(daemon.conn)
