"""The append-only JSONL audit log: one outcome record per event, durable before the cursor moves.

How a record becomes durable without a second store that can disagree:
1. `stage()` inserts the record into `audit_journal` inside the same SQLite transaction that
   records the outcome, so an outcome and its audit record commit or vanish together;
2. `flush()` appends every journal row above the flushed mark to today's file, flushes, fsyncs,
   then moves the mark (and prunes the journal) in a short transaction;
3. after a crash, `recover()` drops a torn last line, finds which journal rows already reached the
   file (a crash between fsync and moving the mark), and appends only the others.
So each journal row reaches the log exactly once. Files are named by the UTC day they were
written (`audit-YYYY-MM-DD.jsonl`); each line's `ts` is when its outcome was recorded.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sqlite3
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from ntfy_intake import db
from ntfy_intake.errors import AuditWriteError

SCHEMA_VERSION = 1
FLUSHED_KEY = "audit_flushed_seq"
FILE_PREFIX = "audit-"
FILE_SUFFIX = ".jsonl"


@functools.lru_cache(maxsize=256)  # a batch's records all share one timestamp
def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def encode(record: Mapping[str, Any]) -> str:
    """A complete record (`ts` and `kind` first) as the journal stores it; None values dropped."""
    return json.dumps(
        {k: v for k, v in record.items() if v is not None}, separators=(",", ":"), ensure_ascii=True
    )


def stage(conn: sqlite3.Connection, kind: str, now: float, **fields: Any) -> None:
    """Queue one record inside the caller's write transaction."""
    stage_encoded(conn, [encode({"ts": rfc3339(now), "kind": kind, **fields})])


def stage_encoded(conn: sqlite3.Connection, lines: list[str]) -> None:
    """Queue already-encoded records (a batch's, in order) inside the caller's transaction."""
    conn.executemany("INSERT INTO audit_journal(line) VALUES (?)", [(line,) for line in lines])


def _line(seq: int, record_json: str) -> str:
    # The journal stores the record without its envelope; seq and schema version are added here.
    return f'{{"v":{SCHEMA_VERSION},"seq":{seq},{record_json[1:]}\n'


class AuditLog:
    """Appends lines to the day's file; every append ends with flush + fsync or raises."""

    def __init__(self, directory: Path, clock: Callable[[], float]) -> None:
        self.directory = directory
        self._clock = clock
        self._day: str | None = None
        self._file: IO[bytes] | None = None

    def path_for(self, day: str) -> Path:
        return self.directory / f"{FILE_PREFIX}{day}{FILE_SUFFIX}"

    def _open_today(self) -> IO[bytes]:
        day = datetime.fromtimestamp(self._clock(), UTC).strftime("%Y-%m-%d")
        if self._file is None or day != self._day:
            self.close()
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            path = self.path_for(day)
            created = not path.exists()
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            self._file = os.fdopen(fd, "ab")
            self._day = day
            if created:
                _fsync_dir(self.directory)
        return self._file

    def append(self, lines: list[str]) -> None:
        if not lines:
            return
        try:
            handle = self._open_today()
            handle.write("".join(lines).encode("ascii"))
            handle.flush()
            os.fsync(handle.fileno())
        except OSError as exc:
            self.close()
            raise AuditWriteError(f"audit log write failed: {exc.strerror or exc}") from exc

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def flushed_seq(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT value FROM kv WHERE name = ?", (FLUSHED_KEY,)).fetchone()
    return int(row[0]) if row else 0


def _mark_flushed(conn: sqlite3.Connection, seq: int) -> None:
    with db.write_txn(conn):
        conn.execute(
            "INSERT INTO kv(name, value) VALUES (?, ?)"
            " ON CONFLICT(name) DO UPDATE SET value = excluded.value",
            (FLUSHED_KEY, str(seq)),
        )
        conn.execute("DELETE FROM audit_journal WHERE seq <= ?", (seq,))


def flush(conn: sqlite3.Connection, log: AuditLog, *, skip: frozenset[int] = frozenset()) -> int:
    """Write every unflushed journal row to the log; return how many lines were written."""
    mark = flushed_seq(conn)
    rows = conn.execute(
        "SELECT seq, line FROM audit_journal WHERE seq > ? ORDER BY seq", (mark,)
    ).fetchall()
    if not rows:
        return 0
    lines = [_line(seq, line) for seq, line in rows if seq not in skip]
    log.append(lines)
    _mark_flushed(conn, rows[-1][0])
    return len(lines)


def recover(conn: sqlite3.Connection, log: AuditLog) -> int:
    """At startup: repair a torn tail, then write outcomes that reached SQLite but not the log."""
    mark = flushed_seq(conn)
    files = log_files(log.directory)
    for path in files[-2:]:
        _truncate_torn_tail(path)
    present: set[int] = set()
    for path in files[-2:]:
        present.update(_seqs_above(path, mark))
    return flush(conn, log, skip=frozenset(present))


def _truncate_torn_tail(path: Path) -> None:
    """A crash mid-write leaves a last line without its newline; it is still in the journal."""
    with path.open("rb+") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return
        block = 65536
        position = size
        while position > 0:
            start = max(0, position - block)
            handle.seek(start)
            chunk = handle.read(position - start)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                handle.truncate(start + newline + 1)
                break
            position = start
        else:
            handle.truncate(0)
        handle.flush()
        os.fsync(handle.fileno())


def _seqs_above(path: Path, mark: int) -> set[int]:
    """Seqs above `mark` at the end of a file, reading backwards only as far as needed."""
    found: set[int] = set()
    for record in _reverse_records(path):
        seq = record.get("seq")
        if not isinstance(seq, int) or seq <= mark:
            break
        found.add(seq)
    return found


def _reverse_records(path: Path) -> Iterator[Mapping[str, Any]]:
    with path.open("rb") as handle:
        position = handle.seek(0, os.SEEK_END)
        tail = b""
        while position > 0:
            start = max(0, position - 65536)
            handle.seek(start)
            tail = handle.read(position - start) + tail
            position = start
            lines = tail.split(b"\n")
            tail = lines[0]
            for raw in reversed(lines[1:]):
                record = _parse(raw)
                if record is not None:
                    yield record
        record = _parse(tail)
        if record is not None:
            yield record


def _parse(raw: bytes) -> Mapping[str, Any] | None:
    if not raw.strip():
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def log_files(directory: Path) -> list[Path]:
    """The audit files, oldest first. Only regular files: anything else (a device, a FIFO) under
    an audit name is not a log this process wrote, and reading it could block forever."""
    if not directory.exists():
        return []
    return sorted(p for p in directory.glob(f"{FILE_PREFIX}*{FILE_SUFFIX}") if p.is_file())


def read_records(directory: Path, *, since_day: str | None = None) -> Iterator[dict[str, Any]]:
    """Every record in file order, oldest file first; torn or garbled lines are skipped."""
    for path in log_files(directory):
        day = path.name[len(FILE_PREFIX) : -len(FILE_SUFFIX)]
        if since_day is not None and day < since_day:
            continue
        with path.open("rb") as handle:
            for raw in handle:
                record = _parse(raw)
                if record is not None:
                    yield dict(record)
