"""One HTTP/1.1 client connection: h11 frames the exchange, a small asyncio Protocol holds the bytes.

h11 (sans-IO HTTP/1.1, by the httpx authors, under httpcore) writes every request and reads
every response head, so a reply is matched to its own request by h11's state machine and a
malformed one is refused as h11 refuses it. What h11 leaves to its caller is the I/O and when a connection may carry another request; those rules
are httpcore's:
- a connection that received a byte, or EOF, while it sat idle is closed, never reused: an
  unsolicited answer (a receiver's or a proxy's 408) is not the reply to the next request;
- an idle connection expires after `KEEPALIVE_EXPIRY`, httpcore's default under httpx;
- a reply followed by more bytes than it declared ends its connection.

Why not httpcore's own pool: it costs 300-400 us of CPU per request on a small machine, this
connection about 120 with h11 on both sides (docs/performance.md, "Fast paths: kept or
returned to the library"). The
connection here is `_Wire`, an asyncio Protocol, rather than a StreamReader, because a
StreamReader does not say whether bytes arrived while idle: the protocol sees every byte.
Failures are httpx's exception types, so intake's handling and diagnose's wording stay one.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import ssl
from collections.abc import Callable, Iterable
from typing import Protocol

import h11
import httpx

from ntfy_intake.wire.http_heads import default_fields, host_name

KEEPALIVE_EXPIRY = 5.0  # seconds an idle connection may wait for its next request (httpcore's)
MAX_HEAD_BYTES = 64 * 1024  # a response head, a chunk-size line or trailers not yet complete
READ_SIZE = 65536
_HIGH_WATER = 4 * READ_SIZE  # received, not yet taken: past it the socket is not read


class NoResponse(httpx.RemoteProtocolError):
    """The server closed or reset the connection before sending a byte of its response."""


class _Wire(asyncio.Protocol):
    """What the socket delivered, and whether it has closed; read with `receive`."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.eof = False
        self.lost: Exception | None = None
        self._readable: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None
        self._reading_paused = False

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > _HIGH_WATER and not self._reading_paused and self.transport:
            self._reading_paused = True
            self.transport.pause_reading()
        self._wake_reader()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake_reader()
        return False  # close the transport: nothing is ever sent after the peer's FIN

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.lost = exc
        self._wake_reader()
        self.resume_writing()

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    # -- what a connection uses ---------------------------------------------------------------

    async def receive(self, read_timeout: float | None) -> bytes:
        """The bytes received so far, waiting up to `read_timeout` for some; b"" once closed."""
        if not self.buffer and not self.eof:
            self._readable = asyncio.get_running_loop().create_future()
            try:
                if read_timeout is None:  # the caller's deadline covers it (read_head)
                    await self._readable
                else:
                    async with asyncio.timeout(read_timeout):
                        await self._readable
            except TimeoutError:
                raise httpx.ReadTimeout("no data from the server in time") from None
            finally:
                self._readable = None
        if not self.buffer and self.lost is not None and isinstance(self.lost, OSError):
            raise httpx.ReadError(os_detail(self.lost))
        data = bytes(self.buffer)
        self.buffer.clear()
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        return data

    async def send(self, data: bytes, write_timeout: float | None) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            raise httpx.WriteError("the connection is closed")
        transport.write(data)
        if self._writable is not None:
            try:
                async with asyncio.timeout(write_timeout):
                    await self._writable
            except TimeoutError:
                raise httpx.WriteTimeout("the server did not take the request in time") from None
        if self.lost is not None:
            raise httpx.WriteError(os_detail(self.lost) if isinstance(self.lost, OSError) else "")

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _wake_reader(self) -> None:
        if self._readable is not None and not self._readable.done():
            self._readable.set_result(None)


class ByteSource(Protocol):
    """Where a response's bytes come from: `receive` waits up to `read_timeout`, b"" once
    closed."""

    async def receive(self, read_timeout: float | None) -> bytes: ...


async def read_head(
    source: ByteSource, conn: h11.Connection, read_timeout: float | None
) -> tuple[h11.Response, bytes]:
    """The head of the response to the request `conn` sent, and the bytes received after it
    (the body's start). Informational responses (100 Continue, 103 Early Hints) are skipped, as
    httpx does.

    Complete within `read_timeout` as a whole: a server that trickles header bytes must not
    hold the caller where its own watchdog cannot see. h11 is handed exactly one head at a time
    (up to its blank line, found as h11 finds it), so the bytes after it stay the caller's."""
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
                        data = await source.receive(None)
                    except httpx.ReadError as exc:
                        if not buf and not answered:
                            raise NoResponse(str(exc)) from None
                        raise
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
                head = h11_head(conn, buf[: blank.end()])
                buf, searched = buf[blank.end() :], 0
                if head is None:
                    answered = True
                    continue
                return head, buf
    except TimeoutError:
        raise httpx.ReadTimeout("no complete response head from the server in time") from None


def h11_head(conn: h11.Connection, head: bytes) -> h11.Response | None:
    """One whole head read by h11: the final response, or None for an informational one."""
    conn.receive_data(head)
    event = next_event(conn)
    if isinstance(event, h11.InformationalResponse):
        return None
    if not isinstance(event, h11.Response):  # pragma: no cover - a whole head
        raise httpx.RemoteProtocolError(f"unexpected {event!r} for a response head")
    return event


_BLANK_LINE = re.compile(rb"\n\r?\n")  # h11's end of a head (h11/_receivebuffer.py)


def next_event(conn: h11.Connection) -> h11.Event | type[h11.PAUSED] | type[h11.NEED_DATA]:
    """h11's next event, its protocol errors as httpx's."""
    try:
        return conn.next_event()
    except h11.RemoteProtocolError as exc:
        raise httpx.RemoteProtocolError(str(exc)) from None


class Connection:
    """One HTTP/1.1 connection, one request at a time: `send`, `read_head`, then the
    body (`read_body`, or the caller's own reader from the head's `rest`)."""

    def __init__(
        self, wire: _Wire, clock: Callable[[], float], state: h11.Connection | None = None
    ) -> None:
        self.wire = wire
        self.h11 = state or client_state()
        self._clock = clock
        self._idle_since: float | None = None

    def reusable(self) -> bool:
        """Idle, within its expiry, and nothing (not a byte, not EOF) arrived while it waited."""
        return (
            self._idle_since is not None
            and self._clock() - self._idle_since <= KEEPALIVE_EXPIRY
            and not self.wire.buffer
            and not self.wire.eof
            and self.h11.our_state is h11.IDLE
        )

    async def send(self, request: bytes, write_timeout: float | None) -> None:
        """A request written by `request_bytes` on this connection's `h11` state."""
        self._idle_since = None
        await self.wire.send(request, write_timeout)

    async def read_head(self, read_timeout: float | None) -> h11.Response:
        head, rest = await read_head(self.wire, self.h11, read_timeout)
        if rest:
            self.h11.receive_data(rest)
        return head

    async def read_body(self, read_timeout: float | None) -> bytes | None:
        """The next part of the body; None at its end. After the end the connection is idle
        (reusable) when both sides may go on and nothing more came."""
        while True:
            event = self._next_event()
            if isinstance(event, h11.Data):
                return bytes(event.data)
            if isinstance(event, h11.EndOfMessage):
                self._finish()
                return None
            self.h11.receive_data(await self.wire.receive(read_timeout))

    def abort(self) -> None:
        self.wire.abort()

    def _finish(self) -> None:
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            # Bytes behind the reply (PAUSED) or EOF (ConnectionClosed, after a body read to its
            # close): never reuse this.
            if self._next_event() is not h11.NEED_DATA:
                return
            self.h11.start_next_cycle()
            self._idle_since = self._clock()

    def _next_event(self) -> h11.Event | type[h11.PAUSED] | type[h11.NEED_DATA]:
        return next_event(self.h11)


def client_state() -> h11.Connection:
    """A fresh h11 client state: a request written on it is validated before any connection."""
    return h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)


def request_bytes(
    conn: h11.Connection,
    method: str,
    target: httpx.URL,
    headers: dict[str, str],
    body: bytes | None = None,
) -> bytes:
    """The request, written by h11 on `conn`: the default fields (`http_heads.default_fields`),
    then `headers`."""
    fields = [*default_fields(target, headers, body), *headers.items()]
    try:
        encoded = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in fields]
        request = h11.Request(method=method, target=target.raw_path, headers=encoded)
        parts = [conn.send(request)]
        if body:
            parts.append(conn.send(h11.Data(data=body)))
        parts.append(conn.send(h11.EndOfMessage()))
    except UnicodeEncodeError:
        raise httpx.LocalProtocolError(
            "a request header holds a character beyond latin-1"
        ) from None
    except h11.LocalProtocolError as exc:
        raise httpx.LocalProtocolError(f"a request header is malformed: {exc}") from None
    return b"".join(part for part in parts if part)


class Connector:
    """Opens TCP or TLS connections with httpx's errors; the TLS context is built on first use
    (httpx's: certifi, or SSL_CERT_FILE / SSL_CERT_DIR)."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._ssl: ssl.SSLContext | None = None
        self._clock = clock

    async def connect(
        self,
        target: httpx.URL,
        connect_timeout: float | None,
        state: h11.Connection | None = None,
    ) -> Connection:
        secure = target.scheme == "https"
        if secure and self._ssl is None:
            self._ssl = httpx.create_ssl_context()
        port = target.port or (443 if secure else 80)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_timeout):
                _, wire = await loop.create_connection(
                    _Wire,
                    host_name(target),
                    port,
                    ssl=self._ssl if secure else None,
                    server_hostname=host_name(target) if secure else None,
                )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"no connection to {target.host}:{port} in time") from None
        except OSError as exc:  # ssl.SSLError included
            raise httpx.ConnectError(os_detail(exc)) from None
        except UnicodeError as exc:  # a host name IDNA refuses (a label over 63 characters)
            raise httpx.ConnectError(f"bad host name {target.host!r}: {exc}") from None
        return Connection(wire, self._clock or loop.time, state)


def os_detail(exc: OSError) -> str:
    """'Connection refused (Connect call failed ...)': the errno's words first, for diagnose.
    asyncio folds the attempts at several addresses into one OSError without an errno."""
    text = str(exc) or type(exc).__name__
    code = exc.errno or next((c for c in _KNOWN_ERRNOS if f"[Errno {c}]" in text), None)
    words = os.strerror(code) if code else ""
    return f"{words} ({text})" if words and words not in text else text


_KNOWN_ERRNOS: Iterable[int] = (
    errno.ECONNREFUSED,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.ETIMEDOUT,
)
