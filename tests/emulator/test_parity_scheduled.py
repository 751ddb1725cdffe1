"""Scheduled delivery as ntfy does it (`X-Delay`/`Delay`/`X-At`/`At`/`X-In`/`In`, query and JSON
`delay`), checked against a real ntfy v2.13 server by hand (docs/emulator.md, fidelity table)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from ntfy_intake.emulator import NtfyEmulator

T0 = 1_700_000_000  # the fake clock's start (conftest.FakeClock)
_LINK = "https://ntfy.sh/docs/publish/#scheduled-delivery"


def poll(client: httpx.Client, path: str, **params: str) -> list[dict[str, Any]]:
    response = client.get(path, params={"poll": "1", **params})
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines()]


@pytest.mark.parametrize(
    ("how", "value", "offset"),
    [
        ("X-Delay", "30s", 30),
        ("Delay", "10m", 600),
        ("X-In", "1h30m", 5400),
        ("In", "10 seconds", 10),
        ("Delay", "1 day", 86400),
        ("Delay", "3d", 3 * 86400),
        ("X-At", str(T0 + 60), 60),
        ("At", "+60s", 60),
        ("?in", "10min", 600),
        ("?delay", "2h", 7200),
        ("?at", str(T0 + 3600), 3600),
    ],
)
def test_delay_forms_are_accepted_with_the_delivery_time(
    client: httpx.Client, how: str, value: str, offset: int
) -> None:
    if how.startswith("?"):
        response = client.put("/t", content=b"later", params={how[1:]: value})
    else:
        response = client.put("/t", content=b"later", headers={how: value})
    assert response.status_code == 200, response.text
    event = response.json()
    assert event["time"] == T0 + offset
    assert event["expires"] == T0 + offset + 43200


def test_json_publish_delay(client: httpx.Client) -> None:
    event = client.post("/", json={"topic": "t", "message": "j", "delay": "30s"}).json()
    assert event["time"] == T0 + 30


@pytest.mark.parametrize(
    ("value", "code", "error"),
    [
        ("9s", 40005, "invalid delay parameter: too small, please refer to the docs"),
        ("0", 40005, "invalid delay parameter: too small, please refer to the docs"),
        ("72h1s", 40006, "invalid delay parameter: too large, please refer to the docs"),
        ("4d", 40006, "invalid delay parameter: too large, please refer to the docs"),
        ("garbage", 40004, "invalid delay parameter: unable to parse delay"),
        ("30", 40004, "invalid delay parameter: unable to parse delay"),  # a past Unix time
        ("2 DAYS", 40004, "invalid delay parameter: unable to parse delay"),
        ("tomorrow, 10am", 40004, "invalid delay parameter: unable to parse delay"),
    ],
)
def test_bad_delays_get_ntfys_errors(
    client: httpx.Client, value: str, code: int, error: str
) -> None:
    response = client.put("/t", content=b"x", headers={"Delay": value})
    assert response.status_code == 400
    assert response.json() == {"code": code, "http": 400, "error": error, "link": _LINK}


def test_delay_without_cache_is_40002(client: httpx.Client) -> None:
    response = client.put("/t", content=b"x", headers={"Delay": "30s", "Cache": "no"})
    assert response.json() == {
        "code": 40002,
        "http": 400,
        "error": "cannot disable cache for delayed message",
    }


def test_scheduled_message_is_invisible_to_since_and_poll_until_sent(
    emu: NtfyEmulator, client: httpx.Client, clock: Any, open_stream: Callable[..., Any]
) -> None:
    before = emu.publish("t", "before")
    scheduled = client.put("/t", content=b"later", headers={"In": "30s"}).json()
    assert [e["id"] for e in poll(client, "/t/json")] == [before["id"]]
    assert [e["id"] for e in poll(client, "/t/json", since=before["id"])] == []
    assert [e["id"] for e in poll(client, "/t/json", scheduled="1")] == [
        before["id"],
        scheduled["id"],
    ]
    assert [e["id"] for e in poll(client, "/t/json", sched="1", since=before["id"])] == [
        scheduled["id"]
    ]
    assert [e["id"] for e in poll(client, "/t/json", since="latest")] == [before["id"]]
    stream = open_stream(emu, "/t/json")
    assert stream.event()["event"] == "open"
    clock.advance(29)
    assert emu.send_delayed() == []  # not due yet
    clock.advance(1)
    assert emu.send_delayed() == [scheduled["id"]]
    live = stream.event()
    assert live == scheduled  # time = the delivery time, as in the publish response
    assert [e["id"] for e in poll(client, "/t/json")] == [before["id"], scheduled["id"]]
    assert emu.send_delayed() == []  # sent once


def test_scheduled_row_keeps_its_publish_position_so_a_later_cursor_skips_it(
    emu: NtfyEmulator, client: httpx.Client, clock: Any
) -> None:
    """ntfy-spec section 10, item 1: the row id is taken at publish time."""
    scheduled = client.put("/t", content=b"later", headers={"Delay": "10s"}).json()
    after = emu.publish("t", "after")
    clock.advance(10)
    emu.send_delayed()
    assert [e["id"] for e in poll(client, "/t/json", since=after["id"])] == []
    # since=<time> reaches it by its delivery time; replay order is (time, insertion).
    assert [e["id"] for e in poll(client, "/t/json", since=str(T0))] == [
        after["id"],
        scheduled["id"],
    ]


def test_delayed_sender_runs_every_interval_by_the_emulators_clock(
    make_emulator: Callable[..., NtfyEmulator], clock: Any, open_stream: Callable[..., Any]
) -> None:
    emu = make_emulator(delayed_sender_interval=0.05)
    scheduled = emu.publish("t", "later", delay=20)
    stream = open_stream(emu, "/t/json")
    assert stream.event()["event"] == "open"
    assert stream.events_until_quiet(0.3) == []  # the clock has not moved
    clock.advance(20)
    assert stream.event(timeout=5)["id"] == scheduled["id"]


def test_pruning_keeps_unsent_scheduled_messages(emu: NtfyEmulator, clock: Any) -> None:
    scheduled = emu.publish("t", "later", delay=3600)
    clock.advance(3600 + 43200)  # past its expiry, never sent
    assert emu.prune() == []
    assert emu.send_delayed() == [scheduled["id"]]
    assert emu.prune() == [scheduled["id"]]
