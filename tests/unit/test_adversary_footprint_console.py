"""Adversary of the console's incidents page after f0f5555 (the sort keeps (last_seen, rowid)
in a subquery; the page's events and requests are looked up by its keys, one placeholder each):
ties, paging to the end, incidents with nothing, hostile keys, a page past 999 keys, on both
engines."""

from __future__ import annotations

import pytest

from ntfy_intake.store import console_reads, db

pytestmark = pytest.mark.engines

HOSTILE = ["it's", 'say "hi"', "100%", "a_b%_", "?", "$1", "ünïcødé ☃", "x'); DROP TABLE inbox;--"]


def _incident(conn: db.Connection, key: str, last_seen: int) -> None:
    conn.execute(
        "INSERT INTO incidents (key, severity, status, status_time, status_event,"
        " first_seen, last_seen, events, version) VALUES (?, 3, 'firing', ?, 'e', ?, ?, 1, 1)",
        (key, last_seen, last_seen - 10, last_seen),
    )


def _event(conn: db.Connection, key: str, event_id: str, at: int) -> None:
    conn.execute(
        "INSERT INTO inbox(event_id, topic, time, raw, raw_sha256, incident_key, severity,"
        " outcome, reason, received_at) VALUES (?, 'alerts', ?, ?, '', ?, 3, 'recorded', '', ?)",
        (event_id, at, '{"title": "t", "message": "m"}', key, float(at)),
    )


def _request(conn: db.Connection, key: str, delivery_key: str, at: float) -> None:
    conn.execute(
        "INSERT INTO outbox(delivery_key, incident_key, reason, state, due_at, created_at)"
        " VALUES (?, ?, 'new', 'pending', ?, ?)",
        (delivery_key, key, at, at),
    )


def _walk(conn: db.Connection, limit: int) -> list[console_reads.IncidentRow]:
    seen: list[console_reads.IncidentRow] = []
    before = None
    for _ in range(1000):
        page = console_reads.incidents(conn, limit=limit, before=before)
        if not page:
            return seen
        seen.extend(page)
        before = console_reads.parse_cursor(page[-1].cursor)
        assert before is not None
    raise AssertionError("paging never ended")


def test_pages_with_ties_in_last_seen_reach_every_incident_once_newest_first(
    store: db.Connection,
) -> None:
    """Ties in last_seen are broken by rowid: walking the "Older incidents" cursor from the
    first page to the last lists every incident exactly once, in the order of one sort."""
    keys = [f"alerts:tie {i}" for i in range(17)] + HOSTILE
    with db.write_txn(store):
        for i, key in enumerate(keys):
            _incident(store, key, 1_700_000_000 + (i % 3))  # three values of last_seen
    walked = _walk(store, limit=4)
    assert sorted(r.key for r in walked) == sorted(keys)
    assert len(walked) == len(keys)
    order = [(r.last_seen, int(r.cursor.split(".")[1])) for r in walked]
    assert order == sorted(order, reverse=True)


def test_each_incident_gets_its_own_events_and_requests_hostile_keys_included(
    store: db.Connection,
) -> None:
    """Keys are bound, never spliced: quotes, %, ?, $1 and non-ASCII keys get their own rows;
    an incident with no events and no requests gets none, and nobody else's."""
    with db.write_txn(store):
        for i, key in enumerate(HOSTILE):
            _incident(store, key, 1_700_000_000 + i)
            for j in range(7):  # more than the five a page shows
                _event(store, key, f"ev{i}x{j}", 1_700_000_000 + j)
                _request(store, key, f"dk{i}x{j}", 1_700_000_000.0 + j)
        _incident(store, "alerts:nothing", 1_800_000_000)
    with console_reads.snapshot(store):
        page = console_reads.incidents(store)
    by_key = {r.key: r for r in page}
    assert set(by_key) == {*HOSTILE, "alerts:nothing"}
    assert by_key["alerts:nothing"].recent == [] and by_key["alerts:nothing"].requests == []
    for i, key in enumerate(HOSTILE):
        row = by_key[key]
        assert [e.event_id for e in row.recent] == [f"ev{i}x{j}" for j in (6, 5, 4, 3, 2)]
        assert [r.delivery_key for r in row.requests] == [f"dk{i}x{j}" for j in (6, 5, 4, 3, 2)]


def test_a_page_of_more_than_999_incidents_is_read_whole(store: db.Connection) -> None:
    """One placeholder per key: a page past SQLite's old 999-variable limit still reads."""
    total = 1200
    with db.write_txn(store):
        for i in range(total):
            _incident(store, f"alerts:many {i}", 1_700_000_000 + i)
            _event(store, f"alerts:many {i}", f"m{i}", 1_700_000_000 + i)
    page = console_reads.incidents(store, limit=total)
    assert len(page) == total
    assert all(len(r.recent) == 1 for r in page)


@pytest.mark.parametrize(
    ("text", "keys"),
    [("1." + "9" * 30, []), ("9" * 30 + ".1", ["alerts:one"]), ("-" + "9" * 30 + ".1", [])],
)
def test_a_hostile_cursor_past_64_bits_reads_a_page_not_an_error(
    store: db.Connection, text: str, keys: list[str]
) -> None:
    """Kills a 500 from the incidents page for a hostile `before` past 64 bits (the console's
    query string is untrusted): SQLite's driver refused to bind the number."""
    with db.write_txn(store):
        _incident(store, "alerts:one", 1_700_000_000)
    cursor = console_reads.parse_cursor(text)
    with console_reads.snapshot(store):
        found = console_reads.incidents(store, before=cursor)
    assert [row.key for row in found] == keys
