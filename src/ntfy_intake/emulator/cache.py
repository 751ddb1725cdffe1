"""The message cache: ntfy's `messages` table, in memory.

Not thread-safe on its own: the hub's lock guards every call. Invariants owned here
(ntfy-spec.md sections 2.2, 2.3, 4.2, 10):
- one global, monotonically increasing row id across all topics (AUTOINCREMENT: never reused);
- `since=<id>` looks the id up in every topic and returns rows with a larger row id (exclusive);
  a well-formed id that is not stored means "all";
- per topic, replay is ordered by (time, row id); several topics are concatenated and then sorted by
  time with a *stable* sort (Go's sort.Slice is not stable: the emulator picks one legal order);
- `latest` is the newest row per topic by (time, row id); time forms are inclusive (`time >= t`);
- pruning deletes rows whose `expires <= now`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ntfy_intake.emulator.since import ALL, Since
from ntfy_intake.emulator.wire import Event


@dataclass(frozen=True)
class Row:
    rowid: int
    event: Event


class MessageCache:
    """Cached `message` events in insertion order. `enabled=False` is ntfy's no-op cache."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self._rows: list[Row] = []
        self._last_rowid = 0

    def add(self, event: Event) -> int | None:
        """Store one event; returns its row id (None when the cache is disabled)."""
        if not self.enabled:
            return None
        self._last_rowid += 1
        self._rows.append(Row(self._last_rowid, event))
        return self._last_rowid

    def rowid(self, message_id: str) -> int | None:
        """The row id of a message id in any topic (the first one, should an id repeat)."""
        return next((row.rowid for row in self._rows if row.event.id == message_id), None)

    def rows(self, topic: str | None = None) -> list[Row]:
        return [row for row in self._rows if topic is None or row.event.topic == topic]

    def select(self, topic: str, since: Since) -> list[Row]:
        """messageCache.Messages for one topic (scheduled messages do not exist here)."""
        if since.is_none():
            return []
        rows = self.rows(topic)
        if since.is_latest():
            newest = max(rows, key=lambda row: (row.event.time, row.rowid), default=None)
            return [] if newest is None else [newest]
        if since.is_id():
            cursor = self.rowid(since.id)
            if cursor is None:
                return self.select(topic, ALL)
            chosen = [row for row in rows if row.rowid > cursor]
        else:
            chosen = [row for row in rows if row.event.time >= since.time]
        return sorted(chosen, key=lambda row: (row.event.time, row.rowid))

    def replay(self, topics: Sequence[str], since: Since) -> list[Row]:
        """sendOldMessages: per-topic lists concatenated (a repeated topic twice), sorted by time."""
        if since.is_none():
            return []
        rows = [row for topic in topics for row in self.select(topic, since)]
        return sorted(rows, key=lambda row: row.event.time)

    def expired(self, now: int) -> list[str]:
        return [row.event.id for row in self._rows if row.event.expires <= now]

    def remove(self, ids: Iterable[str] | None = None) -> list[str]:
        """Delete rows by message id (all rows when ids is None); returns the ids removed."""
        if ids is None:
            removed = [row.event.id for row in self._rows]
            self._rows = []
            return removed
        wanted = set(ids)
        removed = [row.event.id for row in self._rows if row.event.id in wanted]
        self._rows = [row for row in self._rows if row.event.id not in wanted]
        return removed
