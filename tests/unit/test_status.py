"""`status` text and JSON: the same words as the health model, debounce made visible."""

from __future__ import annotations

import json
import sqlite3
import time

from ntfy_intake import settings
from ntfy_intake.store import db, outbox
from ntfy_intake.surfaces import status


def config() -> settings.Settings:
    return settings.load(
        None,
        {
            "NTFY_INTAKE_NTFY_URL": "http://127.0.0.1:9",
            "NTFY_INTAKE_NTFY_TOPICS": "alerts",
            "NTFY_INTAKE_STATE_DIR": "/nonexistent",
        },
    )


def put_snapshot(conn: sqlite3.Connection, **fields: object) -> None:
    with db.write_txn(conn):
        conn.execute(
            "INSERT INTO kv(name, value) VALUES ('health', ?)"
            " ON CONFLICT(name) DO UPDATE SET value = excluded.value",
            (json.dumps(fields),),
        )


def test_requests_in_the_debounce_window_show_in_text_and_json(store: sqlite3.Connection) -> None:
    now = time.time()
    with db.write_txn(store):
        outbox.create(store, "tri_a", "alerts:disk full", "new", now + 97, now)
    report = status.collect(store, config(), now)
    assert report["relay"]["collecting"] == 1 and report["relay"]["next_release_in_s"] == 97.0
    text = status.render(report)
    assert "collecting 1 (debounce window, next release in 97 s), pending 0" in text


def test_text_uses_the_json_words_suppressed_and_dead(store: sqlite3.Connection) -> None:
    text = status.render(status.collect(store, config(), time.time()))
    assert "suppressed 0, dead 0" in text
    assert "capped" not in text and "undeliverable" not in text


def test_first_line_is_the_health_verdict_with_its_reasons(store: sqlite3.Connection) -> None:
    now = time.time()
    put_snapshot(
        store,
        updated_at=now,
        state="backoff",
        started_at=now - 60,
        last_frame_wall=now - 3,
        last_error="ConnectError: [Errno 111] Connection refused",
        last_error_wall=now - 1,
        pid=4242,
    )
    report = status.collect(store, config(), now)
    lines = status.render(report).splitlines()
    assert lines[0].split() == ["health", "RECONNECTING"]
    assert (
        lines[1].startswith("  why") and "ntfy subscription down: last frame 3.0 s ago" in lines[1]
    )
    assert "ConnectError: [Errno 111] Connection refused (1.0 s ago)" in lines[2]
    ok, line = status.healthy(report)
    assert not ok and line.startswith("reconnecting: ntfy subscription down")


def test_check_says_never_when_no_frame_ever_came(store: sqlite3.Connection) -> None:
    now = time.time()
    put_snapshot(store, updated_at=now, state="connecting", started_at=now - 5, pid=1)
    ok, line = status.healthy(status.collect(store, config(), now))
    assert not ok and "None" not in line and "no frame since start 5.0 s ago" in line
