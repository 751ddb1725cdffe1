"""The append-only JSONL audit log: one outcome record per event, durable before the cursor moves.

How a record becomes durable without a second store that can disagree:
1. `stage()` inserts the record into `audit_journal` inside the same transaction that records
   the outcome, so an outcome and its audit record commit or vanish together;
2. `flush()` appends every journal row the files lack to today's file, flushes, fsyncs, then
   moves the mark in a short transaction (the daemon's: in its next write transaction);
3. after a crash, `recover()` drops a torn last line in every file, finds which journal rows
   already reached a file (a crash between fsync and moving the mark) by `seq` across all files,
   never by file names or the clock, and appends only the others.
While running, the writer knows the highest `seq` in the files, so a mark that fails to move
(SQLite's disk full) never makes a line be written twice, and an append that fails part-way is
cut back to where it began. So each journal row reaches the log exactly once. Files are named by the UTC day they were
written (`audit-YYYY-MM-DD.jsonl`); each line's `ts` is when its outcome was recorded.

The two engines differ in what the journal is (DESIGN.md section 9):
- SQLite: a staging area. What the files lack is what lies above the mark (`audit_flushed_seq`),
  and `flush` prunes the journal up to the mark.
- PostgreSQL: the record every node shares. Each node, leader or standby, mirrors it into its
  own files, so what a node appends is decided by ITS files' highest seq (`AuditLog.last_seq`),
  never by the mark another node wrote: after a failover a node's files continue exactly where
  they stopped. `flush` (the leader, or one daemon alone) still moves the mark, forward only,
  for the readers of it (status, the rebuild's emptiness check), and never prunes: retention
  does, past a window (retention.py). `mirror` (a standby) only reads. Each row keeps the term
  of the leader that wrote it (`conn.term`, 0 when unfenced) and its line carries `"term"` when
  it is above 0. The rows arrive in seq order because every journal insert is made under the
  store's write lock (transaction.write_txn): no row can commit below one already visible.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ntfy_intake.errors import AuditWriteError
from ntfy_intake.rules.timestamps import rfc3339
from ntfy_intake.store import db, dialect, postgres
from ntfy_intake.store.audit_files import (
    FILE_PREFIX,
    FILE_SUFFIX,
    log_files,
    read_records,
    repair_tails,
    seqs_above,
)
from ntfy_intake.store.transaction import Connection, SqliteConnection, ride
from ntfy_intake.wire import jsonsafe

# The files as read back live in audit_files; their names are the audit log's API here too.
__all__ = [
    "FILE_PREFIX",
    "FILE_SUFFIX",
    "FLUSHED_KEY",
    "MIRROR_BATCH",
    "SCHEMA_VERSION",
    "AuditLog",
    "encode",
    "file_line",
    "flush",
    "flushed_seq",
    "journal_seq_at_least",
    "log_files",
    "mark_forward",
    "mirror",
    "read_records",
    "recover",
    "repair_tails",
    "seqs_above",
    "stage",
    "stage_encoded",
    "write_owed_mark",
]

SCHEMA_VERSION = 1
FLUSHED_KEY = "audit_flushed_seq"


# json.dumps(record, separators=(",", ":"), ensure_ascii=True), built once: the same text.
_COMPACT = jsonsafe.compact_encoder(sort_keys=False)


def encode(record: Mapping[str, Any]) -> str:
    """A complete record (`ts` and `kind` first) as the journal stores it; None values dropped."""
    if not isinstance(record, dict) or None in record.values():
        record = {k: v for k, v in record.items() if v is not None}
    return _COMPACT(record)


def stage(conn: Connection, kind: str, now: float, **fields: Any) -> None:
    """Queue one record inside the caller's write transaction."""
    stage_encoded(conn, [encode({"ts": rfc3339(now), "kind": kind, **fields})])


def stage_encoded(conn: Connection, lines: list[str]) -> None:
    """Queue already-encoded records (a batch's, in order) inside the caller's transaction. On
    PostgreSQL each row records the term the transaction is fenced to (0 when unfenced)."""
    if isinstance(conn, postgres.PgConnection):
        if not conn.in_transaction:
            # An autocommitted row could commit above a seq still in flight under the write
            # lock, and every mirror would pass that seq by for good (module doc).
            raise RuntimeError("audit journal rows are staged inside db.write_txn only")
        term = conn.term or 0
        conn.executemany(
            "INSERT INTO audit_journal(line, term) VALUES (?, ?)", [(line, term) for line in lines]
        )
        return
    conn.executemany("INSERT INTO audit_journal(line) VALUES (?)", [(line,) for line in lines])


def file_line(seq: int, record_json: str, term: int = 0) -> str:
    """A journal row as its audit file holds it: the record with its envelope (schema version,
    seq and, for a row written under a leadership term, the term) added in front."""
    if term > 0:
        return f'{{"v":{SCHEMA_VERSION},"seq":{seq},"term":{term},{record_json[1:]}\n'
    return f'{{"v":{SCHEMA_VERSION},"seq":{seq},{record_json[1:]}\n'


class AuditLog:
    """Appends lines to the day's file; every append ends with fsync or raises, leaving no part.

    It knows the highest `seq` actually in the files (`last_seq`): read from the files once
    (across all of them, never by name), then moved by each successful append. A line at or
    below it is never written again, whatever failed after its fsync.

    Before each append the open file's identity is checked against its path. A deleted file is
    re-created and the lines the deleted inode held are carried into it (they exist nowhere
    else); a file replaced by another is reopened as it stands. Either way one line describing
    it waits in `take_replacements()` for the owner notice.
    """

    def __init__(self, directory: Path, clock: Callable[[], float]) -> None:
        self.directory = directory
        self._clock = clock
        self._day: str | None = None
        self._fd: int | None = None
        self._path: Path | None = None
        self._last_seq: int | None = None
        self._suspect = False  # a failed append may have left part of a line behind
        self._replacements: list[str] = []
        # PostgreSQL: the highest mark this process wrote (the store's is forward only, so a
        # flush moves it without reading it first, and not again while the files stand still).
        self.marked = 0

    def path_for(self, day: str) -> Path:
        return self.directory / f"{FILE_PREFIX}{day}{FILE_SUFFIX}"

    @property
    def last_seq(self) -> int:
        """The highest seq in the files, torn tails repaired first (read once, then tracked)."""
        if self._last_seq is None or self._suspect:
            self._last_seq = max(repair_tails(self.directory), self._last_seq or 0)
            self._suspect = False
        return self._last_seq

    def take_replacements(self) -> list[str]:
        taken, self._replacements = self._replacements, []
        return taken

    def _open_today(self) -> int:
        day = datetime.fromtimestamp(self._clock(), UTC).strftime("%Y-%m-%d")
        if self._fd is not None and day == self._day:
            self._check_identity()
        if self._fd is None or day != self._day:
            self.close()
            self._open(self.path_for(day))
            self._day = day
        assert self._fd is not None
        return self._fd

    def _open(self, path: Path) -> None:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        created = not path.exists()
        self._fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        self._path = path
        if created:
            _fsync_dir(self.directory)

    def _check_identity(self) -> None:
        assert self._fd is not None and self._path is not None
        own = os.fstat(self._fd)
        try:
            named = os.stat(self._path)
        except FileNotFoundError:
            named = None
        same = named is not None and (named.st_dev, named.st_ino) == (own.st_dev, own.st_ino)
        if same and own.st_nlink > 0:
            return
        path = self._path
        carried = _read_all(self._fd) if named is None and own.st_nlink == 0 else b""
        self.close()
        self._open(path)
        if carried:
            self._write_all(carried)
        what = "deleted" if named is None else "replaced"
        detail = f"audit file {path.name} was {what} while open; reopened"
        if carried:
            lines = carried.count(b"\n")
            detail += f", {lines} lines it held written again"
        self._replacements.append(detail)

    def _write_all(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        os.fsync(self._fd)

    def append(self, lines: list[str], *, last_seq: int | None = None) -> None:
        """Append whole lines; on failure cut the file back to where it was, so no part stays."""
        if not lines:
            return
        size: int | None = None
        try:
            fd = self._open_today()
            size = os.fstat(fd).st_size
            self._write_all("".join(lines).encode("ascii"))
        except OSError as exc:
            self._cut_back(size)
            self.close()
            raise AuditWriteError(f"audit log write failed: {exc.strerror or exc}") from exc
        if last_seq is not None:
            self._last_seq = max(self._last_seq or 0, last_seq)

    def _cut_back(self, size: int | None) -> None:
        if self._fd is None or size is None:
            return
        try:
            os.ftruncate(self._fd, size)
            os.fsync(self._fd)
        except OSError:
            self._suspect = True  # the tail will be read and repaired before the next append

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def flushed_seq(conn: Connection) -> int:
    """The mark. SQLite: the last seq the files hold, what `flush` appends above. PostgreSQL:
    the highest seq a node's flush or recovery reported written, forward only, for the readers
    of it (status, the rebuild's emptiness check); it decides nothing that a node appends."""
    row = conn.execute("SELECT value FROM kv WHERE name = ?", (FLUSHED_KEY,)).fetchone()
    return int(row[0]) if row else 0


def _mark_flushed(conn: Connection, seq: int) -> None:
    # Every owed write goes first (carry_all): an owed mark, older than this one, left owed
    # and written later would move the mark back.
    with db.write_txn(conn, carry_all=True):
        if dialect.is_postgres(conn):
            # Forward only, and the journal kept: the other nodes still mirror those rows.
            mark_forward(conn, FLUSHED_KEY, seq)
            return
        conn.execute(_MARK_SQLITE, (FLUSHED_KEY, str(seq)))
        conn.execute(_TRIM_SQLITE, (seq,))


_MARK_SQLITE = "INSERT INTO kv(name, value) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = excluded.value"
_TRIM = "audit_journal_trim"  # the rider's name
_TRIM_SQLITE = "DELETE FROM audit_journal WHERE seq <= ?"


def mark_forward(conn: Connection, name: str, seq: int) -> None:
    """Inside a write transaction: the kv mark `name` becomes `seq` unless it is higher already
    (two nodes' writes may land in either order)."""
    conn.execute(_MARK_FORWARD, (name, str(seq)))


_MARK_FORWARD = (
    "INSERT INTO kv(name, value) VALUES (?, ?) ON CONFLICT(name) DO UPDATE"
    " SET value = excluded.value WHERE CAST(kv.value AS BIGINT) < CAST(excluded.value AS BIGINT)"
)


def flush(conn: Connection, log: AuditLog, *, mark_rides: bool = False) -> int:
    """Write every journal row not yet in the files; return how many lines were written.

    Rows at or below `log.last_seq` are in the files already (a mark that failed to move after
    their fsync): they are not written again, only marked. On PostgreSQL that is all that
    decides, whatever mark another node wrote, and the journal is kept (module doc).
    `mark_rides` (the daemon): the mark (on SQLite with the journal's trim) rides the
    connection's next write transaction (transaction.ride) instead of committing in one of its
    own; whoever passes it also writes it when nothing else writes (`write_owed_mark`)."""
    if dialect.is_postgres(conn):
        written = mirror(conn, log)
        if log.last_seq > log.marked:
            forward = (FLUSHED_KEY, str(log.last_seq))
            if not (mark_rides and ride(conn, FLUSHED_KEY, _MARK_FORWARD, forward)):
                _mark_flushed(conn, log.last_seq)
            log.marked = log.last_seq
        return written
    mark = flushed_seq(conn)
    written = log.last_seq
    rows = conn.execute(
        "SELECT seq, line FROM audit_journal WHERE seq > ? ORDER BY seq", (max(mark, written),)
    ).fetchall()
    if rows:
        log.append([file_line(seq, line) for seq, line in rows], last_seq=rows[-1][0])
    top = log.last_seq
    if mark_rides and isinstance(conn, SqliteConnection):
        if rows or (top > mark and FLUSHED_KEY not in conn.riders and _journal_above(conn, mark)):
            # A mark behind the files costs nothing (recovery finds lines by seq): the next
            # write transaction, the next batch's when live, carries it and the trim.
            ride(conn, FLUSHED_KEY, _MARK_SQLITE, (FLUSHED_KEY, str(top)))
            ride(conn, _TRIM, _TRIM_SQLITE, (top,))
        return len(rows)
    if top > mark and _journal_above(conn, mark):
        _mark_flushed(conn, top)
    return len(rows)


def _journal_above(conn: Connection, mark: int) -> bool:
    return bool(
        conn.execute("SELECT 1 FROM audit_journal WHERE seq > ? LIMIT 1", (mark,)).fetchone()
    )


def write_owed_mark(conn: Connection) -> bool:
    """The mark a flush left owed (`flush(mark_rides=True)`), in a write transaction of its own
    without an fsync, when nothing else wrote since; False when none was owed. Whatever else
    rides the connection goes with it."""
    if not isinstance(conn, postgres.PgConnection | SqliteConnection) or not conn.riders:
        return False
    with db.commits_without_fsync(conn), db.write_txn(conn, carry_all=True):
        pass  # the owed mark rides this transaction's opening
    return True


MIRROR_BATCH = 1000  # rows per append (one fsync each) when a node catches up
_ROWS_AFTER = "SELECT seq, line, 0 FROM audit_journal WHERE seq > ? ORDER BY seq LIMIT ?"
_ROWS_AFTER_PG = "SELECT seq, line, term FROM audit_journal WHERE seq > ? ORDER BY seq LIMIT ?"


def mirror(
    conn: Connection, log: AuditLog, *, limit: int | None = None, batch: int = MIRROR_BATCH
) -> int:
    """Append every journal row above `log.last_seq` (the files' own highest seq, torn tails
    repaired first) in seq order, at most `limit` rows, in appends of at most `batch` rows that
    each end with fsync; return how many were appended.

    Only reads the database (a standby runs it on a read-only connection) and moves no mark.
    Safe to stop anywhere: an append that fails is cut back to where it began (or, if that
    fails too or the process dies mid-write, its torn tail is cut before the next read), and the
    next call goes on after the last whole line. A row at or below `log.last_seq` is never
    appended again."""
    if batch < 1:
        raise ValueError("batch must be at least 1")
    select = dialect.pick(conn, sqlite=_ROWS_AFTER, postgresql=_ROWS_AFTER_PG)
    written = 0
    while limit is None or written < limit:
        want = batch if limit is None else min(batch, limit - written)
        rows = conn.execute(select, (log.last_seq, want)).fetchall()
        if rows:
            lines = [file_line(int(seq), line, int(term)) for seq, line, term in rows]
            log.append(lines, last_seq=int(rows[-1][0]))
            written += len(rows)
        if len(rows) < want:
            break
    return written


def recover(conn: Connection, log: AuditLog) -> int:
    """At startup: repair torn tails in every file, then write outcomes that reached the
    database but not the log. What is "already written" is found by seq across all files, never
    by names (on PostgreSQL: every row above the files' own highest seq, module doc)."""
    log.last_seq  # noqa: B018 - repairs every torn tail before anything is read or appended
    if dialect.is_postgres(conn):
        return _recover_shared(conn, log)
    mark = flushed_seq(conn)
    present = seqs_above(log.directory, mark)
    rows = conn.execute(
        "SELECT seq, line FROM audit_journal WHERE seq > ? ORDER BY seq", (mark,)
    ).fetchall()
    missing = [(seq, line) for seq, line in rows if seq not in present]
    if missing:
        log.append([file_line(seq, line) for seq, line in missing], last_seq=missing[-1][0])
    if rows:
        _mark_flushed(conn, max(rows[-1][0], log.last_seq))
    _seq_at_least(conn, log.last_seq)
    return len(missing)


def _recover_shared(conn: Connection, log: AuditLog) -> int:
    """PostgreSQL: the node's files catch up with the journal (`mirror`). Through a connection
    that may write, the mark then moves forward to them and new journal rows number above
    them (a database restored from an older backup); each is written only when needed, and a
    read-only connection (a standby's) writes nothing. Files append in seq order only: a line
    lost below their highest seq (a file deleted while the node was down) is not filled in
    here; audit_mirror.compare names it."""
    written = mirror(conn, log)
    top = log.last_seq
    if isinstance(conn, postgres.PgConnection) and conn.readonly:
        return written
    if top > flushed_seq(conn):
        _mark_flushed(conn, top)
    log.marked = top  # the store's mark is at least that now
    (last,) = conn.execute(_PG_SEQ_LAST).fetchone() or (0,)
    if int(last or 0) < top:
        _seq_at_least(conn, top)
    return written


def _seq_at_least(conn: Connection, seq: int) -> None:
    """New journal rows must number above every line in the files (a rebuilt or restored
    database would otherwise reuse seqs, and a reused seq counts as already written)."""
    if seq <= 0:
        return
    with db.write_txn(conn):
        journal_seq_at_least(conn, seq)


def journal_seq_at_least(conn: Connection, seq: int) -> None:
    """Inside a write transaction: the next journal row numbers above `seq` (SQLite: the
    AUTOINCREMENT counter; PostgreSQL: the identity's sequence, which never moves back)."""
    if dialect.is_postgres(conn):
        conn.execute(_PG_SEQ_AT_LEAST, (seq, seq))
        return
    row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'audit_journal'").fetchone()
    if row is None:
        conn.execute("INSERT INTO sqlite_sequence(name, seq) VALUES ('audit_journal', ?)", (seq,))
    elif row[0] < seq:
        conn.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'audit_journal'", (seq,))


_PG_SEQUENCE = (
    " FROM pg_sequences WHERE schemaname = current_schema()"
    " AND sequencename = 'audit_journal_seq_seq'"
)
_PG_SEQ_LAST = "SELECT coalesce(last_value, 0)" + _PG_SEQUENCE
_PG_SEQ_AT_LEAST = (
    "SELECT setval(pg_get_serial_sequence('audit_journal', 'seq'), ?)"
    + _PG_SEQUENCE
    + " AND coalesce(last_value, 0) < ?"
)
