"""Conformance over real loopback sockets: one test (or more) per ntfy-spec.md section 11 checklist
item, named in each docstring.

This is the emulator's one run of the checklist; tests/conformance/test_both_servers.py holds the
same items for the real ntfy server (run when NTFY_BIN is set). Every expectation asserted there
is asserted here too, on the emulator, so the two stay one contract without starting the
emulator twice per item."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from ntfy_intake.testbed.emulator import NtfyEmulator

Poll = Callable[..., list[dict[str, Any]]]
TOKEN = "tk_" + "a" * 29
OTHER = "tk_" + "b" * 29
SINCE_400 = (
    b'{"code":40008,"http":400,"error":"invalid since parameter",'
    b'"link":"https://ntfy.sh/docs/subscribe/api/#fetch-cached-messages"}\n'
)


def ids(events: list[dict[str, Any]]) -> list[str]:
    return [e["id"] for e in events if e["event"] == "message"]


def test_stream_answers_ndjson_and_opens_first(emu: NtfyEmulator, open_stream: Any) -> None:
    """Item 1: 200, application/x-ndjson; charset=utf-8, first line is `open`."""
    emu.publish("t", "cached")
    stream = open_stream(emu, "/t/json?since=all")
    first = stream.event()
    assert stream.status == 200
    assert stream.headers["content-type"] == "application/x-ndjson; charset=utf-8"
    assert stream.headers["access-control-allow-origin"] == "*"
    assert stream.headers["transfer-encoding"] == "chunked"
    assert first["event"] == "open"
    assert stream.event()["message"] == "cached"


def test_open_and_keepalive_shape(
    make_emulator: Callable[..., NtfyEmulator], open_stream: Any, clock: Any
) -> None:
    """Items 2 and 3: open/keepalive carry exactly id, time, event, topic (fresh ids)."""
    emu = make_emulator(keepalive_interval=0.2)
    stream = open_stream(emu, "/t/json")
    opened, kept = stream.event(), stream.event(1.0)
    for frame, kind in ((opened, "open"), (kept, "keepalive")):
        assert list(frame) == ["id", "time", "event", "topic"]
        assert (frame["event"], frame["topic"], frame["time"]) == (kind, "t", int(clock.now))
        assert len(frame["id"]) == 12 and frame["id"].isalnum()
    assert opened["id"] != kept["id"]


@pytest.mark.parametrize("kind", ["json", "sse", "raw"])
def test_keepalive_not_reset_by_traffic(
    make_emulator: Callable[..., NtfyEmulator], open_stream: Any, kind: str
) -> None:
    """Item 3: a keepalive every interval on json, sse and raw, even while messages flow."""
    emu = make_emulator(keepalive_interval=0.2)
    stream = open_stream(emu, f"/t/{kind}")
    stream.line()
    stop = threading.Event()

    def publisher() -> None:
        while not stop.wait(0.03):
            emu.publish("t", "busy")

    thread = threading.Thread(target=publisher)
    thread.start()
    lines, started = [], time.monotonic()
    try:
        while time.monotonic() - started < 0.75:
            lines.append(stream.line())
    finally:
        stop.set()
        thread.join()
    keepalive = {
        "json": lambda line: '"event":"keepalive"' in line,
        "sse": lambda line: line == "event: keepalive",
        "raw": lambda line: line == "",
    }[kind]
    assert 2 <= sum(1 for line in lines if keepalive(line)) <= 4
    assert sum(1 for line in lines if "busy" in line) >= 10


def test_sse_framing(emu: NtfyEmulator, open_stream: Any) -> None:
    """Item 5: messages are `data:` only, other events get an `event:` line; no id/retry."""
    stream = open_stream(emu, "/t/sse")
    assert stream.line() == "event: open"
    assert stream.line().startswith('data: {"id":')
    assert stream.line() == ""
    assert stream.headers["content-type"] == "text/event-stream; charset=utf-8"
    emu.publish("t", "hi")
    data = stream.line()
    assert data.startswith("data: ") and json.loads(data[6:])["message"] == "hi"
    assert stream.line() == ""


def test_raw_framing(emu: NtfyEmulator, open_stream: Any) -> None:
    """Item 6: the body with newlines as spaces; open/keepalive are empty lines."""
    stream = open_stream(emu, "/t/raw")
    assert stream.line() == ""
    assert stream.headers["content-type"] == "text/plain; charset=utf-8"
    emu.publish("t", "two\nlines")
    assert stream.line() == "two lines"


def test_multi_topic_open(emu: NtfyEmulator, open_stream: Any) -> None:
    """Item 7: one open with "a,b"; each message carries its own topic."""
    stream = open_stream(emu, "/a,b/json")
    assert stream.event()["topic"] == "a,b"
    emu.publish("b", "x")
    emu.publish("a", "y")
    assert [(e["topic"], e["message"]) for e in (stream.event(), stream.event())] == [
        ("b", "x"),
        ("a", "y"),
    ]


def test_no_since_no_replay(emu: NtfyEmulator, open_stream: Any) -> None:
    """Item 8: without since and poll, the stream goes straight to live."""
    emu.publish("t", "old")
    stream = open_stream(emu, "/t/json")
    assert stream.event()["event"] == "open"
    emu.publish("t", "new")
    assert stream.event()["message"] == "new"


def test_poll_returns_cache_and_ends(
    emu: NtfyEmulator, client: httpx.Client, open_stream: Any
) -> None:
    """Item 9: poll=1 without since returns everything, no open/keepalive, then closes;
    nothing to send is a 200 with an empty body."""
    empty = client.get("/t/json", params={"poll": "1"})
    assert (empty.status_code, empty.content) == (200, b"")
    assert empty.headers["content-type"] == "application/x-ndjson; charset=utf-8"
    emu.publish("t", "one")
    emu.publish("t", "two")
    for value in ("1", "yes", "TRUE"):
        response = client.get("/t/json", params={"poll": value})
        events = [json.loads(line) for line in response.text.splitlines()]
        assert [e["event"] for e in events] == ["message", "message"]
    assert open_stream(emu, "/t/json?poll=on").event()["event"] == "open"  # "on" is false
    assert client.get("/t/json", headers={"X-Poll": "1"}).text.count("\n") == 2


def test_since_all_and_none(emu: NtfyEmulator, client: httpx.Client, polled: Poll) -> None:
    """Item 10."""
    first = emu.publish("t", "a")
    assert ids(polled(client, "/t/json", since="all")) == [first["id"]]
    assert polled(client, "/t/json", since="none") == []


def test_since_timestamp_inclusive(
    emu: NtfyEmulator, client: httpx.Client, polled: Poll, clock: Any
) -> None:
    """Item 11: since=<ts> returns time >= ts."""
    early = emu.publish("t", "a")
    clock.advance(1)
    same = [emu.publish("t", "b"), emu.publish("t", "c")]
    clock.advance(1)
    later = emu.publish("t", "d")
    got = polled(client, "/t/json", since=str(same[0]["time"]))
    assert ids(got) == [same[0]["id"], same[1]["id"], later["id"]]
    assert early["id"] not in ids(got)


def test_since_duration(emu: NtfyEmulator, client: httpx.Client, polled: Poll, clock: Any) -> None:
    """Item 12: Go durations work against the server clock; `1d` is rejected."""
    old = emu.publish("t", "old")
    clock.advance(3600)
    recent = emu.publish("t", "recent")
    clock.advance(10)
    assert ids(polled(client, "/t/json", since="1m")) == [recent["id"]]
    assert ids(polled(client, "/t/json", since="1h0m10s")) == [old["id"], recent["id"]]
    assert ids(polled(client, "/t/json", since="100ms")) == []
    assert ids(polled(client, "/t/json", since="1h30m")) == [old["id"], recent["id"]]
    bad = client.get("/t/json", params={"poll": "1", "since": "1d"})
    assert (bad.status_code, bad.content) == (400, SINCE_400)


def test_since_id_exclusive_insertion_order(
    emu: NtfyEmulator, client: httpx.Client, polled: Poll, clock: Any
) -> None:
    """Item 13: since=<id> returns rows inserted after it, ordered by (time, insertion), even a
    row whose time is earlier than the cursor's."""
    a = emu.publish("t", "a")
    b = emu.publish("t", "b")
    clock.advance(5)
    c = emu.publish("t", "c")
    backdated = emu.publish("t", "slow upload", time=a["time"])
    assert ids(polled(client, "/t/json", since=a["id"])) == [b["id"], backdated["id"], c["id"]]
    assert ids(polled(client, "/t/json", since=c["id"])) == [backdated["id"]]


def test_since_id_from_another_topic(emu: NtfyEmulator, client: httpx.Client, polled: Poll) -> None:
    """Item 14: the cursor is looked up across all topics."""
    a1 = emu.publish("a", "1")
    b1 = emu.publish("b", "1")
    a2 = emu.publish("a", "2")
    assert ids(polled(client, "/a/json", since=b1["id"])) == [a2["id"]]
    # Same second: per-topic lists in path order, then a stable sort by time.
    assert ids(polled(client, "/a,b/json", since=a1["id"])) == [a2["id"], b1["id"]]


def test_unknown_id_means_all(emu: NtfyEmulator, client: httpx.Client, polled: Poll) -> None:
    """Item 15: a well-formed id that is not cached replays everything, no error."""
    sent = [emu.publish("t", str(i))["id"] for i in range(3)]
    assert ids(polled(client, "/t/json", since="NoMatchForID")) == sent


def test_invalid_since_exact_error(emu: NtfyEmulator, client: httpx.Client) -> None:
    """Item 16: the exact 40008 body and Content-Type, on streams and polls alike."""
    for params in ({"since": "INVALID"}, {"since": "INVALID", "poll": "1"}):
        response = client.get("/t/json", params=params)
        assert response.status_code == 400
        assert response.headers["content-type"] == "application/json"
        assert response.content == SINCE_400
    for value in ("yesterday", "abcdefghij", "1d", "1.5"):
        response = client.get("/t/json", params={"poll": "1", "since": value})
        assert (response.status_code, response.content) == (400, SINCE_400), value


@pytest.mark.parametrize("path", ["/t/json", "/t/sse", "/t/raw"])
def test_error_bodies_are_compact_json_with_a_newline(client: httpx.Client, path: str) -> None:
    """Item 16 on every stream format: the error body is ntfy's compact JSON and a newline."""
    response = client.get(path, params={"since": "bogus"})
    assert response.content == SINCE_400


def test_id_validity(emu: NtfyEmulator, client: httpx.Client, polled: Poll) -> None:
    """Item 17: a 10-character id is a 400; a 12-digit number is an id (unknown: all), not a
    timestamp (which would return nothing)."""
    sent = emu.publish("t", "x")
    assert client.get("/t/json", params={"poll": "1", "since": "hwQ2YpKdmg"}).status_code == 400
    assert ids(polled(client, "/t/json", since="999999999999")) == [sent["id"]]


def test_since_latest(emu: NtfyEmulator, client: httpx.Client, polled: Poll, clock: Any) -> None:
    """Item 18: the newest message of each topic (by time, then insertion)."""
    emu.publish("a", "a1")
    a2 = emu.publish("a", "a2")
    emu.publish("a", "backdated", time=a2["time"] - 100)
    b1 = emu.publish("b", "b1")
    assert ids(polled(client, "/a,b/json", since="latest")) == [a2["id"], b1["id"]]


def test_since_one_and_zero(emu: NtfyEmulator, client: httpx.Client, polled: Poll) -> None:
    """Item 19: since=1 is the "none" marker; since=0 is "all"; since=2 is everything."""
    sent = emu.publish("t", "x")
    assert polled(client, "/t/json", since="1") == []
    assert ids(polled(client, "/t/json", since="0")) == [sent["id"]]
    assert ids(polled(client, "/t/json", since="2")) == [sent["id"]]


def test_filters(emu: NtfyEmulator, client: httpx.Client, polled: Poll, open_stream: Any) -> None:
    """Item 21: id, message, title (exact), priority (any; none counts as 3), tags (all); a bad
    priority is 40007; filters apply to live messages too and never to open/keepalive."""
    plain = emu.publish("t", "plain")
    urgent = emu.publish("t", "fire", title="Fire", priority=5, tags=["a", "b"])
    low = emu.publish("t", "meh", priority=2, tags=["a"])
    assert ids(polled(client, "/t/json", id=urgent["id"])) == [urgent["id"]]
    assert ids(polled(client, "/t/json", since="all", id=plain["id"])) == [plain["id"]]
    assert ids(polled(client, "/t/json", message="meh")) == [low["id"]]
    assert ids(polled(client, "/t/json", title="fire")) == []
    assert ids(polled(client, "/t/json", t="Fire")) == [urgent["id"]]
    assert ids(polled(client, "/t/json", priority="3,urgent")) == [plain["id"], urgent["id"]]
    assert ids(polled(client, "/t/json", tags="a")) == [urgent["id"], low["id"]]
    assert ids(polled(client, "/t/json", tags="a,b")) == [urgent["id"]]
    header_filtered = client.get("/t/json", params={"poll": "1"}, headers={"Title": "Fire"})
    assert ids([json.loads(x) for x in header_filtered.text.splitlines()]) == [urgent["id"]]
    bad = client.get("/t/json", params={"poll": "1", "priority": "6"})
    assert (bad.status_code, bad.json()["code"]) == (400, 40007)
    stream = open_stream(emu, "/t/json?tags=b")
    assert stream.event()["event"] == "open"
    emu.publish("t", "no tags")
    emu.publish("t", "tagged", tags=["b"])
    assert stream.event()["message"] == "tagged"


def test_cache_no(emu: NtfyEmulator, client: httpx.Client, polled: Poll, open_stream: Any) -> None:
    """Item 22: Cache: no reaches connected subscribers, has no expires, is never replayed."""
    stream = open_stream(emu, "/t/json")
    stream.event()
    response = client.put("/t", content=b"secret", headers={"Cache": "no"})
    assert "expires" not in response.json()
    live = stream.event()
    assert live["message"] == "secret" and "expires" not in live
    assert emu.publish("t", "api", cache=False).get("expires") is None
    assert polled(client, "/t/json", since="all") == []
    assert ids(polled(client, "/t/json", since=live["id"])) == []  # unknown id: all = nothing


def test_expires_and_pruning(
    make_emulator: Callable[..., NtfyEmulator], polled: Poll, clock: Any
) -> None:
    """Item 23: expires = time + cache-duration; the manager prunes expired messages."""
    emu = make_emulator(cache_duration=600, manager_interval=0.05)
    sent = emu.publish("t", "x")
    assert sent["expires"] == sent["time"] + 600
    clock.advance(599)
    time.sleep(0.2)
    assert len(emu.messages()) == 1  # not yet expired
    clock.advance(1)
    deadline = time.monotonic() + 2
    while emu.messages() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert emu.messages() == []
    with httpx.Client(base_url=emu.url) as client:
        assert polled(client, "/t/json", since="all") == []


def test_prune_on_demand(
    make_emulator: Callable[..., NtfyEmulator], clock: Any, polled: Poll
) -> None:
    """Item 23: an expired message is replayed until pruning runs; emu.prune() runs it now."""
    emu = make_emulator(cache_duration=60, manager_interval=None)
    old = emu.publish("t", "old")
    clock.advance(30)
    young = emu.publish("t", "young")
    clock.advance(31)
    with httpx.Client(base_url=emu.url) as client:
        assert ids(polled(client, "/t/json", since="all")) == [old["id"], young["id"]]
        assert emu.prune() == [old["id"]]
        assert ids(polled(client, "/t/json", since="all")) == [young["id"]]


def test_cache_duration_zero(
    make_emulator: Callable[..., NtfyEmulator], polled: Poll, open_stream: Any
) -> None:
    """Item 24: nothing is stored and since/poll return nothing; live delivery still works.
    (As in ntfy, the publish response still carries expires = time + 0.)"""
    emu = make_emulator(cache_duration=0)
    stream = open_stream(emu, "/t/json?since=all")
    stream.event()
    with httpx.Client(base_url=emu.url) as client:
        sent = client.put("/t", content=b"x").json()
        assert sent["expires"] == sent["time"]
        assert stream.event()["id"] == sent["id"]
        assert polled(client, "/t/json", since="all") == []
    assert emu.messages() == []


def test_subscription_limit(make_emulator: Callable[..., NtfyEmulator], open_stream: Any) -> None:
    """Item 25: the visitor's (limit+1)th concurrent subscription gets 429 42903; closing one
    frees a slot."""
    emu = make_emulator(subscription_limit=2)
    first = open_stream(emu, "/a/json")
    first.event()
    open_stream(emu, "/b,c/json").event()
    third = open_stream(emu, "/d/json")
    assert third.read_head() == 429
    assert json.loads(third.body) == {
        "code": 42903,
        "http": 429,
        "error": "limit reached: too many active subscriptions",
        "link": "https://ntfy.sh/docs/publish/#limitations",
    }
    first.close()
    emu_deadline = time.monotonic() + 2
    while emu.subscriber_count() > 1 and time.monotonic() < emu_deadline:
        time.sleep(0.01)
    assert open_stream(emu, "/d/json").event()["event"] == "open"


def test_item26_request_limiter_answers_42901(make_emulator: Callable[..., NtfyEmulator]) -> None:
    """Item 26 with ntfy's defaults: a burst of 60 requests, then 429 42901 without Retry-After
    (the clock stands still, so nothing is replenished)."""
    emu = make_emulator(request_limit=True)
    with httpx.Client(base_url=emu.url) as client:
        codes = [client.get("/t/json", params={"poll": "1"}).status_code for _ in range(75)]
        assert codes[:55] == [200] * 55
        limited = client.get("/t/json", params={"poll": "1"})
        assert (limited.status_code, limited.json()["code"]) == (429, 42901)
        assert "retry-after" not in limited.headers


def test_request_limit(make_emulator: Callable[..., NtfyEmulator], clock: Any) -> None:
    """Item 26: each subscribe (and publish) takes a token; burst, then one per replenish."""
    emu = make_emulator(request_limit=True, request_limit_burst=3, request_limit_replenish=5.0)
    with httpx.Client(base_url=emu.url) as client:
        statuses = [client.get("/t/json", params={"poll": "1"}).status_code for _ in range(4)]
        assert statuses == [200, 200, 200, 429]
        limited = client.get("/t/json", params={"poll": "1"})
        assert limited.json()["code"] == 42901 and "retry-after" not in limited.headers
        assert client.put("/t", content=b"x").status_code == 429
        clock.advance(5)
        assert client.put("/t", content=b"x").status_code == 200
        assert client.get("/t/json", params={"poll": "1"}).status_code == 429


def test_auth_ignored_without_tokens(emu: NtfyEmulator, client: httpx.Client) -> None:
    """Item 27: no auth configured: any Authorization header or ?auth= is ignored."""
    for headers, params in (
        ({"Authorization": "Bearer tk_nonsense"}, {}),
        ({"Authorization": "Basic !!!"}, {}),
        ({}, {"auth": "==not base64=="}),
    ):
        response = client.get("/t/json", params={"poll": "1", **params}, headers=headers)
        assert response.status_code == 200


@pytest.fixture
def auth_emu(make_emulator: Callable[..., NtfyEmulator]) -> NtfyEmulator:
    return make_emulator(tokens={TOKEN: {"alerts", "ops*"}, OTHER: {"other"}})


def test_auth_401_and_403(auth_emu: NtfyEmulator) -> None:
    """Items 28 and 30: bad or unknown tokens are 401 40101; anonymous or lacking read on any
    listed topic is 403 40301."""
    unauthorized = {
        "code": 40101,
        "http": 401,
        "error": "unauthorized",
        "link": "https://ntfy.sh/docs/publish/#authentication",
    }
    forbidden = {
        "code": 40301,
        "http": 403,
        "error": "forbidden",
        "link": "https://ntfy.sh/docs/publish/#authentication",
    }
    with httpx.Client(base_url=auth_emu.url) as client:

        def get(path: str, auth: str | None = None) -> httpx.Response:
            headers = {} if auth is None else {"Authorization": auth}
            return client.get(path, params={"poll": "1"}, headers=headers)

        for bad in (
            "Bearer tk_" + "z" * 29,  # unknown
            "Bearer tk_short",  # not 32 characters
            "bearer " + TOKEN,  # only "Bearer" is read as a token; this is not valid Basic
            "Basic " + base64.b64encode(b"phil:pass").decode(),  # users: not in the emulator
        ):
            response = get("/alerts/json", bad)
            assert (response.status_code, response.json()) == (401, unauthorized), bad
        assert (get("/alerts/json").status_code, get("/alerts/json").json()) == (403, forbidden)
        assert get("/alerts/json", "Digest x").status_code == 403  # unsupported: anonymous
        assert get("/alerts,other/json", f"Bearer {TOKEN}").json() == forbidden
        assert get("/alerts,ops-db/json", f"Bearer {TOKEN}").status_code == 200
        basic = base64.b64encode(f":{TOKEN}".encode()).decode()
        assert get("/alerts/json", f"Basic {basic}").status_code == 200
        assert client.get("/alerts/auth", headers={"Authorization": f"Bearer {TOKEN}"}).json() == {
            "success": True
        }
        assert (
            client.get("/other/auth", headers={"Authorization": f"Bearer {TOKEN}"}).status_code
            == 403
        )
        assert client.get("/nope/nope", headers={"Authorization": "Bearer x"}).status_code == 401
        assert client.put("/alerts", content=b"anyone may publish").status_code == 200


def test_auth_via_query(auth_emu: NtfyEmulator) -> None:
    """Item 29: ?auth= is unpadded base64url of the whole header value and beats the header;
    a bad encoding is 500 50001."""
    encoded = base64.urlsafe_b64encode(f"Bearer {TOKEN}".encode()).decode().rstrip("=")
    with httpx.Client(base_url=auth_emu.url) as client:
        ok = client.get(
            "/alerts/json",
            params={"poll": "1", "auth": encoded},
            headers={"Authorization": "Bearer tk_" + "z" * 29},
        )
        assert ok.status_code == 200
        padded = base64.urlsafe_b64encode(b"Bearer tk_1234").decode()
        assert padded.endswith("=")
        broken = client.get("/alerts/json", params={"poll": "1", "auth": padded})
        assert (broken.status_code, broken.json()) == (
            500,
            {"code": 50001, "http": 500, "error": "internal server error"},
        )


def test_auth_failure_limit(auth_emu: NtfyEmulator, clock: Any) -> None:
    """Item 31: 30 failed logins, then 429 42909 (even for a good token), refilled per minute."""
    with httpx.Client(base_url=auth_emu.url) as client:
        bad = {"Authorization": "Bearer tk_" + "z" * 29}
        codes = [client.get("/alerts/auth", headers=bad).status_code for _ in range(31)]
        assert codes == [401] * 30 + [429]
        good = client.get("/alerts/auth", headers={"Authorization": f"Bearer {TOKEN}"})
        assert good.json()["code"] == 42909
        clock.advance(60)
        assert client.get("/alerts/auth", headers={"Authorization": f"Bearer {TOKEN}"}).is_success


def test_websocket_without_upgrade(emu: NtfyEmulator, client: httpx.Client) -> None:
    """Item 32 (first half): GET /t/ws without Upgrade is 400 40016 JSON."""
    response = client.get("/t/ws")
    assert (response.status_code, response.json()["code"]) == (400, 40016)


def test_disallowed_topics(emu: NtfyEmulator, client: httpx.Client) -> None:
    """Item 33: subscribing to a disallowed topic is 40009 (not 40010); publishing is 40010."""
    for path in ("/app/json", "/a,v1/json", "/metrics/sse", "/file/json"):
        response = client.get(path)
        assert (response.status_code, response.json()["code"]) == (400, 40009), path
    for topic in ("app", "settings", "account", "v1", "file", "a,app"):
        response = client.get(f"/{topic}/json", params={"poll": "1"})
        assert (response.status_code, response.json()["code"]) == (400, 40009), topic
        assert response.json()["error"] == "invalid request: topic invalid"
    assert client.put("/app", content=b"x").json()["code"] == 40010


def test_repeated_topic_delivers_twice(
    emu: NtfyEmulator, client: httpx.Client, polled: Poll, open_stream: Any
) -> None:
    """Item 34: /a,a/json gets every replayed and live message twice."""
    cached = emu.publish("a", "cached")
    assert ids(polled(client, "/a,a/json")) == [cached["id"], cached["id"]]
    stream = open_stream(emu, "/a,a/json")
    assert stream.event()["topic"] == "a,a"
    live = emu.publish("a", "live")
    assert [stream.event()["id"], stream.event()["id"]] == [live["id"], live["id"]]


def test_publish_empty_body(emu: NtfyEmulator, client: httpx.Client) -> None:
    """Item 35: an empty PUT publishes "triggered"; 200 JSON in the stream line format."""
    response = client.put("/t")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert list(body) == ["id", "time", "expires", "event", "topic", "message"]
    assert (
        response.content
        == (
            f'{{"id":"{body["id"]}","time":{body["time"]},"expires":{body["expires"]},'
            '"event":"message","topic":"t","message":"triggered"}\n'
        ).encode()
    )


def test_publish_size_limit(emu: NtfyEmulator, client: httpx.Client) -> None:
    """Item 36: 4096 bytes or non-UTF-8 would be an attachment: 400 40014, never 413."""
    assert client.put("/t", content=b"x" * 4095).status_code == 200
    for body in (b"x" * 4096, b"\xc3\x28"):
        response = client.put("/t", content=body)
        assert (response.status_code, response.json()["code"]) == (400, 40014)


def test_json_publish(emu: NtfyEmulator, client: httpx.Client) -> None:
    """Item 37: JSON to / needs a valid topic (40009); invalid JSON is 40024; 2x the limit is
    413 41303."""
    ok = client.post("/", json={"topic": "t", "message": "m", "priority": 4, "tags": ["x"]})
    assert ok.json()["priority"] == 4 and ok.json()["tags"] == ["x"]
    assert emu.messages("t")[-1]["message"] == "m"
    assert client.post("/", json={"message": "m"}).json()["code"] == 40009
    titled = client.post("/", json={"topic": "t", "message": "hi", "title": "T"})
    assert (titled.status_code, titled.json()["title"]) == (200, "T")
    reserved = client.post("/", json={"topic": "docs", "message": "hi"})
    assert (reserved.status_code, reserved.json()["code"]) == (400, 40010)
    assert client.put("/", content=b"{").json()["code"] == 40024
    big = client.put("/", content=b'{"topic":"t","message":"' + b"x" * 8192 + b'"}')
    assert (big.status_code, big.json()["code"]) == (413, 41303)


def test_message_event_field_names_and_types(
    emu: NtfyEmulator, client: httpx.Client, polled: Poll
) -> None:
    """Section 2: a message's fields in ntfy's order and JSON types; a poll returns it as sent."""
    headers = {"Title": "T", "Priority": "4", "Tags": "a,b"}
    sent = client.put("/t", content=b"body", headers=headers).json()
    fields = [(key, type(value).__name__) for key, value in sent.items()]
    assert fields == [
        ("id", "str"),
        ("time", "int"),
        ("expires", "int"),
        ("event", "str"),
        ("topic", "str"),
        ("title", "str"),
        ("message", "str"),
        ("priority", "int"),
        ("tags", "list"),
    ]
    (event,) = polled(client, "/t/json")
    assert event == sent


def test_publish_params(emu: NtfyEmulator, client: httpx.Client) -> None:
    """Section 6.2: header and query names, GET /<topic>/publish, priority names, bad priority."""
    sent = client.get(
        "/t/publish", params={"m": "via get", "t": "Title", "p": "max", "ta": "a,b"}
    ).json()
    assert (sent["message"], sent["title"], sent["priority"], sent["tags"]) == (
        "via get",
        "Title",
        5,
        ["a", "b"],
    )
    assert client.get("/t/trigger").json()["message"] == "triggered"
    # Publish paths are GET-only; ntfy 2.16+ reads POST /t/trigger as sequence id "trigger".
    assert client.post("/t/trigger").json()["sequence_id"] == "trigger"
    headers = {"X-Title": "hdr", "X-Tags": "warning, disk", "X-Priority": "low"}
    sent = client.post("/t", content=b"body", headers=headers).json()
    assert (sent["title"], sent["tags"], sent["priority"]) == ("hdr", ["warning", "disk"], 2)
    bad = client.put("/t", content=b"x", headers={"Priority": "7"})
    assert (bad.status_code, bad.json()) == (
        400,
        {
            "code": 40007,
            "http": 400,
            "error": "invalid priority parameter",
            "link": "https://ntfy.sh/docs/publish/#message-priority",
        },
    )


def test_not_found(emu: NtfyEmulator, client: httpx.Client) -> None:
    """Section 1.1: unknown paths are 404 40401 (the web app is off, as with web-root disable)."""
    for method, path in (
        ("GET", "/t"),
        ("GET", "/t/nope"),
        ("DELETE", "/t"),
        ("GET", "/"),
        ("GET", "/docs/json"),  # ntfy routes /docs and /static to the (disabled) web app first
        ("GET", "/static/json"),
    ):
        response = client.request(method, path)
        assert response.status_code == 404
        assert response.content == b'{"code":40401,"http":404,"error":"page not found"}\n'
    assert client.head("/t/json").status_code == 404  # subscribe paths are GET-only
    assert client.get("/v1/health").json() == {"healthy": True}


def test_live_order_matches_cache_order_across_threads(emu: NtfyEmulator, open_stream: Any) -> None:
    """Item 38 (the default): without injection, live order is cache order, even with
    publishers on several threads."""
    stream = open_stream(emu, "/t/json")
    stream.event()
    threads = [
        threading.Thread(target=lambda: [emu.publish("t", "x") for _ in range(40)])
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    live = [stream.event()["id"] for _ in range(160)]
    assert live == [m["id"] for m in emu.messages("t")]


def test_unexpected_failure_is_500_50001(emu: NtfyEmulator, client: httpx.Client) -> None:
    """Section 1.3: an error that is not one of ntfy's own is 500 with code 50001."""

    def broken_clock() -> float:
        raise OSError("clock unavailable")

    emu.set_clock(broken_clock)
    response = client.put("/t", content=b"x")
    assert (response.status_code, response.content) == (
        500,
        b'{"code":50001,"http":500,"error":"internal server error"}\n',
    )
