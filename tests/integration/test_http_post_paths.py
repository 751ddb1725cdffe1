"""The relay's keep-alive client over real loopback sockets, on both its paths: the fast path
(`http_heads`) and h11 writing and reading every exchange; what it does with odd replies."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ntfy_intake.wire.http_post import KeepAlivePoster

from .test_http_stream import in_loop, serve

TIMEOUTS = httpx.Timeout(2.0)


@in_loop
async def test_reply_read_to_the_servers_close_is_an_answer() -> None:
    """Failure mode: an HTTP/1.1 reply without Content-Length, ended by the server's close, is
    read whole and then h11's own LocalProtocolError (not an httpx error) escapes while the
    connection is readied for reuse: the relay's lane stops instead of settling the delivery."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{}")
        await writer.drain()
        writer.close()

    async with serve(handler) as port:
        poster = KeepAlivePoster(f"http://127.0.0.1:{port}/t", timeouts=TIMEOUTS, max_reply=64)
        status, headers, reply = await poster.post(b"", {})
        await poster.aclose()
    assert (status, headers["content-type"], reply) == (200, "application/json", b"{}")


PATHS = pytest.mark.parametrize("simple", [True, False], ids=["fast-path", "h11"])
PLAIN = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s"
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n" + PLAIN


class Replier:
    """Answers the n-th request on a connection with `replies[n % len]` % (len(body), body),
    the body being the request's own; closes after a reply when `close_after` says so."""

    def __init__(self, replies: list[bytes], *, close_after: bool = False) -> None:
        self.replies = replies
        self.close_after = close_after
        self.connections = 0
        self.heads: list[bytes] = []

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            self.heads.append(head)
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            body = await reader.readexactly(length)
            writer.write(self.replies[served % len(self.replies)] % (len(body), body))
            await writer.drain()
            served += 1
            if self.close_after:
                writer.close()
                return


async def post_each(
    replier: Replier, bodies: list[bytes], headers: dict[str, str], *, simple: bool
) -> tuple[KeepAlivePoster, list[tuple[int, httpx.Headers, bytes]]]:
    async with serve(replier) as port:
        poster = KeepAlivePoster(
            f"http://127.0.0.1:{port}/t", timeouts=TIMEOUTS, max_reply=64, simple=simple
        )
        replies = [await poster.post(body, headers) for body in bodies]
        await poster.aclose()
    return poster, replies


@PATHS
@in_loop
async def test_replies_h11_reads_and_plain_ones_share_one_connection(simple: bool) -> None:
    """Failure mode: after a reply the fast path left to h11 (chunked, 100 Continue), h11's state
    is not ready for the next request, or the next plain reply is read against the last one's."""
    replier = Replier([PLAIN, CHUNKED, PLAIN, CONTINUE, PLAIN])
    bodies = [b"n%d" % i for i in range(10)]
    poster, replies = await post_each(replier, bodies, {"Idempotency-Key": "k"}, simple=simple)
    assert [(status, reply) for status, _, reply in replies] == [(200, body) for body in bodies]
    assert poster.connections_opened == replier.connections == 1


@PATHS
@in_loop
async def test_request_with_a_field_h11_acts_on_is_written_by_h11_and_obeyed(simple: bool) -> None:
    """Failure mode: a caller's `Connection: close` goes out on the fast path, but the
    connection it asked to end is kept for the next delivery."""
    replier = Replier([PLAIN])
    bodies = [b"n%d" % i for i in range(3)]
    poster, replies = await post_each(replier, bodies, {"Connection": "close"}, simple=simple)
    assert [reply for _, _, reply in replies] == bodies
    assert all(b"\r\nConnection: close\r\n" in head for head in replier.heads)
    assert poster.connections_opened == replier.connections == 3


@PATHS
@in_loop
async def test_field_h11_refuses_is_an_httpx_error_and_the_poster_goes_on(simple: bool) -> None:
    replier = Replier([PLAIN])
    async with serve(replier) as port:
        poster = KeepAlivePoster(
            f"http://127.0.0.1:{port}/t", timeouts=TIMEOUTS, max_reply=64, simple=simple
        )
        assert (await poster.post(b"a", {}))[2] == b"a"
        with pytest.raises(httpx.LocalProtocolError):
            await poster.post(b"b", {"X-Injected": "a\r\nHost: elsewhere"})
        assert (await poster.post(b"c", {}))[2] == b"c"
        await poster.aclose()
    assert [head.count(b"Host:") for head in replier.heads] == [1, 1]


REPLIES = [
    PLAIN,
    b"HTTP/1.1 503 Busy\r\nRetry-After: 5\r\nContent-Length: %d\r\n\r\n%s",
    b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
    b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nX-Spaces:  a  b \r\n\r\n%s",
    CHUNKED,
    CONTINUE,
    b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s",
    b"HTTP/1.1 204 No Content\r\nX-Len: %d\r\n\r\n%s",
    b"HTTP/1.1 200 OK\nContent-Length: %d\n\n%s",
    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Folded: a\r\n b\r\n\r\n%s",
    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%sHTTP/1.1 408 Request Timeout\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: %d, 7\r\n\r\n%s",
    b"HTTP/1.1 200 OK\r\nBad Field: %d\r\n\r\n%s",
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    replies=st.lists(st.sampled_from(REPLIES), min_size=1, max_size=4),
    close_after=st.booleans(),
)
def test_both_paths_give_the_same_answers_over_a_socket(
    replies: list[bytes], close_after: bool
) -> None:
    """The fast path and h11 alone, the same replies over real sockets: the same answers or the
    same httpx errors, on as many connections."""

    async def run(simple: bool) -> list[object]:
        replier = Replier(replies, close_after=close_after)
        seen: list[object] = []
        async with serve(replier) as port:
            poster = KeepAlivePoster(
                f"http://127.0.0.1:{port}/t", timeouts=TIMEOUTS, max_reply=64, simple=simple
            )
            for i in range(6):
                try:
                    status, headers, reply = await poster.post(b"n%d" % i, {"Idempotency-Key": "k"})
                    seen.append((status, headers.raw, reply))
                except httpx.HTTPError as exc:
                    seen.append(type(exc).__name__)
            await poster.aclose()
        return [*seen, poster.connections_opened]

    assert asyncio.run(run(True)) == asyncio.run(run(False))
