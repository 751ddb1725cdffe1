"""The two storage engines under test (DESIGN.md section 9): SQLite, and PostgreSQL from the
throwaway cluster `.ci/run` starts (`NTFY_INTAKE_TEST_DATABASE`, a DSN).

A test runs on both when its module says `pytestmark = pytest.mark.engines` (or it takes the
`store` fixture): conftest parametrizes the autouse `engine` fixture, and on PostgreSQL each
test gets a schema of its own (dropped after it), named in the DSN's search path, so the daemon,
its CLI and the test's own reads all see that test's store and nothing else.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from urllib.parse import quote

from ntfy_intake.store import db

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


def with_schema(dsn: str, schema: str) -> str:
    joiner = "&" if "?" in dsn else "?"
    return f"{dsn}{joiner}options={quote(f'-csearch_path={schema}')}"


def with_password(dsn: str, password: str) -> str:
    """The same DSN with a password (the test cluster trusts 127.0.0.1, so it is not checked):
    for tests that the password never reaches a message."""
    scheme, rest = dsn.split("://", 1)
    user, host = rest.split("@", 1) if "@" in rest else ("postgres", rest)
    return f"{scheme}://{user}:{quote(password)}@{host}"


def create_schema(dsn: str) -> tuple[str, str]:
    """A fresh, empty schema on the test server: (its name, a DSN whose search path is it)."""
    schema = f"t_{secrets.token_hex(6)}"
    conn = db.connect(dsn)
    try:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    finally:
        conn.close()
    return schema, with_schema(dsn, schema)


def drop_schema(dsn: str, schema: str) -> None:
    conn = db.connect(dsn)
    try:
        conn.execute("SET lock_timeout = '10s'")
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        conn.close()


def target(state_dir: Path, database: str | None) -> db.Target:
    """Where a test's daemon keeps its store: the test's schema, or the file in `state_dir`."""
    return db.Dsn(database) if database else state_dir / "intake.sqlite3"
