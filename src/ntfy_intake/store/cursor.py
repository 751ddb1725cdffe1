"""The resume point: what `since=` the next subscription carries, and when it may move.

Rules (DESIGN.md section 3):
- a cursor is the id of a *cached* message event whose outcome and audit record are durable;
  before any such event exists it is a join time (`since=<unix seconds>`, inclusive) or `all`;
- ntfy may deliver a message after a later one (live order is not guaranteed, and a replay is
  sorted by time, not insertion), and `since=<id>` is exclusive by insertion order. So the cursor
  lags: an event becomes the resume point only once `reorder_window` has passed since it was read
  off the socket, by which time anything delivered out of order around it has arrived and been
  recorded too. The lagging overlap replays on restart and the inbox absorbs it as duplicates.
- the id cursor alone misses what ntfy makes visible out of insertion order (scheduled messages,
  cache writes that lag the live publish, reorders longer than the window): after every `open`
  an overlap backfill polls `since=<T>` by server time. T is persisted when the connection opens
  (`owe_backfill`) and cleared only with the poll's recorded events (`backfill_done`), so a crash
  or a failed poll leaves it owed, never recomputed from a newer cursor.
`ResumePoint` and the window arithmetic are pure; `load`/`save`/`owe_backfill` are the SQLite edge.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

from ntfy_intake.store import db
from ntfy_intake.store.transaction import Connection, ride

Kind = Literal["id", "time", "all"]


@dataclass(frozen=True, slots=True)
class Cursor:
    kind: Kind
    value: str  # the message id, the unix seconds, or "all"
    message_time: int | None = None  # ntfy `time` of the cursor message (for the gap window)

    @property
    def since(self) -> str:
        return self.value

    @classmethod
    def at_id(cls, event_id: str, message_time: int) -> Cursor:
        return cls("id", event_id, message_time)

    @classmethod
    def at_time(cls, unix_seconds: int) -> Cursor:
        return cls("time", str(unix_seconds))

    @classmethod
    def everything(cls) -> Cursor:
        return cls("all", "all")


@dataclass(frozen=True, slots=True)
class Resume:
    """What a (re)subscribe starts from: the cursor, and what the last connection left owed."""

    cursor: Cursor
    backfill_from: int | None  # owed overlap backfill: poll since this server time
    backfill_epoch: int
    last_frame_time: int | None  # server time of the last frame seen (keepalives count)
    gap_from: int | None  # a gap check owed: the cursor was gone, window starts here


@dataclass(frozen=True, slots=True)
class Owed:
    """The backfill this connection owes, as persisted when it opened."""

    since: int
    epoch: int
    gap_from: int | None


def backfill_since(cursor: Cursor, open_time: int, overlap: float) -> int:
    """T: the older of the cursor message's time and the `open` frame's time, minus overlap."""
    times = [open_time]
    if cursor.kind == "id" and cursor.message_time is not None:
        times.append(cursor.message_time)
    elif cursor.kind == "time":
        times.append(int(cursor.value))
    return min(times) - int(overlap)


def gap_window(
    gap_from: int,
    open_time: int,
    held: list[tuple[int, int | None]],
    cache_duration: float,
    cursor_time: int | None = None,
) -> tuple[int, int] | None:
    """What may be lost after the server dropped the cursor message, or None if nothing can be.

    `held` is (time, expires) of every message the backfill found. A server that prunes only by
    `expires` (= time + its cache duration; the shortest it shows us bounds it, so a daemon
    configured longer than the server cannot hide a loss) still holds anything published after
    the oldest held message and anything younger than that duration: only what came after the
    last frame seen and before both bounds can be gone. But when the cursor message itself was
    young enough to be held (`cursor_time` + duration still ahead of `open`), the server lost
    what it should have kept (restarted without its cache, evicted): then only the messages it
    does hold bound the window."""
    durations = [expires - at for at, expires in held if expires is not None]
    duration = int(min([cache_duration, *durations]))
    lost_early = cursor_time is not None and cursor_time + duration > open_time
    end = open_time if lost_early else open_time - duration
    if held:
        end = min([end, *(at for at, _ in held)])
    return (gap_from, end) if end > gap_from else None


def load_resume(conn: Connection) -> Resume | None:
    row = conn.execute(
        "SELECT kind, value, message_time, backfill_from, backfill_epoch, last_frame_time,"
        " gap_from FROM cursor WHERE id = 1"
    ).fetchone()
    if row is None:
        return None
    return Resume(Cursor(row[0], row[1], row[2]), row[3], row[4], row[5], row[6])


def owe_backfill(conn: Connection, since: int, gap_from: int | None, now: float) -> Owed:
    """Persist the backfill this connection owes; an older one still owed is kept (min)."""
    with db.write_txn(conn):
        row = conn.execute(
            "UPDATE cursor SET backfill_from = CASE WHEN backfill_from < ? THEN backfill_from ELSE ? END,"
            " backfill_epoch = backfill_epoch + 1,"
            " gap_from = coalesce(gap_from, ?), updated_at = ? WHERE id = 1"
            " RETURNING backfill_from, backfill_epoch, gap_from",
            (since, since, gap_from, now),  # NULL < x is not true: NULL takes `since`
        ).fetchone()
    return Owed(row[0], row[1], row[2])


def backfill_done(conn: Connection, owed: Owed) -> bool:
    """Inside the transaction that recorded the poll's events: nothing owed any more, unless a
    newer connection has opened since (it owes its own poll)."""
    return (
        conn.execute(
            "UPDATE cursor SET backfill_from = NULL, gap_from = NULL"
            " WHERE id = 1 AND backfill_epoch = ?",
            (owed.epoch,),
        ).rowcount
        == 1
    )


_SAVE_FRAME_TIME = (
    "UPDATE cursor SET last_frame_time = ? WHERE id = 1"
    " AND (last_frame_time IS NULL OR last_frame_time < ?)"
)


def save_last_frame_time(conn: Connection, server_time: int) -> None:
    with db.write_txn(conn):
        conn.execute(_SAVE_FRAME_TIME, (server_time, server_time))


def owe_last_frame_time(conn: Connection, server_time: int) -> bool:
    """The last frame's time, owed to the connection's next write transaction (the next batch's
    while events flow; the ticker's owed write otherwise): lagging only widens a gap's window.
    False when `conn` carries no owed writes (the caller saves it in its own transaction)."""
    return ride(conn, "last_frame_time", _SAVE_FRAME_TIME, (server_time, server_time))


def load(conn: Connection) -> Cursor | None:
    row = conn.execute("SELECT kind, value, message_time FROM cursor WHERE id = 1").fetchone()
    return None if row is None else Cursor(row[0], row[1], row[2])


def save(conn: Connection, cursor: Cursor, now: float) -> None:
    """The cursor, at once (a drain, a handover). Whatever is owed goes first (carry_all): an
    owed cursor, older than this one, written after it would move it back."""
    with db.write_txn(conn, carry_all=True):
        conn.execute(_SAVE, (cursor.kind, cursor.value, cursor.message_time, now))


def owe(conn: Connection, cursor: Cursor, now: float) -> bool:
    """The cursor, owed to the connection's next write transaction (the next batch's while
    events flow; the ticker's unsynced owed write otherwise): a lost or late save only resumes
    a restart earlier, and the inbox absorbs what is read again. A lone alert's store costs one
    fsync, its batch's, not two. False when `conn` carries no owed writes (the caller saves)."""
    return ride(conn, "cursor", _SAVE, (cursor.kind, cursor.value, cursor.message_time, now))


_SAVE = (
    "INSERT INTO cursor(id, kind, value, message_time, updated_at) VALUES (1, ?, ?, ?, ?)"
    " ON CONFLICT(id) DO UPDATE SET kind = excluded.kind, value = excluded.value,"
    " message_time = excluded.message_time, updated_at = excluded.updated_at"
)


@dataclass(frozen=True, slots=True)
class _Pending:
    event_id: str
    message_time: int
    cached: bool
    read_at: float  # monotonic time the frame was read off the socket


class ResumePoint:
    """Events made durable, in delivery order, waiting out the reorder window.

    Each connection is a generation. When a connection is lost, a message delivered out of order
    may never have arrived on it, so its unsettled events must not become the cursor later: they
    are forgotten, and the next connection (resuming from the persisted, older cursor) replays
    them. Events of an old generation that become durable afterwards are ignored for the same
    reason.
    """

    def __init__(self, reorder_window: float) -> None:
        self.reorder_window = reorder_window
        self.generation = 0
        self._pending: deque[_Pending] = deque()

    def durable(
        self, event_id: str, message_time: int, *, cached: bool, read_at: float, generation: int
    ) -> None:
        """Record that this event's outcome and audit line are durable."""
        if generation == self.generation:
            self._pending.append(_Pending(event_id, message_time, cached, read_at))

    def settle(self, now: float) -> Cursor | None:
        """The newest cursor the window allows, or None when it may not move yet."""
        newest: Cursor | None = None
        while self._pending and self._pending[0].read_at + self.reorder_window <= now:
            item = self._pending.popleft()
            if item.cached:
                newest = Cursor.at_id(item.event_id, item.message_time)
        return newest

    def connection_lost(self) -> int:
        """Start a new generation; return it."""
        self.generation += 1
        self._pending.clear()
        return self.generation

    @property
    def oldest_read_at(self) -> float | None:
        return self._pending[0].read_at if self._pending else None

    def __len__(self) -> int:
        return len(self._pending)
