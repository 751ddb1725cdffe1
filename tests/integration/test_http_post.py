"""The relay's keep-alive client over real loopback sockets: reuse, stale connections, replies."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ntfy_intake.wire.http_post import KeepAlivePoster

from .test_http_stream import in_loop, self_signed, serve

TIMEOUTS = httpx.Timeout(2.0)
Reply = Callable[[int], bytes]  # request number on its connection -> the bytes to answer


class Receiver:
    """Reads requests (Content-Length bodies) on each connection and answers with `reply`."""

    def __init__(
        self, reply: Reply, *, close_after: int | None = None, drop_next: bool = False
    ) -> None:
        self.reply = reply
        self.close_after = close_after  # requests per connection before closing it unasked
        self.drop_next = drop_next  # close only once the next request has arrived, unanswered
        self.connections = 0
        self.bodies: list[bytes] = []

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        while self.close_after is None or served < self.close_after:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            self.bodies.append(await reader.readexactly(length))
            served += 1
            writer.write(self.reply(served))
            await writer.drain()
        if self.drop_next:
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                await reader.readuntil(b"\r\n\r\n")
        writer.close()


def ok(body: bytes = b'{"ok":true}') -> Reply:
    return lambda _: b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


async def post_all(
    receiver: Receiver, n: int, *, between: Callable[[], Awaitable[None]] | None = None
) -> tuple[KeepAlivePoster, list[tuple[int, httpx.Headers, bytes]]]:
    async with serve(receiver) as port:
        poster = KeepAlivePoster(f"http://127.0.0.1:{port}/triage", timeouts=TIMEOUTS, max_reply=64)
        replies = []
        for i in range(n):
            replies.append(await poster.post(b'{"n":%d}' % i, {"Idempotency-Key": f"k{i}"}))
            if between is not None:
                await between()
        await poster.aclose()
    return poster, replies


@in_loop
async def test_one_connection_carries_every_request_one_after_another() -> None:
    receiver = Receiver(ok())
    poster, replies = await post_all(receiver, 20)
    assert [status for status, _, _ in replies] == [200] * 20
    assert replies[0][2] == b'{"ok":true}'
    assert receiver.connections == poster.connections_opened == 1
    assert receiver.bodies == [b'{"n":%d}' % i for i in range(20)]


@in_loop
async def test_connection_the_server_closed_while_idle_is_replaced_without_losing_a_request() -> (
    None
):
    """Failure mode: a kept-alive connection the receiver closed fails the next delivery."""
    receiver = Receiver(ok(), close_after=1)  # closes each connection after one reply
    poster, replies = await post_all(receiver, 5, between=lambda: asyncio.sleep(0.05))
    assert [status for status, _, _ in replies] == [200] * 5
    assert receiver.bodies == [b'{"n":%d}' % i for i in range(5)]  # each once, none lost
    assert receiver.connections == poster.connections_opened == 5


@in_loop
async def test_request_that_meets_the_servers_close_on_a_reused_connection_is_sent_again() -> None:
    """Failure mode: the keep-alive race (the server closes just as the next request arrives)
    fails a delivery the server never took."""
    receiver = Receiver(ok(), close_after=1, drop_next=True)
    poster, replies = await post_all(receiver, 4)
    assert [status for status, _, _ in replies] == [200] * 4
    assert receiver.bodies == [b'{"n":%d}' % i for i in range(4)]
    assert poster.connections_opened == 4


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
    ],
)
@in_loop
async def test_server_that_asks_to_close_gets_a_new_connection_each_time(reply: bytes) -> None:
    receiver = Receiver(lambda _: reply, close_after=1)
    poster, replies = await post_all(receiver, 3)
    assert [r[2] for r in replies] == [b"ok"] * 3
    assert poster.connections_opened == 3


@in_loop
async def test_chunked_reply_is_read_whole_and_the_connection_reused() -> None:
    chunked = b'HTTP/1.1 202 Accepted\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{"a\r\n5\r\n":1}\n\r\n0\r\n\r\n'
    receiver = Receiver(lambda _: chunked)
    poster, replies = await post_all(receiver, 3)
    assert [(r[0], r[2]) for r in replies] == [(202, b'{"a":1}\n')] * 3
    assert poster.connections_opened == 1


@in_loop
async def test_reply_larger_than_the_limit_is_cut_and_its_connection_dropped() -> None:
    big = b"x" * 1000
    receiver = Receiver(ok(big))
    poster, replies = await post_all(receiver, 2)
    assert all(r[2] == big[:64] for r in replies)
    assert poster.connections_opened == 2


@in_loop
async def test_fresh_connection_closed_without_a_reply_is_an_error_not_a_repeat() -> None:
    """Failure mode: a request the receiver may have taken is sent again on the same attempt."""
    receiver = Receiver(lambda _: b"", close_after=1)  # takes the request, answers nothing
    async with serve(receiver) as port:
        poster = KeepAlivePoster(f"http://127.0.0.1:{port}/t", timeouts=TIMEOUTS, max_reply=64)
        with pytest.raises(httpx.RemoteProtocolError):
            await poster.post(b"{}", {})
        await poster.aclose()
    assert receiver.bodies == [b"{}"]


@in_loop
async def test_attempt_cancelled_mid_reply_never_leaves_its_connection_for_the_next() -> None:
    """Failure mode: a reply arriving late is read as the answer to the next request."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = 0
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            body = await reader.readexactly(length)
            number += 1
            if number == 1:
                await asyncio.sleep(0.3)  # the first answer comes after the caller gave up
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    async with serve(handler) as port:
        poster = KeepAlivePoster(f"http://127.0.0.1:{port}/t", timeouts=TIMEOUTS, max_reply=64)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await poster.post(b"first", {})
        status, _, reply = await poster.post(b"second", {})
        await poster.aclose()
    assert (status, reply) == (200, b"second")
    assert poster.connections_opened == 2


@in_loop
async def test_https_receiver_is_trusted_as_httpx_trusts_it_and_its_connection_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Failure mode: the relay's lean client skips certificate checks, or never reuses a TLS
    connection (a handshake per delivery)."""
    cert, key = self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    receiver = Receiver(ok())
    async with serve(receiver, server_ctx) as port:
        url = f"https://127.0.0.1:{port}/triage"
        untrusting = KeepAlivePoster(url, timeouts=TIMEOUTS, max_reply=64)
        with pytest.raises(httpx.ConnectError):
            await untrusting.post(b"{}", {})
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        poster = KeepAlivePoster(url, timeouts=TIMEOUTS, max_reply=64)
        replies = [await poster.post(b'{"n":%d}' % i, {}) for i in range(3)]
        await poster.aclose()
    assert [status for status, _, _ in replies] == [200] * 3
    assert receiver.bodies == [b'{"n":%d}' % i for i in range(3)]
    assert poster.connections_opened == 1


class EchoingReceiver:
    """Answers each request with its own Idempotency-Key, then, `after` seconds later, writes
    `unsolicited` on the same connection while it sits idle (a proxy's or server's 408)."""

    def __init__(self, unsolicited: bytes, *, after: float, close: bool) -> None:
        self.unsolicited = unsolicited
        self.after = after
        self.close = close  # the unsolicited answer ends the connection
        self.connections = 0
        self.keys: list[str] = []

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line)
            await reader.readexactly(int(fields[b"Content-Length"]))
            key = fields[b"Idempotency-Key"].strip()
            self.keys.append(key.decode())
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(key), key))
            await writer.drain()
            await asyncio.sleep(self.after)
            writer.write(self.unsolicited)
            await writer.drain()
            if self.close:
                writer.close()
                return


REQUEST_TIMEOUT_408 = b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 7\r\n\r\ntimeout"
REQUEST_TIMEOUT_408_CLOSE = (
    b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 7\r\n\r\ntimeout"
)


@pytest.mark.parametrize(
    ("unsolicited", "close"),
    [(REQUEST_TIMEOUT_408, False), (REQUEST_TIMEOUT_408_CLOSE, True)],
    ids=["keep-alive", "connection-close"],
)
@in_loop
async def test_unsolicited_408_while_idle_is_never_read_as_the_next_deliverys_reply(
    unsolicited: bytes, close: bool
) -> None:
    """Failure mode: bytes that arrived on an idle kept-alive connection (a receiver's or a
    proxy's unsolicited 408) are read as the reply to the next delivery, and every reply after
    it belongs to the delivery before: deliveries settled on someone else's reply."""
    receiver = EchoingReceiver(unsolicited, after=0.02, close=close)
    async with serve(receiver) as port:
        poster = KeepAlivePoster(f"http://127.0.0.1:{port}/t", timeouts=TIMEOUTS, max_reply=64)
        replies = []
        for i in range(4):
            replies.append(await poster.post(b"{}", {"Idempotency-Key": f"key-{i}"}))
            await asyncio.sleep(0.1)  # idle: the unsolicited answer arrives now
        await poster.aclose()
    assert [(status, body) for status, _, body in replies] == [
        (200, f"key-{i}".encode()) for i in range(4)
    ]
    assert receiver.keys == [f"key-{i}" for i in range(4)]  # each sent once: no spurious retry
    assert poster.connections_opened == 4


@in_loop
async def test_unsolicited_bytes_right_behind_a_reply_keep_its_connection_from_reuse() -> None:
    """Failure mode: a reply followed at once by more bytes (in the same segment) leaves them
    waiting for the next delivery to read."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            body = await reader.readexactly(length)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                + REQUEST_TIMEOUT_408
            )
            await writer.drain()

    async with serve(handler) as port:
        poster = KeepAlivePoster(f"http://127.0.0.1:{port}/t", timeouts=TIMEOUTS, max_reply=64)
        replies = [await poster.post(b"n%d" % i, {}) for i in range(3)]
        await poster.aclose()
    assert [(status, body) for status, _, body in replies] == [(200, b"n%d" % i) for i in range(3)]
    assert poster.connections_opened == 3


@in_loop
async def test_idle_connection_past_the_keepalive_expiry_is_not_reused() -> None:
    """Failure mode: a connection idle for longer than a receiver or proxy keeps it (often
    5-60 s) is reused and meets a close mid-request; httpcore retires it after 5 s idle."""
    now = [1000.0]
    receiver = Receiver(ok())
    async with serve(receiver) as port:
        poster = KeepAlivePoster(
            f"http://127.0.0.1:{port}/t", timeouts=TIMEOUTS, max_reply=64, clock=lambda: now[0]
        )
        await poster.post(b"{}", {})
        now[0] += 4.9
        await poster.post(b"{}", {})
        assert poster.connections_opened == 1
        now[0] += 5.1
        await poster.post(b"{}", {})
        await poster.aclose()
    assert poster.connections_opened == receiver.connections == 2


REPLY_HEADS = [
    b"HTTP/1.1 200 OK",
    b"HTTP/1.1 503 Busy",
    b"HTTP/1.0 200 OK",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK",
    b"HTTP/2 200",
    b"garbage",
]
REPLY_FIELDS = [
    b"Content-Length: 2",
    b"Content-Length: 99",
    b"Content-Length: 2, 3",
    b"Transfer-Encoding: chunked",
    b"Transfer-Encoding: gzip",
    b"Connection: close",
    b"X-Latin: caf\xe9",
    b"Bad Field: x",
    b"X-Nul: a\x00b",
]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    head=st.sampled_from(REPLY_HEADS) | st.binary(max_size=16),
    fields=st.lists(st.sampled_from(REPLY_FIELDS) | st.binary(max_size=12), max_size=4),
    body=st.sampled_from([b"{}", b"2\r\n{}\r\n0\r\n\r\n", b"5 ;x\r\n", b""])
    | st.binary(max_size=40),
    times=st.integers(1, 3),
)
def test_any_reply_is_an_answer_or_an_httpx_error_never_another_exception(
    head: bytes, fields: list[bytes], body: bytes, times: int
) -> None:
    """Whatever a receiver writes back, however often: a (status, headers, body) or an httpx
    error, which the relay retries; any other exception would stop the relay's lane."""
    wire = b"\r\n".join([head, *fields, b"", body])

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head_in = await reader.readuntil(b"\r\n\r\n")
                length = int(head_in.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                writer.write(wire)
                await writer.drain()

    async def run() -> None:
        async with serve(handler) as port:
            poster = KeepAlivePoster(
                f"http://127.0.0.1:{port}/t", timeouts=httpx.Timeout(0.5), max_reply=64
            )
            for _ in range(times):
                with contextlib.suppress(httpx.HTTPError):
                    status, _, reply = await poster.post(b"{}", {"Idempotency-Key": "k"})
                    assert 100 <= status <= 999
                    assert len(reply) <= 64
            await poster.aclose()

    asyncio.run(run())
