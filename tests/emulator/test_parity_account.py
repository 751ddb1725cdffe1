"""`GET /v1/account` (anonymous) and `GET /v1/stats`, shaped as a real ntfy v2.13 answers them:
Home Assistant's ntfy integration calls account() at setup, aiontfy has account() and stats()."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from ntfy_intake.emulator import NtfyEmulator

# Captured from a real ntfy v2.13 (default limits, cache-duration 12h), anonymous visitor.
REAL_ANONYMOUS_ACCOUNT = {
    "username": "*",
    "role": "anonymous",
    "limits": {
        "basis": "ip",
        "messages": 17280,
        "messages_expiry_duration": 43200,
        "emails": 24,
        "calls": 0,
        "reservations": 0,
        "attachment_total_size": 104857600,
        "attachment_file_size": 15728640,
        "attachment_expiry_duration": 10800,
        "attachment_bandwidth": 524288000,
    },
    "stats": {
        "messages": 0,
        "messages_remaining": 17280,
        "emails": 0,
        "emails_remaining": 24,
        "calls": 0,
        "calls_remaining": 0,
        "reservations": 0,
        "reservations_remaining": 0,
        "attachment_total_size": 0,
        "attachment_total_size_remaining": 104857600,
    },
}


def test_anonymous_account_is_what_a_real_ntfy_answers(
    make_emulator: Callable[..., NtfyEmulator],
) -> None:
    emu = make_emulator(request_limit=True)
    with httpx.Client(base_url=emu.url, timeout=5) as http:
        response = http.get("/v1/account")
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        assert response.json() == REAL_ANONYMOUS_ACCOUNT
        assert list(response.json()) == ["username", "role", "limits", "stats"]
        http.put("/t", content=b"one")
        http.put("/t", content=b"two")
        stats = http.get("/v1/account").json()["stats"]
        assert (stats["messages"], stats["messages_remaining"]) == (2, 17278)


def test_account_follows_the_cache_duration(make_emulator: Callable[..., NtfyEmulator]) -> None:
    emu = make_emulator(cache_duration=3600.0)
    account = httpx.get(f"{emu.url}/v1/account").json()
    assert account["limits"]["messages_expiry_duration"] == 3600


def test_account_post_and_other_methods_are_404(client: httpx.Client) -> None:
    assert client.post("/v1/account", json={}).json()["code"] == 40401


def test_stats_count_publishes_and_rate_over_manager_samples(
    make_emulator: Callable[..., NtfyEmulator], clock: Any
) -> None:
    emu = make_emulator(manager_interval=None)
    with httpx.Client(base_url=emu.url, timeout=5) as http:
        assert http.get("/v1/stats").json() == {"messages": 0, "messages_rate": 0}
        for n in range(6):
            http.put("/t", content=f"m{n}".encode())
        emu.publish("t", "programmatic")
        assert http.get("/v1/stats").json() == {"messages": 7, "messages_rate": 0}
        emu.manage()  # one manager run (60 s) later
        assert http.get("/v1/stats").json() == {"messages": 7, "messages_rate": 7 / 60}
