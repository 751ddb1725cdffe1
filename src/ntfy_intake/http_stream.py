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
import base64
import contextlib
import errno
import os
import re
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Protocol

import httpx
from httpx._utils import URLPattern, get_environment_proxies

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
        *,
        chunked: bool,
        length: int | None,
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
        self._chunked = ChunkedBody() if chunked else None
        self._length = length  # None: chunked, or read until the server closes

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
                    _host(target),
                    port,
                    ssl=self._ssl if secure else None,
                    server_hostname=_host(target) if secure else None,
                    limit=READ_SIZE,
                )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"no connection to {target.host}:{port} in time") from None
        except OSError as exc:  # ssl.SSLError included
            raise httpx.ConnectError(os_detail(exc)) from None
        except UnicodeError as exc:  # a host name IDNA refuses (a label over 63 characters)
            raise httpx.ConnectError(f"bad host name {target.host!r}: {exc}") from None


def request_bytes(
    method: str, target: httpx.URL, headers: dict[str, str], body: bytes | None = None
) -> bytes:
    """The request head (and body): `Connection: close` for a GET stream, keep-alive with a
    `Content-Length` when there is a body. `headers` may override the User-Agent."""
    host = _host(target)
    host = host if ":" not in host else f"[{host}]"
    if target.port is not None:
        host = f"{host}:{target.port}"
    lines = [f"{method} {target.raw_path.decode('ascii')} HTTP/1.1", f"Host: {host}"]
    if "User-Agent" not in headers:
        lines.append(f"User-Agent: {USER_AGENT}")
    lines += ["Accept: */*", "Accept-Encoding: identity"]
    lines.append("Connection: close" if body is None else f"Content-Length: {len(body)}")
    if target.username or target.password:
        # What httpx does with credentials in the URL (ntfy.url may hold them): Basic auth.
        userpass = f"{target.username}:{target.password}".encode()
        headers = {**headers, "Authorization": f"Basic {base64.b64encode(userpass).decode()}"}
    for name, value in headers.items():
        if any(c in name or c in value for c in "\r\n\0"):
            raise httpx.LocalProtocolError(f"header {name!r} holds a line break")
        lines.append(f"{name}: {value}")
    try:
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    except UnicodeEncodeError:
        raise httpx.LocalProtocolError(
            "a request header holds a character beyond latin-1"
        ) from None
    return head if body is None else head + body


def _host(target: httpx.URL) -> str:
    """The host as DNS and the Host header want it (an internationalized name in its IDNA form)."""
    return target.raw_host.decode("ascii")


async def read_head(reader: asyncio.StreamReader, read_timeout: float | None) -> RawStreamResponse:
    """The response head, within `read_timeout` as a whole: a server that trickles header bytes
    must not hold intake where its frame watchdog cannot see. Informational responses (100
    Continue, 103 Early Hints) are skipped, as httpx does; bare-LF line ends are taken, as h11
    does."""
    buf, searched = b"", 0
    answered = False  # an informational response came: the server has taken the request
    try:
        async with asyncio.timeout(read_timeout):
            while True:
                blank = _BLANK_LINE.search(buf, searched)
                if blank is None:
                    if len(buf) > MAX_HEAD_BYTES:
                        raise httpx.RemoteProtocolError("response headers too long")
                    searched = max(0, len(buf) - 2)
                    try:
                        data = await reader.read(READ_SIZE)
                    except OSError as exc:
                        if not buf and not answered:
                            raise NoResponse(os_detail(exc)) from None
                        raise httpx.ReadError(os_detail(exc)) from None
                    if not data:
                        if not buf and not answered:
                            raise NoResponse("server disconnected without sending a response")
                        raise httpx.RemoteProtocolError(
                            "server disconnected in the middle of its response head"
                        )
                    buf += data
                    continue
                if blank.end() > MAX_HEAD_BYTES:
                    raise httpx.RemoteProtocolError("response headers too long")
                http11, status, fields = _parse_head(buf[: blank.end()])
                buf, searched = buf[blank.end() :], 0
                if 100 <= status < 200 and status != 101:
                    answered = True
                    continue  # informational: the real response follows
                chunked, length = _framing(status, fields)
                return RawStreamResponse(
                    reader,
                    status,
                    httpx.Headers(fields),  # bytes: latin-1 values stay readable, never a crash
                    buf,
                    read_timeout,
                    chunked=chunked,
                    length=length,
                    http11=http11,
                )
    except TimeoutError:
        raise httpx.ReadTimeout("no complete response head from the server in time") from None


_BLANK_LINE = re.compile(rb"\n\r?\n")
_STATUS_LINE = re.compile(rb"HTTP/1\.([0-9]) ([0-9]{3})(?: [^\x00-\x08\x0a-\x1f\x7f]*)?")
_FIELD_NAME = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_FIELD_VALUE_BAD = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_LENGTH = re.compile(rb"[0-9]{1,20}")


def _parse_head(head: bytes) -> tuple[bool, int, list[tuple[bytes, bytes]]]:
    """Status code and header fields of one head (ending with its blank line), checked as h11
    checks them: a malformed head is a protocol error, never a guess."""
    lines = [line[:-1] if line.endswith(b"\r") else line for line in head.split(b"\n")][:-2]
    status = _STATUS_LINE.fullmatch(lines[0])
    if status is None:
        raise httpx.RemoteProtocolError(f"malformed status line {lines[0][:80]!r}")
    fields: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t") and fields:  # obsolete line folding: one more line of value
            name, value = fields[-1]
            fields[-1] = (name, value + b" " + line.strip(b" \t"))
            continue
        name, colon, value = line.partition(b":")
        value = value.strip(b" \t")
        if not colon or not _FIELD_NAME.fullmatch(name) or _FIELD_VALUE_BAD.search(value):
            raise httpx.RemoteProtocolError(f"malformed header line {line[:80]!r}")
        fields.append((name, value))
    return status[1] == b"1", int(status[2]), fields


def _framing(status: int, fields: list[tuple[bytes, bytes]]) -> tuple[bool, int | None]:
    """(chunked, length) of the body, judged as h11 judges it: a transfer coding other than
    plain `chunked` or Content-Lengths that disagree are refused, never read as payload."""
    encodings = [v for n, v in fields if n.lower() == b"transfer-encoding"]
    lengths = {
        part.strip() for n, v in fields if n.lower() == b"content-length" for part in v.split(b",")
    }
    if len(encodings) > 1:
        raise httpx.RemoteProtocolError("multiple Transfer-Encoding headers")
    if encodings and encodings[0].lower() != b"chunked":
        raise httpx.RemoteProtocolError(
            f"unsupported Transfer-Encoding {encodings[0][:40]!r}: only chunked is read"
        )
    if len(lengths) > 1:
        raise httpx.RemoteProtocolError("conflicting Content-Length headers")
    length = lengths.pop() if lengths else None
    if length is not None and not _LENGTH.fullmatch(length):
        raise httpx.RemoteProtocolError(f"bad Content-Length {length[:40]!r}")
    if status in (204, 304):
        return False, 0
    if encodings:
        return True, None  # chunked wins over a Content-Length (RFC 9112 6.3)
    return False, None if length is None else int(length)


def os_detail(exc: OSError) -> str:
    """'Connection refused (Connect call failed ...)': the errno's words first, for diagnose.
    asyncio folds the attempts at several addresses into one OSError without an errno."""
    text = str(exc) or type(exc).__name__
    code = exc.errno or next((c for c in _KNOWN_ERRNOS if f"[Errno {c}]" in text), None)
    words = os.strerror(code) if code else ""
    return f"{words} ({text})" if words and words not in text else text


_KNOWN_ERRNOS = (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT)
