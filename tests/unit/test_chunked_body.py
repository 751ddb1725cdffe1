"""ChunkedBody: de-chunking an HTTP/1.1 body however the bytes are split on the wire.

It stops at the last chunk (`rest` then starts with the 0-size line): h11 reads that line and
the trailers (tests/unit/test_stream_reader_matches_h11.py holds the whole reader equal to h11)."""

from __future__ import annotations

import itertools

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ntfy_intake.wire.http_stream import ChunkedBody


def encode(chunks: list[bytes], *, extension: bytes = b"", trailers: bytes = b"") -> bytes:
    out = b"".join(b"%x%s\r\n%s\r\n" % (len(c), extension, c) for c in chunks if c)
    return out + b"0\r\n" + trailers + b"\r\n"


def split_at(wire: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(wire)) for c in cuts} | {0, len(wire)})
    return [wire[a:b] for a, b in itertools.pairwise(points)]


def decode(pieces: list[bytes]) -> tuple[bytes, bool]:
    body = ChunkedBody()
    out = b"".join(body.feed(piece) for piece in pieces)
    return out, body.last_chunk


@given(
    chunks=st.lists(st.binary(min_size=0, max_size=300), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=8000), max_size=30),
    extension=st.sampled_from([b"", b";name=value", b";x ", b" ", b"\t"]),
    trailers=st.sampled_from([b"", b"X-Trailer: 1\r\n", b"A: b\r\nC: d\r\n"]),
)
def test_body_is_the_same_however_the_wire_is_split(
    chunks: list[bytes], cuts: list[int], extension: bytes, trailers: bytes
) -> None:
    wire = encode(chunks, extension=extension, trailers=trailers)
    out, done = decode(split_at(wire, cuts))
    assert out == b"".join(chunks)
    assert done


def test_one_byte_at_a_time() -> None:
    chunks = [b'{"id":"a","event":"message"}\n', b"x" * 5000, b"\r\n\r\n"]
    wire = encode(chunks)
    out, done = decode([wire[i : i + 1] for i in range(len(wire))])
    assert out == b"".join(chunks)
    assert done


def test_bytes_from_the_last_chunk_on_are_not_payload() -> None:
    body = ChunkedBody()
    assert body.feed(encode([b"abc"]) + b"HTTP/1.1 200 OK\r\n") == b"abc"
    assert body.last_chunk
    assert body.rest == b"0\r\n\r\nHTTP/1.1 200 OK\r\n"


def test_unfinished_body_is_not_done() -> None:
    body = ChunkedBody()
    assert body.feed(b"5\r\nabc") == b"abc"
    assert not body.last_chunk
    assert body.feed(b"de\r\n") == b"de"
    assert not body.last_chunk


@pytest.mark.parametrize(
    "wire",
    [
        b"zz\r\nabc\r\n",  # not hex
        b"-5\r\nabc\r\n",  # int() would take a sign
        b"0x5\r\nabcde\r\n",  # and a prefix
        b"5_0\r\n",  # and underscores
        b"\r\n",  # no size at all
        b"3\r\nabcXY",  # payload not followed by CRLF
        b"1" * 21 + b"\r\n",  # more than 20 hex digits (h11's bound)
        b"5 ;ext\r\nhello\r\n",  # whitespace before an extension: h11 refuses it
        b"5\x0b\r\nhello\r\n",  # whitespace is only space and tab
        b"5" + b";x" * 40000,  # a size line that never ends (past 64 KiB, as h11 is set)
    ],
)
def test_malformed_body_is_a_protocol_error(wire: bytes) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        ChunkedBody().feed(wire)


@given(st.binary(max_size=200), st.lists(st.integers(0, 200), max_size=5))
def test_any_bytes_either_decode_or_raise_a_protocol_error(wire: bytes, cuts: list[int]) -> None:
    body = ChunkedBody()
    try:
        for piece in split_at(wire, cuts):
            body.feed(piece)
    except httpx.RemoteProtocolError:
        pass


@pytest.mark.parametrize("size_line", [b"5 ", b"5\t", b"5  \t", b"5;ext ", b"05"])
def test_chunk_size_line_with_trailing_whitespace_is_taken_as_h11_takes_it(
    size_line: bytes,
) -> None:
    """Failure mode: a proxy that writes `5 \\r\\n` (h11 takes it on purpose: real servers do)
    fails every stream connection, and intake backs off for ever."""
    body = ChunkedBody()
    assert body.feed(size_line + b"\r\nhello\r\n0\r\n\r\n") == b"hello"
    assert body.last_chunk
