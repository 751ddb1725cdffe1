"""The read timeout of one HTTP connection (wire/http_connection._Wire.receive): each wait for
bytes may last `read_timeout`, however long the whole body takes, and a connection reused for
another request carries no deadline over from the last one."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from ntfy_intake.wire import http_connection
from ntfy_intake.wire.http_stream import RawStreamOpener

from .test_http_stream import chunk, in_loop, read_request, serve

HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@in_loop
async def test_a_body_gone_silent_times_out_after_the_read_timeout() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(HEAD + chunk(b'{"event":"open"}\n'))
        await writer.drain()
        await asyncio.sleep(10)

    async with serve(handler) as port:
        got: list[bytes] = []
        began = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            async with RawStreamOpener()(
                f"http://127.0.0.1:{port}/t/json", {}, {}, httpx.Timeout(2.0, read=0.3)
            ) as response:
                async for part in response.aiter_raw():
                    got.append(part)
        assert got == [b'{"event":"open"}\n']
        assert 0.25 < time.monotonic() - began < 3.0


@in_loop
async def test_a_body_whose_every_part_comes_in_time_is_never_cut() -> None:
    """The whole outlasts the read timeout several times over; no wait does."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(HEAD)
        for n in range(12):
            writer.write(chunk(b'{"n":%d}\n' % n))
            await writer.drain()
            await asyncio.sleep(0.1)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async with (
        serve(handler) as port,
        RawStreamOpener()(
            f"http://127.0.0.1:{port}/t/json", {}, {}, httpx.Timeout(2.0, read=0.35)
        ) as response,
    ):
        body = b"".join([part async for part in response.aiter_raw()])
    assert body.count(b"\n") == 12


@in_loop
async def test_a_reused_connection_is_not_failed_by_its_last_requests_read_timer() -> None:
    """A read with a short timeout, then the next request's head waited for under its own
    (whole-head) deadline: the timer the body's reads left must not fail that wait."""
    requests = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        while True:
            await read_request(reader)
            await reader.readexactly(len(b"alert"))
            requests += 1
            if requests == 2:
                await asyncio.sleep(0.6)  # longer than the first body's read timeout
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)  # the body waited for: a read under the 0.2 s timeout
            writer.write(b"ok")
            await writer.drain()

    async with serve(handler) as port:
        target = httpx.URL(f"http://127.0.0.1:{port}/hook")
        connection = await http_connection.Connector().connect(target, 2.0)
        try:
            for _ in range(2):
                request = http_connection.request_bytes(
                    connection.h11, "POST", target, {}, b"alert"
                )
                await connection.send(request, 2.0)
                head = await connection.read_head(3.0)
                assert head.status_code == 200
                assert await connection.read_body(0.2) == b"ok"
                assert await connection.read_body(0.2) is None
                assert connection.reusable()
        finally:
            connection.abort()
    assert requests == 2
