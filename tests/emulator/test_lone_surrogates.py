"""A lone surrogate in what is published: a JSON `\\ud800` escape with no partner is valid ASCII on
the wire, and Go's decoder (ntfy's) takes it as U+FFFD (encoding/json: "invalid UTF-16 surrogate
pairs ... are replaced by the Unicode replacement character"). The emulator once kept the lone
code point, answered 500 on the publish, and 500 on every poll of the topic after the Python
API had put one in its cache."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx

from ntfy_intake.testbed.emulator import NtfyEmulator


def test_json_publish_with_lone_surrogate_escapes_is_200_with_u_fffd_as_go_decodes_them(
    client: httpx.Client, polled: Callable[..., list[dict[str, Any]]]
) -> None:
    body = (
        b'{"topic":"t","title":"a\\ud800b","message":"m\\udfffx","tags":["\\udbff"],'
        b'"click":"https://x/\\ud800"}'
    )
    answer = client.post("/", content=body)
    assert answer.status_code == 200, answer.text
    event = answer.json()
    assert (event["title"], event["message"]) == ("a\ufffdb", "m\ufffdx")
    assert event["tags"] == ["\ufffd"] and event["click"] == "https://x/\ufffd"
    assert "\\ud" not in answer.text.lower()  # as Go writes it: U+FFFD in UTF-8, no escape
    (cached,) = polled(client, "/t/json")
    assert cached == event


def test_a_surrogate_pair_is_one_character_and_stays_one(client: httpx.Client) -> None:
    answer = client.post("/", content=b'{"topic":"t","title":"\\ud83d\\ude00 up"}')
    assert answer.status_code == 200
    assert answer.json()["title"] == "\U0001f600 up"


def test_api_publish_with_a_lone_surrogate_leaves_the_topic_pollable(
    emu: NtfyEmulator, client: httpx.Client, polled: Callable[..., list[dict[str, Any]]]
) -> None:
    published = emu.publish("t", "x\ud800", title="t\udfff", tags=["\ud800"])
    assert (published["title"], published["message"]) == ("t\ufffd", "x\ufffd")
    answer = client.get("/t/json", params={"poll": "1"})
    assert answer.status_code == 200, answer.text
    (event,) = [json.loads(line) for line in answer.text.splitlines()]
    assert (event["title"], event["message"], event["tags"]) == ("t\ufffd", "x\ufffd", ["\ufffd"])
    assert polled(client, "/t/json") == [event]
