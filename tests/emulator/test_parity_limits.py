"""ntfy's limiters are on by default (request bucket 60 + 1/5 s, 30 subscriptions per visitor);
the emulator's defaults follow, and every 429 is ntfy's body without a Retry-After header."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from ntfy_intake.emulator import EmulatorConfig, NtfyEmulator


def test_rate_limits_are_on_by_default_as_in_ntfy() -> None:
    config = EmulatorConfig()
    assert config.request_limit is True
    assert (config.request_limit_burst, config.request_limit_replenish) == (60, 5.0)
    assert config.subscription_limit == 30


def test_the_61st_request_of_a_default_emulator_gets_42901_without_retry_after(
    clock: Any,
) -> None:
    with (
        NtfyEmulator(EmulatorConfig(clock=clock)).running() as emu,
        httpx.Client(base_url=emu.url, timeout=5) as http,
    ):
        statuses = [http.put("/t", content=f"m{n}").status_code for n in range(60)]
        assert statuses == [200] * 60
        refused = http.get("/t/json", params={"poll": "1"})
        assert refused.status_code == 429
        assert refused.json() == {
            "code": 42901,
            "http": 429,
            "error": "limit reached: too many requests",
            "link": "https://ntfy.sh/docs/publish/#limitations",
        }
        assert "retry-after" not in refused.headers
        clock.advance(5.0)  # one token back
        assert http.put("/t", content="again").status_code == 200


def test_31st_concurrent_subscription_of_a_default_emulator_gets_42903(
    clock: Any, open_stream: Callable[..., Any]
) -> None:
    with NtfyEmulator(EmulatorConfig(clock=clock)).running() as emu:
        streams = [open_stream(emu, "/t/json") for _ in range(30)]
        for stream in streams:
            assert stream.event()["event"] == "open"
        refused = open_stream(emu, "/t/json")
        assert refused.read_head() == 429
        assert "retry-after" not in refused.headers
        assert b'"code":42903' in refused.body
