"""The HTTP surface locked (DESIGN.md section 10, turn 4), against the real daemon over real
sockets on 127.0.0.1: failed logins throttled (bearer and console alike) with one owner notice
per episode, the Host check, logout by POST with the CSRF token."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from ..harness import DaemonThread, query, settings_for, wait_until

pytestmark = pytest.mark.one_engine(
    "the login throttle, the Host check and logout on the HTTP surface; the store only holds the notice"
)

TOKEN = "locked-surface-token-7Hq2Xv9Lp4"
GUESSES = 200


@pytest.fixture
def emu() -> Iterator[NtfyEmulator]:
    with NtfyEmulator(EmulatorConfig(keepalive_interval=0.5)).running() as emulator:
        yield emulator


@pytest.fixture
def daemon(emu: NtfyEmulator, tmp_path: Path) -> Iterator[tuple[DaemonThread, str, Path]]:
    state = tmp_path / "state"
    config = settings_for(emu.url, state, http_token=TOKEN, http_public_url="http://pi.lan:8788")
    with DaemonThread(config) as running:
        wait_until(lambda: running.daemon is not None and running.daemon.http_port)
        assert running.daemon is not None
        yield running, f"http://127.0.0.1:{running.daemon.http_port}", state


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None, page
    return found.group(1)


def log_in(client: httpx.Client) -> httpx.Response:
    csrf = csrf_of(client.get("/console/login").text)
    return client.post("/console/login", data={"csrf": csrf, "token": TOKEN})


def login_notices(state: Path) -> list[tuple[str, str]]:
    return [
        (str(key), str(text))
        for key, text in query(state, "SELECT key, text FROM owner_outbox WHERE kind = 'notice'")
        if str(key).startswith("login_throttled:")
    ]


def test_a_brute_force_loop_gets_429s_and_a_handful_of_guesses_and_the_owner_one_notice(
    daemon: tuple[DaemonThread, str, Path],
) -> None:
    """Failure mode: 1,000 wrong tokens taken in 0.7 s, each one checked, one log line and no
    notice; a 4-digit token fell in 4.9 s."""
    _, base, state = daemon
    started = time.monotonic()
    answers: Counter[int] = Counter()
    retry_after: set[str] = set()
    with httpx.Client(base_url=base, timeout=10) as client:
        for i in range(GUESSES):
            guess = f"guess-{i:04d}-XvQ9"
            if i % 2:
                answer = client.get("/v1/feed/agent", headers={"Authorization": f"Bearer {guess}"})
            else:  # the console's login form: the same guard, the same count
                csrf = csrf_of(client.get("/console/login").text)
                answer = client.post("/console/login", data={"csrf": csrf, "token": guess})
            answers[answer.status_code] += 1
            if answer.status_code == 429:
                retry_after.add(answer.headers["retry-after"])
        elapsed = time.monotonic() - started
        # The right token, from the held address: refused unchecked, bearer and console alike.
        right = client.get("/v1/feed/agent", headers={"Authorization": f"Bearer {TOKEN}"})
        console = log_in(client)
    print(f"\n{GUESSES} guesses in {elapsed:.2f} s: {dict(answers)}; Retry-After {retry_after}")
    assert answers[403] == 5, answers  # the tokens actually compared: five, then the hold
    assert answers[429] == GUESSES - 5, answers
    assert all(1 <= int(value) <= 60 for value in retry_after), retry_after
    assert right.status_code == 429 and int(right.headers["retry-after"]) >= 1
    assert console.status_code == 429 and "ntfy_intake_console" not in str(console.cookies)
    wait_until(lambda: login_notices(state), 15, "the owner's notice recorded")
    time.sleep(0.5)  # a second notice, were one (wrongly) queued, would be recorded by now
    notices = login_notices(state)
    assert len(notices) == 1, notices
    key, text = notices[0]
    assert "loopback" in text and "429" in text  # 127.0.0.1: every loopback address is one
    assert "guess-" not in text and "guess-" not in key and TOKEN not in text


def test_a_guesser_behind_a_local_reverse_proxy_is_held_apart_from_the_agents_on_loopback(
    daemon: tuple[DaemonThread, str, Path],
) -> None:
    """Failure mode: behind a reverse proxy on the box every client is 127.0.0.1, so one
    guesser through the proxy would hold every agent on the box with it."""
    _, base, _ = daemon
    proxied = {"X-Forwarded-For": "198.51.100.7, 203.0.113.9"}
    with httpx.Client(base_url=base, timeout=10) as client:
        codes = [
            client.get(
                "/v1/feed/agent", headers={**proxied, "Authorization": f"Bearer wrong-{i}-XvQ9"}
            ).status_code
            for i in range(8)
        ]
        agent = client.get("/v1/feed/agent", headers={"Authorization": f"Bearer {TOKEN}"})
        again = client.get(
            "/v1/feed/agent", headers={**proxied, "Authorization": f"Bearer {TOKEN}"}
        )
    assert codes == [403] * 5 + [429] * 3, codes
    assert agent.status_code == 200  # the agent on loopback, not through the proxy
    assert again.status_code == 429  # the proxied client (203.0.113.9) is held


def test_a_request_naming_a_foreign_host_is_refused_before_any_route(
    daemon: tuple[DaemonThread, str, Path],
) -> None:
    """Failure mode: any Host served, so a page on a name whose DNS the attacker answers (DNS
    rebinding) could reach the feed and the console through the owner's browser."""
    _, base, _ = daemon
    port = base.rsplit(":", 1)[1]
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=base, timeout=10) as client:
        for forged in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
            for path in ("/v1/feed/agent", "/console/login"):
                answer = client.get(path, headers={**auth, "Host": forged})
                assert answer.status_code == 421, (forged, path, answer.status_code)
                assert answer.json()["error"] == "wrong_host"
            # Nothing secret there: monitoring scrapes them by whatever name it knows.
            assert client.get("/healthz", headers={"Host": forged}).status_code in (200, 503)
        for good in (
            f"127.0.0.1:{port}",
            f"localhost:{port}",
            "[::1]",
            f"192.168.1.5:{port}",  # an IP literal: the page's own origin, not a rebinding
            "pi.lan:8788",  # http.public_url's host
            "PI.LAN.",
        ):
            answer = client.get("/v1/feed/agent", headers={**auth, "Host": good})
            assert answer.status_code == 200, (good, answer.status_code)


def test_a_get_of_the_logout_page_does_not_log_out_only_a_post_with_the_csrf_token_does(
    daemon: tuple[DaemonThread, str, Path],
) -> None:
    """Failure mode: logout was a GET without CSRF (any page's <img src=.../logout> did it)."""
    _, base, _ = daemon
    with httpx.Client(base_url=base, timeout=10, follow_redirects=False) as client:
        assert log_in(client).status_code == 303
        page = client.get("/console/")
        assert page.status_code == 200
        assert 'action="/console/logout"' in page.text and 'href="/console/logout"' not in page.text
        shown = client.get("/console/logout")
        assert shown.status_code == 200 and 'method="post"' in shown.text
        assert client.get("/console/").status_code == 200  # still logged in
        refused = client.post("/console/logout", data={})
        assert refused.status_code == 403
        assert client.get("/console/").status_code == 200  # still logged in
        out = client.post("/console/logout", data={"csrf": csrf_of(page.text)})
        assert out.status_code == 303
        assert client.get("/console/").headers.get("location") == "/console/login"
