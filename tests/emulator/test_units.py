"""Pure pieces of the emulator: parameter reading, Go-compatible JSON, error bodies, publishing
rules and the cache's ordering (ntfy-spec.md sections 1.3, 1.4, 2.2, 2.3, 3, 6)."""

from __future__ import annotations

import json

import pytest

from ntfy_intake.emulator import access, wire
from ntfy_intake.emulator.cache import MessageCache
from ntfy_intake.emulator.params import Params, decode_mime_header, parse_query_string
from ntfy_intake.emulator.publish import build_event, parse_json_publish
from ntfy_intake.emulator.since import ALL, LATEST, NONE, Since
from ntfy_intake.emulator.wire import Event, NtfyError


def event(mid: str, topic: str = "t", time: int = 100, **fields: object) -> Event:
    return Event(id=mid, time=time, event="message", topic=topic, **fields)  # type: ignore[arg-type]


def test_event_key_order_and_omitempty() -> None:
    full = event(
        "abcdefABCDEF", expires=200, title="T", message="m", priority=3, tags=("a",), click="c"
    )
    assert list(full.to_dict()) == [
        "id",
        "time",
        "expires",
        "event",
        "topic",
        "title",
        "message",
        "priority",
        "tags",
        "click",
    ]
    bare = Event(id="abcdefABCDEF", time=5, event="open", topic="a,b")
    assert bare.line() == b'{"id":"abcdefABCDEF","time":5,"event":"open","topic":"a,b"}\n'


def test_go_json_escaping() -> None:
    """Item 1.4: <, >, & and the line separators are escaped; other non-ASCII is raw UTF-8."""
    text = "<a href='x'>&</a> \u00e9\u2603 \u2028\u2029 \n\t\b\f\x01 \" \\ \x7f"
    encoded = wire.go_json({"message": text})
    assert encoded == (
        '{"message":"\\u003ca href=\'x\'\\u003e\\u0026\\u003c/a\\u003e \u00e9\u2603 '
        '\\u2028\\u2029 \\n\\t\\b\\f\\u0001 \\" \\\\ \x7f"}'
    )
    assert json.loads(encoded) == {"message": text}


def test_error_body() -> None:
    assert wire.SINCE_INVALID.body() == (
        b'{"code":40008,"http":400,"error":"invalid since parameter",'
        b'"link":"https://ntfy.sh/docs/subscribe/api/#fetch-cached-messages"}\n'
    )
    assert wire.NOT_FOUND.body() == b'{"code":40401,"http":404,"error":"page not found"}\n'
    assert NtfyError(0, 500, "x").body() == b'{"http":500,"error":"x"}\n'


def test_new_ids_are_valid() -> None:
    ids = {wire.new_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(len(i) == 12 and i.isascii() and i.isalnum() for i in ids)


def test_header_params() -> None:
    params = Params(
        {"X-Title": "  =?UTF-8?B?w6k=?= =?utf-8?q?_ok?=  ", "Priority": "u=3, i"},
        {"priority": "high", "t": "ignored"},
    )
    assert params.get("x-title", "title", "t") == "é ok"
    assert params.get("x-priority", "priority", "prio", "p") == "high"  # RFC 9218 form ignored


def test_mime_words() -> None:
    assert decode_mime_header("a =?iso-8859-1?q?=E9?= b") == "a é b"
    assert decode_mime_header("=?utf-8?b?bad*?=") == "=?utf-8?b?bad*?="
    with pytest.raises(LookupError):
        decode_mime_header("=?koi8-r?q?x?=")


def test_query_string_like_go() -> None:
    assert parse_query_string(b"a=1&a=2&b=x+y&c=%zz&d;e=1&f") == {"a": "1", "b": "x y", "f": ""}


def build(headers: dict[str, str], body: bytes = b"", query: dict[str, str] | None = None) -> Event:
    return build_event(
        "t",
        Params(headers, query or {}),
        body,
        now_ns=100 * 10**9,
        cache_duration=3600,
        size_limit=4096,
    ).event


@pytest.mark.parametrize(
    ("headers", "body", "expected"),
    [
        ({}, b"", {"message": "triggered", "expires": 3700}),
        ({}, b"  hi \n", {"message": "hi"}),
        ({"Message": "param"}, b"body", {"message": "body"}),  # a body beats the parameter
        ({"m": "a\\nb"}, b"", {"message": "a\nb"}),
        ({"Tags": " a , b,,c "}, b"", {"tags": ["a", "b", "c"]}),
        ({"p": "urgent"}, b"", {"priority": 5}),
        ({"X-Priority": "3"}, b"", {"priority": 3}),
        ({"Cache": "no"}, b"", {"expires": None}),
        ({"Cache": "maybe"}, b"", {"expires": None}),  # anything but 1/yes/true disables it
        ({"Cache": "YES"}, b"", {"expires": 3700}),
        ({"Markdown": "1"}, b"x", {"content_type": "text/markdown"}),
        ({"Attach": "https://h/p/f.txt"}, b"", {"message": "You received a file: f.txt"}),
        ({"Poll-ID": "p1"}, b"ignored", {"event": "poll_request", "message": "New message"}),
        ({"up": "1"}, b"\xff\x00", {"message": "/wA=", "encoding": "base64"}),
    ],
)
def test_build_event(headers: dict[str, str], body: bytes, expected: dict[str, object]) -> None:
    built = build(headers, body).to_dict()
    for key, value in expected.items():
        assert built.get(key) == value, key


@pytest.mark.parametrize(
    ("headers", "body", "code"),
    [
        ({"Priority": "6"}, b"", 40007),
        ({}, b"x" * 4096, 40014),
        ({}, b"\xff", 40014),
        ({"Filename": "f.txt"}, b"x", 40014),
        ({"Attach": "ftp://x"}, b"", 40013),
        ({"Icon": "file:///x"}, b"", 40021),
        ({"Email": "a@b"}, b"", 40001),
        ({"Call": "yes"}, b"", 40032),
        ({"Delay": "10m", "Cache": "no"}, b"", 40002),
        ({"Delay": "tomorrow, 10am"}, b"", 40004),
        ({"Delay": "9s"}, b"", 40005),
        ({"Delay": "72h1s"}, b"", 40006),
        ({"Actions": "view, x"}, b"", 40018),
        ({"Template": "yes"}, b"", 40043),
    ],
)
def test_build_event_errors(headers: dict[str, str], body: bytes, code: int) -> None:
    with pytest.raises(NtfyError) as caught:
        build(headers, body)
    assert caught.value.code == code


def test_longest_text_body_is_4095_bytes() -> None:
    assert build({}, b"y" * 4095).message == "y" * 4095


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'{"message":"x"}', 40009),
        (b'{"topic":"bad/topic"}', 40009),
        (b"null", 40009),
        (b"{nope", 40024),
        (b"[]", 40024),
        (b'{"topic":"t","priority":"high"}', 40024),
        (b'{"topic":"t","priority":4.0}', 40024),
        (b'{"topic":"t","tags":"a"}', 40024),
        (b'{"topic":"t","x":NaN}', 40024),
        (b"", 40024),
        (b'{"topic":"t","message":"' + b"x" * 8200 + b'"}', 41303),
    ],
)
def test_json_publish_errors(body: bytes, code: int) -> None:
    with pytest.raises(NtfyError) as caught:
        parse_json_publish(body, 4096)
    assert caught.value.code == code


def test_json_publish_rewrites_to_headers() -> None:
    topic, headers, body = parse_json_publish(
        b' {"Topic":"t","title":"T","priority":4,"tags":["a","b"],"cache":"no","extra":1} trailing',
        4096,
    )
    assert (topic, body) == ("t", b"triggered")
    assert headers == {"X-Title": "T", "X-Cache": "no", "X-Priority": "4", "X-Tags": "a,b"}


def test_cache_ordering_and_cursor() -> None:
    cache = MessageCache()
    cache.add(event("aaaaaaaaaaa1", "a", time=100))
    cache.add(event("bbbbbbbbbbb1", "b", time=100))
    cache.add(event("aaaaaaaaaaa2", "a", time=90))  # inserted later, earlier time
    cache.add(event("aaaaaaaaaaa3", "a", time=100))

    def ids(rows: list[object]) -> list[str]:
        return [row.event.id for row in rows]  # type: ignore[attr-defined]

    assert ids(cache.select("a", ALL)) == ["aaaaaaaaaaa2", "aaaaaaaaaaa1", "aaaaaaaaaaa3"]
    assert ids(cache.select("a", Since(0, "bbbbbbbbbbb1"))) == ["aaaaaaaaaaa2", "aaaaaaaaaaa3"]
    assert ids(cache.select("a", Since(0, "zzzzzzzzzzzz"))) == ids(cache.select("a", ALL))
    assert ids(cache.select("a", Since(100))) == ["aaaaaaaaaaa1", "aaaaaaaaaaa3"]
    assert ids(cache.select("a", LATEST)) == ["aaaaaaaaaaa3"]
    assert cache.select("a", NONE) == []
    assert ids(cache.replay(["b", "a"], ALL)) == [
        "aaaaaaaaaaa2",
        "bbbbbbbbbbb1",
        "aaaaaaaaaaa1",
        "aaaaaaaaaaa3",
    ]
    assert cache.remove(["aaaaaaaaaaa1"]) == ["aaaaaaaaaaa1"]
    assert cache.add(event("ccccccccccc1")) == 5  # row ids are never reused


def test_disabled_cache_stores_nothing() -> None:
    cache = MessageCache(enabled=False)
    assert cache.add(event("aaaaaaaaaaa1")) is None
    assert cache.select("t", ALL) == []


def test_token_bucket_refills_from_the_clock() -> None:
    bucket = access.TokenBucket(2, 5.0, now=0.0)
    assert bucket.allow(0.0) and bucket.allow(0.0) and not bucket.allow(0.0)
    assert not bucket.allow(4.9)
    assert bucket.allow(5.0)


@pytest.mark.parametrize(
    ("patterns", "topic", "ok"),
    [(("alerts",), "alerts", True), (("al*",), "alerts", True), (("a.c",), "abc", False)],
)
def test_acl_patterns(patterns: tuple[str, ...], topic: str, ok: bool) -> None:
    assert access.can_read(patterns, topic) is ok
