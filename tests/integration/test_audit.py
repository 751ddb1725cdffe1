"""The audit log's crash behaviour: torn tails, the fsync/mark window, unwritable directories."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from ntfy_intake.errors import AuditWriteError
from ntfy_intake.store import audit, db, inbox

from ..conftest import make_message, owner_queue
from ..harness import engine_fault

pytestmark = pytest.mark.engines

NOW = 1_764_470_100.0


def record(conn: db.Connection, *ids: str) -> None:
    inbox.record_batch(
        conn,
        [make_message(i, title=i) for i in ids],
        NOW,
        queue=owner_queue(debounce=60.0),  # no release record: one journal row per event
        relay_enabled=True,
    )


def flush(conn: db.Connection, directory: Path) -> int:
    with audit.AuditLog(directory, lambda: NOW) as log:
        return audit.flush(conn, log)


def recover(conn: db.Connection, tmp_path: Path) -> int:
    with audit.AuditLog(tmp_path / "audit", lambda: NOW) as log:
        return audit.recover(conn, log)


def event_ids(directory: Path) -> list[str]:
    return [r["event_id"] for r in audit.read_records(directory) if r["kind"] == "event"]


def test_torn_last_line_is_dropped_and_rewritten_once(store: db.Connection, tmp_path: Path) -> None:
    record(store, "aaaaaaaaaaa1")
    flush(store, tmp_path / "audit")
    record(store, "bbbbbbbbbbb2")
    # Crash mid-write: half a line reached the file, the mark did not move.
    path = audit.log_files(tmp_path / "audit")[-1]
    with path.open("ab") as handle:
        handle.write(b'{"v":1,"seq":2,"ts":"2026-')
    assert event_ids(tmp_path / "audit") == ["aaaaaaaaaaa1"]  # torn line tolerated on read
    recover(store, tmp_path)
    assert event_ids(tmp_path / "audit") == ["aaaaaaaaaaa1", "bbbbbbbbbbb2"]


def test_crash_between_fsync_and_mark_does_not_double_lines(
    store: db.Connection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record(store, "aaaaaaaaaaa1", "bbbbbbbbbbb2")

    def crash(conn: db.Connection, seq: int) -> None:
        raise SystemExit("killed after fsync")

    monkeypatch.setattr(audit, "_mark_flushed", crash)
    with pytest.raises(SystemExit):
        flush(store, tmp_path / "audit")
    monkeypatch.undo()
    record(store, "ccccccccccc3")
    recover(store, tmp_path)
    assert event_ids(tmp_path / "audit") == ["aaaaaaaaaaa1", "bbbbbbbbbbb2", "ccccccccccc3"]
    assert audit.flushed_seq(store) == 3


def test_outcomes_that_missed_the_log_are_written_at_startup(
    store: db.Connection, tmp_path: Path
) -> None:
    record(store, "aaaaaaaaaaa1")  # committed, never flushed (killed before the audit write)
    assert recover(store, tmp_path) == 1
    assert event_ids(tmp_path / "audit") == ["aaaaaaaaaaa1"]
    assert recover(store, tmp_path) == 0


def test_unusable_audit_directory_raises_audit_write_error(
    store: db.Connection, tmp_path: Path
) -> None:
    """Failure mode: the audit path is not a writable directory (works as root, unlike chmod)."""
    directory = tmp_path / "audit"
    directory.write_text("a file where the audit directory should be")
    record(store, "aaaaaaaaaaa1")
    with pytest.raises(AuditWriteError):
        flush(store, directory)
    assert audit.flushed_seq(store) == 0
    assert store.execute("SELECT count(*) FROM audit_journal").fetchone()[0] == 1


def test_full_disk_raises_audit_write_error_and_keeps_journal(
    store: db.Connection, tmp_path: Path
) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("/dev/full is not available")
    directory = tmp_path / "audit"
    directory.mkdir()
    day_file = audit.AuditLog(directory, lambda: NOW).path_for("2025-11-30")
    day_file.symlink_to("/dev/full")
    record(store, "aaaaaaaaaaa1")
    with pytest.raises(AuditWriteError, match="No space"):
        flush(store, directory)
    assert store.execute("SELECT count(*) FROM audit_journal").fetchone()[0] == 1


def test_files_are_named_by_utc_day_and_private(store: db.Connection, tmp_path: Path) -> None:
    record(store, "aaaaaaaaaaa1")
    flush(store, tmp_path / "audit")
    (path,) = audit.log_files(tmp_path / "audit")
    assert path.name == "audit-2025-11-30.jsonl"
    assert path.stat().st_mode & 0o077 == 0


def seqs(directory: Path) -> list[int]:
    return [int(r["seq"]) for r in audit.read_records(directory)]


def test_failed_mark_after_fsync_never_writes_a_line_twice(
    store: db.Connection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 3: lines written and fsynced, then moving the mark fails (SQLite's disk full);
    the next flush in the same process (the shutdown flush) wrote them all again."""
    directory = tmp_path / "audit"
    record(store, "aaaaaaaaaaa1", "bbbbbbbbbbb2")
    real = audit._mark_flushed

    fault = engine_fault("disk_full")

    def disk_full(conn: db.Connection, seq: int) -> None:
        raise fault

    with audit.AuditLog(directory, lambda: NOW) as log:
        monkeypatch.setattr(audit, "_mark_flushed", disk_full)
        with pytest.raises(type(fault)):
            audit.flush(store, log)
        monkeypatch.setattr(audit, "_mark_flushed", real)
        record(store, "ccccccccccc3")
        audit.flush(store, log)
    assert seqs(directory) == [1, 2, 3]
    assert audit.flushed_seq(store) == 3


def test_partial_write_on_a_full_disk_is_cut_back_not_glued_to_the_next_line(
    store: db.Connection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 3: ENOSPC/EFBIG after part of a batch reached the file left half a line, and the
    next append glued a whole line onto it (both unreadable)."""
    directory = tmp_path / "audit"
    record(store, "aaaaaaaaaaa1")
    real_write = os.write

    def short_then_full(fd: int, data: bytes) -> int:
        real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    with audit.AuditLog(directory, lambda: NOW) as log:
        monkeypatch.setattr(audit.os, "write", short_then_full)
        with pytest.raises(AuditWriteError):
            audit.flush(store, log)
        monkeypatch.setattr(audit.os, "write", real_write)
        record(store, "bbbbbbbbbbb2")
        audit.flush(store, log)
    assert event_ids(directory) == ["aaaaaaaaaaa1", "bbbbbbbbbbb2"]
    assert audit.log_files(directory)[0].read_bytes().count(b"\n") == 2


def test_deleted_audit_file_is_reopened_with_one_notice_and_loses_nothing(
    store: db.Connection, tmp_path: Path
) -> None:
    """Finding 4: after the audit file was deleted, writes went on to the deleted inode."""
    directory = tmp_path / "audit"
    with audit.AuditLog(directory, lambda: NOW) as log:
        record(store, "aaaaaaaaaaa1")
        audit.flush(store, log)
        audit.log_files(directory)[0].unlink()
        record(store, "bbbbbbbbbbb2")
        audit.flush(store, log)
        record(store, "ccccccccccc3")
        audit.flush(store, log)
        replaced = log.take_replacements()
    assert event_ids(directory) == ["aaaaaaaaaaa1", "bbbbbbbbbbb2", "ccccccccccc3"]
    assert len(replaced) == 1 and "deleted" in replaced[0]


def test_replaced_audit_file_is_reopened_with_one_notice(
    store: db.Connection, tmp_path: Path
) -> None:
    """Finding 4: a file moved away and replaced (rotation) kept receiving nothing we could see."""
    directory = tmp_path / "audit"
    with audit.AuditLog(directory, lambda: NOW) as log:
        record(store, "aaaaaaaaaaa1")
        audit.flush(store, log)
        path = audit.log_files(directory)[0]
        kept = path.read_bytes()
        path.rename(tmp_path / "rotated.jsonl")
        path.write_bytes(kept)  # the operator's copy stands in its place
        record(store, "bbbbbbbbbbb2")
        audit.flush(store, log)
        replaced = log.take_replacements()
    assert event_ids(directory) == ["aaaaaaaaaaa1", "bbbbbbbbbbb2"]
    assert len(replaced) == 1 and "replaced" in replaced[0]


def test_torn_line_repair_goes_by_seq_across_all_files_not_by_file_names(
    store: db.Connection, tmp_path: Path
) -> None:
    """Finding 7: after the clock stepped back across two days, the torn line sat in a file that
    is not among the two newest names; the next line was glued onto the fragment."""
    directory = tmp_path / "audit"
    day = 86400.0
    record(store, "aaaaaaaaaaa1")
    with audit.AuditLog(directory, lambda: NOW) as log:
        audit.flush(store, log)
    for later in (1, 2):  # two newer, unrelated days exist
        (directory / f"audit-2025-12-0{later}.jsonl").write_bytes(b"")
    record(store, "bbbbbbbbbbb2", "ccccccccccc3")
    stepped_back = NOW - 3 * day
    older = audit.AuditLog(directory, lambda: stepped_back).path_for("2025-11-27")
    rows = store.execute(
        "SELECT seq, line FROM audit_journal WHERE seq > 1 ORDER BY seq"
    ).fetchall()
    whole = audit.file_line(rows[0][0], rows[0][1])
    torn = audit.file_line(rows[1][0], rows[1][1])[:25]
    older.write_bytes((whole + torn).encode())  # a crash after seq 2 and mid seq 3, mark at 1
    with audit.AuditLog(directory, lambda: stepped_back) as log:
        assert audit.recover(store, log) == 1  # seq 3 only: seq 2 is already in a file
    assert sorted(seqs(directory)) == [1, 2, 3]
    assert older.read_bytes().count(b"\n") == older.read_bytes().count(b'"seq"')
