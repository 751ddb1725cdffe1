"""Switches that force the real server's nondeterminism (ntfy-spec.md sections 2.4, 7 and 10):
cache writes that lag live delivery, `open` written after registration (a live message before the
replay), and the unstable order of same-second multi-topic replays."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx

from ntfy_intake.emulator import NtfyEmulator


def _ids(client: httpx.Client, path: str, **params: str) -> list[str]:
    response = client.get(path, params={"poll": "1", **params})
    return [json.loads(line)["id"] for line in response.text.splitlines()]


def test_lagging_cache_write_is_live_at_once_but_invisible_to_since_until_released(
    emu: NtfyEmulator, client: httpx.Client, open_stream: Callable[..., Any]
) -> None:
    stream = open_stream(emu, "/t/json")
    assert stream.event()["event"] == "open"
    cursor = emu.publish("t", "cursor")
    assert stream.event()["id"] == cursor["id"]
    emu.faults.lag_cache_writes()
    lagging = emu.publish("t", "lagging")
    assert stream.event()["id"] == lagging["id"]  # live at once
    assert _ids(client, "/t/json", since=cursor["id"]) == []  # not cached yet
    # A cursor taken from the lagging message is unknown to the cache: a full replay (spec 2.4).
    assert _ids(client, "/t/json", since=lagging["id"]) == [cursor["id"]]
    assert emu.faults.snapshot()["pending_cache_writes"] == 1
    assert emu.faults.release_cache_writes() == 1
    assert _ids(client, "/t/json", since=cursor["id"]) == [lagging["id"]]


def test_cache_write_lag_by_seconds_follows_the_emulators_clock(
    emu: NtfyEmulator, client: httpx.Client, clock: Any
) -> None:
    emu.faults.lag_cache_writes(1.0)
    first = emu.publish("t", "first")
    assert _ids(client, "/t/json") == []
    clock.advance(1.0)
    assert _ids(client, "/t/json") == [first["id"]]
    emu.faults.lag_cache_writes(None)
    assert emu.faults.snapshot()["lag_cache_writes"] is None
    second = emu.publish("t", "second")
    assert _ids(client, "/t/json") == [first["id"], second["id"]]


def test_replay_after_live_sends_open_then_a_live_message_then_the_replay(
    emu: NtfyEmulator, open_stream: Callable[..., Any]
) -> None:
    old = emu.publish("t", "old")
    emu.faults.replay_after_live(timeout=5.0)
    stream = open_stream(emu, "/t/json?since=all")
    assert stream.event()["event"] == "open"
    emu.wait_for_subscribers(1, topic="t")
    live = emu.publish("t", "live")
    # The live message first, then the replay taken after it (so it comes twice, as on ntfy).
    assert [event["id"] for event in stream.events_until_quiet(0.5)] == [
        live["id"],
        old["id"],
        live["id"],
    ]


def test_replay_after_live_gives_up_waiting_after_its_timeout(
    emu: NtfyEmulator, open_stream: Callable[..., Any]
) -> None:
    old = emu.publish("t", "old")
    emu.faults.replay_after_live(timeout=0.2)
    stream = open_stream(emu, "/t/json?since=all")
    assert stream.event()["event"] == "open"
    assert stream.event(timeout=3)["id"] == old["id"]
    assert emu.faults.snapshot()["replay_after_live"] is None  # one stream only


def test_shuffle_same_second_reorders_multi_topic_replays_within_a_second_only(
    emu: NtfyEmulator, client: httpx.Client, clock: Any
) -> None:
    same_second = [emu.publish(topic, f"{topic}{n}") for n in range(4) for topic in ("a", "b")]
    clock.advance(1)
    later = emu.publish("a", "later")
    in_order = [event["id"] for event in same_second]
    emu.faults.shuffle_same_second(seed=7)
    orders = {tuple(_ids(client, "/a,b/json")) for _ in range(5)}
    assert any(list(order[:-1]) != sorted(in_order, key=in_order.index) for order in orders)
    for order in orders:
        assert sorted(order[:-1]) == sorted(in_order)  # the same messages
        assert order[-1] == later["id"]  # never across seconds
    # Single-topic replays keep ntfy's (time, insertion) order.
    assert _ids(client, "/a/json") == [
        *[e["id"] for e in same_second if e["topic"] == "a"],
        later["id"],
    ]
    emu.faults.shuffle_same_second(False)
    assert _ids(client, "/a,b/json")[:-1] == [
        *[e["id"] for e in same_second if e["topic"] == "a"],
        *[e["id"] for e in same_second if e["topic"] == "b"],
    ]


def test_new_switches_over_the_admin_surface(emu: NtfyEmulator, client: httpx.Client) -> None:
    snapshot = client.post(
        "/v1/emulator/faults",
        json={"lag_cache_writes": True, "replay_after_live": 0.5, "shuffle_same_second": True},
    ).json()
    assert snapshot["lag_cache_writes"] == "until_released"
    assert (snapshot["replay_after_live"], snapshot["shuffle_same_second"]) == (0.5, True)
    emu.publish("t", "pending")
    assert (
        client.post("/v1/emulator/faults", json={"release_cache_writes": True}).status_code == 200
    )
    assert len(emu.messages("t")) == 1
    cleared = client.post("/v1/emulator/faults", json={"clear": True}).json()
    assert (cleared["lag_cache_writes"], cleared["shuffle_same_second"]) == (None, False)


def test_misbehave_inclusive_since_id_breaks_exclusivity_on_purpose(
    emu: NtfyEmulator, client: httpx.Client
) -> None:
    """Not a real-server behaviour: a switch a conformance suite can use to prove it can fail."""
    first = emu.publish("t", "first")
    second = emu.publish("t", "second")
    assert _ids(client, "/t/json", since=first["id"]) == [second["id"]]
    client.post("/v1/emulator/faults", json={"misbehave_inclusive_since_id": True})
    assert _ids(client, "/t/json", since=first["id"]) == [first["id"], second["id"]]
    emu.faults.clear()
    assert _ids(client, "/t/json", since=first["id"]) == [second["id"]]
