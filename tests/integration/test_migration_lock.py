"""The migrations under their lock, across processes, and a newer schema at start-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ntfy_intake.store import db, migrations

from .. import harness
from ..harness import Child, env_for

pytestmark = pytest.mark.engines

NAMES = [name for name, _ in migrations.SQLITE]

MIGRATOR = """
import json, sys
from ntfy_intake.store import db, migrations

conn = db.connect(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
print(json.dumps(migrations.apply(conn)), flush=True)
"""


@pytest.mark.slow
def test_processes_starting_together_on_a_fresh_store_apply_each_step_once(
    tmp_path: Path, spawn: Callable[..., Child]
) -> None:
    """Without the lock around reading the ledger and applying, two starters both see a step
    missing and the second fails on `table inbox already exists` (each child opens the test's
    store itself: the SQLite file, or the PostgreSQL schema by its full DSN)."""
    path = harness.store_of(tmp_path / "state")
    children = [spawn(MIGRATOR, harness.target_arg(path)) for _ in range(4)]
    for child in children:
        assert child.expect_line() == "ready"
    for child in children:
        child.send("go")
    applied = [json.loads(child.expect_line()) for child in children]
    assert sorted(name for names in applied for name in names) == sorted(NAMES)
    assert [names for names in applied if names] == [NAMES]  # one process did it all
    conn = db.connect(path)
    assert migrations.ledger(conn) == NAMES
    conn.close()


def newer_database(state: Path) -> db.Target:
    path = harness.store_of(state)
    conn = db.connect(path)
    migrations.apply(conn)
    with db.write_txn(conn):
        conn.execute("INSERT INTO schema_migrations(name) VALUES ('0099_from_the_future')")
    conn.close()
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [["run"], ["feed", "catch-up", "--handle", "triager"]],
    ids=["daemon", "feed_cli"],
)
def test_a_newer_schema_at_start_exits_2_with_one_line(tmp_path: Path, command: list[str]) -> None:
    state = tmp_path / "state"
    path = newer_database(state)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
    env.update(env_for("http://127.0.0.1:9", state))
    proc = subprocess.run(
        [sys.executable, "-m", "ntfy_intake", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "0099_from_the_future" in lines[0], proc.stderr
    assert "newer ntfy-intake" in lines[0]
    assert proc.stdout == ""
    conn = db.connect(path)
    assert migrations.ledger(conn) == [*NAMES, "0099_from_the_future"]
    conn.close()
