"""Owner notices a standby owes on its node row (store/nodes.owe, runtime/owed.py), on a real
PostgreSQL. Each test is named after the failure it kills. Run with NTFY_INTAKE_TEST_DATABASE
set."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ntfy_intake.rules import notices
from ntfy_intake.rules.notices import Notice
from ntfy_intake.runtime import owed
from ntfy_intake.store import db, migrations, nodes, postgres

from .. import harness

pytestmark = pytest.mark.parametrize("engine", ["postgresql"], indirect=True)


@pytest.fixture
def connect(engine: str) -> Iterator[Callable[[], postgres.PgConnection]]:
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


def row_of(conn: postgres.PgConnection, node: str, instance: str) -> None:
    written, _ = nodes.report(
        conn,
        node=node,
        instance=instance,
        ready=True,
        reason=None,
        fingerprint="f1",
        parts={"ntfy.url": "a1"},
        version="0.1.0",
        schema_known=True,
        intake="standby",
        intake_age_s=None,
        stale_s=25.0,
    )
    assert written


def owe(conn: postgres.PgConnection, instance: str, notice: Notice) -> bool:
    return nodes.owe(
        conn, node="nas", instance=instance, key=notice.key, notice=owed.as_json(notice)
    )


HELD = notices.login_throttled("192.0.2.7", 5, 60.0, "1796580744")
LATER = notices.login_throttled("192.0.2.8", 5, 60.0, "1796580999")


def test_a_notice_owed_twice_is_owed_once_and_only_on_the_owing_instance_s_row(
    connect: Callable[[], postgres.PgConnection],
) -> None:
    conn = connect()
    row_of(conn, "nas", "d1.aaaa")
    assert owe(conn, "d1.aaaa", HELD) and owe(conn, "d1.aaaa", HELD)
    assert not owe(conn, "d2.bbbb", LATER)  # another live process's row is not written
    ((node, entries),) = nodes.owed(conn)
    assert node == "nas" and list(entries) == [HELD.key]
    assert owed.from_json(HELD.key, entries[HELD.key]) == HELD
    # A report of the row (every probe) keeps what it owes.
    row_of(conn, "nas", "d1.aaaa")
    assert [list(e) for _, e in nodes.owed(conn)] == [[HELD.key]]


def test_the_leader_records_each_owed_notice_once_and_clears_only_what_it_recorded(
    connect: Callable[[], postgres.PgConnection],
) -> None:
    conn, standby = connect(), connect()
    row_of(conn, "nas", "d1.aaaa")
    owe(standby, "d1.aaaa", HELD)
    told: list[Notice] = []

    async def tell_owner(notice: Notice) -> None:
        told.append(notice)
        owe(standby, "d1.aaaa", LATER)  # owed while the leader records: not cleared with it

    async def run(call: Callable[[], Any]) -> Any:
        return call()

    async def rounds() -> list[int]:
        return [await owed.record(lambda: conn, run, tell_owner) for _ in range(3)]

    assert asyncio.run(rounds()) == [1, 1, 0]
    assert [n.key for n in told] == [HELD.key, LATER.key]
    assert nodes.owed(conn) == []
