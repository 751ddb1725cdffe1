"""A lean HTTP/1.1 GET for ntfy's subscription stream, read in whole socket reads.

h11 writes the request, parses the response head (`http_connection`) and decodes the body. Why
not httpx: ntfy writes and flushes one HTTP chunk per message, and httpx hands the body over one
chunk at a time through several async generator layers; this reader hands over what h11 holds
after each socket read (hundreds of frames during a replay) as one part: about 7 us of
event-loop CPU per frame against 10-13 through httpx, some 7 % of a replayed event's CPU
(docs/performance.md, "Fast paths: kept or returned to the library"). What keeps it rather than
httpx is less the speed than two guarantees: the response head complete within `read_timeout`
as a whole (httpx's timeout is per read), and every response's headers seen (`on_response`).

It does only what the stream needs: one GET over http or https (the same certificate trust as
httpx: `httpx.create_ssl_context`), no proxy (the daemon keeps httpx when one applies to the URL,
see `proxied`), no redirects and no compression, like the httpx client it stands in for. Its
failures are httpx's exception types, so intake's handling and diagnose's wording stay one.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Protocol

import h11
import httpx
from httpx._utils import URLPattern, get_environment_proxies

from ntfy_intake.wire import http_connection
from ntfy_intake.wire.http_connection import ByteSource, Connector

StreamOpener = Callable[
    [str, dict[str, str], dict[str, str], httpx.Timeout],
    contextlib.AbstractAsyncContextManager["StreamResponse"],
]
"""`opener(url, params, headers, timeouts)`: a GET whose response is read as a stream."""


class StreamResponse(Protocol):
    """What intake reads of a response; httpx.Response has the same shape."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> httpx.Headers: ...

    async def aread(self) -> bytes: ...

    def aiter_raw(self) -> AsyncIterator[bytes]: ...


def url_problem(url: str) -> str | None:
    """Why httpx (hence this reader) cannot request `url`, or None. urlsplit, which the settings
    use, takes some URLs httpx refuses (a dotted quad above 255)."""
    try:
        httpx.URL(url)
    except (httpx.InvalidURL, UnicodeError) as exc:
        return str(exc)
    return None


def proxied(url: str) -> bool:
    """True when httpx (`trust_env`) would send `url` through a proxy named by the environment.

    Decided by httpx's own rules (`get_environment_proxies`, `URLPattern`: NO_PROXY=.lan does
    not cover `lan` itself, as in curl), not by urllib's, which differ; they are private to
    httpx, so `test_proxy_decision_is_the_one_httpx_makes` checks them against a real client."""
    target = httpx.URL(url)
    mounts = sorted(
        ((URLPattern(key), proxy) for key, proxy in get_environment_proxies().items()),
        key=lambda mount: mount[0],
    )
    for pattern, proxy in mounts:
        if pattern.matches(target):
            return proxy is not None
    return False


class RawStreamResponse:
    """One response on its own connection, its head and body read by h11 (`aiter_raw` or
    `aread`)."""

    def __init__(
        self,
        source: ByteSource,
        conn: h11.Connection,
        head: h11.Response,
        rest: bytes,
        read_timeout: float | None,
    ) -> None:
        self.status_code = head.status_code
        self.headers = httpx.Headers(list(head.headers.raw_items()))
        self._source = source
        self._conn = conn
        self._rest = rest  # bytes after the head: the body's start
        self._read_timeout = read_timeout

    async def aiter_raw(self) -> AsyncGenerator[bytes, None]:
        """The body as it arrives, decoded by h11; ends where the body ends. What h11 holds
        after each socket read goes out as one part (a replay's read holds hundreds of
        chunks, one per message)."""
        data, self._rest = self._rest, b""
        while True:
            if data:
                self._conn.receive_data(data)
            parts: list[bytes] = []
            event = http_connection.next_event(self._conn)
            while isinstance(event, h11.Data):
                parts.append(bytes(event.data))
                event = http_connection.next_event(self._conn)
            if parts:
                yield parts[0] if len(parts) == 1 else b"".join(parts)
            if isinstance(event, h11.EndOfMessage):
                return
            data = await self._source.receive(self._read_timeout)
            if not data:
                self._conn.receive_data(b"")  # EOF: h11 says whether the body was complete

    async def aread(self) -> bytes:
        return b"".join([part async for part in self.aiter_raw()])


async def read_response(
    source: ByteSource, conn: h11.Connection, read_timeout: float | None
) -> RawStreamResponse:
    """The response to the request `conn` sent, its head complete within `read_timeout`."""
    head, rest = await http_connection.read_head(source, conn, read_timeout)
    return RawStreamResponse(source, conn, head, rest, read_timeout)


def httpx_opener(client: httpx.AsyncClient) -> StreamOpener:
    """The same GET through httpx: what the daemon uses when a proxy or a test transport applies."""

    def opener(
        url: str, params: dict[str, str], headers: dict[str, str], timeouts: httpx.Timeout
    ) -> contextlib.AbstractAsyncContextManager[StreamResponse]:
        return client.stream("GET", url, params=params, headers=headers, timeout=timeouts)

    return opener


class RawStreamOpener:
    """Opens `GET url?params` on a fresh connection: `async with opener(...) as response`.

    `on_response` sees every response's headers (the daemon checks its clock against `Date`)."""

    def __init__(self, on_response: Callable[[httpx.Headers], None] | None = None) -> None:
        self.on_response = on_response
        self._connector = Connector()

    @contextlib.asynccontextmanager
    async def __call__(
        self, url: str, params: dict[str, str], headers: dict[str, str], timeouts: httpx.Timeout
    ) -> AsyncIterator[StreamResponse]:
        target = httpx.URL(url, params=params)
        if target.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {target.scheme!r}")
        state = http_connection.client_state()
        request = http_connection.request_bytes(state, "GET", target, headers)  # refused here
        connection = await self._connector.connect(target, timeouts.connect, state)
        try:
            await connection.send(request, timeouts.write)
            response = await read_response(connection.wire, connection.h11, timeouts.read)
            if self.on_response is not None:
                self.on_response(response.headers)
            yield response
        finally:
            # The stream is done with, whatever state it is in: no graceful close to wait for.
            connection.abort()
