"""Maintenance windows against the real daemon, on both engines: inside a window the owner
message about a matching incident is suppressed with reason `maintenance:<name>` while the event
is recorded and triaged as usual; outside one (another topic, a window not open now) it is sent.

The windows are set relative to the wall clock the daemon runs on (a window 2 h either side of
now holds; one 3 h ahead does not), so nothing waits for a time of day. The rule's edges (DST
nights, midnight, day names) are proven with an injected clock in tests/unit/test_maintenance.py.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from ntfy_intake import settings
from ntfy_intake.testbed import receiver
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from ..harness import DaemonThread, audit_records, env_for, query, wait_until

pytestmark = pytest.mark.engines

FALLBACK = "owner-notices"
TOKEN = "maintenance-test-token-7Hq2Xv9Lp4"


def hhmm(moment: datetime) -> str:
    return moment.strftime("%H:%M")


def windows_toml(now: datetime) -> str:
    """`nightly-backup` holds now (it opened 2 h ago, daily: if that was yesterday, the window
    crosses midnight and belongs to yesterday); `later` on the other topic opens in 3 h."""
    return f"""
[[maintenance]]
name = "nightly-backup"
topics = ["backup*"]
days = "daily"
from = "{hhmm(now - timedelta(hours=2))}"
to = "{hhmm(now + timedelta(hours=2))}"
timezone = "UTC"

[[maintenance]]
name = "later"
topics = ["alerts"]
days = "daily"
from = "{hhmm(now + timedelta(hours=3))}"
to = "{hhmm(now + timedelta(hours=4))}"
timezone = "UTC"
"""


@pytest.fixture
def emu() -> Iterator[NtfyEmulator]:
    with NtfyEmulator(EmulatorConfig(keepalive_interval=0.5)).running() as emulator:
        yield emulator


@pytest.fixture
def running(emu: NtfyEmulator, tmp_path: Path) -> Iterator[tuple[DaemonThread, Path]]:
    state = tmp_path / "state"
    config = tmp_path / "config.toml"
    config.write_text(windows_toml(datetime.now(UTC)))
    env = env_for(
        emu.url,
        state,
        cadence_debounce="0s",
        owner_fallback_topic=FALLBACK,
        http_token=TOKEN,
    )
    with receiver.running(tmp_path / "receiver.sqlite3") as triage:
        env["NTFY_INTAKE_RELAY_URL"] = triage.url
        with DaemonThread(settings.load(config, env)) as daemon:
            wait_until(lambda: daemon.daemon is not None and daemon.daemon.http_port)
            yield daemon, state


def owner_rows(state: Path) -> list[tuple[str, str | None]]:
    return query(
        state,
        "SELECT o.state, o.last_error FROM owner_outbox o JOIN outbox r"
        " ON o.key = 'notify:' || r.delivery_key WHERE r.incident_key LIKE ? ORDER BY o.key",
        "backups:%",
    )


def test_owner_message_inside_a_maintenance_window_is_suppressed_and_the_event_still_triaged(
    running: tuple[DaemonThread, Path], emu: NtfyEmulator
) -> None:
    _, state = running
    emu.publish("backups", "backup job failed", title="Backup", priority=5)
    wait_until(
        lambda: owner_rows(state) == [("suppressed", "maintenance:nightly-backup")],
        what="the owner message suppressed as maintenance:nightly-backup",
    )
    # The event was recorded and triaged as usual: in the inbox, audited, its request delivered.
    assert query(state, "SELECT topic FROM inbox") == [("backups",)]
    wait_until(lambda: [r for r in audit_records(state) if r["kind"] == "event"])
    (event,) = [r for r in audit_records(state) if r["kind"] == "event"]
    assert (event["topic"], event["outcome"]) == ("backups", "triage_requested")
    wait_until(
        lambda: (
            query(state, "SELECT state FROM outbox WHERE incident_key = ?", event["incident"])
            == [("delivered",)]
        ),
        what="the triage request delivered",
    )
    wait_until(
        lambda: (
            [
                (r["result"], r["reason"])
                for r in audit_records(state)
                if r["kind"] == "owner_message" and r.get("message_kind") == "triage"
            ]
            == [("suppressed", "maintenance:nightly-backup")]
        ),
        what="the owner_message audit line with its reason",
    )
    # Nothing reached the owner's fallback topic.
    assert emu.messages(FALLBACK) == []


def test_owner_message_outside_any_window_is_sent(
    running: tuple[DaemonThread, Path], emu: NtfyEmulator
) -> None:
    _, state = running
    emu.publish("alerts", "disk failing", title="Disk", priority=5)
    wait_until(
        lambda: query(state, "SELECT state FROM owner_outbox WHERE kind = 'triage'") == [("sent",)],
        what="the owner message sent (the `later` window is not open, `nightly-backup` is"
        " for another topic)",
    )
    deadline = time.monotonic() + 10
    while not emu.messages(FALLBACK) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(emu.messages(FALLBACK)) == 1


def test_console_lists_the_windows_the_one_holding_now_and_the_message_it_held(
    running: tuple[DaemonThread, Path], emu: NtfyEmulator
) -> None:
    daemon, state = running
    assert daemon.daemon is not None
    emu.publish("backups", "backup job failed", title="Backup", priority=5)
    wait_until(lambda: owner_rows(state) == [("suppressed", "maintenance:nightly-backup")])
    with httpx.Client(base_url=f"http://127.0.0.1:{daemon.daemon.http_port}") as client:
        form = client.get("/console/login").text
        csrf = re.search(r'name="csrf" value="([^"]+)"', form)
        assert csrf is not None
        answer = client.post("/console/login", data={"csrf": csrf.group(1), "token": TOKEN})
        assert answer.status_code == 303, answer.text
        page = client.get("/console/").text
        owner_page = client.get("/console/owner").text
    assert "maintenance:nightly-backup" in owner_page
    section = page[page.index('id="maintenance"') :]
    section = section[: section.index("</section>")]
    backup, later = section.split("<li>")[1:3]
    assert '<span class="tag">holding</span> <strong>nightly-backup</strong>' in backup
    assert "holding until" in backup and "backup*" in backup
    assert "holding" not in later.split("</strong>")[0] and "<strong>later</strong>" in later
    assert "next " in later
