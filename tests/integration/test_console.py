"""The owner console over plain HTTP against the real daemon: sessions, CSRF, headers, silences."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ntfy_intake.testbed import receiver
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from ..harness import DaemonThread, query, settings_for, wait_until

pytestmark = pytest.mark.engines

TOKEN = "console-test-token"
OPEN: list[httpx.Client] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while OPEN:
        OPEN.pop().close()


@pytest.fixture
def emu() -> Iterator[NtfyEmulator]:
    with NtfyEmulator(EmulatorConfig(keepalive_interval=0.5)).running() as emulator:
        yield emulator


@pytest.fixture
def console(emu: NtfyEmulator, tmp_path: Path) -> Iterator[tuple[DaemonThread, str, Path]]:
    state = tmp_path / "state"
    with receiver.running(tmp_path / "receiver.sqlite3") as triage:
        config = settings_for(
            emu.url, state, http_token=TOKEN, relay_url=triage.url, cadence_debounce="0s"
        )
        with DaemonThread(config) as running:
            wait_until(lambda: running.daemon is not None and running.daemon.http_port)
            assert running.daemon is not None
            yield running, f"http://127.0.0.1:{running.daemon.http_port}", state


def login(base: str) -> httpx.Client:
    client = httpx.Client(base_url=base, follow_redirects=False)
    OPEN.append(client)
    form = client.get("/console/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert csrf is not None
    answer = client.post("/console/login", data={"csrf": csrf.group(1), "token": TOKEN})
    assert answer.status_code == 303, answer.text
    return client


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None
    return found.group(1)


def test_no_session_gets_the_login_page_and_no_alert_data(
    console: tuple[DaemonThread, str, Path], emu: NtfyEmulator
) -> None:
    _, base, state = console
    emu.publish("alerts", "secret-alert-body", title="Disk secret")
    wait_until(lambda: query(state, "SELECT count(*) FROM inbox") == [(1,)])
    for path in ["/console/", "/console/incidents", "/console/audit", "/console/owner"]:
        answer = httpx.get(base + path, follow_redirects=True)
        assert answer.url.path == "/console/login"
        assert "secret" not in answer.text.lower()
        assert answer.headers["content-security-policy"] == "default-src 'self'"
        assert answer.headers["x-frame-options"] == "DENY"


def test_wrong_token_is_403_and_sets_no_session(console: tuple[DaemonThread, str, Path]) -> None:
    _, base, _ = console
    with httpx.Client(base_url=base) as client:
        csrf = csrf_of(client.get("/console/login").text)
        answer = client.post("/console/login", data={"csrf": csrf, "token": "wrong"})
    assert answer.status_code == 403
    assert "ntfy_intake_console" not in answer.headers.get("set-cookie", "")


def test_session_cookie_is_httponly_and_samesite_strict(
    console: tuple[DaemonThread, str, Path],
) -> None:
    _, base, _ = console
    with httpx.Client(base_url=base) as client:
        csrf = csrf_of(client.get("/console/login").text)
        answer = client.post("/console/login", data={"csrf": csrf, "token": TOKEN})
    cookie = answer.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie


def test_post_without_csrf_token_is_refused_and_changes_nothing(
    console: tuple[DaemonThread, str, Path],
) -> None:
    running, base, _ = console
    client = login(base)
    answer = client.post(
        "/console/silences", data={"scope": "topic", "target": "alerts", "for": "2h"}
    )
    assert answer.status_code == 403
    assert (
        running.daemon is not None
        and running.daemon.owner_queue.state.silences.active(running.daemon.clock()) == []
    )


def test_every_page_renders_for_a_session_with_the_status_in_the_title(
    console: tuple[DaemonThread, str, Path], emu: NtfyEmulator
) -> None:
    _, base, state = console
    emu.publish("alerts", "<img src=x onerror=alert(1)>", title="<script>alert(1)</script>")
    wait_until(lambda: query(state, "SELECT count(*) FROM inbox") == [(1,)])
    client = login(base)
    for path in ["/", "/incidents", "/deliveries", "/owner", "/quarantine", "/audit?kind=event"]:
        answer = client.get("/console" + path)
        assert answer.status_code == 200, path
        assert re.search(r"<title>\w+ · ", answer.text), path
        assert "<script>alert" not in answer.text and "<img src=x" not in answer.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in client.get("/console/incidents").text


def test_silence_from_the_console_suppresses_the_next_owner_message_as_silenced(
    console: tuple[DaemonThread, str, Path], emu: NtfyEmulator
) -> None:
    _, base, state = console
    client = login(base)
    csrf = csrf_of(client.get("/console/").text)
    made = client.post(
        "/console/silences",
        data={"csrf": csrf, "scope": "topic", "target": "alerts", "for": "2h", "reason": "fix"},
    )
    assert made.status_code == 303
    emu.publish("alerts", "disk failing", title="Disk", priority=5)
    wait_until(
        lambda: (
            query(state, "SELECT state, last_error FROM owner_outbox WHERE kind = 'triage'")
            == [("suppressed", "silenced")]
        ),
        timeout=30,
    )
    assert "silenced" in client.get("/console/owner").text
    assert query(state, "SELECT count(*) FROM outbox WHERE state = 'delivered'") == [(1,)]
