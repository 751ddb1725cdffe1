"""The resume point: what `since=` the next subscription carries, and when it may move.

Rules (DESIGN.md section 3):
- a cursor is the id of a *cached* message event whose outcome and audit record are durable;
  before any such event exists it is a join time (`since=<unix seconds>`, inclusive) or `all`;
- ntfy may deliver a message after a later one (live order is not guaranteed, and a replay is
  sorted by time, not insertion), and `since=<id>` is exclusive by insertion order. So the cursor
  lags: an event becomes the resume point only once `reorder_window` has passed since it was read
  off the socket, by which time anything delivered out of order around it has arrived and been
  recorded too. The lagging overlap replays on restart and the inbox absorbs it as duplicates.
`ResumePoint` is pure (monotonic times passed in); `load`/`save` are the SQLite edge.
"""

from __future__ import annotations

import sqlite3
from collections import deque
from dataclasses import dataclass
from typing import Literal

from ntfy_intake import db

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


def load(conn: sqlite3.Connection) -> Cursor | None:
    row = conn.execute("SELECT kind, value, message_time FROM cursor WHERE id = 1").fetchone()
    return None if row is None else Cursor(row[0], row[1], row[2])


def save(conn: sqlite3.Connection, cursor: Cursor, now: float) -> None:
    with db.write_txn(conn):
        conn.execute(
            "INSERT INTO cursor(id, kind, value, message_time, updated_at) VALUES (1, ?, ?, ?, ?)"
            " ON CONFLICT(id) DO UPDATE SET kind = excluded.kind, value = excluded.value,"
            " message_time = excluded.message_time, updated_at = excluded.updated_at",
            (cursor.kind, cursor.value, cursor.message_time, now),
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
