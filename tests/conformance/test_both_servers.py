"""ntfy-spec.md section 11, item by item, against the real ntfy server (NTFY_BIN): each test
computes what a client observes. The emulator's run of the same checklist is
tests/emulator/test_conformance.py, which asserts every expectation written here (and more, with
its clock injected), so the checklist runs once per server, not twice against the emulator.

Where the real server is nondeterministic (same-second multi-topic order, live order under load,
`open` written after registration) the assertion is the envelope of what it may do.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from ..emulator.conftest import RawStream
from ..servers import Server

MakeServer = Callable[..., Server]
SINCE_400 = {
    "code": 40008,
    "http": 400,
    "error": "invalid since parameter",
    "link": "https://ntfy.sh/docs/subscribe/api/#fetch-cached-messages",
}
FRAME_KEYS = ["id", "time", "event", "topic"]


@pytest.fixture(params=[pytest.param("real", marks=pytest.mark.real_ntfy)])
def kind(request: pytest.FixtureRequest) -> str:
    """Overrides the directory's two-server `kind`: only the real server runs this checklist."""
    value: str = request.param
    return value


def ids(events: list[dict[str, Any]]) -> list[str]:
    return [event["id"] for event in events if event["event"] == "message"]


def stream(server: Server, target: str, headers: dict[str, str] | None = None) -> RawStream:
    return RawStream(server.url, target, headers)


def error_of(response: httpx.Response) -> tuple[int, int, str]:
    body = response.json()
    assert set(body) in ({"code", "http", "error", "link"}, {"code", "http", "error"}), body
    assert body["http"] == response.status_code
    return response.status_code, body["code"], response.headers["content-type"]


def test_item01_stream_is_ndjson_and_opens_first(server: Server) -> None:
    server.publish("t", "cached")
    raw = stream(server, "/t/json?since=all")
    try:
        first = raw.event(5)
        assert raw.status == 200
        assert raw.headers["content-type"] == "application/x-ndjson; charset=utf-8"
        assert first["event"] == "open"
        assert raw.event(5)["message"] == "cached"
    finally:
        raw.close()


def test_item02_03_open_and_keepalive_carry_exactly_four_fields(
    make_server: MakeServer, kind: str
) -> None:
    # The emulator shows a keepalive's shape after 1 s; the real one keeps its 5 s minimum.
    server = make_server(keepalive_interval=5 if kind == "real" else 1)
    raw = stream(server, "/t/json")
    try:
        opened = raw.event(5)
        kept = raw.event(15)  # one keepalive interval (5 s, ntfy's minimum)
    finally:
        raw.close()
    for frame, kind in ((opened, "open"), (kept, "keepalive")):
        assert list(frame) == FRAME_KEYS
        assert (frame["event"], frame["topic"]) == (kind, "t")
        assert isinstance(frame["time"], int) and abs(frame["time"] - time.time()) < 30
        assert len(frame["id"]) == 12 and frame["id"].isalnum()
    assert opened["id"] != kept["id"]


def test_message_event_field_names_and_types(server: Server) -> None:
    sent = server.publish("t", "body", Title="T", Priority="4", Tags="a,b")
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
    (polled,) = server.poll("/t/json")
    assert polled == sent


def test_item05_sse_framing(server: Server) -> None:
    server.publish("t", "hello")
    raw = stream(server, "/t/sse?since=all")
    try:
        lines = [raw.line(5) for _ in range(5)]
    finally:
        raw.close()
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert lines[0] == "event: open"
    assert json.loads(lines[1].removeprefix("data: "))["event"] == "open"
    assert lines[2] == ""
    assert lines[3].startswith("data: ") and json.loads(lines[3][6:])["message"] == "hello"
    assert lines[4] == ""


def test_item06_raw_framing(server: Server) -> None:
    server.publish("t", "two\nlines")
    raw = stream(server, "/t/raw?since=all")
    try:
        assert raw.line(5) == ""  # the open event is an empty line
        assert raw.line(5) == "two lines"
    finally:
        raw.close()


def test_item07_multi_topic_open_and_per_message_topic(server: Server) -> None:
    raw = stream(server, "/a,b/json")
    try:
        opened = raw.event(5)
        server.publish("b", "on b")
        message = raw.event(5)
    finally:
        raw.close()
    assert opened["topic"] == "a,b"
    assert (message["topic"], message["message"]) == ("b", "on b")


def test_item08_no_since_no_replay(server: Server) -> None:
    server.publish("t", "old")
    raw = stream(server, "/t/json")
    try:
        assert raw.event(5)["event"] == "open"
        server.publish("t", "new")
        assert raw.event(5)["message"] == "new"
    finally:
        raw.close()


def test_item09_poll_returns_the_cache_and_ends(server: Server) -> None:
    first, second = server.publish("t", "1"), server.publish("t", "2")
    response = server.get("/t/json", params={"poll": "1"})
    events = [json.loads(line) for line in response.text.splitlines()]
    assert ids(events) == [first["id"], second["id"]]
    assert {event["event"] for event in events} == {"message"}


def test_item10_since_all_and_none(server: Server) -> None:
    sent = server.publish("t", "x")
    assert ids(server.poll("/t/json", since="all")) == [sent["id"]]
    assert server.poll("/t/json", since="none") == []


def test_item11_since_unix_time_is_inclusive(server: Server) -> None:
    sent = server.publish("t", "x")
    assert ids(server.poll("/t/json", since=str(sent["time"]))) == [sent["id"]]
    assert server.poll("/t/json", since=str(sent["time"] + 1)) == []


def test_item12_since_duration_is_go_syntax(server: Server) -> None:
    sent = server.publish("t", "x")
    assert ids(server.poll("/t/json", since="1h30m")) == [sent["id"]]
    assert ids(server.poll("/t/json", since="100ms")) in ([], [sent["id"]])
    response = server.get("/t/json", params={"poll": "1", "since": "1d"})
    assert error_of(response)[:2] == (400, 40008)


def test_item13_14_since_id_is_exclusive_and_looked_up_across_topics(server: Server) -> None:
    first = server.publish("a", "1")
    on_b = server.publish("b", "2")
    third = server.publish("a", "3")
    assert ids(server.poll("/a/json", since=first["id"])) == [third["id"]]
    assert ids(server.poll("/a/json", since=on_b["id"])) == [third["id"]]
    # Same-second rows of several topics come in an unstable order on the real server: the
    # envelope is "these ids, ordered by time".
    both = server.poll("/a,b/json", since=first["id"])
    assert sorted(ids(both)) == sorted([on_b["id"], third["id"]])
    assert [event["time"] for event in both] == sorted(event["time"] for event in both)


def test_item15_unknown_well_formed_id_returns_everything(server: Server) -> None:
    sent = [server.publish("t", str(n))["id"] for n in range(3)]
    assert ids(server.poll("/t/json", since="AAAAAAAAAAAA")) == sent


def test_item16_17_invalid_since_has_the_exact_40008_body(server: Server) -> None:
    for value in ("yesterday", "abcdefghij", "1d", "1.5"):
        response = server.get("/t/json", params={"poll": "1", "since": value})
        assert response.status_code == 400, value
        assert response.json() == SINCE_400
        assert response.text.endswith("}\n")
        assert response.headers["content-type"] == "application/json"
    # 12 digits count as an id: unknown, so everything.
    sent = server.publish("t", "x")
    assert ids(server.poll("/t/json", since="123456789012")) == [sent["id"]]


def test_item18_since_latest_is_the_newest_per_topic(server: Server) -> None:
    server.publish("a", "old")
    newest = server.publish("a", "new")
    assert ids(server.poll("/a/json", since="latest")) == [newest["id"]]


def test_item19_since_1_returns_nothing(server: Server) -> None:
    server.publish("t", "x")
    assert server.poll("/t/json", since="1") == []


def test_item21_filters_apply_to_messages(server: Server) -> None:
    low = server.publish("t", "low", Priority="1", Tags="x")
    high = server.publish("t", "high", Priority="5", Tags="x,y")
    default = server.publish("t", "plain")
    assert ids(server.poll("/t/json", priority="5")) == [high["id"]]
    assert ids(server.poll("/t/json", priority="3")) == [default["id"]]
    assert ids(server.poll("/t/json", tags="x,y")) == [high["id"]]
    assert ids(server.poll("/t/json", tags="x")) == [low["id"], high["id"]]
    assert ids(server.poll("/t/json", message="plain")) == [default["id"]]
    response = server.get("/t/json", params={"poll": "1", "priority": "9"})
    assert error_of(response)[:2] == (400, 40007)


def test_item22_cache_no_reaches_live_subscribers_only(server: Server) -> None:
    raw = stream(server, "/t/json")
    try:
        raw.event(5)
        sent = server.publish("t", "ephemeral", Cache="no")
        live = raw.event(5)
    finally:
        raw.close()
    assert live["id"] == sent["id"] and "expires" not in live and "expires" not in sent
    assert server.poll("/t/json", since="all") == []


def test_item23_expires_is_time_plus_cache_duration(make_server: MakeServer) -> None:
    server = make_server(cache_duration=3600)
    sent = server.publish("t", "x")
    assert sent["expires"] - sent["time"] == 3600


def test_item24_cache_duration_zero_stores_nothing(make_server: MakeServer) -> None:
    server = make_server(cache_duration=0)
    server.publish("t", "x")
    assert server.poll("/t/json", since="all") == []


def test_item26_request_limiter_answers_42901(make_server: MakeServer) -> None:
    server = make_server(rate_limits=True)
    codes = [server.get("/t/json", params={"poll": "1"}).status_code for _ in range(75)]
    assert codes[:55] == [200] * 55
    limited = server.get("/t/json", params={"poll": "1"})
    assert error_of(limited)[:2] == (429, 42901)
    assert "retry-after" not in limited.headers


def test_item27_without_auth_credentials_are_ignored(server: Server) -> None:
    sent = server.publish("t", "x")
    response = server.get(
        "/t/json", params={"poll": "1"}, headers={"Authorization": "Bearer tk_" + "z" * 29}
    )
    assert response.status_code == 200 and sent["id"] in response.text


def test_item28_401_for_bad_credentials_and_403_for_no_read_access(
    make_server: MakeServer,
) -> None:
    server = make_server(auth={"reader": ["alerts"]})
    token = server.tokens["reader"]
    server.publish("alerts", "x")

    def status(path: str, auth: str | None) -> tuple[int, int | None]:
        headers = {"Authorization": auth} if auth else {}
        response = server.get(path, params={"poll": "1"}, headers=headers)
        code = response.json()["code"] if response.status_code != 200 else None
        return response.status_code, code

    assert status("/alerts/json", f"Bearer {token}") == (200, None)
    assert status("/alerts,other/json", f"Bearer {token}") == (403, 40301)
    assert status("/alerts/json", None) == (403, 40301)
    assert status("/alerts/json", "Bearer tk_" + "0" * 29) == (401, 40101)


def test_item29_auth_query_parameter(make_server: MakeServer) -> None:
    server = make_server(auth={"reader": ["alerts"]})
    encoded = base64.urlsafe_b64encode(f"Bearer {server.tokens['reader']}".encode()).decode()
    response = server.get("/alerts/json", params={"poll": "1", "auth": encoded.rstrip("=")})
    assert response.status_code == 200


def test_item32_websocket_path_without_upgrade_is_40016(server: Server) -> None:
    assert error_of(server.get("/t/ws"))[:2] == (400, 40016)


def test_item33_disallowed_topic_is_40009(server: Server) -> None:
    for topic in ("app", "settings", "account", "v1", "file", "a,app"):
        response = server.get(f"/{topic}/json", params={"poll": "1"})
        assert error_of(response)[:2] == (400, 40009), topic
        assert response.json()["error"] == "invalid request: topic invalid"
    # /docs/ and /static/ are the web app's own paths, routed before topics: with the web app
    # off (`web-root: disable`) they are ntfy's 404.
    for topic in ("docs", "static"):
        response = server.get(f"/{topic}/json", params={"poll": "1"})
        assert error_of(response)[:2] == (404, 40401)


def test_item34_repeated_topic_delivers_twice(server: Server) -> None:
    raw = stream(server, "/t,t/json")
    try:
        assert raw.event(5)["event"] == "open"
        sent = server.publish("t", "twice")
        assert [raw.event(5)["id"], raw.event(5)["id"]] == [sent["id"], sent["id"]]
    finally:
        raw.close()


def test_item35_empty_put_publishes_triggered(server: Server) -> None:
    sent = server.publish("t")
    assert sent["message"] == "triggered"


def test_item36_body_over_the_size_limit_without_attachments_is_40014(server: Server) -> None:
    response = server.put("t", "x" * 4096)
    assert error_of(response)[:2] == (400, 40014)
    assert server.put("t", "x" * 4095).status_code == 200


def test_item37_json_publish_needs_a_valid_topic(server: Server) -> None:
    sent = httpx.post(server.url, json={"topic": "t", "message": "hi", "title": "T"}, timeout=10)
    assert sent.status_code == 200 and sent.json()["title"] == "T"
    missing = httpx.post(server.url, json={"message": "hi"}, timeout=10)
    assert error_of(missing)[:2] == (400, 40009)
    reserved = httpx.post(server.url, json={"topic": "docs", "message": "hi"}, timeout=10)
    assert error_of(reserved)[:2] == (400, 40010)


def test_item38_live_messages_all_arrive_whatever_their_order(server: Server) -> None:
    raw = stream(server, "/t/json")
    try:
        raw.event(5)
        sent = {server.publish("t", str(n))["id"] for n in range(20)}
        received = {raw.event(5)["id"] for _ in range(20)}
    finally:
        raw.close()
    assert received == sent


@pytest.mark.parametrize("path", ["/t/json", "/t/sse", "/t/raw"])
def test_error_bodies_are_compact_json_with_a_newline(server: Server, path: str) -> None:
    response = server.get(path, params={"since": "bogus"})
    assert response.text == json.dumps(SINCE_400, separators=(",", ":")) + "\n"
