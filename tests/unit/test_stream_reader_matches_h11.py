"""The stream reader against h11 read event by event: any response, split at any byte.

The stream reader hands over what h11 holds after each socket read as one part and lets h11
judge the end of the body (EOF included). Here both read the same bytes, cut into the same
pieces, and must agree: the same status, the same header fields, the same body, or both a
protocol error.
"""

from __future__ import annotations

import asyncio
import itertools

import h11
import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ntfy_intake.wire import http_connection
from ntfy_intake.wire.http_stream import read_response

Outcome = tuple[str, int, tuple[tuple[bytes, bytes], ...], bytes] | tuple[str]
PROTOCOL_ERROR: Outcome = ("protocol error",)


class Pieces:
    """A reader that hands over exactly one piece per read, then EOF: the wire's own cuts."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = [piece for piece in pieces if piece]  # b"" would read as EOF

    async def receive(self, read_timeout: float | None) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""


def split_at(wire: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(wire)) for c in cuts} | {0, len(wire)})
    return [wire[a:b] for a, b in itertools.pairwise(points)]


def by_h11(pieces: list[bytes]) -> Outcome:
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/t/json", headers=[("Host", "x")]))
    conn.send(h11.EndOfMessage())
    response: h11.Response | None = None
    body: list[bytes] = []
    feed = [*pieces, b""]  # b"": the server closed
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                if not feed:
                    return PROTOCOL_ERROR
                conn.receive_data(feed.pop(0))
            elif isinstance(event, h11.InformationalResponse):
                continue
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                body.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed | h11.PAUSED):
                break
            else:  # pragma: no cover - h11 has no other event for a client
                raise AssertionError(event)
    except h11.RemoteProtocolError:
        return PROTOCOL_ERROR
    if response is None:  # pragma: no cover - a closed connection before a head raises
        return PROTOCOL_ERROR
    fields = tuple((bytes(n), bytes(v)) for n, v in response.headers)
    return ("ok", response.status_code, fields, b"".join(body))


def by_stream_reader(pieces: list[bytes]) -> Outcome:
    async def read() -> Outcome:
        conn = h11.Connection(h11.CLIENT)
        http_connection.request_bytes(conn, "GET", httpx.URL("http://x/t/json"), {})
        response = await read_response(Pieces(pieces), conn, read_timeout=None)
        body = await response.aread()
        fields = tuple((n.lower(), v) for n, v in response.headers.raw)
        return ("ok", response.status_code, fields, body)

    try:
        return asyncio.run(read())
    except httpx.RemoteProtocolError:
        return PROTOCOL_ERROR


# -- what a server, a proxy or an attacker may write ---------------------------------------------

HEX = "0123456789abcdefABCDEF"
size_prefixes = st.sampled_from([b"", b"0", b"00", b"000000"])
whitespace = st.sampled_from([b"", b"", b" ", b"\t", b"  ", b" \t"])
extensions = st.sampled_from([b"", b"", b";name=value", b";x", b";", b" ;x", b";a\tb"])
odd_sizes = st.sampled_from([b"", b"-5", b"+5", b"0x5", b"5_0", b"g", b" 5", b"1" * 21])


@st.composite
def chunk_lines(draw: st.DrawFn, size: int) -> bytes:
    if draw(st.integers(0, 30)) == 0:
        return draw(odd_sizes)
    digits = draw(size_prefixes) + (b"%x" % size if draw(st.booleans()) else b"%X" % size)
    return digits + draw(extensions) + draw(whitespace)


@st.composite
def chunked_bodies(draw: st.DrawFn) -> bytes:
    out = b""
    for data in draw(st.lists(st.binary(min_size=1, max_size=120), max_size=6)):
        footer = b"\r\n" if draw(st.integers(0, 20)) else draw(st.sampled_from([b"\n", b"XY", b""]))
        out += draw(chunk_lines(len(data))) + b"\r\n" + data + footer
    out += draw(chunk_lines(0)) + b"\r\n"
    trailers = draw(
        st.sampled_from(
            [
                b"",
                b"",
                b"X-Trailer: 1\r\n",
                b"A: b\r\nC: d\r\n",
                b"bad trailer\r\n",
                b"X: a\r\n  folded\r\n",
                b"X: a\x00b\r\n",
            ]
        )
    )
    return out + trailers + draw(st.sampled_from([b"\r\n", b"\r\n", b"\n", b""]))


status_lines = st.sampled_from(
    [
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 200",
        b"HTTP/1.0 200 OK",
        b"HTTP/1.1 429 Too Many Requests",
        b"HTTP/1.1 200 OK\tfine",
        b"HTTP/2 200",
        b"HTTP/1.1 20 OK",
        b"FTP/1.1 200 OK",
    ]
)
extra_fields = st.lists(
    st.sampled_from(
        [
            b"Content-Type: application/x-ndjson",
            b"Date: Tue, 01 Dec 2026 10:00:00 GMT",
            b"X-Folded: a\r\n b",
            b"Bad Field: x",
            b"X-Empty:",
            b"X-Latin: caf\xe9",
            b": no name",
            b"X-Ctl: a\x01b",
        ]
    ),
    max_size=3,
)


@st.composite
def responses(draw: st.DrawFn) -> bytes:
    head = [draw(status_lines), *draw(extra_fields)]
    framing = draw(
        st.sampled_from(
            [
                "chunked",
                "chunked",
                "chunked",
                "length",
                "close",
                "both",
                "gzip",
                "two-encodings",
                "two-lengths",
            ]
        )
    )
    body = draw(st.binary(max_size=80))
    if framing in ("chunked", "both", "two-encodings"):
        head.append(
            draw(st.sampled_from([b"Transfer-Encoding: chunked", b"transfer-encoding: Chunked"]))
        )
        body = draw(chunked_bodies())
    if framing == "two-encodings":
        head.append(b"Transfer-Encoding: chunked")
    if framing == "gzip":
        head.append(b"Transfer-Encoding: gzip, chunked")
        body = draw(chunked_bodies())
    if framing in ("length", "both"):
        declared = len(body) + draw(st.sampled_from([0, 0, 0, -1, 3]))
        head.append(b"Content-Length: %d" % max(declared, 0))
    if framing == "two-lengths":
        head += [b"Content-Length: 3", b"Content-Length: 4"]
    informational = draw(st.sampled_from([b"", b"", b"HTTP/1.1 100 Continue\r\n\r\n"]))
    newline = draw(st.sampled_from([b"\r\n", b"\r\n", b"\n"]))
    return informational + newline.join(head) + newline + newline + body


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(wire=responses(), cuts=st.lists(st.integers(0, 1200), max_size=12))
@example(
    wire=b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5 \r\nhello\r\n0\r\n\r\n", cuts=[]
)
@example(
    wire=b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5 ;ext\r\nhello\r\n0\r\n\r\n",
    cuts=[],
)
def test_stream_reader_reads_any_response_as_h11_does(wire: bytes, cuts: list[int]) -> None:
    pieces = split_at(wire, cuts)
    assert by_stream_reader(pieces) == by_h11(pieces)


@pytest.mark.parametrize(
    ("size_line", "expected"),
    [
        (b"5 ", "ok"),  # trailing whitespace: h11 takes it, real servers and proxies write it
        (b"5\t", "ok"),
        (b"5;name=value", "ok"),
        (b"5 ;ext", "protocol error"),  # whitespace before an extension: h11 refuses it
        (b"0x5", "protocol error"),
    ],
)
def test_chunk_size_line_is_judged_as_h11_judges_it(size_line: bytes, expected: str) -> None:
    """Failure mode: a proxy that writes `5 \\r\\n` fails every connection (intake backs off for
    ever), while `5 ;ext`, which h11 refuses, was taken."""
    wire = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%s\r\nhello\r\n0\r\n\r\n" % size_line
    )
    outcome = by_stream_reader([wire])
    assert outcome[0] == expected
    assert outcome == by_h11([wire])
