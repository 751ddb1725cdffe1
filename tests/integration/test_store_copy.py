"""`ntfy-intake store copy --to DSN` (issue 23): a one-box SQLite state moved into an empty
PostgreSQL database, after which the daemon on PostgreSQL sends nothing twice."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from ntfy_intake.store import db, migrations
from ntfy_intake.testbed import receiver, signal_standin
from ntfy_intake.testbed.emulator import NtfyEmulator

from .. import engines, harness
from ..harness import daemon_process, env_for, event_ids, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("engine", ["postgresql"], indirect=True)]


def store_copy(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
    env["NTFY_INTAKE_STATE_DIR"] = str(state)
    return subprocess.run(
        [sys.executable, "-m", "ntfy_intake", "store", "copy", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def owner_settled(path: Path) -> bool:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        rows = conn.execute(
            "SELECT count(*), sum(state IN ('pending', 'leased')) FROM owner_outbox"
        ).fetchone()
    finally:
        conn.close()
    return not rows[1]


def sqlite_env(emu_url: str, state: Path, **overrides: str) -> dict[str, str]:
    env = env_for(emu_url, state, **overrides)
    env.pop("NTFY_INTAKE_STATE_DATABASE", None)  # the one-box state before the move
    return env


def test_copied_state_sends_nothing_twice_on_postgresql(emu: NtfyEmulator, tmp_path: Path) -> None:
    """Failure mode: a move to PostgreSQL that loses the cursor, the delivery keys or the owner
    keys re-sends every triage request and owner message under new keys."""
    state = tmp_path / "state"
    assert harness.DATABASE is not None
    with receiver.running(tmp_path / "rx.sqlite3") as triage, signal_standin.running() as sig:
        owner = {
            "owner_signal_url": sig.url,
            "owner_signal_number": "+31600000000",
            "owner_recipients": "+31600000001",
        }
        common = {"relay_url": triage.url, "cadence_debounce": "0s", **owner}
        with daemon_process(sqlite_env(emu.url, state, **common)) as proc:
            emu.wait_for_subscribers(1, timeout=30)
            before = [
                emu.publish("alerts", f"disk {n} full", title=f"Disk {n}")["id"] for n in range(3)
            ]
            wait_until(lambda: len(receiver.receipts(triage.db_path)) == 3, timeout=30)
            wait_until(lambda: owner_settled(state / "intake.sqlite3"), timeout=30)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        owner_before = len(sig.messages())

        copied = store_copy(state, "--to", harness.DATABASE)
        assert copied.returncode == 0, copied.stderr
        assert "copied" in copied.stdout and "inbox 3" in copied.stdout

        # The same state dir on PostgreSQL: the backfill replays the cached events, which must
        # all be duplicates; the new one is the only new triage request.
        with daemon_process(env_for(emu.url, state, **common)):
            emu.wait_for_subscribers(1, timeout=30)
            after = emu.publish("alerts", "nas unreachable", title="NAS")["id"]
            wait_until(lambda: len(receiver.receipts(triage.db_path)) == 4, timeout=30)
            wait_until(lambda: after in event_ids(state), timeout=30)
        receipts = receiver.receipts(triage.db_path)
        owner_texts = [m.message for m in sig.messages()]
    assert len(receipts) == 4
    assert [r.repeats for r in receipts] == [0, 0, 0, 0]  # no delivery key sent twice
    assert Counter(event_ids(state)) == Counter([*before, after])  # one event line per id
    assert len(owner_texts) >= owner_before and len(set(owner_texts)) == len(owner_texts)
    conn = db.connect(harness.DATABASE, readonly=True)
    try:
        assert conn.execute("SELECT count(*) FROM inbox").fetchone()[0] == 4
        assert conn.execute("SELECT kind FROM cursor").fetchone()[0] == "id"
    finally:
        conn.close()


def test_copy_into_a_database_that_holds_a_store_is_refused_with_one_line(tmp_path: Path) -> None:
    """Failure mode: a copy over a live PostgreSQL store mixes two daemons' keys."""
    assert harness.DATABASE is not None
    state = tmp_path / "state"
    first = tmp_path / "first"
    conn = db.connect(first / "intake.sqlite3")
    migrations.apply(conn)
    conn.execute("INSERT INTO kv(name, value) VALUES ('x', 'y')")
    conn.execute("INSERT INTO cursor(id, kind, value, updated_at) VALUES (1, 'id', 'abc', 0)")
    conn.close()
    assert store_copy(first, "--to", harness.DATABASE).returncode == 0
    (state / "audit").mkdir(parents=True)
    (state / "audit" / "audit-2026-12-01.jsonl").write_text(
        json.dumps({"v": 1, "seq": 1, "kind": "notice", "ts": "2026-12-01T00:00:00Z"}) + "\n"
    )
    secret = engines.with_password(harness.DATABASE, "hunter2")
    refused = store_copy(state, "--to", secret)
    assert refused.returncode == 2
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "already holds a store" in refused.stderr
    assert "hunter2" not in refused.stderr + refused.stdout
    assert "Traceback" not in refused.stderr


def test_copy_without_a_database_or_audit_log_says_there_is_nothing(tmp_path: Path) -> None:
    assert harness.DATABASE is not None
    refused = store_copy(tmp_path / "empty", "--to", harness.DATABASE)
    assert refused.returncode == 2
    assert "nothing to copy" in refused.stderr
