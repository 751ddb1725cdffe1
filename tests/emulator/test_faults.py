"""Fault injection: each switch does what it says, over real sockets (checklist item 38 and the
races of ntfy-spec.md section 7)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx

from ntfy_intake.emulator import EmulatorConfig, NtfyEmulator

Poll = Callable[..., list[dict[str, Any]]]
SINCE_400 = (
    b'{"code":40008,"http":400,"error":"invalid since parameter",'
    b'"link":"https://ntfy.sh/docs/subscribe/api/#fetch-cached-messages"}\n'
)


def message_ids(events: list[dict[str, Any]]) -> list[str]:
    return [e["id"] for e in events if e["event"] == "message"]


def test_silence_sends_nothing_on_open_streams(
    make_emulator: Callable[..., NtfyEmulator], open_stream: Any
) -> None:
    """An open stream goes completely quiet: no keepalive, no message, and the connection
    stays open."""
    emu = make_emulator(keepalive_interval=0.1)
    stream = open_stream(emu, "/t/json")
    assert stream.event()["event"] == "open"
    emu.faults.silence()
    emu.publish("t", "lost live, still cached")
    assert stream.no_bytes_for(0.4)
    assert emu.subscriber_count("t") == 1
    assert [m["message"] for m in emu.messages("t")] == ["lost live, still cached"]


def test_silence_new_streams_get_no_headers(
    make_emulator: Callable[..., NtfyEmulator], open_stream: Any
) -> None:
    """A stream opened during silence never even gets a status line; polls hang too. Lifting
    the silence helps new streams only."""
    emu = make_emulator(keepalive_interval=0.1)
    emu.faults.silence(True)
    stream = open_stream(emu, "/t/json")
    polled = open_stream(emu, "/t/json?poll=1")
    assert stream.no_bytes_for(0.3) and polled.no_bytes_for(0.01)
    emu.faults.silence(False)
    assert stream.no_bytes_for(0.2)  # still a zombie
    assert open_stream(emu, "/t/json").event()["event"] == "open"
    assert emu.subscribe_log[0]["status"] is None


def test_drop_cuts_the_stream(emu: NtfyEmulator, open_stream: Any) -> None:
    """drop_connections() ends every open stream without the final chunk (a reset as the
    client sees it); later publishes are not sent to it."""
    streams = [open_stream(emu, "/a/json"), open_stream(emu, "/b/json?since=all")]
    for stream in streams:
        stream.event()
    assert emu.faults.drop_connections() == 2
    emu.publish("a", "after the drop")
    assert [stream.ending() for stream in streams] == ["cut", "cut"]
    assert [e["event"] for e in streams[0].events_until_quiet(0.05)] == []


def test_drop_gracefully_ends_cleanly(emu: NtfyEmulator, open_stream: Any) -> None:
    stream = open_stream(emu, "/a/json")
    stream.event()
    emu.faults.drop_connections(graceful=True)
    assert stream.ending() == "clean"


def test_drop_with_httpx_client(emu: NtfyEmulator) -> None:
    """What the daemon's client sees: httpx raises RemoteProtocolError mid-stream."""
    with httpx.Client(base_url=emu.url, timeout=3) as client, client.stream("GET", "/t/json") as r:
        lines = r.iter_lines()
        assert json.loads(next(lines))["event"] == "open"
        emu.faults.drop_connections()
        try:
            next(lines)
        except httpx.RemoteProtocolError:
            pass
        else:  # pragma: no cover - the assertion documents the expectation
            raise AssertionError("the stream should have been cut")


def test_force_400(emu: NtfyEmulator, client: httpx.Client, polled: Poll) -> None:
    """The next n subscribe requests that carry a cursor get the exact 40008 body; requests
    without one (the `since=all` gap probe, a plain stream) pass while it waits."""
    sent = emu.publish("t", "x")
    emu.faults.force_400(2)
    assert message_ids(polled(client, "/t/json", since="all", id=sent["id"])) == [sent["id"]]
    for since in (sent["id"], "10m"):
        response = client.get("/t/json", params={"poll": "1", "since": since})
        assert (response.status_code, response.content) == (400, SINCE_400)
        assert response.headers["content-type"] == "application/json"
    assert message_ids(polled(client, "/t/json", since=sent["id"])) == []
    assert [e["fault"] for e in emu.subscribe_log] == [None, "force_400", "force_400", None]


def test_fail_subscribes(emu: NtfyEmulator, client: httpx.Client) -> None:
    """The next n subscribes fail with the status (Retry-After when given), ntfy-style body."""
    emu.faults.fail_subscribes(2, status=429, retry_after=2.5)
    for _ in range(2):
        response = client.get("/t/json", params={"poll": "1"})
        assert response.status_code == 429
        assert response.headers["retry-after"] == "3"
        assert response.json() == {
            "code": 42901,
            "http": 429,
            "error": "limit reached: too many requests",
            "link": "https://ntfy.sh/docs/publish/#limitations",
        }
    assert client.get("/t/json", params={"poll": "1"}).status_code == 200
    emu.faults.fail_subscribes(1)
    unavailable = client.get("/t/json", params={"poll": "1"})
    assert (unavailable.status_code, unavailable.json()) == (
        503,
        {"code": 50301, "http": 503, "error": "service unavailable"},
    )
    assert "retry-after" not in unavailable.headers
    log = emu.subscribe_log
    assert [(e["status"], e["code"], e["fault"]) for e in log] == [
        (429, 42901, "fail_subscribes"),
        (429, 42901, "fail_subscribes"),
        (200, None, None),
        (503, 50301, "fail_subscribes"),
    ]


def test_swap_next_live(emu: NtfyEmulator, open_stream: Any, client: httpx.Client) -> None:
    """Item 38: the next two live messages arrive swapped, the first `delay` s late; both are
    cached in publish order."""
    stream = open_stream(emu, "/t/json")
    stream.event()
    emu.faults.swap_next_live(delay=0.2)
    first = emu.publish("t", "first")
    second = emu.publish("t", "second")
    third = emu.publish("t", "third")
    started = time.monotonic()
    got = [stream.event(), stream.event()]
    arrived_late = time.monotonic() - started
    assert [e["id"] for e in got] == [second["id"], third["id"]]
    assert stream.event()["id"] == first["id"]
    assert time.monotonic() - started >= 0.15 > arrived_late
    assert [m["id"] for m in emu.messages("t")] == [first["id"], second["id"], third["id"]]
    replay = [json.loads(x) for x in client.get("/t/json?poll=1").text.splitlines()]
    assert message_ids(replay) == [first["id"], second["id"], third["id"]]


def test_duplicate_at_subscribe(emu: NtfyEmulator, open_stream: Any) -> None:
    """Item 38: the next stream with a replay gets its newest message twice (right after open,
    as if live, and again in the replay); the one after is normal."""
    a = emu.publish("t", "a")
    b = emu.publish("t", "b")
    emu.faults.duplicate_at_subscribe()
    quiet = open_stream(emu, "/t/json")  # no replay: the fault waits
    assert quiet.events_until_quiet(0.1)[0]["event"] == "open"
    stream = open_stream(emu, "/t/json?since=all")
    events = stream.events_until_quiet(0.2)
    assert [e["event"] for e in events] == ["open", "message", "message", "message"]
    assert [e["id"] for e in events[1:]] == [b["id"], a["id"], b["id"]]
    again = open_stream(emu, "/t/json?since=all").events_until_quiet(0.2)
    assert message_ids(again) == [a["id"], b["id"]]


def test_evict_makes_the_cursor_unknown(
    emu: NtfyEmulator, client: httpx.Client, polled: Poll
) -> None:
    """An evicted cursor is a well-formed unknown id: since=<it> returns the whole cache."""
    a, b, c = (emu.publish("t", x) for x in "abc")
    assert message_ids(polled(client, "/t/json", since=b["id"])) == [c["id"]]
    assert emu.faults.evict([b["id"]]) == [b["id"]]
    assert message_ids(polled(client, "/t/json", since=b["id"])) == [a["id"], c["id"]]
    assert message_ids(polled(client, "/t/json", since="all", id=b["id"])) == []
    assert emu.faults.evict() == [a["id"], c["id"]]
    assert emu.messages() == []


def test_clear_releases_a_held_message(emu: NtfyEmulator, open_stream: Any) -> None:
    stream = open_stream(emu, "/t/json")
    stream.event()
    emu.faults.swap_next_live()
    held = emu.publish("t", "held")
    assert emu.faults.snapshot()["holding"] == held["id"]
    emu.faults.clear()
    assert stream.event()["id"] == held["id"]
    assert emu.faults.snapshot() == {
        "silenced": False,
        "force_400": 0,
        "fail_subscribes": {"n": 0, "status": 503, "retry_after": None},
        "swap_next_live": None,
        "holding": None,
        "duplicate_at_subscribe": False,
        "lag_cache_writes": None,
        "pending_cache_writes": 0,
        "replay_after_live": None,
        "shuffle_same_second": False,
        "misbehave_inclusive_since_id": False,
    }


def test_inject_raw_writes_bytes_verbatim_to_open_streams_only() -> None:
    with NtfyEmulator(EmulatorConfig(keepalive_interval=30.0)).running() as emu:
        with (
            httpx.Client(timeout=5) as client,
            client.stream("GET", f"{emu.url}/alerts/json") as response,
        ):
            lines = response.iter_lines()
            assert '"event":"open"' in next(lines)
            assert emu.faults.inject_raw(b'not json\n{"event":"message","id":true}\n') == 1
            assert next(lines) == "not json"
            assert next(lines) == '{"event":"message","id":true}'
        assert emu.messages() == []  # nothing injected is cached
