"""The per-node readiness rows on a real PostgreSQL (store/nodes.py; DESIGN.md section 11). Each
test is named after the failure it kills. Run with NTFY_INTAKE_TEST_DATABASE set."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ntfy_intake.rules.readiness import NodeSeen
from ntfy_intake.store import db, migrations, nodes, postgres

from .. import harness

pytestmark = pytest.mark.parametrize("engine", ["postgresql"], indirect=True)

PARTS = {"ntfy.url": "a1b2", "ntfy.topics": "c3d4"}


@pytest.fixture
def connect(engine: str) -> Iterator[Callable[[], postgres.PgConnection]]:
    """Connections to this test's schema, migrated (the nodes table is step 0008)."""
    opened: list[postgres.PgConnection] = []

    def open_one() -> postgres.PgConnection:
        conn = db.connect(harness.DATABASE or "")
        assert isinstance(conn, postgres.PgConnection)
        opened.append(conn)
        return conn

    migrations.apply(open_one())
    yield open_one
    for conn in opened:
        conn.close()


def report(conn: postgres.PgConnection, **changed: Any) -> tuple[bool, NodeSeen]:
    values: dict[str, Any] = {
        "node": "pi",
        "instance": "d1r.aaaa",
        "ready": True,
        "reason": None,
        "fingerprint": "f1",
        "parts": PARTS,
        "version": "0.1.0",
        "schema_known": True,
        "intake": "standby",
        "intake_age_s": None,
        "predecessor": "d1r.",
        "stale_s": 25.0,
        **changed,
    }
    return nodes.report(conn, **values)


def test_a_report_is_read_back_whole_with_ages_from_the_server(
    connect: Callable[[], postgres.PgConnection],
) -> None:
    conn = connect()
    written, row = report(
        conn, ready=False, reason="ntfy answered HTTP 502", intake="dead", intake_age_s=42.0
    )
    assert written
    (read,) = nodes.read_all(connect())
    assert (read.instance, read.seen_at) == (row.instance, row.seen_at)
    assert (read.node, read.instance, read.ready, read.reason) == (
        "pi",
        "d1r.aaaa",
        False,
        "ntfy answered HTTP 502",
    )
    assert (read.fingerprint, dict(read.parts), read.version, read.schema_known) == (
        "f1",
        PARTS,
        "0.1.0",
        True,
    )
    assert read.intake == "dead"
    assert read.intake_age_s is not None and 42.0 <= read.intake_age_s < 45.0
    assert 0.0 <= read.seen_age_s < 3.0


def test_ages_are_the_server_s_not_the_reader_s(
    connect: Callable[[], postgres.PgConnection],
) -> None:
    conn = connect()
    report(conn)
    conn.execute("UPDATE nodes SET seen_at = now() - INTERVAL '30 seconds'")
    (read,) = nodes.read_all(conn)
    assert 30.0 <= read.seen_age_s < 33.0


def test_a_second_live_instance_never_overwrites_the_first_one_s_row(
    connect: Callable[[], postgres.PgConnection],
) -> None:
    first, second = connect(), connect()
    assert report(first)[0]
    written, theirs = report(second, instance="e2s.bbbb", predecessor="e2s.", ready=False)
    assert not written
    assert theirs.instance == "d1r.aaaa" and theirs.ready
    (read,) = nodes.read_all(first)
    assert read.instance == "d1r.aaaa" and read.ready
    # The first goes on reporting under its name; seen_at moves, so the second can tell it lives.
    again = report(first)[1]
    assert again.seen_at >= theirs.seen_at


def test_a_crashed_predecessor_s_fresh_row_is_reclaimed_at_once(
    connect: Callable[[], postgres.PgConnection],
) -> None:
    conn = connect()
    assert report(conn, instance="d1r.aaaa")[0]
    # A restart of the same state directory: a new instance with the directory's prefix.
    written, row = report(conn, instance="d1r.cccc")
    assert written and row.instance == "d1r.cccc"


def test_a_stale_row_under_the_name_is_taken_by_anyone(
    connect: Callable[[], postgres.PgConnection],
) -> None:
    conn = connect()
    assert report(conn)[0]
    conn.execute("UPDATE nodes SET seen_at = now() - INTERVAL '26 seconds'")
    written, row = report(conn, instance="e2s.bbbb", predecessor="e2s.")
    assert written and row.instance == "e2s.bbbb"


def test_every_node_is_listed_by_name(connect: Callable[[], postgres.PgConnection]) -> None:
    conn = connect()
    report(conn, node="pi", intake="live", intake_age_s=1.0)
    report(conn, node="nas", instance="e2s.bbbb", predecessor="e2s.")
    assert [(r.node, r.intake) for r in nodes.read_all(conn)] == [
        ("nas", "standby"),
        ("pi", "live"),
    ]
    assert nodes.forget(conn, "nas", "e2s.bbbb")
    assert not nodes.forget(conn, "pi", "e2s.bbbb")  # another instance's row stays
    assert [r.node for r in nodes.read_all(conn)] == ["pi"]
