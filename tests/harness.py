"""Test harness: the daemon in a background thread (in-process) or as a real subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ntfy_intake import settings
from ntfy_intake.runtime.daemon import Daemon
from ntfy_intake.store import audit, db

TOPICS = "alerts,backups"
# The PostgreSQL DSN of the running test's own schema, or None on SQLite (conftest's `engine`).
DATABASE: str | None = None


def wait_until(
    predicate: Callable[[], object], timeout: float = 30.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def env_for(ntfy_url: str, state_dir: Path, **overrides: str) -> dict[str, str]:
    env = {
        "NTFY_INTAKE_NTFY_URL": ntfy_url,
        "NTFY_INTAKE_NTFY_TOPICS": TOPICS,
        "NTFY_INTAKE_STATE_DIR": str(state_dir),
        "NTFY_INTAKE_NTFY_KEEPALIVE_INTERVAL": "1s",
        "NTFY_INTAKE_NTFY_REORDER_WINDOW": "300ms",
        "NTFY_INTAKE_HTTP_LISTEN": "127.0.0.1:0",
    }
    if DATABASE is not None:
        env["NTFY_INTAKE_STATE_DATABASE"] = DATABASE
    env.update({f"NTFY_INTAKE_{k.upper()}": v for k, v in overrides.items()})
    return env


def settings_for(ntfy_url: str, state_dir: Path, **overrides: str) -> settings.Settings:
    return settings.load(None, env_for(ntfy_url, state_dir, **overrides))


class DaemonThread:
    """The real daemon on its own event loop in a thread; `stop()` is a graceful SIGTERM."""

    def __init__(self, config: settings.Settings, **daemon_kwargs: Any) -> None:
        self.config = config
        self.kwargs = {"backoff_base": 0.05, "relay_retry_base": 0.05, **daemon_kwargs}
        self.daemon: Daemon | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self.error: BaseException | None = None

    def start(self) -> DaemonThread:
        self.daemon = Daemon(self.config, **self.kwargs)
        self._started.clear()
        self._thread = threading.Thread(target=self._main, name="daemon", daemon=True)
        self._thread.start()
        assert self._started.wait(10), "daemon did not start"
        return self

    def _main(self) -> None:
        async def main() -> None:
            assert self.daemon is not None
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self._started.set()
            await self.daemon.run(self._stop)

        try:
            asyncio.run(main())
        except BaseException as exc:  # surfaced by stop()
            self.error = exc
            self._started.set()

    def stop(self, timeout: float = 20.0) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "daemon did not stop"
        self._thread = None
        if self.error is not None:
            raise self.error

    def __enter__(self) -> DaemonThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def daemon_process(
    env: Mapping[str, str],
    *,
    extra_env: Mapping[str, str] | None = None,
    stdout: Any = subprocess.DEVNULL,
) -> Iterator[subprocess.Popen[bytes]]:
    """`ntfy-intake run` as a real subprocess; always killed by pid on the way out."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
    full_env.update(env)
    full_env.update(extra_env or {})
    proc = subprocess.Popen(
        [sys.executable, "-m", "ntfy_intake", "run"],
        env=full_env,
        stdout=stdout,
        stderr=subprocess.PIPE,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()


def audit_records(state_dir: Path) -> list[dict[str, Any]]:
    return list(audit.read_records(state_dir / "audit"))


def event_ids(state_dir: Path) -> list[str]:
    return [r["event_id"] for r in audit_records(state_dir) if r["kind"] == "event"]


def notices(state_dir: Path, kind: str | None = None) -> list[dict[str, Any]]:
    return [
        r
        for r in audit_records(state_dir)
        if r["kind"] == "notice" and (kind is None or r["notice"] == kind)
    ]


def store_of(state_dir: Path) -> Path | str:
    """The store a test's daemon with this state dir uses, on the test's engine: the DSN as a
    string on PostgreSQL (`str(db.Dsn)` leaves out the password and the options that name the
    test's schema, so a child process handed one would open another store)."""
    return DATABASE if DATABASE else state_dir / "intake.sqlite3"


def query(state_dir: Path, sql: str, *params: object) -> list[tuple[Any, ...]]:
    if DATABASE is not None:
        pg = db.connect(DATABASE, readonly=True)
        try:
            return [tuple(row) for row in pg.execute(sql, params)]
        finally:
            pg.close()
    conn = sqlite3.connect(f"file:{state_dir / 'intake.sqlite3'}?mode=ro", uri=True, timeout=10)
    try:
        return [tuple(row) for row in conn.execute(sql, params)]
    finally:
        conn.close()


def cursor_row(state_dir: Path) -> tuple[str, str]:
    (row,) = query(state_dir, "SELECT kind, value FROM cursor")
    return row[0], row[1]


def stream_sinces(subscribe_log: list[dict[str, Any]]) -> list[str | None]:
    """The `since` of every streaming (non-poll) subscribe request, in order."""
    return [e["params"].get("since") for e in subscribe_log if not e["params"].get("poll")]


def dumps(obj: object) -> str:
    return json.dumps(obj, sort_keys=True)


CHILD_WAIT = 60.0


class Child:
    """A subprocess whose stdout lines can be awaited with a bound (never a fixed sleep)."""

    def __init__(self, proc: subprocess.Popen[str], stderr_path: Path) -> None:
        self.proc = proc
        self.stderr_path = stderr_path
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))

    def expect_line(self, timeout: float = CHILD_WAIT) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                return self._lines.get(timeout=0.1)
            except queue.Empty:
                if self.proc.poll() is not None:  # died: drain what it said, then fail fast
                    self._reader.join(timeout=CHILD_WAIT)
                    try:
                        return self._lines.get_nowait()
                    except queue.Empty:
                        break
        stderr = self.stderr_path.read_text(errors="replace")
        raise AssertionError(
            f"child {self.proc.pid} gave no line (rc={self.proc.poll()}):\n{stderr}"
        )

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=CHILD_WAIT)
        self._reader.join(timeout=CHILD_WAIT)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


class CommitFaults:
    """Fails the COMMIT of chosen write transactions, as an fsync failing with EIO would: the
    transaction rolls back whole and the error is a transient one, which the daemon waits out
    by running the same work again (`Database.run`).

    A transaction is chosen by the function that opened it: `fail_once("Relay._settle_and_claim")`
    fails the next transaction opened while that function (by `__qualname__`) is on the stack,
    `skip=n` lets the first n of them commit. Every module calls `db.write_txn` through the
    module, so patching it there reaches them all.
    """

    ERROR = "disk I/O error"

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._armed: dict[str, list[int]] = {}  # site -> [transactions to skip, to fail]
        self.fired: list[str] = []
        real = db.write_txn

        @contextmanager
        def write_txn(conn: sqlite3.Connection, **kwargs: Any) -> Iterator[Any]:
            site = self._take(sys._getframe(1))
            before_commit = kwargs.pop("before_commit", None)

            def commit_fault() -> None:
                if before_commit is not None:
                    before_commit()
                if site is not None:
                    self.fired.append(site)
                    raise sqlite3.OperationalError(self.ERROR)

            with real(conn, before_commit=commit_fault, **kwargs) as txn:
                yield txn

        monkeypatch.setattr(db, "write_txn", write_txn)

    def fail_once(self, within: str, *, skip: int = 0) -> None:
        self._armed[within] = [skip, 1]

    @property
    def armed(self) -> bool:
        return any(left for _, left in self._armed.values())

    def _take(self, frame: Any) -> str | None:
        while frame is not None:
            name = str(frame.f_code.co_qualname)
            counts = self._armed.get(name)
            if counts is not None and counts[1] > 0:
                if counts[0] > 0:
                    counts[0] -= 1
                    return None
                counts[1] -= 1
                return name
            frame = frame.f_back
        return None


def target_arg(target: db.Target) -> str:
    """`target` as a child process's argument: the full DSN (its search path names the test's
    schema; `str(Dsn)` leaves that out, with the password), or the file's path."""
    return target.conninfo if isinstance(target, db.Dsn) else str(target)


def store_arg(state_dir: Path) -> str:
    """`store_of(state_dir)` as a child process's argument (`target_arg`)."""
    return target_arg(store_of(state_dir))


def wipe_store(state_dir: Path) -> None:
    """The store lost, its audit log kept: the SQLite file (and its WAL) deleted, or every table
    of the test's PostgreSQL schema dropped (the schema left empty, as a new database is)."""
    if DATABASE is None:
        for name in ("intake.sqlite3", "intake.sqlite3-wal", "intake.sqlite3-shm"):
            (state_dir / name).unlink(missing_ok=True)
        return
    conn = db.connect(DATABASE)
    try:
        (schema,) = conn.execute("SELECT current_schema()").fetchone()
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        conn.execute(f'CREATE SCHEMA "{schema}"')
    finally:
        conn.close()


@contextmanager
def separate_store(directory: Path) -> Iterator[db.Target]:
    """A second, empty store for a test that needs more than one: `directory`'s SQLite file, or
    a schema of its own on the test's PostgreSQL server (dropped on the way out)."""
    if DATABASE is None:
        yield directory / "intake.sqlite3"
        return
    from . import engines  # noqa: PLC0415 - engines imports nothing from here

    server = engines.server_dsn()
    assert server is not None
    schema, dsn = engines.create_schema(server)
    try:
        yield db.Dsn(dsn)
    finally:
        engines.drop_schema(server, schema)


def store_exists(state_dir: Path) -> bool:
    """Whether the daemon has created its store yet: the SQLite file, or the migrations' ledger
    in the test's PostgreSQL schema."""
    if DATABASE is None:
        return (state_dir / "intake.sqlite3").exists()
    conn = db.connect(DATABASE, readonly=True)
    try:
        (found,) = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
        return bool(found)
    finally:
        conn.close()


def engine_fault(kind: str) -> Exception:
    """The error the test's engine's driver raises for a storage fault `kind` ("locked",
    "disk_full", "io"): sqlite3's message, or psycopg's class for PostgreSQL's SQLSTATE, so an
    injected fault goes through the same classification (storage.classify) a real one does."""
    if DATABASE is None:
        text = {"locked": "database is locked", "disk_full": "database or disk is full"}
        return sqlite3.OperationalError(text.get(kind, "disk I/O error"))
    from psycopg import errors  # noqa: PLC0415 - only on PostgreSQL

    if kind == "locked":
        return errors.LockNotAvailable("canceling statement due to lock timeout")
    if kind == "disk_full":
        return errors.DiskFull("could not extend file: No space left on device")
    return errors.IoError("could not fsync file: Input/output error")
