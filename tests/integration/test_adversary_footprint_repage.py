"""Adversary of `ntfy-intake store repage` (35e6133): a full disk, a reader holding the file, a
WAL a killed writer left uncheckpointed, a kill -9 mid-rewrite, a daemon started meanwhile, a
read-only state dir, a store made before migration 0014. The promise: the file is as it was or
rewritten whole, never half; a refusal is one line, never a traceback."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from ntfy_intake.runtime.recovery import StateLock
from ntfy_intake.settings import load
from ntfy_intake.store import db, migrations
from ntfy_intake.surfaces import store_cli

from .test_store_repage import old_store, repage

pytestmark = pytest.mark.sqlite_only(reason="pages are a SQLite file's")


def contents(path: Path) -> tuple[int, str, str, int, int]:
    conn = sqlite3.connect(path)
    try:
        return (
            int(conn.execute("PRAGMA page_size").fetchone()[0]),
            str(conn.execute("PRAGMA journal_mode").fetchone()[0]),
            str(conn.execute("PRAGMA integrity_check").fetchone()[0]),
            int(conn.execute("SELECT count(*) FROM inbox").fetchone()[0]),
            int(conn.execute("SELECT coalesce(max(seq), 0) FROM inbox").fetchone()[0]),
        )
    finally:
        conn.close()


def one_line(done: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_repage_past_the_file_size_limit_leaves_the_store_as_it_was(tmp_path: Path) -> None:
    """A disk that fills during the VACUUM (here: RLIMIT_FSIZE, EFBIG on every file): one line,
    a failing exit, the store whole on 4 KiB pages in WAL, and the next repage with room done."""
    path = old_store(tmp_path / "state", events=3000)
    size = path.stat().st_size
    for fsize in (size // 2, size + 4096):
        failed = repage(tmp_path / "state", fsize=fsize)
        assert failed.returncode != 0 and failed.stdout == ""
        one_line(failed)
        assert contents(path) == (4096, "wal", "ok", 3000, 3000)
    done = repage(tmp_path / "state")
    assert done.returncode == 0, done.stderr
    assert contents(path) == (2048, "wal", "ok", 3000, 3000)


@contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip("needs a tmpfs mount (root)")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


@pytest.mark.parametrize("room_kib", [0, 64, 700])
def test_repage_on_a_full_disk_leaves_the_store_as_it_was(tmp_path: Path, room_kib: int) -> None:
    """ENOSPC on the state dir's own file system (a small tmpfs filled up to `room_kib`): the
    rollback journal or the rewrite runs out; the file must be whole, in WAL, on its old pages."""
    with small_tmpfs(tmp_path / "mnt", "8m") as mnt:
        path = old_store(mnt / "state", events=3000)
        room = os.statvfs(mnt)
        filler = mnt / "filler"
        with suppress(OSError), filler.open("wb") as out:  # full: ENOSPC, as meant
            out.write(b"\0" * max(0, room.f_bavail * room.f_frsize - room_kib * 1024))
        failed = repage(mnt / "state")
        assert failed.returncode != 0, failed.stdout
        one_line(failed)
        filler.unlink()  # room for the look's own -shm, then the look
        assert contents(path) == (4096, "wal", "ok", 3000, 3000)
        done = repage(mnt / "state")
        assert done.returncode == 0, done.stderr
        assert contents(path) == (2048, "wal", "ok", 3000, 3000)


def test_repage_while_a_reader_holds_the_file_is_refused_in_one_line(tmp_path: Path) -> None:
    """`status` or an agent's `feed pull` (no daemon lock) has the file open: leaving WAL needs
    it alone. One line, nothing changed, never '4096-byte pages -> 4096-byte pages'."""
    path = old_store(tmp_path / "state", events=200)
    reader = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM inbox").fetchone()
        refused = repage(tmp_path / "state")
    finally:
        reader.close()
    assert refused.returncode != 0 and refused.stdout == ""
    one_line(refused)
    assert contents(path) == (4096, "wal", "ok", 200, 200)


def test_frames_a_killed_writer_left_in_the_wal_survive_the_rewrite(tmp_path: Path) -> None:
    """A daemon killed with a WAL not yet checkpointed: its last commits live only in the WAL;
    the rewrite must take them into the new file."""
    path = old_store(tmp_path / "state", events=100)
    writer = (
        "import os, signal, sqlite3\n"
        f"c = sqlite3.connect({str(path)!r}, isolation_level=None)\n"
        "c.execute('PRAGMA wal_autocheckpoint=0')\n"
        "c.execute('BEGIN IMMEDIATE')\n"
        "c.executemany(\"INSERT INTO kv(name, value) VALUES (?, 'v')\","
        " [(f'k{i}',) for i in range(500)])\n"
        "c.execute('COMMIT')\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    subprocess.run([sys.executable, "-c", writer], check=False, timeout=60)
    assert Path(f"{path}-wal").stat().st_size > 0
    done = repage(tmp_path / "state")
    assert done.returncode == 0, done.stderr
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT count(*) FROM kv WHERE name LIKE 'k%'").fetchone()[0] == 500
    finally:
        conn.close()
    assert contents(path) == (2048, "wal", "ok", 100, 100)


@pytest.mark.parametrize("after_s", [0.15, 0.35, 0.6])
def test_kill9_during_repage_leaves_a_whole_store(tmp_path: Path, after_s: float) -> None:
    """A power cut or kill -9 while the VACUUM rewrites (journal_mode DELETE at that moment: a
    hot rollback journal): the next open rolls back or finds the rewrite done, every row there."""
    path = old_store(tmp_path / "state", events=40_000)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
    env["NTFY_INTAKE_STATE_DIR"] = str(tmp_path / "state")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ntfy_intake", "store", "repage"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        seen = time.monotonic()
        while not Path(f"{path}-journal").exists() and proc.poll() is None:
            if time.monotonic() - seen > 60:
                break
            time.sleep(0.001)
        journal = Path(f"{path}-journal").exists()
        time.sleep(after_s * 0.1)
    finally:
        alive = proc.poll() is None
        if alive:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    assert journal and alive, "killed outside the rewrite: the test saw nothing"
    conn = db.connect(path)  # what the daemon's next start does first
    try:
        assert db.page_size(conn) in (4096, 2048)
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT count(*), max(seq) FROM inbox").fetchone()[:] == (
            40_000,
            40_000,
        )
        assert migrations.apply(conn) == []
    finally:
        conn.close()
    done = repage(tmp_path / "state")
    assert done.returncode == 0, done.stderr
    assert contents(path)[:3] == (2048, "wal", "ok")


def test_a_daemon_started_while_repage_runs_is_refused_and_the_rewrite_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """systemd restarting the daemon in the middle of a repage: the lock keeps it out (one
    line), and the rewrite is not disturbed."""
    state = tmp_path / "state"
    path = old_store(state, events=500)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
    env.update(
        {
            "NTFY_INTAKE_STATE_DIR": str(state),
            "NTFY_INTAKE_NTFY_URL": "http://127.0.0.1:9",
            "NTFY_INTAKE_NTFY_TOPICS": "alerts",
            "NTFY_INTAKE_HTTP_LISTEN": "127.0.0.1:0",
        }
    )
    started: list[subprocess.CompletedProcess[str]] = []
    original = db.repage

    def repage_with_a_daemon_starting(conn: db.Connection, size: int = db.PAGE_SIZE) -> None:
        started.append(
            subprocess.run(
                [sys.executable, "-m", "ntfy_intake", "run"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        )
        original(conn, size)

    monkeypatch.setattr(db, "repage", repage_with_a_daemon_starting)
    settings = load(None, {"NTFY_INTAKE_STATE_DIR": str(state)}, need_ntfy=False)
    assert store_cli.repage(settings, StateLock(state / "daemon.lock")) == 0
    (daemon,) = started
    assert daemon.returncode != 0
    assert "another ntfy-intake daemon is using" in daemon.stderr
    assert "Traceback" not in daemon.stderr
    assert contents(path) == (2048, "wal", "ok", 500, 500)


@contextmanager
def read_only(directory: Path) -> Iterator[None]:
    bound = subprocess.run(
        ["mount", "--bind", str(directory), str(directory)], capture_output=True, check=False
    )
    if bound.returncode != 0:
        pytest.skip("needs a bind mount (root)")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(directory)], check=True)
        yield
    finally:
        subprocess.run(["umount", str(directory)], check=True)


def test_repage_on_a_read_only_state_dir_says_so_in_one_line(tmp_path: Path) -> None:
    """A state dir mounted read-only (a Pi's SD card remounted ro after errors): one line, no
    traceback, the file unchanged."""
    state = tmp_path / "state"
    path = old_store(state, events=50)
    before = path.read_bytes()
    with read_only(state):
        refused = repage(state)
    assert path.read_bytes() == before
    assert refused.returncode != 0
    one_line(refused)


def test_a_store_made_before_0014_repaged_then_migrated_keeps_its_outbox_links(
    tmp_path: Path,
) -> None:
    """An old version's 4 KiB store, its ledger at 0013: repage, then the next start's
    migrations (0014 rebuilds outbox_events WITHOUT ROWID in the new pages) keep every link."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    path = state / "intake.sqlite3"
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA page_size=4096")
    raw.execute("PRAGMA journal_mode=WAL")
    raw.close()
    conn = db.connect(path)
    names = [name for name, _ in migrations.SQLITE]
    migrations.apply(conn, migrations.SQLITE[: names.index("0014_fewer_pages_per_event")])
    with db.write_txn(conn):
        for d in range(50):
            conn.execute(
                "INSERT INTO outbox(delivery_key, incident_key, reason, state, due_at,"
                " created_at) VALUES (?, 'alerts:x', 'new', 'collecting', 1, 1)",
                (f"d{d}",),
            )
            conn.executemany(
                "INSERT INTO outbox_events(delivery_key, event_id) VALUES (?, ?)",
                [(f"d{d}", f"e{d}x{e}") for e in range(20)],
            )
    conn.close()
    done = repage(state)
    assert done.returncode == 0, done.stderr
    conn = db.connect(path)
    try:
        assert db.page_size(conn) == 2048
        assert migrations.apply(conn) == names[names.index("0014_fewer_pages_per_event") :]
        assert conn.execute("SELECT count(*) FROM outbox_events").fetchone()[0] == 1000
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    finally:
        conn.close()


def test_repage_on_a_postgresql_store_says_so_without_the_password(tmp_path: Path) -> None:
    """Pages are a SQLite file's: one line, exit 2, and the DSN's password never printed."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
    env["NTFY_INTAKE_STATE_DIR"] = str(state)
    env["NTFY_INTAKE_STATE_DATABASE"] = "postgresql://intake:s3cr%40t-pw@127.0.0.1:9/intake"
    done = subprocess.run(
        [sys.executable, "-m", "ntfy_intake", "store", "repage"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    one_line(done)
    assert "PostgreSQL" in done.stderr
    assert "s3cr" not in done.stderr + done.stdout
