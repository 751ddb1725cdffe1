"""`status` names the maintenance windows, which one holds now and until when, and when the
others open next: the same figures the console's overview shows (it reads `status.collect`)."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime

from ntfy_intake import settings
from ntfy_intake.rules.maintenance import Window
from ntfy_intake.store import db
from ntfy_intake.surfaces import status

SUNDAY_0130_CET = datetime(2026, 1, 11, 0, 30, tzinfo=UTC).timestamp()
BACKUP = Window("sunday-backup", ("nas*",), (), frozenset({6}), 60, 240, "Europe/Amsterdam")
REINDEX = Window("reindex", (), ("search:*",), frozenset(range(7)), 22 * 60, 30, "UTC")


def config(*windows: Window) -> settings.Settings:
    loaded = settings.load(
        None,
        {
            "NTFY_INTAKE_NTFY_URL": "http://127.0.0.1:9",
            "NTFY_INTAKE_NTFY_TOPICS": "nas1",
            "NTFY_INTAKE_STATE_DIR": "/nonexistent",
        },
    )
    return dataclasses.replace(loaded, maintenance=windows)


def test_status_lists_each_window_and_which_holds_now(store: db.Connection) -> None:
    report = status.collect(store, config(BACKUP, REINDEX), SUNDAY_0130_CET)
    backup, reindex = report["maintenance"]
    assert backup == {
        "name": "sunday-backup",
        "when": "sun 01:00-04:00 Europe/Amsterdam",
        "topics": ["nas*"],
        "incidents": [],
        "active": True,
        "until": "2026-01-11 03:00Z",
        "next": "2026-01-18 00:00Z",
    }
    assert (reindex["active"], reindex["next"]) == (False, "2026-01-11 22:00Z")
    text = status.render(report)
    assert re.search(r"^maintenance +1 of 2 holding now$", text, re.M), text
    assert re.search(
        r"^  window +'sunday-backup' sun 01:00-04:00 Europe/Amsterdam \(nas\*\):"
        r" HOLDING until 2026-01-11 03:00Z$",
        text,
        re.M,
    ), text
    assert "'reindex' daily 22:00-00:30 UTC (incident search:*): next 2026-01-11 22:00Z" in text


def test_status_without_windows_says_so(store: db.Connection) -> None:
    report = status.collect(store, config(), SUNDAY_0130_CET)
    assert report["maintenance"] == []
    assert re.search(r"^maintenance +no windows$", status.render(report), re.M)
