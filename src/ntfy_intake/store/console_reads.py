"""What the owner console's pages read: bounded, indexed, read-only queries.

Every function takes a `db.Connection` (the console keeps its own, read-only, in the thread pool:
the daemon's writer never waits for a page) and returns plain rows for the templates. Each read is
bounded (`limit`) and served by an index (migrations 0005 and 0006), so a page costs the same with
100,000 events in the inbox as with ten. A page reads inside one short read transaction
(`snapshot`): its rows agree with each other, and the WAL is held only for the page's queries.
Text read here is whatever ntfy sent: the templates escape it.

The incidents page is three statements, not one per incident: the page of incidents, their
newest events (a correlated `IN (... LIMIT n)` per incident, by index) and their newest triage
requests. Dates are formatted by SQLite (`strftime`), where a hostile `time` gives NULL, not an
exception. Titles and messages are taken out of the raw frame in Python (`json.loads`), not with
`json_extract`: SQLite turns a lone-surrogate escape (`\\ud800`) into bytes that are not UTF-8,
which the driver refuses to decode; Python's decoder keeps it, and the templates replace it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ntfy_intake.store import audit, dialect
from ntfy_intake.store.db import Connection

PAGE = 50
INCIDENTS_PAGE = 25  # each with its 5 newest events and requests: "Older incidents" for more
EVENTS_PER_INCIDENT = 5
_TAIL_BYTES = 512 * 1024
_AUDIT_SCAN = 8 * 1024 * 1024  # how far back the audit page searches for a filter


@dataclass(frozen=True, slots=True)
class EventRow:
    event_id: str
    topic: str
    time: int
    when: str  # `time`, formatted (empty when SQLite cannot: a hostile value)
    outcome: str
    reason: str
    title: str
    message: str


@dataclass(frozen=True, slots=True)
class RequestRow:
    delivery_key: str
    incident_key: str
    reason: str
    state: str
    attempts: int
    due_at: float
    last_error: str | None
    created_at: float


@dataclass(frozen=True, slots=True)
class IncidentRow:
    key: str
    severity: int
    status: str
    first_seen: int
    last_seen: int
    events: int
    recent: list[EventRow]
    requests: list[RequestRow]
    first_when: str = ""
    last_when: str = ""
    cursor: str = ""  # where the next page starts (`before`): "<last_seen>.<rowid>"


@dataclass(frozen=True, slots=True)
class OwnerRow:
    key: str
    kind: str
    topic: str
    text: str
    state: str
    attempts: int
    channel: str | None
    last_error: str | None
    created_at: float


@dataclass(frozen=True, slots=True)
class QuarantineRow:
    id: int
    reason: str
    event_id: str | None
    raw: str
    count: int
    last_seen: float


@contextlib.contextmanager
def snapshot(conn: Connection) -> Iterator[Connection]:
    """One read transaction around a page's queries: the rows agree, and the WAL snapshot is
    let go as soon as the page has read (never left open between pages)."""
    conn.execute("BEGIN")
    try:
        yield conn
    finally:
        if conn.in_transaction:  # SQLite may have ended it on an error: keep that error
            conn.execute("ROLLBACK")


def _title_message(raw: str) -> tuple[str, str]:
    try:
        frame = json.loads(raw)
    except ValueError:
        return "", raw[:300]
    if not isinstance(frame, dict):
        return "", ""
    title, message = frame.get("title", ""), frame.get("message", "")
    return (
        title if isinstance(title, str) else "",
        message[:300] if isinstance(message, str) else "",
    )


_WHEN = "coalesce(strftime('%Y-%m-%d %H:%M:%SZ', {}, 'unixepoch'), '')"
# PostgreSQL: to_timestamp refuses what SQLite turns into NULL (a hostile `time`): guarded.
_WHEN_PG = (
    "CASE WHEN {0} BETWEEN -62135596800 AND 253402300799 THEN"
    " to_char(to_timestamp({0}) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS\"Z\"') ELSE '' END"
)
_REQUEST_COLUMNS = (
    "delivery_key, incident_key, reason, state, attempts, due_at, last_error, created_at"
)
# The page of incidents: newest seen first, ties by rowid, those before the cursor `(?, ?)`.
# No index on last_seen (every event would write it: migrations 0014), so the incidents are
# scanned: the sort keeps only (last_seen, rowid) for the LIMIT, and the page's rows are read
# and formatted after it, once; its events and requests are looked up by the page's keys.
# (PostgreSQL's tables have a `rowid` identity column for this: migrations_pg 0006.)
_PAGE_TEMPLATE = (
    "SELECT rowid, key, severity, status, first_seen, last_seen, events,"
    " {first}, {last}"
    " FROM incidents WHERE rowid IN (SELECT rowid FROM incidents"
    " WHERE (last_seen, rowid) < (?, ?) ORDER BY last_seen DESC, rowid DESC LIMIT ?)"
    " ORDER BY last_seen DESC, rowid DESC"
)
_PAGE = _PAGE_TEMPLATE.format(first=_WHEN.format("first_seen"), last=_WHEN.format("last_seen"))
_PAGE_PG = _PAGE_TEMPLATE.format(
    first=_WHEN_PG.format("first_seen"), last=_WHEN_PG.format("last_seen")
)
# Each of the page's incidents (`{keys}`: one placeholder per key): its newest events
# (inbox_incident) and newest requests (outbox_incident_created).
_PAGE_EVENTS_TEMPLATE = (
    "SELECT e.incident_key, e.event_id, e.topic, e.time,"
    " {when}, e.outcome, e.reason, e.raw FROM incidents p"
    " JOIN inbox e ON e.seq IN (SELECT s.seq FROM inbox s WHERE s.incident_key = p.key"
    " ORDER BY s.time DESC LIMIT ?)"
    " WHERE p.key IN ({{keys}})"
    " ORDER BY e.incident_key, e.time DESC, e.seq DESC"
)
_PAGE_EVENTS = _PAGE_EVENTS_TEMPLATE.format(when=_WHEN.format("e.time"))
_PAGE_EVENTS_PG = _PAGE_EVENTS_TEMPLATE.format(when=_WHEN_PG.format("e.time"))
_PAGE_REQUESTS = (
    "SELECT {columns}"
    " FROM incidents p JOIN outbox o ON o.rowid IN (SELECT s.rowid FROM outbox s"
    " WHERE s.incident_key = p.key ORDER BY s.created_at DESC LIMIT ?)"
    " WHERE p.key IN ({{keys}})"
    " ORDER BY o.incident_key, o.created_at DESC"
)
_O_COLUMNS = ", ".join("o." + c for c in _REQUEST_COLUMNS.split(", "))
_PAGE_REQUESTS = _PAGE_REQUESTS.format(columns=_O_COLUMNS)
_FIRST_PAGE = (2**63 - 1, 2**63 - 1)


def parse_cursor(text: str | None) -> tuple[int, int] | None:
    """A `before` cursor ("<last_seen>.<rowid>", as `IncidentRow.cursor`), or None."""
    if not text or len(text) > 40:
        return None
    seen, dot, rowid = text.partition(".")
    if not dot or not seen.removeprefix("-").isdigit() or not rowid.isdigit():
        return None
    # Held to 64 bits, where every stored value lies (SQLite's driver refuses a number past
    # them): a cursor beyond the newest row pages from it, one below the oldest finds nothing.
    return _int64(int(seen)), _int64(int(rowid))


def _int64(n: int) -> int:
    return max(-(2**63), min(2**63 - 1, n))


def _request(r: Any) -> RequestRow:
    return RequestRow(
        str(r[0]), str(r[1]), str(r[2]), str(r[3]), int(r[4]), float(r[5]), r[6], r[7]
    )


def _event(r: Any) -> EventRow:
    title, message = _title_message(r[7])
    return EventRow(
        str(r[1]), str(r[2]), int(r[3]), str(r[4]), str(r[5]), str(r[6]), title, message
    )


def incidents(
    conn: Connection, *, limit: int = INCIDENTS_PAGE, before: tuple[int, int] | None = None
) -> list[IncidentRow]:
    """A page of the most recently seen incidents (those seen before `before`, a cursor from
    `IncidentRow.cursor`), each with its newest events and its newest triage requests."""
    page = (*(before or _FIRST_PAGE), limit)
    pg = dialect.is_postgres(conn)
    found = conn.execute(_PAGE_PG if pg else _PAGE, page).fetchall()
    if not found:
        return []
    keys = [str(r[1]) for r in found]
    marks = ", ".join("?" for _ in keys)
    recent: dict[str, list[EventRow]] = {}
    events_sql = (_PAGE_EVENTS_PG if pg else _PAGE_EVENTS).format(keys=marks)
    for r in conn.execute(events_sql, (EVENTS_PER_INCIDENT, *keys)):
        recent.setdefault(str(r[0]), []).append(_event(r))
    requests: dict[str, list[RequestRow]] = {}
    for r in conn.execute(_PAGE_REQUESTS.format(keys=marks), (EVENTS_PER_INCIDENT, *keys)):
        requests.setdefault(str(r[1]), []).append(_request(r))
    return [
        IncidentRow(
            str(r[1]),
            int(r[2]),
            str(r[3]),
            int(r[4]),
            int(r[5]),
            int(r[6]),
            recent.get(str(r[1]), []),
            requests.get(str(r[1]), []),
            str(r[7]),
            str(r[8]),
            f"{int(r[5])}.{int(r[0])}",
        )
        for r in found
    ]


def _requests(
    conn: Connection, where: str, params: tuple[Any, ...], limit: int
) -> list[RequestRow]:
    return [
        _request(r)
        for r in conn.execute(
            f"SELECT {_REQUEST_COLUMNS} FROM outbox WHERE {where} ORDER BY created_at DESC LIMIT ?",
            (*params, limit),
        )
    ]


def deliveries(conn: Connection, state: str, *, limit: int = PAGE) -> list[RequestRow]:
    """Triage requests in `state` ('pending' counts leased and collecting rows too), newest first."""
    states = ("pending", "leased", "collecting") if state == "pending" else (state,)
    marks = ", ".join("?" for _ in states)
    return _requests(conn, f"state IN ({marks})", states, limit)


def owner_messages(conn: Connection, *, limit: int = PAGE) -> list[OwnerRow]:
    """Owner messages, newest first: sent, pending, dead and suppressed (with the reason)."""
    return [
        OwnerRow(str(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]), int(r[5]), r[6], r[7], r[8])
        for r in conn.execute(
            "SELECT key, kind, topic, text, state, attempts, channel, last_error, created_at"
            " FROM owner_outbox ORDER BY created_at DESC LIMIT ?",
            (limit,),
        )
    ]


def quarantine(conn: Connection, *, limit: int = PAGE) -> list[QuarantineRow]:
    return [
        QuarantineRow(int(r[0]), str(r[1]), r[2], str(r[3])[:4000], int(r[4]), float(r[5]))
        for r in conn.execute(
            "SELECT id, reason, event_id, raw, count, last_seen FROM quarantine"
            " ORDER BY last_seen DESC LIMIT ?",
            (limit,),
        )
    ]


def _tail_lines(path: Path, budget: int) -> Iterator[bytes]:
    """The file's complete lines, newest first, reading at most `budget` bytes from its end."""
    with path.open("rb") as handle:
        end = handle.seek(0, os.SEEK_END)
        start = max(0, end - budget)
        handle.seek(start)
        data = handle.read(end - start)
    lines = data.split(b"\n")
    if start > 0:
        lines = lines[1:]  # the first one is cut
    for line in reversed(lines):
        if line.strip():
            yield line


def audit_tail(
    directory: Path, *, kind: str | None = None, needle: str | None = None, limit: int = PAGE
) -> list[dict[str, Any]]:
    """The newest audit records, newest first, optionally only one `kind` or those whose line
    contains `needle` (an event id, a delivery key, a silence id). Searches a bounded tail."""
    found: list[dict[str, Any]] = []
    budget = _AUDIT_SCAN if (kind or needle) else _TAIL_BYTES
    for path in reversed(audit.log_files(directory)):
        for line in _tail_lines(path, budget):
            if needle and needle.encode("utf-8", "replace") not in line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a torn last line
            if not isinstance(record, dict) or (kind and record.get("kind") != kind):
                continue
            found.append(record)
            if len(found) >= limit:
                return found
        budget -= min(budget, path.stat().st_size)
        if budget <= 0:
            break
    return found
