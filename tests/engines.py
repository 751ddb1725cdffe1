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
import fcntl
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
        _SERVER, _NOT_STARTED = _shared_cluster()
    return _SERVER


# The run's own cluster is one for all pytest-xdist workers: the first worker that needs it
# starts it under a file lock in the run's directory (made by the controller, or by the only
# process without xdist) and writes its DSN there; the others read it. The controller stops
# it once, after every worker is done (`close_run`). Every test makes its own schema, so one
# server serves them all, and a cluster per worker would cost an initdb and ~40 MB apiece.
_RUN: dict[str, Path] = {}


def open_run() -> str:
    """The run's shared directory, made by the process that ends last (the xdist controller,
    or pytest without xdist); "" when a DSN was exported and no cluster of ours is needed."""
    if _SERVER is not None:
        return ""
    directory = Path(tempfile.mkdtemp(prefix="ntfy-intake-test-pg."))
    directory.chmod(0o711)  # the cluster inside belongs to the postgres user when run as root
    _RUN["dir"], _RUN["owner"] = directory, directory
    return str(directory)


def run_dir() -> str:
    return str(_RUN.get("dir", ""))


def join_run(directory: str) -> None:
    """A worker: the controller's directory (`open_run`), or none with a DSN exported."""
    if directory:
        _RUN["dir"] = Path(directory)


def close_run() -> None:
    """The controller, at the end: stop the shared cluster if a worker started one."""
    directory = _RUN.pop("owner", None)
    if directory is None:
        return
    if (directory / "cluster").exists():
        _stop_own_cluster(directory / "cluster")
    if not (directory / "failed").exists():  # else kept: its logs say why it did not start
        shutil.rmtree(directory, ignore_errors=True)


def _shared_cluster() -> tuple[str | None, str]:
    directory = _RUN.get("dir")
    if directory is None:  # imported outside a pytest run that opened one
        directory = Path(open_run())
        atexit.register(close_run)
    with (directory / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        dsn, failed = directory / "dsn", directory / "failed"
        if dsn.exists():
            return dsn.read_text().strip(), "started"
        if failed.exists():
            return None, failed.read_text().strip()
        server, why = _start_own_cluster(directory / "cluster")
        (dsn if server else failed).write_text(server or why)
        return server, why


def _start_own_cluster(directory: Path) -> tuple[str | None, str]:
    try:
        done = subprocess.run(
            ["bash", str(_PG_CLUSTER), "start", str(directory)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"scripts/pg-cluster could not run ({exc})"
    if done.returncode != 0:
        _stop_own_cluster(directory)
        if done.returncode == 3:
            return None, "PostgreSQL is not installed (apt-get install postgresql)"
        detail = " ".join(done.stderr.split())[-200:] or f"exit {done.returncode}"
        return None, f"scripts/pg-cluster start failed: {detail}; see {directory}"
    return done.stdout.strip(), "started"


def _stop_own_cluster(directory: Path) -> None:
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(
            ["bash", str(_PG_CLUSTER), "stop", str(directory)],
            capture_output=True,
            timeout=120,
            check=False,
        )


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
