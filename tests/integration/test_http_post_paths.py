"""The relay's keep-alive client over real loopback sockets, on both its paths: the fast path
(`http_heads`) and h11 writing and reading every exchange; what it does with odd replies."""

from __future__ import annotations

import asyncio

import httpx

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
