"""The relay's keep-alive client over real loopback sockets: what it does with odd replies, and
with requests and replies that h11's state machine acts on."""

from __future__ import annotations

import asyncio

import httpx
import pytest

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
    replier: Replier, bodies: list[bytes], headers: dict[str, str]
) -> tuple[KeepAlivePoster, list[tuple[int, httpx.Headers, bytes]]]:
    async with serve(replier) as port:
        poster = KeepAlivePoster(f"http://127.0.0.1:{port}/t", timeouts=TIMEOUTS, max_reply=64)
        replies = [await poster.post(body, headers) for body in bodies]
        await poster.aclose()
    return poster, replies


@in_loop
async def test_replies_h11_reads_and_plain_ones_share_one_connection() -> None:
    """Failure mode: after a chunked reply or a 100 Continue, h11's state is not ready for the
    next request, or the next plain reply is read against the last one's."""
    replier = Replier([PLAIN, CHUNKED, PLAIN, CONTINUE, PLAIN])
    bodies = [b"n%d" % i for i in range(10)]
    poster, replies = await post_each(replier, bodies, {"Idempotency-Key": "k"})
    assert [(status, reply) for status, _, reply in replies] == [(200, body) for body in bodies]
    assert poster.connections_opened == replier.connections == 1


@in_loop
async def test_request_with_a_field_h11_acts_on_is_written_by_h11_and_obeyed() -> None:
    """Failure mode: a caller's `Connection: close` goes out, but the connection it asked to
    end is kept for the next delivery."""
    replier = Replier([PLAIN])
    bodies = [b"n%d" % i for i in range(3)]
    poster, replies = await post_each(replier, bodies, {"Connection": "close"})
    assert [reply for _, _, reply in replies] == bodies
    assert all(b"\r\nConnection: close\r\n" in head for head in replier.heads)
    assert poster.connections_opened == replier.connections == 3


@in_loop
async def test_field_h11_refuses_is_an_httpx_error_and_the_poster_goes_on() -> None:
    replier = Replier([PLAIN])
    async with serve(replier) as port:
        poster = KeepAlivePoster(f"http://127.0.0.1:{port}/t", timeouts=TIMEOUTS, max_reply=64)
        assert (await poster.post(b"a", {}))[2] == b"a"
        with pytest.raises(httpx.LocalProtocolError):
            await poster.post(b"b", {"X-Injected": "a\r\nHost: elsewhere"})
        assert (await poster.post(b"c", {}))[2] == b"c"
        await poster.aclose()
    assert [head.count(b"Host:") for head in replier.heads] == [1, 1]
