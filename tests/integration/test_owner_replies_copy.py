"""`ntfy-intake store copy --to DSN` carries the owner's reply state to PostgreSQL: the
timestamps replies quote, the envelopes already handled and the acks (store/owner_replies.py)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ntfy_intake.store import db, migrations

from .. import harness

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("engine", ["postgresql"], indirect=True)]

ROWS = {
    # The last column: the firing the message showed (its incident's version when sent).
    "owner_signal_sent": [(1_764_470_000_123, "notify:tri_a", 1_764_470_000.0, 2)],
    "owner_replies": [("+31600000001", 1_764_470_001_000, 1_764_470_002.0, "ack", "acknowledged")],
    "owner_acks": [("alerts:disk", 3, 1_764_470_002.0)],
}


def test_store_copy_does_not_forget_the_owners_replies_and_acks(tmp_path: Path) -> None:
    """Failure mode: after the move a quote names nothing, an ack no longer holds, and a
    replayed envelope acts again."""
    state = tmp_path / "state"
    state.mkdir()
    conn = db.connect(state / "intake.sqlite3")
    migrations.apply(conn)
    conn.close()
    raw = sqlite3.connect(state / "intake.sqlite3")
    with raw:
        for table, rows in ROWS.items():
            marks = ", ".join("?" * len(rows[0]))
            raw.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
    raw.close()
    assert harness.DATABASE is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
    env["NTFY_INTAKE_STATE_DIR"] = str(state)
    done = subprocess.run(
        [sys.executable, "-m", "ntfy_intake", "store", "copy", "--to", harness.DATABASE],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    pg = db.connect(harness.DATABASE, readonly=True)
    try:
        for table, rows in ROWS.items():
            got = [tuple(r) for r in pg.execute(f"SELECT * FROM {table}")]
            assert got == rows, table
    finally:
        pg.close()
