"""POSTs to one URL over a few kept-alive HTTP/1.1 connections: the relay's lean client.

One request at a time per connection (`http_connection.Connection`), so a delivery is settled on
its own reply; h11 writes every request and reads every reply. A connection goes back to the pool only when the reply ended by its own framing with both sides
free to go on (h11's rule), and is taken out again only by httpcore's rules: idle for no longer
than `KEEPALIVE_EXPIRY`, and nothing (not a byte, not EOF) arrived while it waited.

Why not httpx or httpcore here: a POST through httpx costs about 600 us of CPU on a small
machine, through httpcore's pool about 300 us, through this client about 120 us (docs/performance.md,
bench/bench_latency.py `--only post`). The daemon keeps httpx when the
environment names a proxy for the relay URL, or when a test injects a transport.

A request that found its reused connection closed by the server before any byte of the reply
came back is sent once more on a fresh connection: the server never answered it, and the
delivery key makes a repeat harmless anyway.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from ntfy_intake.wire.http_connection import (
    Connection,
    Connector,
    NoResponse,
    client_state,
    request_bytes,
)


class _StaleConnection(Exception):
    """The server had closed a kept-alive connection before our request reached it."""


class KeepAlivePoster:
    """`await poster.post(body, headers)` -> (status, headers, reply up to `max_reply` bytes)."""

    def __init__(
        self,
        url: str,
        *,
        timeouts: httpx.Timeout,
        max_reply: int,
        max_idle: int = 16,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.target = httpx.URL(url)
        if self.target.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {self.target.scheme!r}")
        self.timeouts = timeouts
        self.max_reply = max_reply
        self.max_idle = max_idle
        self.connections_opened = 0
        self._idle: list[Connection] = []
        self._connector = Connector(clock)

    async def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, httpx.Headers, bytes]:
        while self._idle:
            connection = self._idle.pop()
            if not connection.reusable():
                connection.abort()
                continue
            try:
                request = request_bytes(connection.h11, "POST", self.target, headers, body)
            except httpx.LocalProtocolError:
                connection.abort()
                raise
            try:
                return await self._exchange(connection, request, reused=True)
            except _StaleConnection:
                continue
        state = client_state()
        request = request_bytes(state, "POST", self.target, headers, body)  # before connecting
        connection = await self._connector.connect(self.target, self.timeouts.connect, state)
        self.connections_opened += 1
        return await self._exchange(connection, request, reused=False)

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().abort()

    async def _exchange(
        self,
        connection: Connection,
        request: bytes,
        *,
        reused: bool,
    ) -> tuple[int, httpx.Headers, bytes]:
        keep = False
        try:
            try:
                await connection.send(request, self.timeouts.write)
            except httpx.WriteError:
                if reused:
                    raise _StaleConnection from None
                raise
            try:
                head = await connection.read_head(self.timeouts.read)
            except NoResponse:
                # Not a byte of a reply on a connection the server may have closed while it sat
                # idle: try a fresh one. Any other failure is the server's answer.
                if reused:
                    raise _StaleConnection from None
                raise
            parts: list[bytes] = []
            size = 0
            while size < self.max_reply:
                part = await connection.read_body(self.timeouts.read)
                if part is None:
                    keep = connection.reusable()
                    break
                parts.append(part)
                size += len(part)
            # Past max_reply the rest is not read: this connection is not reused.
            reply = b"".join(parts)[: self.max_reply]
            return head.status_code, httpx.Headers(list(head.headers.raw_items())), reply
        finally:
            # Cancelled (the attempt's deadline), failed or told to close: never reused.
            if keep and len(self._idle) < self.max_idle:
                self._idle.append(connection)
            else:
                connection.abort()
