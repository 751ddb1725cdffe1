"""The two storage engines under test (DESIGN.md section 9): SQLite, and PostgreSQL from the
throwaway cluster `.ci/run` starts (`NTFY_INTAKE_TEST_DATABASE`, a DSN) or, when none is
exported and PostgreSQL is installed, one the test run starts itself (`server_dsn`).

A test runs on both when its module says `pytestmark = pytest.mark.engines` (or it takes the
`store` fixture): conftest parametrizes the autouse `engine` fixture, and on PostgreSQL each
test gets a schema of its own (dropped after it), named in the DSN's search path, so the daemon,
its CLI and the test's own reads all see that test's store and nothing else.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import quote

from ntfy_intake.store import db
from ntfy_intake.testbed import drill_store

ENV = "NTFY_INTAKE_TEST_DATABASE"
ENGINES = ("sqlite", "postgresql")
# Read once, at import: conftest clears every NTFY_INTAKE_ variable around each test.
_SERVER = os.environ.get(ENV) or None
_PG_CLUSTER = Path(__file__).resolve().parent.parent / "scripts" / "pg-cluster"
# Why the suite has no server of its own (None until it tried to start one).
_NOT_STARTED: str | None = None


def server_dsn() -> str | None:
    """The PostgreSQL server the engine tests use: the exported DSN, or else a throwaway cluster
    this test run starts itself when PostgreSQL is installed (the README's one test command
    covers both engines on a machine that has it), stopped when the run ends."""
    global _SERVER, _NOT_STARTED
    if _SERVER is None and _NOT_STARTED is None:
        _SERVER, _NOT_STARTED = _start_own_cluster()
    return _SERVER


def _start_own_cluster() -> tuple[str | None, str]:
    directory = Path(tempfile.mkdtemp(prefix="ntfy-intake-test-pg."))
    try:
        done = subprocess.run(
            ["bash", str(_PG_CLUSTER), "start", str(directory)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        shutil.rmtree(directory, ignore_errors=True)
        return None, f"scripts/pg-cluster could not run ({exc})"
    if done.returncode != 0:
        _stop_own_cluster(directory)
        if done.returncode == 3:
            return None, "PostgreSQL is not installed (apt-get install postgresql)"
        detail = " ".join(done.stderr.split())[-200:] or f"exit {done.returncode}"
        return None, f"scripts/pg-cluster start failed: {detail}; see {directory}"
    atexit.register(_stop_own_cluster, directory)
    return done.stdout.strip(), "started"


def _stop_own_cluster(directory: Path) -> None:
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(
            ["bash", str(_PG_CLUSTER), "stop", str(directory)],
            capture_output=True,
            timeout=120,
            check=False,
        )
    shutil.rmtree(directory, ignore_errors=True)


def unavailable() -> str:
    why = f": {_NOT_STARTED}" if _NOT_STARTED and _NOT_STARTED != "started" else ""
    return (
        f"PostgreSQL tests need a PostgreSQL server: install it (apt-get install postgresql; the"
        f" suite then starts a throwaway cluster itself) or export {ENV} as a DSN{why}"
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
