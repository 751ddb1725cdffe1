"""A lean HTTP/1.1 GET for ntfy's subscription stream, read in whole socket reads.

Why not httpx here: ntfy writes and flushes one HTTP chunk per message, and h11 (under httpx)
hands the body over one chunk at a time through several async generator layers, about 20 us of
event-loop CPU per frame, a quarter of a replayed event's whole cost (docs/performance.md). This
reader takes what the socket holds (up to 64 KiB, hundreds of frames during a replay) and
de-chunks it in one pass (`ChunkedBody`, pure and tested on its own).

It does only what the stream needs: one GET over http or https (the same certificate trust as
httpx: `httpx.create_ssl_context`), no proxy (the daemon keeps httpx when one applies to the URL,
see `proxied`), no redirects and no compression, like the httpx client it stands in for. Its
failures are httpx's exception types, so intake's handling and diagnose's wording stay one.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import ssl
import urllib.request
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Protocol

import httpx

from ntfy_intake import __version__

READ_SIZE = 65536
MAX_HEAD_BYTES = 64 * 1024  # status line and headers
MAX_CHUNK_LINE = 4096  # a chunk-size line with its extensions, or one trailer line
USER_AGENT = f"ntfy-intake/{__version__}"


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


def proxied(url: str) -> bool:
    """True when the environment names a proxy for `url` (what httpx's `trust_env` honours)."""
    proxies = urllib.request.getproxies_environment()
    parsed = httpx.URL(url)
    if parsed.scheme not in proxies and "all" not in proxies:
        return False
    bypass: bool = urllib.request.proxy_bypass_environment(parsed.host, proxies)  # type: ignore[attr-defined]
    return not bypass


class NoResponse(httpx.RemoteProtocolError):
    """The server closed or reset the connection before sending a byte of its response."""


class ChunkedBody:
    """Decodes `Transfer-Encoding: chunked` from bytes as they arrive; no I/O.

    `feed` returns the payload found so far (many chunks at once); `done` turns true after the
    last chunk and its trailers. A malformed body raises httpx.RemoteProtocolError."""

    def __init__(self) -> None:
        self._pending = b""  # an unfinished size line, chunk end or trailer line
        self._left = 0  # payload bytes the current chunk still owes
        self._crlf_owed = False  # the CRLF that closes a chunk's payload
        self._in_trailers = False
        self.done = False
        self.excess = b""  # bytes after the body's end: a connection holding them is not reused

    def feed(self, data: bytes) -> bytes:
        buf = self._pending + data if self._pending else data
        pos, end = 0, len(buf)
        parts: list[bytes] = []
        while pos < end and not self.done:
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
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise httpx.RemoteProtocolError("malformed chunked body: no CRLF after a chunk")
                pos += 2
                self._crlf_owed = False
                continue
            newline = buf.find(b"\r\n", pos, pos + MAX_CHUNK_LINE + 2)
            if newline < 0:
                if end - pos > MAX_CHUNK_LINE:
                    raise httpx.RemoteProtocolError("malformed chunked body: line too long")
                break
            line = buf[pos:newline]
            pos = newline + 2
            if self._in_trailers:
                self.done = not line  # trailers end with an empty line; their content is unused
            else:
                self._left = _chunk_size(line)
                self._in_trailers = self._left == 0
        if self.done:
            self._pending, self.excess = b"", self.excess + buf[pos:]
        else:
            self._pending = buf[pos:]
        return parts[0] if len(parts) == 1 else b"".join(parts)


def _chunk_size(line: bytes) -> int:
    size = line.split(b";", 1)[0].strip() if b";" in line else line
    # int(x, 16) also takes "0x", "_", signs and spaces: HTTP allows hex digits only.
    if not size or len(size) > 16 or size.translate(None, _HEX_DIGITS):
        raise httpx.RemoteProtocolError(f"malformed chunked body: bad size {line[:40]!r}")
    return int(size, 16)


_HEX_DIGITS = b"0123456789abcdefABCDEF"


class RawStreamResponse:
    """One response on its own connection; the body is read with `aiter_raw` or `aread`."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        status_code: int,
        headers: httpx.Headers,
        leftover: bytes,
        read_timeout: float | None,
        http11: bool = True,
    ) -> None:
        self.status_code = status_code
        self.headers = headers
        # Kept alive only when HTTP/1.1 said nothing against it and the body ends by its framing.
        self._keep_alive = http11 and "close" not in headers.get("connection", "").lower()
        self.reusable = False  # set once the whole body was read on a connection kept alive
        self._reader = reader
        self._leftover = leftover
        self._read_timeout = read_timeout
        encoding = headers.get("transfer-encoding", "").lower()
        self._chunked = ChunkedBody() if "chunked" in encoding else None
        length = headers.get("content-length")
        no_body = status_code in (204, 304) or 100 <= status_code < 200
        if no_body:
            self._length: int | None = 0
        elif self._chunked is None and length is not None:
            if not length.strip().isdigit():
                raise httpx.RemoteProtocolError(f"bad Content-Length {length[:40]!r}")
            self._length = int(length)
        else:
            self._length = None  # chunked, or read until the server closes

    async def aiter_raw(self) -> AsyncGenerator[bytes, None]:
        """The body as it arrives, de-chunked; ends where the body ends."""
        chunked, length = self._chunked, self._length
        data, self._leftover = self._leftover, b""
        while True:
            if data:
                if chunked is not None:
                    payload = chunked.feed(data)
                    if payload:
                        yield payload
                    if chunked.done:
                        self.reusable = self._keep_alive and not chunked.excess
                        return
                elif length is not None:
                    payload = data[:length]
                    length -= len(payload)
                    if len(data) > len(payload):
                        self._keep_alive = False  # more than the body: the rest means nothing
                    if payload:
                        yield payload
                else:
                    yield data
            if length == 0 and chunked is None:
                self.reusable = self._keep_alive
                return
            data = await self._read()
            if not data:
                if chunked is not None or length:
                    raise httpx.RemoteProtocolError(
                        "peer closed connection without sending complete message body"
                    )
                return

    async def aread(self) -> bytes:
        return b"".join([part async for part in self.aiter_raw()])

    async def _read(self) -> bytes:
        try:
            async with asyncio.timeout(self._read_timeout):
                return await self._reader.read(READ_SIZE)
        except TimeoutError:
            raise httpx.ReadTimeout("no data from the server in time") from None
        except OSError as exc:
            raise httpx.ReadError(os_detail(exc)) from None


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
        request = request_bytes("GET", target, headers)
        reader, writer = await self._connector.connect(target, timeouts.connect)
        try:
            try:
                writer.write(request)
                async with asyncio.timeout(timeouts.write):
                    await writer.drain()
            except TimeoutError:
                raise httpx.WriteTimeout("the server did not take the request in time") from None
            except OSError as exc:
                raise httpx.WriteError(os_detail(exc)) from None
            response = await read_head(reader, timeouts.read)
            if self.on_response is not None:
                self.on_response(response.headers)
            yield response
        finally:
            # The stream is done with, whatever state it is in: no graceful close to wait for.
            writer.transport.abort()


class Connector:
    """Opens TCP or TLS connections with httpx's errors; the TLS context is built on first use
    (httpx's: certifi, or SSL_CERT_FILE / SSL_CERT_DIR)."""

    def __init__(self) -> None:
        self._ssl: ssl.SSLContext | None = None

    async def connect(
        self, target: httpx.URL, connect_timeout: float | None
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        secure = target.scheme == "https"
        if secure and self._ssl is None:
            self._ssl = httpx.create_ssl_context()
        port = target.port or (443 if secure else 80)
        try:
            async with asyncio.timeout(connect_timeout):
                return await asyncio.open_connection(
                    target.host,
                    port,
                    ssl=self._ssl if secure else None,
                    server_hostname=target.host if secure else None,
                    limit=READ_SIZE,
                )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"no connection to {target.host}:{port} in time") from None
        except OSError as exc:  # ssl.SSLError included
            raise httpx.ConnectError(os_detail(exc)) from None


def request_bytes(
    method: str, target: httpx.URL, headers: dict[str, str], body: bytes | None = None
) -> bytes:
    """The request head (and body): `Connection: close` for a GET stream, keep-alive with a
    `Content-Length` when there is a body. `headers` may override the User-Agent."""
    host = target.host if ":" not in target.host else f"[{target.host}]"
    if target.port is not None:
        host = f"{host}:{target.port}"
    lines = [f"{method} {target.raw_path.decode('ascii')} HTTP/1.1", f"Host: {host}"]
    if "User-Agent" not in headers:
        lines.append(f"User-Agent: {USER_AGENT}")
    lines += ["Accept: */*", "Accept-Encoding: identity"]
    lines.append("Connection: close" if body is None else f"Content-Length: {len(body)}")
    for name, value in headers.items():
        if any(c in name or c in value for c in "\r\n\0"):
            raise httpx.LocalProtocolError(f"header {name!r} holds a line break")
        lines.append(f"{name}: {value}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if body is None else head + body


async def read_head(reader: asyncio.StreamReader, read_timeout: float | None) -> RawStreamResponse:
    buf = b""
    while (end := buf.find(b"\r\n\r\n")) < 0:
        if len(buf) > MAX_HEAD_BYTES:
            raise httpx.RemoteProtocolError("response headers too long")
        try:
            async with asyncio.timeout(read_timeout):
                data = await reader.read(READ_SIZE)
        except TimeoutError:
            raise httpx.ReadTimeout("no response from the server in time") from None
        except OSError as exc:
            if not buf:
                raise NoResponse(os_detail(exc)) from None
            raise httpx.ReadError(os_detail(exc)) from None
        if not data:
            if not buf:
                raise NoResponse("server disconnected without sending a response")
            raise httpx.RemoteProtocolError("server disconnected in the middle of its headers")
        buf += data
    if end > MAX_HEAD_BYTES:
        raise httpx.RemoteProtocolError("response headers too long")
    head, leftover = buf[:end].decode("latin-1"), buf[end + 4 :]
    status_line, *header_lines = head.split("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise httpx.RemoteProtocolError(f"malformed status line {status_line[:80]!r}")
    fields: list[tuple[str, str]] = []
    for line in header_lines:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise httpx.RemoteProtocolError(f"malformed header line {line[:80]!r}")
        fields.append((name, value.strip()))
    return RawStreamResponse(
        reader,
        int(parts[1]),
        httpx.Headers(fields),
        leftover,
        read_timeout,
        http11=parts[0] == "HTTP/1.1",
    )


def os_detail(exc: OSError) -> str:
    """'Connection refused (Connect call failed ...)': the errno's words first, for diagnose.
    asyncio folds the attempts at several addresses into one OSError without an errno."""
    text = str(exc) or type(exc).__name__
    code = exc.errno or next((c for c in _KNOWN_ERRNOS if f"[Errno {c}]" in text), None)
    words = os.strerror(code) if code else ""
    return f"{words} ({text})" if words and words not in text else text


_KNOWN_ERRNOS = (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT)
