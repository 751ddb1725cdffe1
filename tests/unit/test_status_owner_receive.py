"""`status` shows the reply path from the owner's phone (`owner.receive`) as the running daemon
last stored it in its health snapshot (runtime/vitals.py): the mode, the age of the last
successful receive, the failures and, while failing, the last error's line."""

from __future__ import annotations

import time

from ntfy_intake import settings
from ntfy_intake.store import db, vitals_state
from ntfy_intake.surfaces import status


def config(receive: str) -> settings.Settings:
    return settings.load(
        None,
        {
            "NTFY_INTAKE_NTFY_URL": "http://127.0.0.1:9",
            "NTFY_INTAKE_NTFY_TOPICS": "alerts",
            "NTFY_INTAKE_STATE_DIR": "/nonexistent",
            "NTFY_INTAKE_OWNER_SIGNAL_URL": "http://127.0.0.1:9",
            "NTFY_INTAKE_OWNER_SIGNAL_NUMBER": "+31600000000",
            "NTFY_INTAKE_OWNER_RECIPIENTS": "+31600000001",
            "NTFY_INTAKE_OWNER_RECEIVE": receive,
        },
    )


def running_daemon(store: db.Connection, now: float, receive: object) -> None:
    snapshot = {"updated_at": now, "state": "live", "started_at": now - 600, "pid": 7}
    vitals_state.save_health(store, {**snapshot, "owner_receive": receive})


def row(text: str) -> str:
    """The row's value (the name column is as wide as the longest name)."""
    line = next(line for line in text.splitlines() if line.startswith("owner replies"))
    return line.removeprefix("owner replies").strip()


def test_status_says_when_the_reply_path_last_received_and_that_it_fails(
    store: db.Connection,
) -> None:
    now = time.time()
    failing = {
        "mode": "poll",
        "last_ok": now - 300,
        "failures": 4,
        "last_error": "ConnectError: All connection attempts failed",
        "failing_since": now - 240,
    }
    running_daemon(store, now, failing)
    report = status.collect(store, config("poll"), now)
    receive = report["owner_receive"]
    assert receive["mode"] == "poll" and receive["failures"] == 4
    assert receive["last_ok_age_s"] == 300.0 and receive["failing_for_s"] == 240.0
    assert row(status.render(report)) == (
        "poll: last receive 5.0 min ago, FAILING since 4.0 min ago,"
        " 4 failures this run (last: ConnectError: All connection attempts failed)"
    )
    healthy = {**failing, "last_ok": now - 2, "failing_since": None}
    running_daemon(store, now, healthy)
    line = row(status.render(status.collect(store, config("poll"), now)))
    # A failure long past is counted, its text is not news any more.
    assert line == "poll: last receive 2.0 s ago, 4 failures this run"


def test_status_says_off_and_not_running_rather_than_a_stale_receive(
    store: db.Connection,
) -> None:
    now = time.time()
    running_daemon(store, now, None)
    assert row(status.render(status.collect(store, config("off"), now))) == "off"
    stale = {"mode": "websocket", "last_ok": now - 100, "failures": 0}
    running_daemon(store, now - 60, stale)  # the snapshot is a minute old: no daemon runs
    report = status.collect(store, config("websocket"), now)
    assert report["owner_receive"] == {"mode": "websocket", "running": False}
    assert row(status.render(report)) == "websocket: daemon not running"
