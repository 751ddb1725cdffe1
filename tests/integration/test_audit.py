"""The audit log's crash behaviour: torn tails, the fsync/mark window, unwritable directories."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from ntfy_intake import audit, inbox
from ntfy_intake.errors import AuditWriteError

from ..conftest import make_message, owner_queue

NOW = 1_764_470_100.0


def record(conn: sqlite3.Connection, *ids: str) -> None:
    inbox.record_batch(
        conn,
        [make_message(i, title=i) for i in ids],
        NOW,
        queue=owner_queue(),
        relay_enabled=True,
    )


def flush(conn: sqlite3.Connection, directory: Path) -> int:
    with audit.AuditLog(directory, lambda: NOW) as log:
        return audit.flush(conn, log)


def recover(conn: sqlite3.Connection, tmp_path: Path) -> int:
    with audit.AuditLog(tmp_path / "audit", lambda: NOW) as log:
        return audit.recover(conn, log)


def event_ids(directory: Path) -> list[str]:
    return [r["event_id"] for r in audit.read_records(directory) if r["kind"] == "event"]


def test_torn_last_line_is_dropped_and_rewritten_once(
    store: sqlite3.Connection, tmp_path: Path
) -> None:
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
    store: sqlite3.Connection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record(store, "aaaaaaaaaaa1", "bbbbbbbbbbb2")

    def crash(conn: sqlite3.Connection, seq: int) -> None:
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
    store: sqlite3.Connection, tmp_path: Path
) -> None:
    record(store, "aaaaaaaaaaa1")  # committed, never flushed (killed before the audit write)
    assert recover(store, tmp_path) == 1
    assert event_ids(tmp_path / "audit") == ["aaaaaaaaaaa1"]
    assert recover(store, tmp_path) == 0


def test_unusable_audit_directory_raises_audit_write_error(
    store: sqlite3.Connection, tmp_path: Path
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
    store: sqlite3.Connection, tmp_path: Path
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


def test_files_are_named_by_utc_day_and_private(store: sqlite3.Connection, tmp_path: Path) -> None:
    record(store, "aaaaaaaaaaa1")
    flush(store, tmp_path / "audit")
    (path,) = audit.log_files(tmp_path / "audit")
    assert path.name == "audit-2025-11-30.jsonl"
    assert path.stat().st_mode & 0o077 == 0
