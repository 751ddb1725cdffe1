"""ntfy 2.16+ sequence ids: updates, `message_delete` and `message_clear` (ntfy-spec.md items 39
and 40; modelled from the spec, as the real server at hand is v2.13, which has none of this:
`EmulatorConfig(ntfy_version="2.13")` switches it off)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from ntfy_intake.emulator import EmulatorConfig, NtfyEmulator


def _poll(client: httpx.Client, path: str, **params: str) -> list[dict[str, Any]]:
    response = client.get(path, params={"poll": "1", **params})
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines()]


def test_sequence_id_is_left_out_when_equal_to_the_id(client: httpx.Client) -> None:
    plain = client.put("/t", content=b"x").json()
    assert "sequence_id" not in plain
    assert "sequence_id" not in _poll(client, "/t/json")[0]


def test_updates_reuse_a_sequence_id_by_path_header_or_json(client: httpx.Client) -> None:
    first = client.put("/t/job-1", content=b"started").json()
    second = client.put("/t", content=b"halfway", headers={"X-Sequence-ID": "job-1"}).json()
    third = client.post("/", json={"topic": "t", "message": "done", "sequence_id": "job-1"}).json()
    fourth = client.put("/t", content=b"q", params={"sid": "job-1"}).json()
    events = [first, second, third, fourth]
    assert [event["sequence_id"] for event in events] == ["job-1"] * 4
    assert len({event["id"] for event in events}) == 4  # each update is its own message
    assert list(first)[:3] == ["id", "sequence_id", "time"]
    assert [event["message"] for event in _poll(client, "/t/json")] == [
        "started",
        "halfway",
        "done",
        "q",
    ]


def test_invalid_sequence_id_is_40049(client: httpx.Client) -> None:
    response = client.put("/t", content=b"x", headers={"Sequence-ID": "not valid!"})
    assert response.status_code == 400
    assert response.json()["code"] == 40049


def test_delete_and_clear_are_cached_events_replayed_by_since(
    emu: NtfyEmulator, client: httpx.Client, open_stream: Callable[..., Any]
) -> None:
    original = client.put("/t/job-1", content=b"started").json()
    stream = open_stream(emu, "/t/sse")
    assert stream.line().startswith("event: open")
    assert stream.line().startswith("data: ")
    assert stream.line() == ""
    deleted = client.delete("/t/job-1")
    assert deleted.status_code == 200
    delete_event = deleted.json()
    assert list(delete_event) == ["id", "sequence_id", "time", "expires", "event", "topic"]
    assert (delete_event["event"], delete_event["sequence_id"]) == ("message_delete", "job-1")
    assert delete_event["id"] != "job-1"
    # SSE writes message_delete as data only, like a message.
    assert stream.line() == "data: " + json.dumps(delete_event, separators=(",", ":"))
    cleared = client.put("/t/job-1/clear").json()
    read = client.put("/t/job-1/read").json()
    assert [cleared["event"], read["event"]] == ["message_clear", "message_clear"]
    replay = _poll(client, "/t/json", since="all")
    assert [event["id"] for event in replay] == [
        original["id"],
        delete_event["id"],
        cleared["id"],
        read["id"],
    ]
    assert [event["id"] for event in _poll(client, "/t/json", since=delete_event["id"])] == [
        cleared["id"],
        read["id"],
    ]
    # Filters apply to delete/clear events as to messages.
    assert _poll(client, "/t/json", title="x") == []


def test_ntfy_2_13_has_no_sequences(make_emulator: Callable[..., NtfyEmulator]) -> None:
    emu = make_emulator(ntfy_version="2.13")
    with httpx.Client(base_url=emu.url, timeout=5) as http:
        sent = http.put("/t", content=b"x", headers={"X-Sequence-ID": "job-1"}).json()
        assert "sequence_id" not in sent
        assert http.put("/t/job-1", content=b"x").json()["code"] == 40401
        assert http.delete("/t/job-1").json()["code"] == 40401
        assert http.put("/t/job-1/clear").json()["code"] == 40401


def test_config_refuses_unknown_versions_and_bad_sender_intervals() -> None:
    with pytest.raises(ValueError, match="ntfy_version"):
        EmulatorConfig(ntfy_version="2.15")
    with pytest.raises(ValueError, match="delayed_sender_interval"):
        EmulatorConfig(delayed_sender_interval=0)
    assert EmulatorConfig().ntfy_version == "2.17"
