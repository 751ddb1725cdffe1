"""The two storage engines under test (DESIGN.md section 9): SQLite, and PostgreSQL from the
throwaway cluster `.ci/run` starts (`NTFY_INTAKE_TEST_DATABASE`, a DSN).

A test runs on both when its module says `pytestmark = pytest.mark.engines` (or it takes the
`store` fixture): conftest parametrizes the autouse `engine` fixture, and on PostgreSQL each
test gets a schema of its own (dropped after it), named in the DSN's search path, so the daemon,
its CLI and the test's own reads all see that test's store and nothing else.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import quote

from ntfy_intake.store import db
from ntfy_intake.testbed import drill_store

ENV = "NTFY_INTAKE_TEST_DATABASE"
ENGINES = ("sqlite", "postgresql")
# Read once, at import: conftest clears every NTFY_INTAKE_ variable around each test.
_SERVER = os.environ.get(ENV) or None


def server_dsn() -> str | None:
    return _SERVER


def unavailable() -> str:
    return (
        f"PostgreSQL tests need {ENV} (a DSN of a throwaway server; .ci/run starts one with"
        " scripts/pg-cluster)"
    )


def with_password(dsn: str, password: str) -> str:
    """The same DSN with a password (the test cluster trusts 127.0.0.1, so it is not checked):
    for tests that the password never reaches a message."""
    scheme, rest = dsn.split("://", 1)
    user, host = rest.split("@", 1) if "@" in rest else ("postgres", rest)
    return f"{scheme}://{user}:{quote(password)}@{host}"


def create_schema(dsn: str) -> tuple[str, str]:
    """A fresh, empty schema on the test server: (its name, a DSN whose search path is it)."""
    return drill_store.create_schema(dsn, prefix="t")


drop_schema = drill_store.drop_schema
with_schema = drill_store.with_schema


def target(state_dir: Path, database: str | None) -> db.Target:
    """Where a test's daemon keeps its store: the test's schema, or the file in `state_dir`."""
    return db.Dsn(database) if database else state_dir / "intake.sqlite3"


def drill_schema_dropped(server: str, table: str) -> bool:
    """Whether the schema a drill's table names (`store: PostgreSQL ... schema drill_...`) is
    gone from `server` again."""
    found = re.search(r"^store: PostgreSQL \S+ schema (drill_[0-9a-f]+) ", table, re.MULTILINE)
    assert found, table
    conn = db.connect(server)
    try:
        row = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = ?", (found.group(1),)
        ).fetchone()
    finally:
        conn.close()
    return bool(row[0] == 0)
