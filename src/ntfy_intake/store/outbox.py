"""The triage outbox: rows written inside the inbox transaction, each with a stable delivery key.

Row life: `collecting` (the debounce window: later events of the incident join it) ->
`pending` (released: payload frozen, feed entry written, due for the relay) -> `leased` (a relay
attempt is in flight; the lease expires if the daemon dies) -> `delivered` | `dead`. With the
push relay off, released rows go to `skipped` (agents pull them from the feed instead).
A payload is built once, at release, and never changes: a receiver sees one body per key.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ntfy_intake.rules import event_profile, sanitize
from ntfy_intake.rules.owner_replies import ack_current
from ntfy_intake.store import audit, db, dialect
from ntfy_intake.store.transaction import Connection, Cursor
from ntfy_intake.wire import frames

SCHEMA = "ntfy-intake.triage/1"
UNTRUSTED_FIELDS = [
    "events[].title",
    "events[].message",
    "events[].tags",
    "events[].click",
    "events[].icon",
    "events[].actions",
    "events[].attachment",
]
# What publishers may add to a message, passed to the agent as ntfy sent it (when present).
PUBLISHER_FIELDS = ("click", "icon", "actions", "attachment", "content_type")

# Called inside the release transaction with (conn, delivery_key, payload, summary, now).
FeedAppend = Callable[[Connection, str, dict[str, Any], str, float], None]


# A request opened by the inbox batch: (delivery key, incident key, reason, due at, created at).
CREATE = (
    "INSERT INTO outbox(delivery_key, incident_key, reason, state, due_at, created_at)"
    " VALUES (?, ?, ?, 'collecting', ?, ?)"
)


def create(
    conn: Connection, key: str, incident_key: str, reason: str, due_at: float, now: float
) -> None:
    conn.execute(CREATE, (key, incident_key, reason, due_at, now))


_NEXT_RELEASE = "SELECT min(due_at) FROM outbox WHERE state = 'collecting'"


def next_release_at(conn: Connection) -> float | None:
    return _release_at(conn.execute(_NEXT_RELEASE).fetchone())


def _release_at(row: Any) -> float | None:
    return None if row[0] is None else float(row[0])


def ask_next_release(conn: Connection) -> Callable[[], float | None]:
    """`next_release_at`, asked inside the caller's write transaction after its last change to
    the outbox and read by calling the result once the transaction committed. PostgreSQL: the
    answer comes with the COMMIT's, no round trip of its own. SQLite reads it at once (a
    statement left stepping would hold its COMMIT back)."""
    cursor = conn.execute(_NEXT_RELEASE)
    if dialect.is_postgres(conn):
        return lambda: _release_at(cursor.fetchone())
    at = _release_at(cursor.fetchone())
    return lambda: at


def release_due(
    conn: Connection, now: float, *, relay_enabled: bool, feed_append: FeedAppend | None
) -> list[str]:
    """Freeze the payload of every request whose window closed; call inside a write txn.
    Up to `_READ_AHEAD` due requests at a time, oldest due first, are read with everything their
    payloads are built from (`_ask_due`: one statement, one answer to wait for on PostgreSQL),
    then written; no write here changes what another request's payload reads, and
    a written request is no longer `collecting`, so the next read takes the ones after it."""
    released: list[str] = []
    while True:
        due = _ask_due(conn, now)
        for key, (payload, summary, version) in due:
            conn.execute(
                "UPDATE outbox SET state = ?, payload = ?, incident_version = ?"
                " WHERE delivery_key = ?",
                (
                    "pending" if relay_enabled else "skipped",
                    json.dumps(payload, separators=(",", ":"), ensure_ascii=True),
                    version,
                    key,
                ),
            )
            if feed_append is not None:
                feed_append(conn, key, payload, summary, now)
            # The frozen payload is audited: the audit log can rebuild the request (rebuild.py).
            audit.stage(conn, "release", now, delivery_key=key, summary=summary, payload=payload)
            released.append(key)
        if len(due) < _READ_AHEAD:
            return released


# Requests read per release step (a backlog releases one per incident).
_READ_AHEAD = 64

Built = tuple[dict[str, Any], str, int]  # a payload, its one-line summary, the incident version

# The owner's ack (store/owner_replies.py), as the version it was given at, or NULL.
_ACKED = "(SELECT a.version FROM owner_acks a WHERE a.incident_key = o.incident_key)"
_HEAD = (
    f"SELECT o.delivery_key, o.reason, i.key, i.severity, i.status, i.version, {_ACKED}"
    " FROM outbox o LEFT JOIN incidents i ON i.key = o.incident_key"
)
_DUE_ORDER = " WHERE o.state = 'collecting' AND o.due_at <= ? ORDER BY o.due_at, o.delivery_key"
_EVENTS = (
    "SELECT n.raw, n.incident_key FROM outbox_events e JOIN inbox n ON n.event_id = e.event_id"
    " WHERE e.delivery_key = {} ORDER BY n.time, n.seq"
)
# The kinds as SQL literals, from the one list of them: a kind ntfy adds is named there alone.
# They are the wire's constants, never input; the check keeps a quote out all the same.
_DEVICE_ACTIONS = ", ".join(f"'{kind}'" for kind in frames.DEVICE_ACTIONS if kind.isidentifier())
# ntfy >= 2.16: devices that removed or dismissed one of these messages. Information for the
# agent, never a resolution: the request goes out all the same.
_ACTION_ROWS = (
    "SELECT DISTINCT a.event_id, a.event, a.sequence_id, a.topic, a.time, a.seq"
    " FROM outbox_events e JOIN inbox n ON n.event_id = e.event_id"
    " JOIN inbox a ON a.sequence_id = n.sequence_id AND a.topic = n.topic"
    f" WHERE e.delivery_key = {{}} AND a.event IN ({_DEVICE_ACTIONS})"
)
_ACTIONS = f"{_ACTION_ROWS} ORDER BY a.time, a.seq"
# PostgreSQL: the due requests and what their payloads are built from in ONE statement, so one
# answer to wait for. The per-request reads are scalar subqueries of the outer row (run per row
# on their indexes, whatever the planner knows of the tables' sizes), their rows in JSON arrays.
_DUE_PG = (
    "SELECT o.delivery_key, o.reason, i.key, i.severity, i.status, i.version,"
    " (SELECT json_agg(json_build_array(n.raw, n.incident_key) ORDER BY n.time, n.seq)"
    "   FROM outbox_events e JOIN inbox n ON n.event_id = e.event_id"
    "   WHERE e.delivery_key = o.delivery_key),"
    " (SELECT json_agg(json_build_array(d.event_id, d.event, d.sequence_id, d.topic, d.time)"
    f"   ORDER BY d.time, d.seq) FROM ({_ACTION_ROWS.format('o.delivery_key')}) d),"
    f" {_ACKED}"
    " FROM outbox o LEFT JOIN incidents i ON i.key = o.incident_key"
    f"{_DUE_ORDER} LIMIT ?"
)


def _ask_due(conn: Connection, now: float) -> list[tuple[str, Built]]:
    """Up to `_READ_AHEAD` due requests, oldest due first, with their payloads built: on
    PostgreSQL from one statement (`_DUE_PG`), on SQLite (no round trips) as `build_payload`."""
    if dialect.is_postgres(conn):
        rows = conn.execute(_DUE_PG, (now, _READ_AHEAD)).fetchall()
        return [
            (row[0], _payload_from((*row[:6], row[8]), row[6] or [], row[7] or [])) for row in rows
        ]
    keys = conn.execute(
        f"SELECT o.delivery_key FROM outbox o{_DUE_ORDER} LIMIT ?", (now, _READ_AHEAD)
    )
    return [(key, build_payload(conn, key)) for (key,) in keys.fetchall()]


def build_payload(conn: Connection, key: str) -> Built:
    """The relay body (DESIGN.md section 5), a one-line summary for wake lines, the version."""
    head = conn.execute(f"{_HEAD} WHERE o.delivery_key = ?", (key,))
    events = conn.execute(_EVENTS.format("?"), (key,))
    actions = conn.execute(_ACTIONS.format("?"), (key,))
    return _payload_from(head.fetchone(), events.fetchall(), actions.fetchall())


def event_view(frame: dict[str, Any], incident_key: str | None = None) -> dict[str, Any]:
    """One event as the agent sees it: ntfy's fields as sent, the body decoded when ntfy base64-
    encoded it, and no key for what the publisher did not send (a titleless alert has no
    `title`, never a null one). `profile`: the publisher profile that keyed it, when one did
    (rules/event_profile.py, given the event's recorded `incident_key`)."""
    message = frame.get("message", "")
    if frame.get("encoding") == "base64" and isinstance(message, str):
        message = frames.decode_base64_body(message)
    view: dict[str, Any] = {"id": frame["id"], "topic": frame["topic"], "time": frame["time"]}
    if isinstance(frame.get("title"), str):
        view["title"] = frame["title"]
    view["message"] = message
    view["priority"] = frame.get("priority", 3)
    view["tags"] = frame.get("tags", [])
    view.update({name: frame[name] for name in PUBLISHER_FIELDS if frame.get(name) is not None})
    profile = None
    if incident_key is not None:
        title = view.get("title")
        profile = event_profile.recorded(
            event_id=view["id"],
            time=view["time"],
            topic=view["topic"],
            title=title if isinstance(title, str) else None,
            message=message if isinstance(message, str) else "",
            priority=view["priority"] if type(view["priority"]) is int else None,
            tags=[tag for tag in view["tags"] if isinstance(tag, str)],
            incident_key=incident_key,
        )
    if profile is not None:
        view["profile"] = profile
    return view


def _payload_from(head: Any, raws: Sequence[Sequence[str]], actions: list[Any]) -> Built:
    key, reason, incident_key, severity, status, version, acked = head
    if incident_key is None:  # written in one transaction with its request: never, unless edited
        raise LookupError(f"triage request {key} names no recorded incident")
    # The raw frame is kept as received; what reaches an agent obeys the decode rule.
    events = [
        event_view(sanitize.valid_utf8(json.loads(raw)), event_key) for raw, event_key in raws
    ]
    device_actions = [
        {"id": row[0], "event": row[1], "sequence_id": row[2], "topic": row[3], "time": row[4]}
        for row in actions
    ]
    payload = {
        "schema": SCHEMA,
        "delivery_key": key,
        "reason": reason,
        "incident": {
            "key": incident_key,
            "severity": severity,
            "status": status,
            "version": version,
        },
        "events": events,
        "untrusted_fields": UNTRUSTED_FIELDS,
    }
    if device_actions:
        payload["device_actions"] = device_actions
    # The owner acknowledged this incident from his phone and the ack still holds: the agent
    # need not tell him again. Absent otherwise (never false).
    if acked is not None and ack_current(int(acked), str(status), int(version)):
        payload["acknowledged"] = True
    summary = f"{incident_key} sev {severity} {status} ({len(events)} event(s))"
    return payload, summary, int(version)


# -- the relay's side: claim, settle, redrive ------------------------------------------------------


def claim_due(
    conn: Connection,
    now: float,
    *,
    limit: int,
    lease: float,
    holding: Collection[str] = (),
) -> list[Claim]:
    """Lease up to `limit` due rows (pending, or leased by a claim whose lease ran out)."""
    with db.write_txn(conn):
        return lease_due(conn, now, limit=limit, lease=lease, holding=holding)


# Pending rows are taken only up to the due time of the `limit`-th one (ties included): found on
# the (state, due_at) index, so a claim sorts about `limit` rows, not the whole backlog.
# A JSON array of keys as rows of `value`: SQLite's json_each, PostgreSQL's function of it.
_PG_KEYS = "json_array_elements_text(CAST({} AS json))"
_LEASE_DUE_SQLITE = (
    "UPDATE outbox SET state = 'leased', lease_until = :until, attempts = attempts + 1"
    " WHERE delivery_key IN (SELECT delivery_key FROM outbox"
    "   WHERE (state = 'pending' AND due_at <= coalesce((SELECT due_at FROM outbox"
    "       WHERE state = 'pending' AND due_at <= :now ORDER BY due_at LIMIT 1 OFFSET :limit - 1),"
    "     :now))"
    "   OR (state = 'leased' AND lease_until <= :now"
    "     AND delivery_key NOT IN (SELECT value FROM json_each(:holding)))"
    "   ORDER BY due_at, created_at LIMIT :limit)"
    " RETURNING delivery_key, payload, attempts, incident_key, due_at, created_at"
)
_LEASE_DUE_PG = _LEASE_DUE_SQLITE.replace("json_each(:holding)", _PG_KEYS.format(":holding"))


def lease_due(
    conn: Connection,
    now: float,
    *,
    limit: int,
    lease: float,
    holding: Collection[str] = (),
) -> list[Claim]:
    """`claim_due` inside the caller's write transaction. `holding`: keys the caller already
    holds (claimed, not yet settled); their lease may run out while they wait their turn, and
    they must not be claimed twice."""
    return ask_lease(conn, now, limit=limit, lease=lease, holding=holding)()


def ask_lease(
    conn: Connection,
    now: float,
    *,
    limit: int,
    lease: float,
    holding: Collection[str] = (),
) -> Callable[[], list[Claim]]:
    """`lease_due`, its claims read by calling the result: after the transaction's COMMIT when
    nothing in it needs them sooner (PostgreSQL: the claims come with the COMMIT's answer, a
    claim alone is one round trip). SQLite reads them at once, as `ask_next_release`."""
    cursor = conn.execute(
        dialect.pick(conn, sqlite=_LEASE_DUE_SQLITE, postgresql=_LEASE_DUE_PG),
        {"until": now + lease, "now": now, "holding": json.dumps(list(holding)), "limit": limit},
    )
    if dialect.is_postgres(conn):
        return lambda: _claims(cursor.fetchall())
    claims = _claims(cursor.fetchall())
    return lambda: claims


@dataclass(frozen=True, slots=True)
class HandOff:
    """Room this process's relay has for rows a release frees (`ask_hand_off`): up to `limit`
    of them leased to it in the release's own transaction, for `lease` seconds."""

    limit: int
    lease: float


# A released row is leased in its release's transaction only when no other row of its incident
# is pending or leased: the relay's order within an incident (oldest due first) then holds as if
# it had claimed the row itself, with no claim's round trip between the release and the POST.
_HAND_OFF_SQLITE = (
    "UPDATE outbox SET state = 'leased', lease_until = :until, attempts = attempts + 1"
    " WHERE delivery_key IN (SELECT value FROM json_each(:keys)) AND state = 'pending'"
    "   AND NOT EXISTS (SELECT 1 FROM outbox AS other WHERE other.incident_key = outbox.incident_key"
    "     AND other.delivery_key <> outbox.delivery_key AND other.state IN ('pending', 'leased'))"
    " RETURNING delivery_key, payload, attempts, incident_key, due_at, created_at"
)
_HAND_OFF_PG = _HAND_OFF_SQLITE.replace("json_each(:keys)", _PG_KEYS.format(":keys"))


def ask_hand_off(
    conn: Connection, released: Sequence[str], now: float, room: HandOff | None
) -> Callable[[], list[Claim]]:
    """Inside the release's write transaction: lease up to `room.limit` of the `released` rows
    to the caller's relay (see `_HAND_OFF_SQLITE`), its claims read by calling the result once
    committed (PostgreSQL: with the COMMIT's answer). Nothing is asked without room or rows."""
    keys = list(released[: room.limit]) if room is not None else []
    if room is None or not keys:
        return list
    cursor = conn.execute(
        dialect.pick(conn, sqlite=_HAND_OFF_SQLITE, postgresql=_HAND_OFF_PG),
        {"until": now + room.lease, "keys": json.dumps(keys)},
    )
    if dialect.is_postgres(conn):
        return lambda: _claims(cursor.fetchall())
    claims = _claims(cursor.fetchall())
    return lambda: claims


def _claims(rows: list[Any]) -> list[Claim]:
    # RETURNING comes in no promised order: oldest due first (the relay keeps that order within
    # each incident), the key breaking ties.
    rows.sort(key=lambda row: (row[4], row[5], row[0]))
    return [Claim(row[0], row[1], row[2], row[3]) for row in rows]


def unclaim(conn: Connection, keys: Collection[str]) -> int:
    """Claimed rows whose attempt never started (the relay is stopping) go back to pending, the
    attempt they were counted for taken back."""
    return conn.execute(
        "UPDATE outbox SET state = 'pending', lease_until = NULL, attempts = attempts - 1"
        " WHERE state = 'leased' AND delivery_key IN (SELECT value FROM "
        + dialect.pick(conn, sqlite="json_each(?)", postgresql=_PG_KEYS.format("?"))
        + ")",
        (json.dumps(list(keys)),),
    ).rowcount


@dataclass(frozen=True, slots=True)
class Claim:
    delivery_key: str
    payload: str
    attempt: int
    incident_key: str = ""


# Both outboxes (triage requests, owner messages) lease rows the same way.
Table = Literal["outbox", "owner_outbox"]


def release_leases(conn: Connection, table: Table = "outbox") -> int:
    """At startup: the previous process is gone, so its in-flight attempts are retried now
    (an attempt that had gone out goes out again: at-least-once, absorbed by keys)."""
    with db.write_txn(conn):
        return conn.execute(
            f"UPDATE {table} SET state = 'pending', lease_until = NULL WHERE state = 'leased'"
        ).rowcount


def next_due_at(conn: Connection, table: Table = "outbox") -> float | None:
    """When the next row falls due: a pending row's due time, or a lease running out."""
    return ask_next_due(conn, table)()


def ask_next_due(conn: Connection, table: Table = "outbox") -> Callable[[], float | None]:
    """`next_due_at` asked inside the caller's write transaction, read by calling the result
    once it committed (PostgreSQL: with the COMMIT's answer; SQLite: read at once, as
    `ask_next_release`)."""
    cursor = conn.execute(
        "SELECT min(CASE state WHEN 'pending' THEN due_at ELSE lease_until END)"
        f" FROM {table} WHERE state IN ('pending', 'leased')"
    )
    if dialect.is_postgres(conn):
        return lambda: _release_at(cursor.fetchone())
    at = _release_at(cursor.fetchone())
    return lambda: at


def mark_delivered(conn: Connection, key: str, response: str, now: float) -> bool:
    """Only a leased row settles: a row redriven or already settled meanwhile is left alone."""
    return ask_mark(conn, Mark.delivered(key, response, now)).rowcount == 1


def mark_retry(conn: Connection, key: str, due_at: float, error: str) -> bool:
    return ask_mark(conn, Mark.retry(key, due_at, error)).rowcount == 1


def mark_dead(conn: Connection, key: str, error: str, now: float) -> bool:
    return ask_mark(conn, Mark.dead(key, error, now)).rowcount == 1


@dataclass(frozen=True, slots=True)
class Mark:
    """One settle of a leased row, as `mark_delivered`, `mark_retry` or `mark_dead` make it."""

    sql: str
    params: tuple[object, ...]

    @classmethod
    def delivered(cls, key: str, response: str, now: float) -> Mark:
        return cls(_MARK_DELIVERED, (now, response, key))

    @classmethod
    def retry(cls, key: str, due_at: float, error: str) -> Mark:
        return cls(_MARK_RETRY, (due_at, error, key))

    @classmethod
    def dead(cls, key: str, error: str, now: float) -> Mark:
        return cls(_MARK_DEAD, (error, now, key))


_MARK_DELIVERED = (
    "UPDATE outbox SET state = 'delivered', settled_at = ?, response = ?,"
    " lease_until = NULL, last_error = NULL WHERE delivery_key = ? AND state = 'leased'"
)
_MARK_RETRY = (
    "UPDATE outbox SET state = 'pending', due_at = ?, last_error = ?, lease_until = NULL"
    " WHERE delivery_key = ? AND state = 'leased'"
)
_MARK_DEAD = (
    "UPDATE outbox SET state = 'dead', last_error = ?, settled_at = ?, lease_until = NULL"
    " WHERE delivery_key = ? AND state = 'leased'"
)


def ask_mark(conn: Connection, mark: Mark) -> Cursor:
    """Send one settle; its `rowcount` (1: the row was still this lease's) is read from the
    result. Several asked before the first is read wait for one answer on PostgreSQL."""
    return conn.execute(mark.sql, mark.params)


def settle_all(conn: Connection, marks: Sequence[Mark]) -> list[bool]:
    """Inside the caller's write transaction: every settle sent, then each one's rowcount read
    (one answer to wait for on PostgreSQL): whether each row was still leased and now settled.
    The server runs them in order as before, so each answer is the one it gave when read at
    once; what the caller does with an answer writes other tables (owner outbox, journal)."""
    asked = [ask_mark(conn, mark) for mark in marks]
    return [cursor.rowcount == 1 for cursor in asked]


def redrive(conn: Connection, keys: Sequence[str] | None, now: float) -> list[str]:
    """Put dead rows back in the queue (all of them when `keys` is None), attempts reset."""
    with db.write_txn(conn):
        if keys is None:
            selected = [
                r[0] for r in conn.execute("SELECT delivery_key FROM outbox WHERE state = 'dead'")
            ]
        else:
            selected = [
                key
                for key in keys
                if conn.execute(
                    "SELECT 1 FROM outbox WHERE delivery_key = ? AND state = 'dead'", (key,)
                ).fetchone()
            ]
        for key in selected:
            conn.execute(
                "UPDATE outbox SET state = 'pending', attempts = 0, due_at = ?, settled_at = NULL"
                " WHERE delivery_key = ?",
                (now, key),
            )
            audit.stage(conn, "delivery", now, delivery_key=key, attempt=0, result="redriven")
    return selected
