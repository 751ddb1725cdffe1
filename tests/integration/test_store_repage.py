"""`ntfy-intake store repage`: a SQLite store made with 4 KiB pages, before new stores had 2 KiB
ones, rewritten with them (a live event then writes about half the bytes to an SD card:
docs/performance.md, "Per live event: bytes and CPU"), nothing in it lost."""

from __future__ import annotations

import fcntl
import os
import resource
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ntfy_intake.store import db, migrations

pytestmark = pytest.mark.sqlite_only(reason="pages are a SQLite file's")


def repage(state: Path, *, fsize: int | None = None) -> subprocess.CompletedProcess[str]:
    """`store repage` in a child process; `fsize`: its file size limit, what a full disk is to
    a writer (EFBIG past it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
    env["NTFY_INTAKE_STATE_DIR"] = str(state)

    def limit() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.run(
        [sys.executable, "-m", "ntfy_intake", "store", "repage"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=limit,
    )


def old_store(state: Path, events: int = 500) -> Path:
    """A migrated store created with SQLite's default 4 KiB pages, holding `events` rows."""
    state.mkdir(mode=0o700)
    path = state / "intake.sqlite3"
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA page_size=4096")
    raw.execute("PRAGMA journal_mode=WAL")
    raw.execute("CREATE TABLE placeholder(x)")  # the file exists with its page size
    raw.execute("DROP TABLE placeholder")
    raw.close()
    conn = db.connect(path)
    migrations.apply(conn)
    with db.write_txn(conn):
        conn.executemany(
            "INSERT INTO inbox(event_id, topic, time, raw, raw_sha256, incident_key, severity,"
            " outcome, reason, received_at) VALUES (?, 'alerts', ?, ?, '', 'alerts:x', 3,"
            " 'recorded', '', ?)",
            [(f"e{i}", 1_700_000_000 + i, "x" * 300, float(i)) for i in range(events)],
        )
    assert db.page_size(conn) == 4096
    conn.close()
    return path


def test_a_store_made_with_4_kib_pages_is_rewritten_with_2_kib_ones_losing_nothing(
    tmp_path: Path,
) -> None:
    """Kills an upgrade that leaves an existing store on 4 KiB pages for good: a page size
    holds from a file's creation, so only new stores got the smaller pages."""
    path = old_store(tmp_path / "state")
    done = repage(tmp_path / "state")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"rewrote {path}: 4096-byte pages -> 2048-byte pages in ")
    assert done.stderr == ""
    conn = db.connect(path)
    try:
        assert db.page_size(conn) == db.PAGE_SIZE == 2048
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT count(*), max(seq) FROM inbox").fetchone()[:] == (500, 500)
        assert migrations.apply(conn) == []
    finally:
        conn.close()
    again = repage(tmp_path / "state")
    assert again.returncode == 0
    assert again.stdout == f"{path} has 2048-byte pages already: nothing to do\n"


def test_repage_while_a_daemon_holds_the_state_is_refused_and_changes_nothing(
    tmp_path: Path,
) -> None:
    """The rewrite needs the file to itself: with a daemon running, one line and exit 1 (as
    `store copy`: stopping the daemon fixes it, no setting does)."""
    path = old_store(tmp_path / "state")
    before = path.read_bytes()
    fd = os.open(tmp_path / "state" / "daemon.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what a running daemon holds
        refused = repage(tmp_path / "state")
    finally:
        os.close(fd)
    assert refused.returncode == 1
    assert "another ntfy-intake daemon is using" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    assert path.read_bytes() == before


def test_repage_without_a_store_says_so_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    missing = repage(tmp_path / "state")
    assert missing.returncode == 2
    assert "store repage: no database" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
