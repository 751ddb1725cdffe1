"""The message cache: ntfy's `messages` table, in memory.

Not thread-safe on its own: the hub's lock guards every call. Invariants owned here
(ntfy-spec.md sections 2.2, 2.3, 4.2, 10):
- one global, monotonically increasing row id across all topics (AUTOINCREMENT: never reused);
- `since=<id>` looks the id up in every topic and returns rows with a larger row id (exclusive);
  a well-formed id that is not stored means "all";
- per topic, replay is ordered by (time, row id); several topics are concatenated and then sorted by
  time with a *stable* sort (Go's sort.Slice is not stable: the emulator picks one legal order);
- `latest` is the newest row per topic by (time, row id); time forms are inclusive (`time >= t`);
- a scheduled (delayed) row is stored at publish time with `published=False`: it has its row id
  from then on, but only `scheduled=1` replays see it until the delayed sender marks it published
  (`time >= t` forms then drop the published filter; the id form takes `rowid > cursor OR
  unpublished`; `latest` never sees it);
- pruning deletes published rows whose `expires <= now`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ntfy_intake.emulator.since import ALL, Since
from ntfy_intake.emulator.wire import Event


@dataclass
class Row:
    rowid: int
    event: Event
    published: bool = True


class MessageCache:
    """Cached `message` events in insertion order. `enabled=False` is ntfy's no-op cache."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.inclusive_id_cursor = False  # a deliberate bug (faults.misbehave_inclusive_since_id)
        self._rows: list[Row] = []
        self._last_rowid = 0

    def add(self, event: Event, *, published: bool = True) -> int | None:
        """Store one event; returns its row id (None when the cache is disabled)."""
        if not self.enabled:
            return None
        self._last_rowid += 1
        self._rows.append(Row(self._last_rowid, event, published))
        return self._last_rowid

    def due(self, now: int) -> list[Row]:
        """MessagesDue: unpublished rows whose time has come, by (time, row id)."""
        rows = [row for row in self._rows if not row.published and row.event.time <= now]
        return sorted(rows, key=lambda row: (row.event.time, row.rowid))

    def mark_published(self, row: Row) -> None:
        row.published = True

    def rowid(self, message_id: str) -> int | None:
        """The row id of a message id in any topic (the first one, should an id repeat)."""
        return next((row.rowid for row in self._rows if row.event.id == message_id), None)

    def rows(self, topic: str | None = None) -> list[Row]:
        return [row for row in self._rows if topic is None or row.event.topic == topic]

    def select(self, topic: str, since: Since, *, scheduled: bool = False) -> list[Row]:
        """messageCache.Messages for one topic."""
        if since.is_none():
            return []
        rows = self.rows(topic)
        if since.is_latest():
            published = [row for row in rows if row.published]
            newest = max(published, key=lambda row: (row.event.time, row.rowid), default=None)
            return [] if newest is None else [newest]
        if since.is_id():
            cursor = self.rowid(since.id)
            if cursor is None:
                return self.select(topic, ALL, scheduled=scheduled)
            if self.inclusive_id_cursor:
                cursor -= 1
            chosen = [
                row
                for row in rows
                if (row.rowid > cursor and row.published) or (scheduled and not row.published)
            ]
        else:
            chosen = [
                row for row in rows if row.event.time >= since.time and (row.published or scheduled)
            ]
        return sorted(chosen, key=lambda row: (row.event.time, row.rowid))

    def replay(self, topics: Sequence[str], since: Since, *, scheduled: bool = False) -> list[Row]:
        """sendOldMessages: per-topic lists concatenated (a repeated topic twice), sorted by time."""
        if since.is_none():
            return []
        rows = [row for topic in topics for row in self.select(topic, since, scheduled=scheduled)]
        return sorted(rows, key=lambda row: row.event.time)

    def expired(self, now: int) -> list[str]:
        return [row.event.id for row in self._rows if row.event.expires <= now and row.published]

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
