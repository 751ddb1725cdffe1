"""The fallback topic's buttons against the real daemon, on both engines: alerts through the
emulator, a triage agent asking to tell the owner, no Signal (every owner message goes to the
fallback topic), `http.public_url` set. The buttons are read from the emulator's cache as the
ntfy app gets them and pressed as it presses them.

Each test is named after the failure it kills.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ntfy_intake import settings
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator
from ntfy_intake.testbed.receiver import ReceiverHandle

from ..harness import DaemonThread, audit_records, env_for, query, wait_until
from ..ports import free_port

pytestmark = pytest.mark.engines

FALLBACK = "owner-notices"


@pytest.fixture
def emu() -> Iterator[NtfyEmulator]:
    with NtfyEmulator(EmulatorConfig(keepalive_interval=0.5)).running() as emulator:
        yield emulator


def config(emu: NtfyEmulator, state: Path, triage: ReceiverHandle, port: int) -> Any:
    return settings.load(
        None,
        env_for(
            emu.url,
            state,
            relay_url=triage.url,
            cadence_debounce="0s",
            cadence_cooldown="0s",  # every event a request: every one could reach the owner
            owner_fallback_topic=FALLBACK,
            http_listen=f"127.0.0.1:{port}",
            http_public_url=f"http://127.0.0.1:{port}",
        ),
    )


def rows(state: Path, title: str) -> list[tuple[str, str | None]]:
    """The owner messages about the incident titled `title`, oldest first."""
    try:
        return query(
            state,
            "SELECT state, last_error FROM owner_outbox"
            " WHERE kind = 'triage' AND text LIKE ? ORDER BY created_at, key",
            f"%{title}%",
        )
    except Exception:  # the store is being created by the daemon
        return []


def alert(emu: NtfyEmulator, state: Path, title: str, n: int) -> None:
    emu.publish("alerts", f"{title} number {n}", title=title, priority=5)
    wait_until(lambda: len(rows(state, title)) == n, timeout=30, what=f"{title} message {n}")
    wait_until(lambda: rows(state, title)[-1][0] != "pending", timeout=30, what="settled")


def buttons(emu: NtfyEmulator, title: str) -> dict[str, dict[str, Any]]:
    """The buttons of the first fallback message about `title`, as a subscriber reads them."""

    def found() -> list[dict[str, Any]]:
        response = httpx.get(f"{emu.url}/{FALLBACK}/json?poll=1", timeout=10)
        events = [httpx.Response(200, content=line).json() for line in response.text.splitlines()]
        return [e for e in events if title in e.get("message", "")]

    wait_until(found, timeout=30, what=f"the fallback message about {title}")
    return {a["label"]: a for a in found()[0].get("actions", [])}


def press(action: dict[str, Any]) -> httpx.Response:
    return httpx.request(
        action["method"],
        action["url"],
        headers=action.get("headers", {}),
        content=action.get("body", "").encode(),
        timeout=10,
    )


def test_buttons_ack_and_silence_hold_across_a_restart_while_other_incidents_arrive(
    emu: NtfyEmulator, tmp_path: Path, triage: ReceiverHandle
) -> None:
    """Failure mode: the owner presses Ack or Silence 2h on his phone and keeps being messaged
    about it (or, after a restart, messaged again), or an unrelated incident is held too."""
    state = tmp_path / "state"
    port = free_port()
    config_ = config(emu, state, triage, port)
    with DaemonThread(config_) as daemon:
        emu.wait_for_subscribers(1, timeout=30)
        wait_until(lambda: daemon.daemon is not None and daemon.daemon.http_port, what="HTTP")
        alert(emu, state, "Disk full", 1)
        alert(emu, state, "CPU hot", 1)
        disk, cpu = buttons(emu, "Disk full"), buttons(emu, "CPU hot")
        assert disk["Ack"]["url"] == f"http://127.0.0.1:{port}/v1/owner/buttons/ack"
        acked = press(disk["Ack"])
        assert acked.status_code == 200, acked.text
        silenced = press(cpu["Silence 2h"])
        assert silenced.status_code == 200, silenced.text
        assert press(disk["Ack"]).status_code == 409
        alert(emu, state, "Disk full", 2)
        alert(emu, state, "CPU hot", 2)
        alert(emu, state, "Fan stopped", 1)
    assert rows(state, "Disk full")[1] == ("suppressed", "acknowledged")
    assert rows(state, "CPU hot")[1] == ("suppressed", "silenced")
    assert rows(state, "Fan stopped") == [("sent", None)]
    assert set(buttons(emu, "Fan stopped")) == {"Ack", "Silence 2h"}
    with DaemonThread(config_):
        emu.wait_for_subscribers(1, timeout=30)
        alert(emu, state, "Disk full", 3)
        alert(emu, state, "CPU hot", 3)
        alert(emu, state, "Fan stopped", 2)
    assert rows(state, "Disk full")[2] == ("suppressed", "acknowledged")
    assert rows(state, "CPU hot")[2] == ("suppressed", "silenced")
    assert rows(state, "Fan stopped")[1] == ("sent", None)
    lines = [r for r in audit_records(state) if r["kind"] == "owner_reply"]
    assert [(r["command"], r["result"], r["via"]) for r in lines] == [
        ("ack", "acknowledged", "button"),
        ("silence", "silenced", "button"),
        ("ack", "already_done", "button"),
    ]
    secret = query(state, "SELECT secret FROM owner_action_key")[0][0]
    assert secret not in str(audit_records(state))
