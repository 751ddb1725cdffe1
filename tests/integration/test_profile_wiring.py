"""Publisher profiles wired through the batch: the setting, the audit line, the triage payload.

The failures these kill: `ntfy.profiles = "off"` changed nothing (the batch always asked the
profiles); the `event` audit line did not say which profile keyed a message; the triage
payload's events did not either (DESIGN.md section 12: `events[].profile`).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from ntfy_intake.store import audit, db, inbox, migrations, outbox, rebuild
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator
from ntfy_intake.wire.frames import decode_line

from .. import publishers
from ..conftest import owner_queue
from ..harness import DaemonThread, event_ids, query, separate_store, settings_for, wait_until

NOW = 1_764_470_100.0
KUMA = "uptime-kuma:alerts:web"
TOPICS = frozenset({"alerts", "backups"})


def _frame(payload: dict[str, Any], event_id: str, at: int) -> Any:
    obj = {**payload, "id": event_id, "time": at, "expires": at + 43200, "event": "message"}
    return decode_line(json.dumps(obj).encode(), TOPICS)


def _batch(*, at: int = 1_764_470_000) -> list[Any]:
    """Uptime Kuma's Down and Up, and an ordinary titled message."""
    return [
        _frame(publishers.KUMA_DOWN, "kumadown0001", at),
        _frame(publishers.KUMA_UP, "kumaup000001", at + 1),
        _frame(
            {"topic": "alerts", "title": "Disk full", "message": "sda1 at 97%"}, "plain0000001", at
        ),
    ]


def _event_lines(conn: db.Connection) -> dict[str, dict[str, Any]]:
    lines = [json.loads(line) for (line,) in conn.execute("SELECT line FROM audit_journal")]
    return {r["event_id"]: r for r in lines if r.get("kind") == "event"}


@pytest.mark.one_engine("which incident a publish lands on is a rule; no storage")
@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        (
            "off",
            {"alerts:web down [uptime-kuma]": "firing", "alerts:web up [uptime-kuma]": "firing"},
        ),
        ("auto", {KUMA: "resolved"}),
    ],
)
def test_profiles_off_reaches_the_batch_and_kuma_down_up_stay_two_incidents(
    tmp_path: Path, setting: str, expected: dict[str, str]
) -> None:
    with (
        NtfyEmulator(EmulatorConfig(keepalive_interval=1.0)).running() as emu,
        DaemonThread(settings_for(emu.url, tmp_path, ntfy_profiles=setting)),
    ):
        emu.wait_for_subscribers(1)
        publishers.publish_json(emu.url, publishers.KUMA_DOWN)
        time.sleep(1.1)  # ntfy's one-second times: the Up must be the later event
        publishers.publish_json(emu.url, publishers.KUMA_UP)
        wait_until(lambda: len(event_ids(tmp_path)) == 2, what="both events recorded")
    assert dict(query(tmp_path, "SELECT key, status FROM incidents")) == expected


def test_event_audit_line_names_the_profile_and_an_ordinary_line_has_no_such_field(
    store: db.Connection,
) -> None:
    inbox.record_batch(store, _batch(), NOW, queue=owner_queue(), relay_enabled=True)
    lines = _event_lines(store)
    assert lines["kumadown0001"]["profile"] == "uptime-kuma"
    assert lines["kumaup000001"]["profile"] == "uptime-kuma"
    assert "profile" not in lines["plain0000001"]


def test_profiles_off_in_the_policy_keys_by_title_and_audits_no_profile(
    store: db.Connection,
) -> None:
    queue = owner_queue(profiles=False)
    inbox.record_batch(store, _batch(), NOW, queue=queue, relay_enabled=True)
    assert {key for (key,) in store.execute("SELECT key FROM incidents")} == {
        "alerts:web down [uptime-kuma]",
        "alerts:web up [uptime-kuma]",
        "alerts:disk full",
    }
    assert all("profile" not in line for line in _event_lines(store).values())


def _payload_events(conn: db.Connection) -> dict[str, dict[str, Any]]:
    """Every released request's events, by event id, as the relay would send them."""
    with db.write_txn(conn):
        outbox.release_due(conn, NOW + 1, relay_enabled=True, feed_append=None)
    events: dict[str, dict[str, Any]] = {}
    for (payload,) in conn.execute("SELECT payload FROM outbox WHERE payload IS NOT NULL"):
        for event in json.loads(payload)["events"]:
            events[event["id"]] = event
    return events


def test_triage_payload_events_carry_the_profile_and_an_ordinary_event_none(
    store: db.Connection,
) -> None:
    inbox.record_batch(store, _batch(), NOW, queue=owner_queue(), relay_enabled=True)
    events = _payload_events(store)
    assert events["kumadown0001"]["profile"] == "uptime-kuma"
    assert events["kumaup000001"]["profile"] == "uptime-kuma"
    assert "profile" not in events["plain0000001"]


def test_triage_payload_under_profiles_off_names_no_profile(store: db.Connection) -> None:
    """The payload says what keyed the event when it was recorded: with "off" no profile did,
    though the profile would recognise the message."""
    inbox.record_batch(store, _batch(), NOW, queue=owner_queue(profiles=False), relay_enabled=True)
    events = _payload_events(store)
    assert set(events) == {"kumadown0001", "kumaup000001", "plain0000001"}
    assert all("profile" not in event for event in events.values())


@pytest.mark.engines
def test_rebuild_keeps_the_recorded_key_when_the_setting_changed_between_runs(
    tmp_path: Path,
) -> None:
    """Recorded under "auto", rebuilt from the audit log, replayed by ntfy under "off": the
    replay is a duplicate of the recorded key's event, never a second incident by title."""
    with contextlib.ExitStack() as stack:
        first_store = stack.enter_context(separate_store(tmp_path / "first"))
        second_store = stack.enter_context(separate_store(tmp_path / "second"))
        first = db.connect(first_store)
        migrations.apply(first)
        inbox.record_batch(first, _batch(), NOW, queue=owner_queue(), relay_enabled=True)
        with audit.AuditLog(tmp_path / "audit", lambda: NOW) as log:
            audit.flush(first, log)
        first.close()
        second = db.connect(second_store)
        migrations.apply(second)
        summary = rebuild.from_audit(
            second, tmp_path / "audit", NOW, debounce=0.0, relay_enabled=True, feed_append=None
        )
        assert summary is not None and summary.events == 3
        replay = inbox.record_batch(
            second, _batch(), NOW + 5, queue=owner_queue(profiles=False), relay_enabled=True
        )
        assert (replay.recorded, replay.duplicates) == (0, 3)
        incidents = dict(second.execute("SELECT key, status FROM incidents").fetchall())
        assert incidents == {KUMA: "resolved", "alerts:disk full": "firing"}
        second.close()
