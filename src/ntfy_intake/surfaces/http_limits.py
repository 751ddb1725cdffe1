"""Bounds on the daemon's HTTP surface, so nothing a client does there can starve intake.

The threat: any local user can open slow connections. uvicorn alone has no header timeout (its
keep-alive timer is cancelled by every byte received, so a client trickling one byte a second is
never timed out), and `limit_concurrency` answers 503 only after accepting the socket, which has
already cost a file descriptor. 1,100 such connections exhausted the daemon's 1,024 descriptors:
the audit log latched on EMFILE, the relay failed and `/healthz` stopped answering.

The choice, an accept guard plus a protocol wrapper around uvicorn's own h11 protocol:
- **Accept guard** (`accept_loop`): the daemon accepts connections itself, one at a time, and only
  while fewer than `Limits.hard_cap` are open. Past it, new connections wait in the kernel's listen
  backlog and cost this process no descriptor at all. A cap that answers 503 (the soft cap) can
  only bound descriptors if accepting stops somewhere; a guard in front of asyncio's
  `create_server` cannot, because asyncio accepts up to `backlog` sockets per wake-up before any
  protocol sees them. The listening socket is still served by uvicorn's protocol and ASGI code,
  so request parsing, lifespan and graceful shutdown stay uvicorn's.
- **Protocol wrapper** (`GuardedH11Protocol`): between `max_connections` and `hard_cap` a new
  connection gets an immediate 503 JSON answer and is closed (a client learns why). Every
  connection must deliver its request headers within `header_timeout` of connecting (or of its
  previous response), its whole body within `read_timeout`, and take its whole answer within
  `response_timeout`, all counted from wall time, not from the last byte: a trickle cannot
  stretch any of them. A connection past a deadline is aborted, which frees its descriptor at
  once even when the client reads nothing.
- **Descriptor reserve** (`fit_to_descriptors`): the caps shrink to leave `FD_RESERVE` descriptors
  for intake, the database, the audit log and the relay, whatever the soft RLIMIT_NOFILE is.
  (The systemd unit raises LimitNOFILE; its `SystemCallFilter=~@resources` forbids setrlimit here.)
- **Lingering close** (`_LingeringTransport`, the transport uvicorn is handed): every close the
  server decides on goes through it (uvicorn's close after an answer with `Connection: close`, its
  400 for a malformed request, the keep-alive timeout and shutdown; the 503 above; and an answer
  given before the request body is all in). If the client may still be sending (its request is
  partly in: h11's `their_state` SEND_BODY or ERROR, or unparsed bytes; or it was turned away with
  the 503 before its request was read), the close is a half-close: the answer is flushed and
  followed by a FIN, and whatever still arrives is read and dropped, never parsed or buffered,
  until the client closes or `LINGER_S` has passed; then the socket is aborted. Why: a socket
  closed with unread data is reset by the kernel, and the reset throws the answer out of the
  client's receive buffer. urllib, curl and most clients read only after sending the whole body,
  so an oversize `POST` answered 413 while its body was still arriving got a connection reset, not
  the 413. A client that owes nothing (a whole request or none) is closed at once, as before:
  nothing is unread, so the close sends a FIN, not a reset, and waiting would only hold every
  idle keep-alive connection, and so shutdown, for `LINGER_S`. An answer given while the body is still arriving always closes:
  uvicorn would otherwise keep the connection and parse the rest of a body nobody reads (until
  the header deadline aborted it). That answer carries no `Connection: close` (uvicorn has sent
  its headers by then); the FIN after it tells the client. `LINGER_S` is wall time, not renewed by
  bytes, so a client that keeps sending cannot hold the slot longer; there is no byte bound, since
  dropped bytes cost no memory and the time bound caps the reading. A lingering connection keeps
  its slot, and counts toward both caps, until it is closed. Deadline aborts stay aborts.
Open long polls have their own cap in `http_api` (503 past it).

Another server (hypercorn, a hand-written h11 loop) was considered: hypercorn has the same
keep-alive-per-byte behaviour and no accept guard, and a hand-written server would re-implement
what uvicorn already does correctly once a request is complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import resource
import socket
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import h11
import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol

log = structlog.get_logger("ntfy_intake.http")

FD_RESERVE = 96  # descriptors kept for intake, SQLite (db, -wal, -shm), the audit log, httpx pools
# After the server closes: how long the client may go on sending (discarded) before the socket is
# dropped. Long enough for a client on loopback or a LAN to finish a body of many megabytes and
# read the answer; short enough that a lingering connection is not a slot an attacker can hold.
LINGER_S = 2.0
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"retry-after: 1\r\nconnection: close\r\ncontent-length: 55\r\n\r\n"
    b'{"error":"busy","message":"too many connections; retry"}'
)
# The client's h11 states in which it has sent a whole request or none: it owes no more bytes.
_OWES_NOTHING = frozenset({h11.IDLE, h11.DONE, h11.MUST_CLOSE, h11.CLOSED})
_ACCEPT_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


@dataclass(frozen=True, slots=True)
class Limits:
    max_connections: int = 128  # open connections served normally
    busy_headroom: int = 16  # more connections accepted only to answer 503 and close
    max_long_polls: int = 64  # open `/wait` requests (enforced by http_api)
    header_timeout: float = 10.0  # connect (or previous response) -> request headers complete
    read_timeout: float = 30.0  # connect (or previous response) -> request body complete
    # request start -> response fully written: the longest long poll (300 s) plus a margin, so a
    # client that never reads its answer cannot hold a connection slot for ever either
    response_timeout: float = 330.0
    backlog: int = 128

    @property
    def hard_cap(self) -> int:
        return self.max_connections + self.busy_headroom


def open_descriptors() -> int:
    with contextlib.suppress(OSError):
        return len(os.listdir("/proc/self/fd"))
    return 64  # no /proc: a generous guess


def fit_to_descriptors(limits: Limits, soft_limit: int, in_use: int) -> Limits:
    """`limits` shrunk so that in_use + hard_cap + FD_RESERVE stays within `soft_limit`."""
    room = soft_limit - in_use - FD_RESERVE
    if limits.hard_cap <= room:
        return limits
    headroom = max(1, min(limits.busy_headroom, room // 8))
    connections = max(1, room - headroom)
    return replace(
        limits,
        max_connections=connections,
        busy_headroom=headroom,
        max_long_polls=max(1, min(limits.max_long_polls, connections // 2)),
    )


def current_limits(limits: Limits) -> Limits:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return limits
    return fit_to_descriptors(limits, soft, open_descriptors())


class _LingeringTransport(asyncio.Transport):
    """The transport uvicorn is given: `close()` hands the closing to the protocol's `_linger`.

    Everything else passes through to the real transport. Once closed, writes and pauses are
    dropped (the answer is out; reading must go on while lingering) and `is_closing()` is true,
    so uvicorn treats the connection as closed.
    """

    def __init__(self, transport: asyncio.Transport, linger: Callable[[], None]) -> None:
        super().__init__()
        self.real = transport
        self.lingering = False
        self._linger = linger

    def close(self) -> None:
        if self.lingering:
            return
        if self.real.is_closing():  # closed by asyncio (the peer closed): nothing to wait for
            self.real.close()
            return
        self.lingering = True
        self._linger()

    def abort(self) -> None:
        self.real.abort()

    def is_closing(self) -> bool:
        return self.lingering or self.real.is_closing()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self.lingering:
            self.real.write(data)

    def writelines(self, list_of_data: Any) -> None:
        if not self.lingering:
            self.real.writelines(list_of_data)

    def write_eof(self) -> None:
        self.real.write_eof()

    def can_write_eof(self) -> bool:
        return self.real.can_write_eof()

    def pause_reading(self) -> None:
        if not self.lingering:
            self.real.pause_reading()

    def resume_reading(self) -> None:
        self.real.resume_reading()

    def is_reading(self) -> bool:
        return self.real.is_reading()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.real.get_extra_info(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.real.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self.real.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.real.get_write_buffer_limits()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.real.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.real.get_protocol()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a soft cap (503), wall-clock deadlines and a lingering close."""

    limits: Limits = Limits()
    on_closed: Callable[[], None] = staticmethod(lambda: None)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rejected = False
        self._deadline: asyncio.TimerHandle | None = None
        self._started = 0.0
        self._closer: _LingeringTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        wrapped = self._closer = _LingeringTransport(transport, self._linger)
        if len(self.connections) >= self.limits.max_connections:
            self._rejected = True
            self.transport = wrapped
            wrapped.write(_BUSY)
            wrapped.close()
            return
        super().connection_made(wrapped)
        self._arm()

    def _linger(self) -> None:
        """Flush the answer and send a FIN, then discard what arrives until EOF or LINGER_S."""
        assert self._closer is not None
        real = self._closer.real
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        owes_nothing = self.conn.their_state in _OWES_NOTHING and not self.conn.trailing_data[0]
        if owes_nothing and not self._rejected:
            # The request is all in, or none was begun (keep-alive timeout, shutdown): nothing
            # unread, nothing on its way, so this close cannot reset; waiting would only delay it.
            real.close()
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # The connection is done with: a request still running sees its client as gone.
            cycle.disconnected = True
            cycle.message_event.set()
        self._deadline = self.loop.call_later(LINGER_S, real.abort)
        try:
            if real.can_write_eof():
                real.write_eof()  # after the buffered answer: asyncio shuts down once it is written
        except OSError:  # the peer already reset the connection: nothing left to linger for
            real.abort()
            return
        real.resume_reading()

    def _closing_down(self) -> bool:
        return self._closer is not None and self._closer.lingering

    def _arm(self) -> None:
        """Start the clock for the next request: headers by header_timeout, body by read_timeout."""
        self._started = self.loop.time()
        self._schedule(self.limits.header_timeout)

    def _schedule(self, delay: float) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(delay, self._check_deadline)

    def _check_deadline(self) -> None:
        self._deadline = None
        cycle = self.cycle
        waiting_for_headers = cycle is None or cycle.response_complete
        elapsed = self.loop.time() - self._started
        if not waiting_for_headers:
            # Headers arrived: the body must follow by read_timeout, the answer be taken by
            # response_timeout (a long poll waits in between; a client may never read).
            limit = self.limits.read_timeout if cycle.more_body else self.limits.response_timeout
            if elapsed < limit:
                self._schedule(limit - elapsed)
                return
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()  # not close(): a client that reads nothing must not hold the fd

    def on_response_complete(self) -> None:
        if self.conn.their_state is h11.SEND_BODY:
            # Answered before the body was all in (a 413, a 401 to a large POST): close, and
            # discard the rest while lingering, rather than have h11 parse it for nobody.
            self.transport.close()
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def data_received(self, data: bytes) -> None:
        if self._closing_down():
            return  # dropped unread: this connection is being closed
        if not self._rejected:
            super().data_received(data)

    def eof_received(self) -> None:
        # Returning None, asyncio closes the transport: a lingering close ends here.
        if not self._rejected and not self._closing_down():
            super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if not self._rejected:
            super().connection_lost(exc)
        type(self).on_closed()


def protocol_class(limits: Limits, on_closed: Callable[[], None]) -> type[GuardedH11Protocol]:
    """A subclass bound to these limits and this server's slot release."""
    return type(
        "BoundGuardedH11Protocol",
        (GuardedH11Protocol,),
        {"limits": limits, "on_closed": staticmethod(on_closed)},
    )


async def accept_loop(
    sock: socket.socket,
    slots: asyncio.Semaphore,
    make_protocol: Callable[[], asyncio.Protocol],
) -> None:
    """Accept while a slot is free; each connection's protocol releases its slot when lost."""
    loop = asyncio.get_running_loop()
    sock.setblocking(False)
    while True:
        await slots.acquire()
        try:
            conn, _ = await loop.sock_accept(sock)
        except OSError as exc:
            slots.release()
            if exc.errno not in _ACCEPT_ERRORS:
                raise
            # Out of descriptors system-wide or by a burst elsewhere: back off, stay quiet.
            log.warning("http.accept_failed", error=os.strerror(exc.errno or 0))
            await asyncio.sleep(0.5)
            continue
        try:
            await loop.connect_accepted_socket(make_protocol, conn)
        except OSError:
            conn.close()
            slots.release()
