"""Escalations shown apart from the agent's messages (DESIGN.md section 13), in `status` and on
the console's overview: the day's count against `relay.escalate_daily_cap`, the newest one, and
the requests that escalate next with their due instants. Both engines: the store is under test
(the rows `status` reads); the console through the real daemon and its HTTP surface.

Each test is named after the failure it kills.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest

from ntfy_intake import settings
from ntfy_intake.rules import cadence
from ntfy_intake.store import db
from ntfy_intake.store.owner_queue import OwnerQueue
from ntfy_intake.surfaces import status
from ntfy_intake.testbed import signal_standin
from ntfy_intake.testbed.emulator import NtfyEmulator
from ntfy_intake.testbed.receiver import ReceiverHandle

from ..harness import DaemonThread, env_for, wait_until

pytestmark = pytest.mark.engines

TOKEN = "escalation-console-token-7Hq2Lm4Xz9"


def incident(conn: db.Connection, key: str, severity: int) -> None:
    conn.execute(
        "INSERT INTO incidents(key, severity, status, status_time, status_event, first_seen,"
        " last_seen, events, version) VALUES (?, ?, 'firing', 1, 'e1', 1, 1, 1, 1)",
        (key, severity),
    )


def request(conn: db.Connection, key: str, incident_key: str, created_at: float) -> None:
    conn.execute(
        "INSERT INTO outbox(delivery_key, incident_key, reason, state, attempts, due_at,"
        " created_at) VALUES (?, ?, 'new_incident', 'pending', 3, ?, ?)",
        (key, incident_key, created_at, created_at),
    )


def test_status_shows_escalations_apart_with_the_cap_the_last_and_what_is_due_next(
    store: db.Connection, tmp_path: Path
) -> None:
    """Failure mode: the owner sees escalations only mixed into "owner outbox: sent 7", cannot
    tell how much of the escalation cap is left, and cannot see that one is about to come."""
    config = settings.load(
        None,
        env_for(
            "http://127.0.0.1:9",
            tmp_path,
            relay_url="http://127.0.0.1:9/triage",
            cadence_debounce="0s",
        ),
    )
    now = time.time()
    queue = OwnerQueue(cadence.Policy(), cadence.CadenceState.empty(cadence.Policy()))
    with db.write_txn(store) as txn:
        incident(store, "alerts:disk", 5)
        incident(store, "alerts:cpu", 4)
        incident(store, "alerts:fan", 3)  # below escalate_min_severity: never listed
        request(store, "tri_disk", "alerts:disk", now - 700)
        request(store, "tri_cpu", "alerts:cpu", now - 100)
        request(store, "tri_fan", "alerts:fan", now - 100)
        queue.escalation(
            txn,
            "escalate:tri_disk",
            "[alerts] Disk full (severity 5) - triage agent silent for 10m.",
            now - 60,
            incident="alerts:disk",
            topics=("alerts",),
        )
    report = status.collect(store, config, now)
    found = report["escalations"]
    assert (found["enabled"], found["today"], found["held_today"], found["cap"]) == (
        True,
        1,
        0,
        5,
    )
    assert found["last"]["incident"] == "alerts:disk" and found["last"]["state"] == "pending"
    [due] = found["upcoming"]
    assert (due["delivery_key"], due["incident"]) == ("tri_cpu", "alerts:cpu")
    assert 490 <= due["due_in_s"] <= 500
    text = status.render(report)
    assert re.search(r"\nescalations +1 of 5 today, after 10m silent at severity >= 4\n", text)
    assert re.search(r"\n  last +\S+ \S+ alerts:disk \(pending\)", text), text
    assert re.search(r"\n  due +alerts:cpu \(severity 4\) at .* unless the agent answers", text)


def test_status_says_escalation_is_off_without_a_relay(
    store: db.Connection, tmp_path: Path
) -> None:
    config = settings.load(None, env_for("http://127.0.0.1:9", tmp_path))
    report = status.collect(store, config, time.time())
    assert report["escalations"]["enabled"] is False
    assert re.search(r"\nescalations +off \(no relay nor", status.render(report))


def overview_card(base: str) -> str:
    with httpx.Client(base_url=base, follow_redirects=False, timeout=10) as client:
        form = client.get("/console/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf is not None
        answer = client.post("/console/login", data={"csrf": csrf.group(1), "token": TOKEN})
        assert answer.status_code == 303, answer.text
        page = client.get("/console/").text
    found = re.search(r'<div class="card" id="escalations">(.*?)</div>', page, re.DOTALL)
    assert found is not None, page
    return found.group(1)


def test_console_overview_shows_the_days_escalations_and_the_last_one(
    emu: NtfyEmulator, tmp_path: Path, triage: ReceiverHandle
) -> None:
    triage.faults.fail_next(100_000, status=503)
    with signal_standin.running() as sig:
        config = settings.load(
            None,
            env_for(
                emu.url,
                tmp_path / "state",
                http_token=TOKEN,
                cadence_debounce="0s",
                relay_url=triage.url,
                relay_max_attempts="1000",
                relay_escalate_after="1s",
                owner_signal_url=sig.url,
                owner_signal_number="+31600000000",
                owner_recipients="+31600000001",
            ),
        )
        with DaemonThread(config) as running:
            wait_until(lambda: running.daemon is not None and running.daemon.http_port)
            assert running.daemon is not None
            base = f"http://127.0.0.1:{running.daemon.http_port}"
            emu.wait_for_subscribers(1, timeout=30)
            assert "No request is waiting on a silent agent" in overview_card(base)
            emu.publish("alerts", "nas disk at 99%", title="Disk full on nas", priority=5)
            wait_until(
                lambda: "Last:" in overview_card(base), timeout=30, what="the escalation shown"
            )
            card = overview_card(base)
    assert '<span class="big">1</span> of 5 today' in card
    assert re.search(r"Last: .*alerts.*\((pending|sent)\)", card), card
