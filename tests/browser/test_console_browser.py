"""The owner console in a real browser: Debian's Chromium driven by Playwright, loopback only.

Without /usr/bin/chromium these skip naming why; under CI=true they fail instead (.ci/run
installs it). NTFY_INTAKE_SCREENSHOTS=docs/console saves each page light, dark and phone."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ntfy_intake.testbed import receiver
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from ..harness import DaemonThread, daemon_process, env_for, query, settings_for, wait_until

CHROMIUM = Path("/usr/bin/chromium")
TOKEN = "browser-test-token-7Hq2Xv9Lp4"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
HOSTILE = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "\x1b[31mred\x1b[0m alert",
    "replacement \ufffd char",
    "lone \ud800 surrogate",  # a JSON \ud800 escape: ntfy (Go) and the emulator keep U+FFFD
]
# What a broken server or proxy could send (ntfy itself never writes a lone surrogate escape).
RAW_FRAME = (
    '{{"id":"loneSurrog8a","time":{time},"event":"message","topic":"alerts",'
    '"title":"raw \\ud800 title","message":"raw \\udfff body"}}\n'
)
SHOTS = os.environ.get("NTFY_INTAKE_SCREENSHOTS")  # read at import: conftest empties NTFY_INTAKE_*
PAGES = ["", "incidents", "deliveries", "owner", "quarantine", "audit"]

if not CHROMIUM.exists():
    if os.environ.get("CI") == "true":
        pytest.fail("CI=true but /usr/bin/chromium is missing (apt-get install chromium)")
    pytest.skip("no /usr/bin/chromium: apt-get install chromium", allow_module_level=True)

sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as play:
        launched = play.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield launched
        launched.close()


@pytest.fixture
def emu() -> Iterator[NtfyEmulator]:
    with NtfyEmulator(EmulatorConfig(keepalive_interval=0.5)).running() as emulator:
        yield emulator


@pytest.fixture
def daemon(emu: NtfyEmulator, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    state = tmp_path / "state"
    with receiver.running(tmp_path / "receiver.sqlite3") as triage:
        config = settings_for(
            emu.url, state, http_token=TOKEN, relay_url=triage.url, cadence_debounce="0s"
        )
        with DaemonThread(config) as running:
            wait_until(lambda: running.daemon is not None and running.daemon.http_port)
            assert running.daemon is not None
            yield f"http://127.0.0.1:{running.daemon.http_port}", state


def new_page(browser: Any, *, width: int = 1280, dark: bool = False) -> Any:
    context = browser.new_context(
        viewport={"width": width, "height": 900}, color_scheme="dark" if dark else "light"
    )
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.dialogs = dialogs
    return page


def log_in(page: Any, base: str) -> None:
    page.goto(base + "/console/login")
    page.fill("input[name=token]", TOKEN)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/console/$"))


def test_no_session_shows_the_login_page_and_no_alert_data(
    browser: Any, daemon: tuple[str, Path], emu: NtfyEmulator
) -> None:
    base, state = daemon
    emu.publish("alerts", "private-body", title="private-title")
    wait_until(lambda: query(state, "SELECT count(*) FROM inbox") == [(1,)])
    page = new_page(browser)
    for name in PAGES:
        page.goto(f"{base}/console/{name}")
        assert page.url.endswith("/console/login")
        assert "private" not in page.content()


def test_wrong_token_is_403(browser: Any, daemon: tuple[str, Path]) -> None:
    base, _ = daemon
    page = new_page(browser)
    page.goto(base + "/console/login")
    page.fill("input[name=token]", "not-the-token")
    with page.expect_response(lambda r: r.request.method == "POST") as answer:
        page.click("button[type=submit]")
    assert answer.value.status == 403


def test_hostile_titles_render_as_text_and_never_open_a_dialog(
    browser: Any, daemon: tuple[str, Path], emu: NtfyEmulator
) -> None:
    base, state = daemon
    emu.wait_for_subscribers(1)
    for n, title in enumerate(HOSTILE):
        # Through the emulator's HTTP JSON publish, as a publisher would (ASCII JSON: a lone
        # surrogate goes as its \ud800 escape).
        body = {"topic": "alerts", "title": title, "message": title, "priority": 3 + n % 2}
        answer = httpx.post(emu.url, content=json.dumps(body, ensure_ascii=True))
        assert answer.status_code == 200, answer.text
    assert emu.faults.inject_raw(RAW_FRAME.format(time=int(time.time())).encode()) == 1
    wait_until(lambda: query(state, "SELECT count(*) FROM inbox") == [(len(HOSTILE) + 1,)])
    page = new_page(browser)
    answers: list[int] = []
    page.on("response", lambda r: answers.append(r.status))
    log_in(page, base)
    for name in ["incidents", "", "audit"]:
        page.goto(f"{base}/console/{name}")
        assert "\x1b" not in page.content()
    page.goto(base + "/console/incidents")
    text = page.inner_text("main")
    assert "<script>alert(1)</script>" in text and "<img src=x onerror=alert(1)>" in text
    assert "lone \ufffd surrogate" in text  # the publish: U+FFFD from the emulator on
    assert "raw \ufffd title" in text and "raw \ufffd body" in text  # the raw frame's escape
    page.wait_for_timeout(300)
    assert page.dialogs == []
    assert answers and max(answers) < 500, answers


def test_no_page_scrolls_sideways_at_390_px_and_dark_mode_is_dark(
    browser: Any, daemon: tuple[str, Path], emu: NtfyEmulator
) -> None:
    base, state = daemon
    emu.publish("alerts", "disk " + "x" * 300, title="A very long title " * 8, priority=5)
    wait_until(lambda: query(state, "SELECT count(*) FROM inbox") == [(1,)])
    shots = SHOTS
    for width, dark, label in [(390, False, "phone"), (1280, False, "light"), (1280, True, "dark")]:
        page = new_page(browser, width=width, dark=dark)
        log_in(page, base)
        for name in PAGES:
            page.goto(f"{base}/console/{name}")
            overflow = page.evaluate(
                "document.documentElement.scrollWidth - document.documentElement.clientWidth"
            )
            assert overflow <= 0, f"/console/{name} scrolls sideways at {width} px"
            if dark:
                bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
                rgb = [int(v) for v in re.findall(r"\d+", bg)[:3]]
                assert sum(rgb) < 150, f"dark mode is not dark: {bg}"
            if shots:
                Path(shots).mkdir(parents=True, exist_ok=True)
                page.screenshot(path=f"{shots}/{name or 'overview'}-{label}.png", full_page=False)
        page.context.close()


def test_redrive_without_csrf_token_is_refused(browser: Any, daemon: tuple[str, Path]) -> None:
    base, _ = daemon
    page = new_page(browser)
    log_in(page, base)
    answer = page.request.post(base + "/console/redrive", form={"all": "1"})
    assert answer.status == 403


def test_stale_banner_appears_when_the_daemon_stops_answering(
    browser: Any, emu: NtfyEmulator, tmp_path: Path
) -> None:
    config = settings_for(emu.url, tmp_path / "state", http_token=TOKEN)
    running = DaemonThread(config).start()
    try:
        wait_until(lambda: running.daemon is not None and running.daemon.http_port)
        assert running.daemon is not None
        base = f"http://127.0.0.1:{running.daemon.http_port}"
        page = new_page(browser)
        log_in(page, base)
    finally:
        running.stop()
    page.wait_for_selector("#stale:not([hidden])", timeout=30_000)
    assert "the daemon is not answering" in page.inner_text("#stale")


def health_port(state: Path, pid: int | None = None) -> int | None:
    """The HTTP port in the daemon's health snapshot (of process `pid` when given)."""
    try:
        rows = query(state, "SELECT value FROM kv WHERE name = 'health'")
    except sqlite3.OperationalError:  # no store yet
        return None
    for (value,) in rows:
        snapshot = json.loads(value)
        port = snapshot.get("http_port")
        if isinstance(port, int) and (pid is None or snapshot.get("pid") == pid):
            return port
    return None


def started(state: Path, proc: subprocess.Popen[bytes]) -> str:
    wait_until(lambda: health_port(state, proc.pid), what=f"daemon {proc.pid} listening")
    return f"http://127.0.0.1:{health_port(state, proc.pid)}"


def test_redrive_from_the_page_puts_the_dead_row_back_and_the_receiver_gets_the_same_key(
    browser: Any, emu: NtfyEmulator, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    receipts_db = tmp_path / "receiver.sqlite3"
    with receiver.running(receipts_db) as triage:
        triage.faults.reject_next(400)  # one permanent refusal: the row goes dead at once
        config = settings_for(
            emu.url, state, http_token=TOKEN, relay_url=triage.url, cadence_debounce="0s"
        )
        with DaemonThread(config) as running:
            wait_until(lambda: running.daemon is not None and running.daemon.http_port)
            assert running.daemon is not None
            base = f"http://127.0.0.1:{running.daemon.http_port}"
            emu.wait_for_subscribers(1)
            emu.publish("alerts", "disk full", title="Disk")
            wait_until(lambda: query(state, "SELECT state FROM outbox") == [("dead",)])
            ((dead_key,),) = query(state, "SELECT delivery_key FROM outbox")
            assert receiver.receipts(receipts_db) == []  # the fault is used up: nothing refuses now
            page = new_page(browser)
            log_in(page, base)
            page.goto(base + "/console/deliveries")
            row = page.locator("li", has_text=dead_key)
            with page.expect_navigation():
                row.get_by_role("button", name="Redrive").click()
            wait_until(
                lambda: query(state, "SELECT state FROM outbox") == [("delivered",)],
                what="the redriven row delivered",
            )
            assert [r.key for r in receiver.receipts(receipts_db)] == [dead_key]
            page.goto(base + "/console/deliveries")
            assert "No dead row." in page.inner_text("main")


def test_silence_made_on_the_page_still_suppresses_after_kill_9_and_restart(
    browser: Any, emu: NtfyEmulator, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    with receiver.running(tmp_path / "receiver.sqlite3") as triage:
        env = env_for(emu.url, state, http_token=TOKEN, relay_url=triage.url, cadence_debounce="0s")
        with daemon_process(env) as first:
            base = started(state, first)
            page = new_page(browser)
            log_in(page, base)
            form = page.locator("form.silence-form").first
            form.locator("input[name=target]").fill("alerts")
            form.locator("input[name=reason]").fill("disk swap")
            with page.expect_navigation():
                form.get_by_role("button", name="Silence").click()
            assert "alerts" in page.inner_text("main")
            os.kill(first.pid, signal.SIGKILL)
            first.wait(timeout=10)
            page.context.close()
        with daemon_process(env) as second:
            started(state, second)
            emu.publish("alerts", "disk failing", title="Disk", priority=5)
            wait_until(
                lambda: (
                    query(state, "SELECT state, last_error FROM owner_outbox WHERE kind = 'triage'")
                    == [("suppressed", "silenced")]
                ),
                what="the owner message suppressed as silenced after the restart",
            )


def test_stale_banner_appears_within_30_s_of_kill_9_without_a_reload(
    browser: Any, emu: NtfyEmulator, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    with daemon_process(env_for(emu.url, state, http_token=TOKEN)) as proc:
        base = started(state, proc)
        page = new_page(browser)
        log_in(page, base)
        navigations: list[str] = []
        page.on("framenavigated", lambda frame: navigations.append(frame.url))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        page.get_by_text("not updated for").wait_for(state="visible", timeout=30_000)
        assert "the daemon is not answering" in page.inner_text("#stale")
        assert navigations == []  # the page told us by itself: no reload, no navigation
        page.context.close()
