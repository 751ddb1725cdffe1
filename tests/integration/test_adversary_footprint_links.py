"""Adversary of migration 0014 (fcc7d4e/4eb0b82: SQLite's outbox_events a WITHOUT ROWID table,
links to no request left out): the links a collecting triage request holds must survive a
rebuild from the audit log (both engines) and `store copy` from a 0014 SQLite store into
PostgreSQL, so the request still names every event it collected."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ntfy_intake.store import copy, db, migrations
from ntfy_intake.testbed import receiver
from ntfy_intake.testbed.emulator import NtfyEmulator

from .. import harness
from ..harness import (
    DaemonThread,
    daemon_process,
    event_ids,
    query,
    settings_for,
    wait_until,
    wipe_store,
)

LINKS = "SELECT delivery_key, event_id FROM outbox_events ORDER BY delivery_key, event_id"


def collect(emu: NtfyEmulator, state: Path, relay_url: str, **extra: str) -> set[tuple[str, str]]:
    """Two incidents, each collecting events in a long debounce window: links, no delivery."""
    config = settings_for(emu.url, state, relay_url=relay_url, cadence_debounce="1h", **extra)
    ids = []
    with DaemonThread(config):
        emu.wait_for_subscribers(1)
        for i in range(6):
            title = "disk full" if i % 2 else "nas down"
            ids.append(emu.publish("alerts", f"{title} {i}", title=title)["id"])
        wait_until(lambda: set(ids) <= set(event_ids(state)), what="events in the files")
    links = {(str(d), str(e)) for d, e in query(state, LINKS)}
    assert {e for _, e in links} == set(ids), links
    assert len({d for d, _ in links}) == 2
    return links


@pytest.mark.engines
def test_a_rebuild_from_the_audit_log_restores_every_outbox_link(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    with receiver.running(tmp_path / "rx.sqlite3") as triage:
        before = collect(emu, state, triage.url)
        wipe_store(state)
        config = settings_for(emu.url, state, relay_url=triage.url, cadence_debounce="1h")
        with DaemonThread(config):
            emu.wait_for_subscribers(1)  # after the rebuild: it comes before subscribing
            wait_until(lambda: query(state, "SELECT count(*) FROM outbox") == [(2,)])
    after = {(str(d), str(e)) for d, e in query(state, LINKS)}
    assert after == before
    assert query(state, "SELECT count(*) FROM outbox WHERE state = 'collecting'") == [(2,)]


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_store_copy_of_a_0014_store_keeps_every_outbox_link(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    dsn = harness.DATABASE
    assert dsn is not None
    harness.DATABASE = None  # the one-box SQLite store first
    try:
        with receiver.running(tmp_path / "rx.sqlite3") as triage:
            before = collect(emu, state, triage.url)
    finally:
        harness.DATABASE = dsn
    target = db.connect(dsn)
    try:
        copied = copy.copy_file(state / "intake.sqlite3", target, audit_top=0)
        assert copied.rows["outbox_events"] == len(before)
        after = {(str(d), str(e)) for d, e in target.execute(LINKS)}
    finally:
        target.close()
    assert after == before


@pytest.mark.sqlite_only(reason="the clustered outbox links are SQLite's (migrations 0014)")
def test_a_link_held_twice_neither_fails_every_start_nor_loops(tmp_path: Path) -> None:
    """A link held twice names one link: migrate it once (as 4eb0b82 leaves an orphan out),
    or else refuse for good (exit 2, one line): never a transient failure on every start."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    path = state / "intake.sqlite3"
    conn = db.connect(path)
    names = [name for name, _ in migrations.SQLITE]
    migrations.apply(conn, migrations.SQLITE[: names.index("0014_fewer_pages_per_event")])
    with db.write_txn(conn):
        conn.execute(
            "INSERT INTO incidents(key, severity, status, status_time, status_event,"
            " first_seen, last_seen, events, version)"
            " VALUES ('alerts:x', 3, 'firing', 1, 'e1', 1, 1, 2, 1)"
        )
        conn.execute(
            "INSERT INTO outbox(delivery_key, incident_key, reason, state, due_at, created_at)"
            " VALUES ('d1', 'alerts:x', 'new', 'collecting', 1, 1)"
        )
        conn.execute("DROP TABLE outbox_events")
        conn.execute(
            "CREATE TABLE outbox_events(delivery_key TEXT NOT NULL"
            " REFERENCES outbox(delivery_key), event_id TEXT NOT NULL)"
        )
        conn.executemany("INSERT INTO outbox_events VALUES ('d1', ?)", [("e1",), ("e1",), ("e2",)])
    conn.close()
    env = {
        "NTFY_INTAKE_STATE_DIR": str(state),
        "NTFY_INTAKE_NTFY_URL": "http://127.0.0.1:9",
        "NTFY_INTAKE_NTFY_TOPICS": "alerts",
        "NTFY_INTAKE_HTTP_LISTEN": "127.0.0.1:0",
    }
    with daemon_process(env) as proc:
        try:
            code: int | None = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            code = None  # running: it migrated
        stderr = b"" if code is None else proc.stderr.read() if proc.stderr else b""
    if code is None:
        links = query(state, "SELECT delivery_key, event_id FROM outbox_events ORDER BY 2")
        assert links == [("d1", "e1"), ("d1", "e2")]
    else:
        assert code == 2, stderr
        assert len(stderr.decode().strip().splitlines()) == 1
