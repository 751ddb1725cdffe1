"""POSTs to one URL over a few kept-alive HTTP/1.1 connections: the relay's lean client.

Why not httpx here: a relay POST through httpx costs about 1 ms of CPU on a small machine (h11,
anyio, the connection pool checking every idle connection, two sends per request), which caps
the relay near 600 deliveries/s on two cores (docs/performance.md). This client writes each
request in one send and reads the reply with the same wire code as the stream reader
(`http_stream`): httpx's errors, its TLS trust, no proxy (the daemon keeps httpx when the
environment names one for the relay URL, or when a test injects a transport).

A connection is reused only when the previous reply ended by its own framing on HTTP/1.1 without
`Connection: close`. A request that found its reused connection closed by the server before any
byte of the reply came back is sent once more on a fresh connection: the server never answered
it, and the delivery key makes a repeat harmless anyway.
"""

from __future__ import annotations

import asyncio

import httpx

from ntfy_intake.http_stream import Connector, NoResponse, os_detail, read_head, request_bytes


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @property
    def closed(self) -> bool:
        return self.writer.transport.is_closing() or self.reader.at_eof()

    def abort(self) -> None:
        self.writer.transport.abort()


class _StaleConnection(Exception):
    """The server had closed a kept-alive connection before our request reached it."""


class KeepAlivePoster:
    """`await poster.post(body, headers)` -> (status, headers, reply up to `max_reply` bytes)."""

    def __init__(
        self, url: str, *, timeouts: httpx.Timeout, max_reply: int, max_idle: int = 16
    ) -> None:
        self.target = httpx.URL(url)
        if self.target.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {self.target.scheme!r}")
        self.timeouts = timeouts
        self.max_reply = max_reply
        self.max_idle = max_idle
        self.connections_opened = 0
        self._idle: list[_Connection] = []
        self._connector = Connector()

    async def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, httpx.Headers, bytes]:
        request = request_bytes("POST", self.target, headers, body)
        while self._idle:
            connection = self._idle.pop()
            if connection.closed:
                connection.abort()
                continue
            try:
                return await self._exchange(connection, request, reused=True)
            except _StaleConnection:
                continue
        return await self._exchange(await self._open(), request, reused=False)

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().abort()

    async def _open(self) -> _Connection:
        reader, writer = await self._connector.connect(self.target, self.timeouts.connect)
        self.connections_opened += 1
        return _Connection(reader, writer)

    async def _exchange(
        self, connection: _Connection, request: bytes, *, reused: bool
    ) -> tuple[int, httpx.Headers, bytes]:
        keep = False
        try:
            try:
                connection.writer.write(request)
                async with asyncio.timeout(self.timeouts.write):
                    await connection.writer.drain()
            except TimeoutError:
                raise httpx.WriteTimeout("the server did not take the request in time") from None
            except OSError as exc:
                if reused:
                    raise _StaleConnection from None
                raise httpx.WriteError(os_detail(exc)) from None
            try:
                response = await read_head(connection.reader, self.timeouts.read)
            except NoResponse:
                # Not a byte of a reply on a connection the server may have closed while it sat
                # idle: try a fresh one. Any other failure is the server's answer.
                if reused:
                    raise _StaleConnection from None
                raise
            parts: list[bytes] = []
            size = 0
            body = response.aiter_raw()
            try:
                async for part in body:
                    parts.append(part)
                    size += len(part)
                    if size >= self.max_reply:
                        break  # the rest is not read: this connection is not reused
                else:
                    keep = response.reusable
            finally:
                await body.aclose()
            return response.status_code, response.headers, b"".join(parts)[: self.max_reply]
        finally:
            # Cancelled (the attempt's deadline), failed or told to close: never reused.
            if keep and len(self._idle) < self.max_idle:
                self._idle.append(connection)
            else:
                connection.abort()
