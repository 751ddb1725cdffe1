"""`status` text and JSON: the same words as the health model, debounce made visible."""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

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


def fast_config() -> settings.Settings:
    """Limits tighter than the snapshot's own 2 s cadence, as the health tests run them."""
    return settings.load(
        None,
        {
            "NTFY_INTAKE_NTFY_URL": "http://127.0.0.1:9",
            "NTFY_INTAKE_NTFY_TOPICS": "alerts",
            "NTFY_INTAKE_STATE_DIR": "/nonexistent",
            "NTFY_INTAKE_NTFY_KEEPALIVE_INTERVAL": "1s",
            "NTFY_INTAKE_NTFY_KEEPALIVE_TIMEOUT": "1500ms",
            "NTFY_INTAKE_NTFY_DEAD_AFTER": "3s",
        },
    )


def stored_report(
    store: sqlite3.Connection, *, written_ago: float, frame_before_write: float
) -> dict[str, Any]:
    """`status` of a live snapshot written `written_ago` s ago, with its last frame
    `frame_before_write` s before that write, under `fast_config`'s limits."""
    now = time.time()
    written = now - written_ago
    put_snapshot(
        store,
        updated_at=written,
        state="live",
        started_at=now - 60,
        last_frame_wall=written - frame_before_write,
    )
    return status.collect(store, fast_config(), now)


def test_a_snapshot_written_between_frames_is_not_read_as_a_silent_stream(
    store: sqlite3.Connection,
) -> None:
    # The daemon stores its snapshot every 2 s; a frame 0.5 s before that write was fresh.
    # Read 1.9 s later, the frame is 2.4 s old: past keepalive_timeout only by the read's lag.
    report = stored_report(store, written_ago=1.9, frame_before_write=0.5)
    assert report["intake"]["state"] == "live"
    ok, line = status.healthy(report)
    assert ok and line == "live (last frame 2.4 s ago)"


def test_a_frame_already_stale_when_the_snapshot_was_written_is_silence(
    store: sqlite3.Connection,
) -> None:
    report = stored_report(store, written_ago=1.0, frame_before_write=1.7)
    assert report["intake"]["state"] == "reconnecting"
    assert not status.healthy(report)[0]


def test_an_overdue_snapshot_earns_no_more_than_two_periods_of_grace(
    store: sqlite3.Connection,
) -> None:
    # Ten seconds without a snapshot (the writer stalled): its last frame, 0.2 s before the write,
    # is judged 10.2 - 4 = 6.2 s old, past dead_after (3 s).
    report = stored_report(store, written_ago=10.0, frame_before_write=0.2)
    assert report["intake"]["state"] == "dead"
    assert report["intake"]["last_frame_age_s"] == 10.2
