"""The relay's fast path against h11 itself: any request it can write, any reply split at any byte.

The relay writes its POSTs without h11 (`http_heads.RequestWriter`) and reads a plain reply's head
without it (`http_heads.simple_head`, inside `Connection`), kept for speed: bench/bench_latency.py
`--only post` measures it beside h11 in the same run. Here:
- every request the writer writes is byte for byte what h11 writes, and where h11 refuses one the
  writer hands it to h11 (which then refuses it: the same error);
- a connection reading a reply through the fast path agrees with h11 read event by event (the
  same status, fields, body and reuse, or both a protocol error), and exactly with the same
  connection reading through h11 alone (the same error type and words).
"""

from __future__ import annotations

import asyncio
import itertools

import h11
import httpx
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from ntfy_intake import __version__
from ntfy_intake.wire import http_connection
from ntfy_intake.wire.http_heads import RequestWriter, SimpleHead

# -- requests --------------------------------------------------------------------------------

Written = bytes | str


def by_h11(target: httpx.URL, headers: dict[str, str], body: bytes) -> Written:
    try:
        return http_connection.request_bytes(
            h11.Connection(h11.CLIENT), "POST", target, headers, body
        )
    except httpx.LocalProtocolError:
        return "refused"


hosts = st.sampled_from(
    ["127.0.0.1", "localhost", "receiver.example", "[::1]", "bücher.example", "xn--bcher-kva.ex"]
)
paths = st.sampled_from(
    ["/triage", "/", "", "/a/b?x=1&y=%20", "/caf%C3%A9", "/ü", "/a b", "/t?q=\u20ac", "/x#frag"]
)
userinfo = st.sampled_from(["", "", "user:secret@", "ü:pa ss@", "only@", ":p@"])


@st.composite
def targets(draw: st.DrawFn) -> httpx.URL:
    scheme = draw(st.sampled_from(["http", "https"]))
    port = draw(st.sampled_from(["", ":8080", ":80", ":443", ":1"]))
    url = f"{scheme}://{draw(userinfo)}{draw(hosts)}{port}{draw(paths)}"
    try:
        return httpx.URL(url)
    except httpx.InvalidURL:
        assume(False)
        raise  # pragma: no cover - assume raised


names = st.sampled_from(
    [
        "Idempotency-Key",
        "Content-Type",
        "User-Agent",
        "user-agent",
        "Authorization",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "X-Empty",
        "Host",
        "host",
        "Content-Length",
        "CONTENT-LENGTH",
        "Transfer-Encoding",
        "Connection",
        "Expect",
        "Upgrade",
        "Accept",
        "Bad Name",
        "X-\u00dcnicode",
        "X-\u20ac",
        "",
        "X:Colon",
        "X\tTab",
    ]
) | st.text(max_size=8)
values = st.sampled_from(
    [
        "triage_0000001",
        "application/json",
        f"ntfy-intake/{__version__}",
        "Bearer tok_123",
        "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=",
        "1764470000",
        "",
        " lead",
        "trail ",
        "a\tb",
        "a  b",
        "caf\xe9",
        "\u20ac",
        "a\x00b",
        "a\r\nX-Injected: y",
        "a\nb",
        "close",
        "100-continue",
        "chunked",
        "5",
        "websocket",
    ]
) | st.text(max_size=12)
header_dicts = st.dictionaries(names, values, max_size=6)


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(target=targets(), first=header_dicts, second=header_dicts, body=st.binary(max_size=64))
@example(
    target=httpx.URL("http://127.0.0.1:8080/triage"),
    first={"Idempotency-Key": "k1", "Content-Type": "application/json"},
    second={"Idempotency-Key": "k2", "User-Agent": "custom"},
    body=b"{}",
)
def test_writer_writes_what_h11_writes_or_leaves_it_to_h11(
    target: httpx.URL, first: dict[str, str], second: dict[str, str], body: bytes
) -> None:
    writer = RequestWriter(target)
    for headers in (first, second, first):  # again: the writer's memory of names seen
        written = writer.write(headers, body)
        if written is not None:  # None: the poster has h11 write it, or refuse it
            assert written == by_h11(target, headers, body)


def test_the_relays_own_requests_take_the_fast_path() -> None:
    """Failure mode: the writer leaves every request to h11 (and the equality above holds
    trivially): the relay pays h11's cost on every delivery."""
    target = httpx.URL("https://user:pw@receiver.example:8443/triage?x=1")
    writer = RequestWriter(target)
    for i in range(3):
        headers = {
            "Idempotency-Key": f"triage_{i:07d}",
            "Content-Type": "application/json",
            "User-Agent": f"ntfy-intake/{__version__}",
            "Authorization": "Bearer tok",
            "webhook-id": f"triage_{i:07d}",
            "webhook-timestamp": "1764470000",
            "webhook-signature": "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=",
        }
        body = b'{"n":%d}' % i
        written = writer.write(headers, body)
        assert written is not None
        assert written == by_h11(target, headers, body)
    assert writer.write({}, b"") == by_h11(target, {}, b"")


@pytest.mark.parametrize(
    ("headers", "refused"),
    [
        ({"Host": "other"}, True),
        ({"Content-Length": "3"}, True),
        ({"Transfer-Encoding": "chunked"}, False),  # h11 frames the body by it: its own call
        ({"Connection": "close"}, False),
        ({"X-Bad": "a\r\nX-Injected: y"}, True),
        ({"Bad Name": "x"}, True),
        ({"X-Euro": "\u20ac"}, True),
    ],
)
def test_what_h11_judges_the_writer_leaves_to_h11(headers: dict[str, str], refused: bool) -> None:
    target = httpx.URL("http://127.0.0.1:8080/triage")
    assert RequestWriter(target).write(headers, b"{}") is None
    assert (by_h11(target, headers, b"{}") == "refused") is refused


# -- replies ---------------------------------------------------------------------------------

Outcome = tuple[object, ...]
PROTOCOL_ERROR: Outcome = ("protocol error",)
TARGET = httpx.URL("http://127.0.0.1:8080/triage")
HEADERS = {"Idempotency-Key": "triage_0000001", "Content-Type": "application/json"}
BODY = b'{"n":1}'


class Pieces:
    """A wire that hands over exactly one piece per read, then EOF: the socket's own cuts."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = [piece for piece in pieces if piece]  # b"" would read as EOF
        self.eof = False

    @property
    def buffer(self) -> bytes:  # arrived, not yet read: what `Connection.reusable` looks at
        return b"".join(self.pieces)

    async def receive(self, read_timeout: float | None) -> bytes:
        if self.pieces:
            return self.pieces.pop(0)
        self.eof = True
        return b""

    async def send(self, data: bytes, write_timeout: float | None) -> None:
        pass

    def abort(self) -> None:
        pass


def split_at(wire: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(wire)) for c in cuts} | {0, len(wire)})
    return [wire[a:b] for a, b in itertools.pairwise(points)]


def read_by_h11(pieces: list[bytes]) -> Outcome:
    """h11 event by event: (status, fields, body, whether the connection may carry another)."""
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=http_connection.MAX_HEAD_BYTES)
    http_connection.request_bytes(conn, "POST", TARGET, HEADERS, BODY)
    response: h11.Response | None = None
    body: list[bytes] = []
    feed = [piece for piece in pieces if piece]
    closed = False
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                if closed:
                    return PROTOCOL_ERROR
                data = feed.pop(0) if feed else b""
                closed = not data
                conn.receive_data(data)
            elif isinstance(event, h11.InformationalResponse):
                continue
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                body.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            else:  # ConnectionClosed before a message ended raises instead
                raise AssertionError(event)  # pragma: no cover
    except h11.RemoteProtocolError:
        return PROTOCOL_ERROR
    assert response is not None
    kept = (
        conn.our_state is h11.DONE
        and conn.their_state is h11.DONE
        and conn.next_event() is h11.NEED_DATA  # not PAUSED: nothing behind the reply
        and not feed
        and not closed
    )
    fields = tuple((bytes(n), bytes(v)) for n, v in response.headers.raw_items())
    return ("ok", response.status_code, fields, b"".join(body), kept)


def read_by_connection(pieces: list[bytes], *, simple: bool) -> tuple[Outcome, bool]:
    """The relay's connection: (outcome, whether the fast path read the head)."""

    async def read() -> tuple[Outcome, bool]:
        wire = Pieces(pieces)
        connection = http_connection.Connection(wire, lambda: 0.0)  # type: ignore[arg-type]
        if simple:
            request = RequestWriter(TARGET).write(HEADERS, BODY)
            assert request is not None

            def replay(state: h11.Connection) -> bytes:
                return http_connection.request_bytes(state, "POST", TARGET, HEADERS, BODY)

            await connection.send(request, None, replay)
        else:
            request = http_connection.request_bytes(connection.h11, "POST", TARGET, HEADERS, BODY)
            await connection.send(request, None)
        head = await connection.read_head(None)
        parts = []
        while (part := await connection.read_body(None)) is not None:
            parts.append(part)
        if isinstance(head, SimpleHead):
            fields = tuple(head.fields)
        else:
            fields = tuple((bytes(n), bytes(v)) for n, v in head.headers.raw_items())
        kept = connection.reusable()
        return ("ok", head.status_code, fields, b"".join(parts), kept), isinstance(head, SimpleHead)

    try:
        return asyncio.run(read())
    except httpx.RemoteProtocolError as exc:
        return (type(exc).__name__, str(exc)), False


def coarse(outcome: Outcome) -> Outcome:
    return outcome if outcome[0] == "ok" else PROTOCOL_ERROR


# -- what a receiver, a proxy or an attacker may write -----------------------------------------

# Plain shapes (the fast path's) are drawn as often as odd ones, so that a head whose only flaw
# is one odd field or length is common.
plain_status = st.sampled_from(
    [
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 200",
        b"HTTP/1.1 202 Accepted",
        b"HTTP/1.1 429 Too Many Requests",
        b"HTTP/1.1 503 Busy",
        b"HTTP/1.1 999 x",
        b"HTTP/1.1 200 OK\tfine",
        b"HTTP/1.1 200 caf\xe9",
        b"HTTP/1.1 200 OK ",
    ]
)
odd_status = st.sampled_from(
    [
        b"HTTP/1.1 204 No Content",
        b"HTTP/1.1 304 Not Modified",
        b"HTTP/1.1 101 Switching Protocols",
        b"HTTP/1.1 199 odd",
        b"HTTP/1.0 200 OK",
        b"HTTP/1.1  200 OK",
        b"HTTP/1.1 200 a\x00b",
        b"HTTP/2 200",
        b"HTTP/1.1 20 OK",
        b"HTTP/1.1 2000 OK",
        b"http/1.1 200 OK",
        b"FTP/1.1 200 OK",
        b" HTTP/1.1 200 OK",
        b"",
    ]
)
status_lines = st.one_of(plain_status, plain_status, odd_status)
plain_field = st.sampled_from(
    [
        b"Content-Type: application/json",
        b"date: Tue, 01 Dec 2026 10:00:00 GMT",
        b"Retry-After: 5",
        b"Connection: close",
        b"connection: Keep-Alive, CLOSE",
        b"Connection: keep-alive",
        b"Connection: closed",
        b"Connection: ,close,",
        b"X-Empty:",
        b"X-Spaces:   a  b  ",
        b"X-Latin: caf\xe9",
    ]
)
odd_field = st.sampled_from(
    [
        b"X-Folded: a\r\n b",
        b"X-Folded-Tab: a\r\n\tb",
        b"Bad Field: x",
        b": no name",
        b"X-Ctl: a\x01b",
        b"X-Bare-LF: a\nb",
        b"X-CR: a\rb",
    ]
)
fields = st.lists(st.one_of(plain_field, plain_field, plain_field, odd_field), max_size=4)
odd_lengths = st.sampled_from(
    [b"005", b" 5", b"5 ", b"+5", b"-5", b"5,5", b"5, 5", b"5, 6", b"", b"0x5", b"1" * 21, b"5\t"]
)
behind = st.sampled_from(
    [b"", b"", b"", b"x", b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 7\r\n\r\ntimeout"]
)


@st.composite
def replies(draw: st.DrawFn) -> bytes:
    head = [draw(status_lines), *draw(fields)]
    body = draw(st.binary(max_size=40))
    framing = draw(
        st.sampled_from(
            [
                "length",
                "length",
                "odd-length",
                "odd-length",
                "two-lengths",
                "chunked",
                "both",
                "close",
            ]
        )
    )
    if framing == "length":
        declared = len(body) + draw(st.sampled_from([0, 0, 0, -1, 3]))
        name = draw(st.sampled_from([b"Content-Length", b"content-length", b"CONTENT-LENGTH"]))
        head.insert(draw(st.integers(1, len(head))), b"%s: %d" % (name, max(declared, 0)))
    elif framing == "odd-length":
        head.append(b"Content-Length: " + draw(odd_lengths))
        body = b"hello" + body
    elif framing == "two-lengths":
        head += [b"Content-Length: %d" % len(body), b"Content-Length: %d" % draw(st.integers(0, 9))]
    elif framing in ("chunked", "both"):
        head.append(b"Transfer-Encoding: chunked")
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n"
        if framing == "both":
            head.append(b"Content-Length: %d" % len(body))
    informational = draw(
        st.sampled_from(
            [
                b"",
                b"",
                b"",
                b"HTTP/1.1 100 Continue\r\n\r\n",
                b"HTTP/1.1 103 Hints\r\nLink: </a>\r\n\r\n",
            ]
        )
    )
    newline = draw(st.sampled_from([b"\r\n", b"\r\n", b"\r\n", b"\n"]))
    leading = draw(st.sampled_from([b"", b"", b"", b"\r\n"]))
    wire = leading + informational + newline.join(head) + newline + newline + body
    return wire + draw(behind)


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(wire=replies(), cuts=st.lists(st.integers(0, 400), max_size=10))
@example(wire=b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", cuts=[])
@example(wire=b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}x", cuts=[])
@example(wire=b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}", cuts=[])
@example(wire=b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n{}", cuts=[1, 30])
@example(wire=b"", cuts=[])
@example(wire=b"HTTP/1.1 200 OK\r\nContent-Length: %s\r\n\r\nhello" % (b"1" * 21), cuts=[])
def test_connection_reads_any_reply_as_h11_does(wire: bytes, cuts: list[int]) -> None:
    pieces = split_at(wire, cuts)
    fast, _ = read_by_connection(pieces, simple=True)
    through_h11, took_fast_path = read_by_connection(pieces, simple=False)
    assert not took_fast_path
    assert fast == through_h11
    assert coarse(fast) == read_by_h11(pieces)


@pytest.mark.parametrize(
    ("wire", "kept"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", True),
        (b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 5\r\ncontent-length: 0\r\n\r\n", True),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}HTTP/1.1 408 x\r\n\r\n", False),
    ],
)
def test_plain_replies_take_the_fast_path(wire: bytes, kept: bool) -> None:
    """Failure mode: every reply falls to h11 (and the equality above holds trivially)."""
    outcome, took_fast_path = read_by_connection([wire], simple=True)
    assert took_fast_path
    assert outcome[4] is kept
    assert outcome == read_by_h11([wire])
