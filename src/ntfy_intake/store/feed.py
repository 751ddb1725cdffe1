"""The agent feed store: per-channel append-only entries plus forward-only ack cursors.

Agents are crash-prone LLM sessions, so every durable fact lives here and nothing on the agent side
has to survive. Invariants owned by this module, each enforced where every writer passes through:

- an entry's ``seq`` is ``max(seq) + 1`` of its channel, computed by the INSERT itself inside the
  writer's write transaction (the store's write lock), so concurrent writers serialize and can
  never collide; ``PRIMARY KEY(channel, seq)`` is the backstop;
- a producer retry is absorbed: ``(channel, idempotency_key)`` is UNIQUE and a repeat returns the
  original entry instead of appending;
- a cursor only moves forward: every ack is ``SET acked_seq = MAX(acked_seq, ?)`` inside a write
  transaction, so a late, replayed or cross-process ack can never move it back;
- an ack beyond the channel head is refused (it would mark unseen entries handled);
- a new handle joins at head unless it asks for history; an existing cursor is never reset;
- reading never consumes: only `FeedStore.ack` moves a cursor.

Concurrency: one connection per `FeedStore`, under a lock so a transaction never interleaves with
another thread's statement; the doorbell (``doorbell.py``) reads on a connection of its own.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from ntfy_intake.errors import FeedError, StoreError
from ntfy_intake.store import db, migrations
from ntfy_intake.store.transaction import Connection

__all__ = [
    "DEFAULT_CHANNEL",
    "INFO_CHANNEL",
    "MAX_PAGE",
    "OWNER_ACK_SCHEMA",
    "Entry",
    "FeedStore",
    "append",
    "append_owner_ack",
    "append_unread",
    "check_name",
    "cursors_of",
    "head_of",
    "next_ring",
]

DEFAULT_CHANNEL = "triage"
# What an agent may want to know about an incident after its request went out (device actions,
# the owner's ack): information, never a request to act.
INFO_CHANNEL = "incident_info"
OWNER_ACK_SCHEMA = "ntfy-intake.owner-ack/1"
FEED_SENDER = "ntfy-intake"
MAX_PAGE = 1000
JoinAt = Literal["head", "start"]

# Handles are stable role names and channels are fixed names: keep both to a plain identifier set.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,63}")

_ENTRY_COLUMNS = "channel, seq, delivery_key, sender, payload, summary, created_at"


@dataclass(frozen=True)
class Entry:
    """One feed entry. `payload` and `summary` hold untrusted alert text: treat them as data."""

    channel: str
    seq: int
    delivery_key: str
    sender: str
    payload: dict[str, object]
    summary: str
    created_at: float

    def to_json(self) -> dict[str, object]:
        """The JSON shape the CLI and HTTP feed print (payload carried as data, not instructions)."""
        return {
            "channel": self.channel,
            "seq": self.seq,
            "delivery_key": self.delivery_key,
            "sender": self.sender,
            "summary": self.summary,
            "created_at": self.created_at,
            "payload": self.payload,
        }

    @classmethod
    def from_row(cls, row: Any) -> Entry:
        columns = {name: row[name] for name in _ENTRY_COLUMNS.split(", ")}
        return cls(**{**columns, "payload": cast(dict[str, object], json.loads(row["payload"]))})


def check_name(kind: str, value: str) -> str:
    """Return `value` if it is a valid handle or channel name, else raise FeedError."""
    if not isinstance(value, str) or _NAME.fullmatch(value) is None:
        raise FeedError(
            f"invalid {kind} {value!r}: use 1-64 of A-Z a-z 0-9 _ . : @ -, starting alphanumeric"
        )
    return value


def _check_seq(seq: int) -> int:
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise FeedError(f"seq must be a non-negative integer, got {seq!r}")
    return seq


def _check_join(at: str) -> JoinAt:
    if at not in ("head", "start"):
        raise FeedError(f"at must be 'head' or 'start', got {at!r}")
    return cast(JoinAt, at)


def _check_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise FeedError(f"page size must be between 1 and {MAX_PAGE}, got {limit!r}")
    return limit


# -- connection-level functions (the caller owns the connection and, for writes, the txn) ------


def head_of(conn: Connection, channel: str) -> int:
    """The highest seq of `channel`, 0 when it is empty."""
    row = conn.execute(
        "SELECT COALESCE(MAX(seq), 0) FROM feed_entries WHERE channel = ?", (channel,)
    ).fetchone()
    return int(row[0])


def cursors_of(conn: Connection, handle: str) -> dict[str, int]:
    """The handle's cursor per channel (empty when it never joined)."""
    rows = conn.execute(
        "SELECT channel, acked_seq FROM feed_cursors WHERE handle = ? ORDER BY channel", (handle,)
    )
    return {row[0]: int(row[1]) for row in rows}


def next_ring(
    conn: Connection, channel: str, after: int, *, not_from: str
) -> tuple[int, str, str] | None:
    """(seq, sender, summary) of the first entry after `after` not sent by `not_from`.

    Deliberately never selects the payload: the doorbell has no way to read a body.
    """
    row = conn.execute(
        "SELECT seq, sender, summary FROM feed_entries"
        " WHERE channel = ? AND seq > ? AND sender <> ? ORDER BY seq LIMIT 1",
        (channel, after, not_from),
    ).fetchone()
    return None if row is None else (int(row[0]), str(row[1]), str(row[2]))


def _encode(payload: Mapping[str, object]) -> str:
    if not isinstance(payload, Mapping):
        raise FeedError(f"payload must be a JSON object, got {type(payload).__name__}")
    try:
        return json.dumps(dict(payload), sort_keys=True, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise FeedError(f"payload is not JSON-serialisable: {exc}") from exc


def _select_entry(conn: Connection, where: str, params: tuple[object, ...]) -> Entry | None:
    row = conn.execute(
        f"SELECT {_ENTRY_COLUMNS} FROM feed_entries WHERE {where}", params
    ).fetchone()
    return None if row is None else Entry.from_row(row)


# One statement: the channel's next seq computed by the server in the INSERT itself, a repeat
# of an idempotency key absorbed by its UNIQUE index (the seq's primary key still raises).
_APPEND = (
    "INSERT INTO feed_entries (channel, seq, delivery_key, sender, payload, summary,"
    " idempotency_key, created_at) SELECT ?, COALESCE(MAX(seq), 0) + 1, ?, ?, ?, ?, ?, ?"
    " FROM feed_entries WHERE channel = ? ON CONFLICT (channel, idempotency_key) DO NOTHING"
)


def append(
    conn: Connection,
    channel: str,
    payload: Mapping[str, object],
    *,
    delivery_key: str,
    sender: str,
    summary: str,
    idempotency_key: str | None,
    now: float,
) -> Entry:
    """Append one entry; `conn` must already be inside a write transaction (``db.write_txn``).

    The daemon calls this from its inbox transaction, so a triage request and its feed entry commit
    (or roll back) together. Idempotent on ``(channel, idempotency_key)``: a repeat returns the
    original entry unchanged, whatever payload it carries.
    """
    encoded = _encode(payload)
    row = _insert(
        conn, channel, encoded, delivery_key, sender, summary, idempotency_key, now, returning=True
    ).fetchone()
    if row is None:  # a repeat
        existing = _select_entry(
            conn, "channel = ? AND idempotency_key = ?", (channel, idempotency_key)
        )
        assert existing is not None, "absorbed by the unique index, so it is there"
        return existing
    return Entry(
        channel=channel,
        seq=int(row[0]),
        delivery_key=delivery_key,
        sender=sender,
        payload=cast(dict[str, object], json.loads(encoded)),
        summary=summary,
        created_at=now,
    )


def append_unread(
    conn: Connection,
    channel: str,
    payload: Mapping[str, object],
    *,
    delivery_key: str,
    sender: str,
    summary: str,
    idempotency_key: str | None,
    now: float,
) -> None:
    """`append` for a caller that reads nothing back (the daemon's inbox transaction): the
    same statement, whose answer nobody waits for (on PostgreSQL it comes with COMMIT)."""
    encoded = _encode(payload)
    _insert(conn, channel, encoded, delivery_key, sender, summary, idempotency_key, now)


def append_owner_ack(
    conn: Connection, incident: str, version: int, now: float, *, about: str | None, via: str
) -> None:
    """The owner's ack of `incident` on the `incident_info` channel, inside the ack's write
    transaction (an ack and its entry commit together). `about`: the owner message the ack
    answered (`notify:<delivery key>` or `escalate:<delivery key>`), whose delivery key the entry
    carries, as the request's own entry does. One entry per ack episode: the same incident acked
    again at the same version (a second reply, a button after a reply) appends nothing."""
    delivery_key = (about or "").partition(":")[2] or incident
    payload: dict[str, object] = {
        "schema": OWNER_ACK_SCHEMA,
        "incident": incident,
        "acknowledged": True,
        "version": version,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "via": via,
        "message": about,
        "delivery_key": delivery_key,
    }
    append_unread(
        conn,
        INFO_CHANNEL,
        payload,
        delivery_key=delivery_key,
        sender=FEED_SENDER,
        summary=f"{incident}: acknowledged by the owner",
        idempotency_key=f"ack:{incident}:{version}",
        now=now,
    )


def _insert(
    conn: Connection,
    channel: str,
    encoded: str,
    delivery_key: str,
    sender: str,
    summary: str,
    idempotency_key: str | None,
    now: float,
    *,
    returning: bool = False,
) -> Any:
    check_name("channel", channel)
    if not conn.in_transaction:
        raise FeedError("feed append needs an open write transaction (use db.write_txn)")
    if not isinstance(sender, str) or not sender:
        raise FeedError("sender must be a non-empty string")
    if not delivery_key:
        raise FeedError("delivery_key must be a non-empty string")
    params = (channel, delivery_key, sender, encoded, summary, idempotency_key, now, channel)
    return conn.execute(_APPEND + (" RETURNING seq" if returning else ""), params)


def _join(conn: Connection, handle: str, channel: str, at: JoinAt, now: float) -> int:
    """Create the cursor if missing (inside the caller's write txn) and return it."""
    start = 0 if at == "start" else head_of(conn, channel)
    conn.execute(
        "INSERT INTO feed_cursors (handle, channel, acked_seq, joined_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (handle, channel) DO NOTHING",
        (handle, channel, start, now),
    )
    row = conn.execute(
        "SELECT acked_seq FROM feed_cursors WHERE handle = ? AND channel = ?", (handle, channel)
    ).fetchone()
    return int(row[0])


# -- the store used by agents, the CLI and the HTTP surface ------------------------------------


@contextlib.contextmanager
def _store_errors() -> Iterator[None]:
    try:
        yield
    except db.ERRORS as exc:
        raise StoreError(f"feed store: {exc}") from exc


def _connect(path: db.Target) -> Connection:
    """`db.connect`, retrying the one step SQLite does not retry by itself.

    Switching a fresh file to WAL needs an exclusive lock and fails at once with SQLITE_BUSY
    (the busy handler is not consulted) when another process opens the same fresh file at the
    same moment, e.g. two agents starting together. Retry for as long as the busy timeout.
    """
    deadline = time.monotonic() + db.BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            return db.connect(path)
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                raise
            time.sleep(0.005)


class FeedStore:
    """The agent feed over the daemon's SQLite file; safe whether or not the daemon runs."""

    def __init__(self, conn: Connection, db_path: db.Target) -> None:
        self._conn = conn
        self.db_path = db_path
        self._lock = threading.RLock()
        # In-process fast path for doorbells: bumped after every committed post. An optimisation
        # only; doorbells also watch PRAGMA data_version, so losing it loses nothing.
        self._posted = threading.Condition()
        self._generation = 0

    @classmethod
    def open(cls, db_path: db.Target | str) -> FeedStore:
        """Open (creating if needed) the database and migrate it (the whole list: a fresh file
        opened here first has the daemon's tables too; the migration lock keeps agents and the
        daemon starting together from racing)."""
        path = db.target_of(db_path)
        with _store_errors():
            conn = _connect(path)
            try:
                migrations.apply(conn)
            except BaseException:
                conn.close()
                raise
        return cls(conn, path)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> FeedStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- producers

    def post(
        self,
        channel: str,
        payload: Mapping[str, object],
        *,
        sender: str,
        summary: str,
        idempotency_key: str | None = None,
        delivery_key: str | None = None,
        now: float | None = None,
    ) -> Entry:
        """Append an entry in its own transaction; a repeated idempotency key returns the original."""
        key = delivery_key if delivery_key is not None else f"feed-{uuid.uuid4().hex}"
        with self._lock, _store_errors(), db.write_txn(self._conn) as txn:
            entry = append(
                txn.conn,
                channel,
                payload,
                delivery_key=key,
                sender=sender,
                summary=summary,
                idempotency_key=idempotency_key,
                now=time.time() if now is None else now,
            )
            # Doorbells ring for committed entries only.
            txn.after_commit(self._announce_post)
        return entry

    def _announce_post(self) -> None:
        with self._posted:
            self._generation += 1
            self._posted.notify_all()

    # -- consumers

    def subscribe(self, handle: str, channel: str = DEFAULT_CHANNEL, *, at: JoinAt = "head") -> int:
        """Join `handle` to `channel` (at head, or at the start for history) and return its cursor.

        An existing cursor is never moved, whatever `at` says.
        """
        check_name("handle", handle)
        check_name("channel", channel)
        _check_join(at)
        with self._lock, _store_errors(), db.write_txn(self._conn) as txn:
            return _join(txn.conn, handle, channel, at, time.time())

    def catch_up(
        self,
        handle: str,
        *,
        channel: str | None = None,
        page_size: int = 100,
        at: JoinAt = "head",
    ) -> list[Entry]:
        """Every unacked entry of the handle's channels, ordered by channel then seq.

        Pages until a page comes back empty (a short or full batch is never taken as the head).
        A handle with no cursor at all joins `channel` (default ``triage``) at head, or at the
        start with ``at="start"``. Fetching consumes nothing: ack after handling.
        """
        check_name("handle", handle)
        _check_limit(page_size)
        _check_join(at)
        if channel is not None:
            check_name("channel", channel)
            self.subscribe(handle, channel, at=at)
            channels = [channel]
        else:
            channels = sorted(self.cursors(handle))
            if not channels:
                self.subscribe(handle, DEFAULT_CHANNEL, at=at)
                channels = [DEFAULT_CHANNEL]
        entries: list[Entry] = []
        for name in channels:
            after = self.cursors(handle)[name]
            while batch := self.page(handle, name, after=after, limit=page_size):
                entries.extend(batch)
                after = batch[-1].seq
        return entries

    def page(self, handle: str, channel: str, *, after: int | None, limit: int) -> list[Entry]:
        """Up to `limit` entries of `channel` with seq > `after` (default: the handle's cursor).

        A pure read. With ``after=None`` the handle must already have a cursor on the channel
        (subscribe or catch up first).
        """
        check_name("handle", handle)
        check_name("channel", channel)
        _check_limit(limit)
        if after is None:
            cursor = self.cursor(handle, channel)
            if cursor is None:
                raise FeedError(f"handle {handle!r} has not joined channel {channel!r}")
            after = cursor
        _check_seq(after)
        with self._lock, _store_errors():
            rows = self._conn.execute(
                f"SELECT {_ENTRY_COLUMNS} FROM feed_entries"
                " WHERE channel = ? AND seq > ? ORDER BY seq LIMIT ?",
                (channel, after, limit),
            ).fetchall()
        return [Entry.from_row(row) for row in rows]

    def ack(self, handle: str, channel: str, seq: int) -> int:
        """Mark everything up to `seq` handled; return the cursor after the ack.

        Forward-only: a stale or replayed ack returns the unchanged cursor. An ack beyond the
        channel head raises FeedError, as does an ack for a handle that never joined the channel.
        """
        check_name("handle", handle)
        check_name("channel", channel)
        _check_seq(seq)
        with self._lock, _store_errors(), db.write_txn(self._conn) as txn:
            conn = txn.conn
            head = head_of(conn, channel)
            if seq > head:
                raise FeedError(f"ack {seq} is beyond head {head} of channel {channel!r}")
            updated = conn.execute(
                "UPDATE feed_cursors SET acked_seq = CASE WHEN acked_seq > ? THEN acked_seq ELSE ? END"
                " WHERE handle = ? AND channel = ?",
                (seq, seq, handle, channel),
            ).rowcount
            if updated == 0:
                raise FeedError(
                    f"handle {handle!r} has not joined channel {channel!r}: catch up first"
                )
            row = conn.execute(
                "SELECT acked_seq FROM feed_cursors WHERE handle = ? AND channel = ?",
                (handle, channel),
            ).fetchone()
            return int(row[0])

    # -- reads

    def head(self, channel: str) -> int:
        """The channel's highest seq (0 when empty)."""
        check_name("channel", channel)
        with self._lock, _store_errors():
            return head_of(self._conn, channel)

    def cursor(self, handle: str, channel: str) -> int | None:
        """The handle's cursor on `channel`, or None if it never joined."""
        return self.cursors(handle).get(check_name("channel", channel))

    def cursors(self, handle: str) -> dict[str, int]:
        """The handle's cursor per joined channel."""
        check_name("handle", handle)
        with self._lock, _store_errors():
            return cursors_of(self._conn, handle)

    # -- in-process notification (used by doorbell.py)

    def changes(self) -> int:
        """A counter bumped after every post committed through this store."""
        with self._posted:
            return self._generation

    def wait_for_change(self, seen: int, timeout: float) -> int:
        """Block until `changes()` differs from `seen` or `timeout` passes; return the counter."""
        with self._posted:
            self._posted.wait_for(lambda: self._generation != seen, timeout)
            return self._generation
