"""`status` (and the console's overview, which reads `status.collect`) lists each `[[expect]]`
entry as the daemon folds it from the audit log: the last arrival, and whether it is missed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ntfy_intake import settings
from ntfy_intake.rules.expectations import Expectation, instant
from ntfy_intake.store import db
from ntfy_intake.surfaces import status

T0 = 1_780_000_000  # 2026-05-28T20:26:40Z
BACKUP = Expectation("nightly-backup", "backups", every=86400.0, grace=3600.0)
KUMA = Expectation("kuma", "alerts", every=600.0, grace=60.0, title="web up")


def config(state_dir: Path, *expected: Expectation) -> settings.Settings:
    loaded = settings.load(
        None,
        {
            "NTFY_INTAKE_NTFY_URL": "http://127.0.0.1:9",
            "NTFY_INTAKE_NTFY_TOPICS": "alerts,backups",
            "NTFY_INTAKE_STATE_DIR": str(state_dir),
        },
    )
    return dataclasses.replace(loaded, expect=expected)


def test_status_says_which_publisher_went_quiet(store: db.Connection, tmp_path: Path) -> None:
    audit_dir = tmp_path / "audit"
    audit_dir.mkdir()
    lines = [
        {
            "seq": 1,
            "ts": instant(T0),
            "kind": "event",
            "event_id": "a",
            "topic": "backups",
            "incident": "backups:backup finished",
            "severity": 3,
            "status": "firing",
            "time": T0,
        },
        {
            "seq": 2,
            "ts": instant(T0),
            "kind": "event",
            "event_id": "b",
            "topic": "alerts",
            "incident": "alerts:web up",
            "severity": 3,
            "status": "firing",
            "time": T0 - 700,
        },
    ]
    day = instant(T0)[:10]
    (audit_dir / f"audit-{day}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    report = status.collect(store, config(tmp_path, BACKUP, KUMA), T0 + 60)
    backup, kuma = report["expectations"]
    assert backup == {
        "name": "nightly-backup",
        "topic": "backups",
        "title": None,
        "every": "1d",
        "grace": "1h",
        "last": "2026-05-28 20:26Z",
        "due": "2026-05-29 21:26Z",
        "missed": False,
        "since": None,
    }
    assert kuma["missed"] is True and kuma["since"] == "2026-05-28 20:15Z"
    text = status.render(report)
    assert "1 of 2 missed" in text
    assert "'kuma' every 10m (alerts title 'web up'): last 2026-05-28 20:15Z; MISSED since" in text


def test_no_expectations_no_line(store: db.Connection, tmp_path: Path) -> None:
    report = status.collect(store, config(tmp_path), T0)
    assert report["expectations"] == []
    assert "expectations" not in status.render(report)
