"""A lean HTTP/1.1 GET for ntfy's subscription stream, read in whole socket reads.

h11 writes the request and parses the response head (`http_connection`), and reads every body
that is not chunked. Why not httpx for the body: ntfy writes and flushes one HTTP chunk per
message, and h11 (under httpx) hands the body over one chunk at a time through several async
generator layers, about 20 us of event-loop CPU per frame, a quarter of a replayed event's whole
cost (docs/performance.md). This reader takes what the socket holds (hundreds of frames during a
replay) and de-chunks it in one pass (`ChunkedBody`), held equal to h11 by a differential test.

It does only what the stream needs: one GET over http or https (the same certificate trust as
httpx: `httpx.create_ssl_context`), no proxy (the daemon keeps httpx when one applies to the URL,
see `proxied`), no redirects and no compression, like the httpx client it stands in for. Its
failures are httpx's exception types, so intake's handling and diagnose's wording stay one.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Protocol

import h11
import httpx
from httpx._utils import URLPattern, get_environment_proxies

from ntfy_intake.wire import http_connection
from ntfy_intake.wire.http_connection import MAX_HEAD_BYTES, ByteSource, Connector

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


class ChunkedBody:
    """De-chunks `Transfer-Encoding: chunked` payload from bytes as they arrive; no I/O.

    The fast path of the stream reader, kept for speed: ntfy writes one chunk per message, and
    this takes hundreds of them from one socket read in one pass, where h11 hands them over one
    event at a time (about 4 us more per frame: bench/bench_read.py). It reads chunk-size lines
    as h11 does (`_CHUNK_LINE` is h11's grammar) and stops at the last chunk: the last-chunk
    line, the trailers and what follows are h11's to judge (`rest`).
    `tests/unit/test_stream_reader_matches_h11.py` holds the two equal on any response, split
    at any byte. `feed` returns the payload found so far; a malformed body raises
    httpx.RemoteProtocolError."""

    def __init__(self) -> None:
        self._pending = b""  # an unfinished size line or chunk end
        self._left = 0  # payload bytes the current chunk still owes
        self._crlf_owed = False  # the CRLF that closes a chunk's payload
        self.last_chunk = False  # reached the 0-size line: `rest` starts with it
        self.rest = b""

    def feed(self, data: bytes) -> bytes:
        if self.last_chunk:
            self.rest += data
            return b""
        buf = self._pending + data if self._pending else data
        pos, end = 0, len(buf)
        parts: list[bytes] = []
        while pos < end:
            if self._left:
                take = min(self._left, end - pos)
                parts.append(buf[pos : pos + take])
                pos += take
                self._left -= take
                if self._left:
                    break
                self._crlf_owed = True
            if self._crlf_owed:
                if end - pos < 2:
                    if buf[pos:end] != b"\r\n"[: end - pos]:
                        raise httpx.RemoteProtocolError(
                            "malformed chunked body: no CRLF after a chunk"
                        )
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise httpx.RemoteProtocolError("malformed chunked body: no CRLF after a chunk")
                pos += 2
                self._crlf_owed = False
                continue
            newline = buf.find(b"\r\n", pos, pos + MAX_HEAD_BYTES + 2)
            if newline < 0:
                if end - pos > MAX_HEAD_BYTES:
                    raise httpx.RemoteProtocolError("malformed chunked body: line too long")
                break
            size = _CHUNK_LINE.fullmatch(buf, pos, newline)
            if size is None:
                raise httpx.RemoteProtocolError(
                    f"malformed chunked body: bad chunk header {buf[pos:newline][:40]!r}"
                )
            self._left = int(size[1], 16)
            if not self._left:
                self.last_chunk = True
                self.rest = buf[pos:]
                pos = end
                break
            pos = newline + 2
        self._pending = b"" if self.last_chunk else buf[pos:]
        return parts[0] if len(parts) == 1 else b"".join(parts)


# h11's chunk header (h11/_abnf.py): 1-20 hex digits, an extension that starts right after
# them, optional trailing whitespace (which real servers and proxies write).
_CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;.*)?[ \t]*")


class RawStreamResponse:
    """One response on its own connection, its head parsed by h11; the body is read with
    `aiter_raw` or `aread` (chunked: `ChunkedBody`, then h11 from the last chunk on)."""

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
        # h11 has judged Transfer-Encoding (chunked is the only one it takes) and 204/304.
        self._chunked = conn.their_state is h11.SEND_BODY and "transfer-encoding" in self.headers

    async def aiter_raw(self) -> AsyncGenerator[bytes, None]:
        """The body as it arrives, de-chunked; ends where the body ends."""
        if self._chunked:
            chunked = ChunkedBody()
            data, self._rest = self._rest, b""
            while True:
                payload = chunked.feed(data) if data else b""
                if payload:
                    yield payload
                if chunked.last_chunk:
                    break
                data = await self._source.receive(self._read_timeout)
                if not data:
                    raise httpx.RemoteProtocolError(
                        "peer closed connection without sending complete message body"
                    )
            # h11 never saw the chunks before: it takes over at a chunk boundary, as if they
            # had been empty, and reads the last chunk and the trailers.
            self._rest = chunked.rest
        if self._rest:
            self._conn.receive_data(self._rest)
            self._rest = b""
        while True:
            event = http_connection.next_event(self._conn)
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return
            else:
                self._conn.receive_data(await self._source.receive(self._read_timeout))

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
