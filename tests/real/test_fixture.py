"""The real-server fixture itself: it starts, answers, restarts with and without its cache, and
makes users, tokens and ACLs with ntfy's own commands."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from ..real_ntfy import RealNtfy

pytestmark = pytest.mark.real_ntfy


def test_real_server_publishes_and_replays(make_real_ntfy: Callable[..., RealNtfy]) -> None:
    server = make_real_ntfy()
    sent = server.publish("alerts", "disk full", Title="nas")
    polled = httpx.get(f"{server.url}/alerts/json", params={"poll": "1"}).text.splitlines()
    assert [line for line in polled if sent["id"] in line]
    assert sent["expires"] - sent["time"] == 12 * 3600


def test_restart_keeps_or_drops_the_cache(make_real_ntfy: Callable[..., RealNtfy]) -> None:
    server = make_real_ntfy()
    sent = server.publish("alerts", "kept")
    server.kill9()
    server.restart(keep_cache=True)
    assert sent["id"] in httpx.get(f"{server.url}/alerts/json?poll=1").text
    server.restart(keep_cache=False)
    assert httpx.get(f"{server.url}/alerts/json?poll=1").text == ""


def test_tokens_and_acls_come_from_ntfys_own_commands(
    make_real_ntfy: Callable[..., RealNtfy],
) -> None:
    server = make_real_ntfy(auth=True, default_access="deny-all")
    server.add_user("reader")
    server.grant("reader", "alerts", "read-only")
    token = server.add_token("reader")
    auth = {"Authorization": f"Bearer {token}"}
    assert httpx.get(f"{server.url}/alerts/json?poll=1", headers=auth).status_code == 200
    assert httpx.get(f"{server.url}/other/json?poll=1", headers=auth).json()["code"] == 40301
    assert httpx.get(f"{server.url}/alerts/json?poll=1").json()["code"] == 40301
