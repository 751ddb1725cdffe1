"""The lean stream reader against hostile or broken servers, over real loopback sockets.

Every reply a server can make must end one of two ways: read as httpx (h11) would read it, or an
httpx.TransportError, which intake's `run` loop handles by backing off and reconnecting. Any other
exception kills the intake task (the daemon stops), and a reply read more laxly than httpx reads
it can hand intake bytes that are not the events the server sent.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import socketserver
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ntfy_intake.flow import intake
from ntfy_intake.store.cursor import Cursor, Owed, Resume
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator
from ntfy_intake.wire import http_connection
from ntfy_intake.wire.http_stream import RawStreamOpener, read_response

from ..harness import DaemonThread, event_ids, settings_for, wait_until
from .test_cli import cli
from .test_http_stream import TIMEOUTS, chunk, in_loop, read_request, serve

FRAME = b'{"id":"a1","time":1700000000,"event":"message","topic":"alerts","message":"m"}\n'
CHUNKED_OK = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(FRAME) + b"0\r\n\r\n"


async def read_with(client: str, url: str) -> tuple[int, bytes]:
    if client == "raw":
        async with RawStreamOpener()(url, {"since": "all"}, {}, TIMEOUTS) as response:
            return response.status_code, b"".join([c async for c in response.aiter_raw()])
    async with (
        httpx.AsyncClient() as http,
        http.stream("GET", url, params={"since": "all"}, timeout=TIMEOUTS) as response,
    ):
        return response.status_code, b"".join([c async for c in response.aiter_raw()])


async def outcome(client: str, reply: bytes, *, byte_by_byte: bool = False) -> object:
    """What reading `reply` gives: (status, body), or the exception's type."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for piece in (reply[i : i + 1] for i in range(len(reply))) if byte_by_byte else [reply]:
            writer.write(piece)
            await writer.drain()
            if byte_by_byte:
                await asyncio.sleep(0.0005)
        with contextlib.suppress(OSError):
            await reader.read()  # until the client hangs up

    async with serve(handler) as port:
        try:
            return await read_with(client, f"http://127.0.0.1:{port}/alerts/json")
        except Exception as exc:
            return type(exc)


READ_AS_HTTPX_READS = {
    "latin-1 byte in a header value": b"HTTP/1.1 200 OK\r\nServer: caf\xe9\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n" + chunk(FRAME) + b"0\r\n\r\n",
    "garbage Date header": b"HTTP/1.1 200 OK\r\nDate: \xff\xfe\r\nContent-Length: 0\r\n\r\n",
    "100 Continue first": b"HTTP/1.1 100 Continue\r\n\r\n" + CHUNKED_OK,
    "103 Early Hints first": b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
    b"HTTP/1.1 102 Processing\r\n\r\n" + CHUNKED_OK,
    "bare LF line ends in the head": b"HTTP/1.1 200 OK\nTransfer-Encoding: chunked\n\n"
    + chunk(FRAME)
    + b"0\r\n\r\n",
    "bare LF head with a length": b"HTTP/1.1 200 OK\nContent-Length: %d\n\n" % len(FRAME) + FRAME,
    "folded header line": b"HTTP/1.1 200 OK\r\nX-Note: one\r\n  two\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n" + chunk(FRAME) + b"0\r\n\r\n",
    "the same Content-Length twice": b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n"
    b"Content-Length: %d\r\n\r\n" % (len(FRAME), len(FRAME)) + FRAME,
    "Content-Length and chunked": b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n" + chunk(FRAME) + b"0\r\n\r\n",
}

REFUSED_AS_HTTPX_REFUSES = {
    "superscript digit in the status": b"HTTP/1.1 \xb200 OK\r\nContent-Length: 0\r\n\r\n",
    "superscript digit in Content-Length": b"HTTP/1.1 200 OK\r\nContent-Length: \xb9\r\n\r\nx",
    "gzip under chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
    + chunk(b"\x1f\x8b\x08\x00binary\n")
    + b"0\r\n\r\n",
    "a coding that only contains the word": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: xchunked\r\n"
    b"\r\n" + chunk(FRAME) + b"0\r\n\r\n",
    "identity coding": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\n" + FRAME,
    "two Transfer-Encoding headers": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n" + chunk(FRAME) + b"0\r\n\r\n",
    "Content-Lengths that disagree": b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n"
    b"Content-Length: 3\r\n\r\n" % len(FRAME) + FRAME,
    "status with four digits": b"HTTP/1.1 0200 OK\r\nContent-Length: 0\r\n\r\n",
    "NUL in a header value": b"HTTP/1.1 200 OK\r\nX: a\x00b\r\nContent-Length: 0\r\n\r\n",
    "space in a header name": b"HTTP/1.1 200 OK\r\nX Y: z\r\nContent-Length: 0\r\n\r\n",
}


ALL = Cursor("all", "all")


@contextlib.asynccontextmanager
async def intake_running(
    port: int,
    *,
    cursor: Cursor = ALL,
    sink: Callable[[intake.Item], None] = lambda item: None,
    opens: bool = True,
    **config: Any,
) -> AsyncIterator[intake.IntakeHealth]:
    """Intake on the lean reader against the server on `port`, stopped (and its task awaited,
    so an exception in it fails the test) on the way out."""

    async def resume() -> Resume:
        return Resume(cursor, None, 0, None, None)

    async def no_cursor_drop(cursor: Cursor, body: str) -> None:
        raise AssertionError("no 400 here")

    async def owe(since: int, gap_from: int | None) -> Owed:
        assert opens, "the stream never opens here"
        return Owed(since, 0, gap_from)

    health = intake.IntakeHealth()
    async with httpx.AsyncClient() as client:
        reader = intake.Intake(
            intake.IntakeConfig(f"http://127.0.0.1:{port}", ("alerts",), None, **config),
            client,
            sink=sink,
            current_resume=resume,
            on_rejected_cursor=no_cursor_drop,
            owe_backfill=owe,
            new_generation=itertools.count().__next__,
            health=health,
            open_stream=RawStreamOpener(),
        )
        stop = asyncio.Event()
        task = asyncio.create_task(reader.run(stop))
        try:
            yield health
        finally:
            stop.set()
            await task  # the loop survived what the server did and stops when asked


@pytest.mark.parametrize("reply", READ_AS_HTTPX_READS.values(), ids=READ_AS_HTTPX_READS.keys())
@in_loop
async def test_reply_httpx_reads_is_read_the_same_not_a_crash_or_a_refusal(reply: bytes) -> None:
    expected = await outcome("httpx", reply)
    assert isinstance(expected, tuple), expected
    assert await outcome("raw", reply) == expected


@pytest.mark.parametrize(
    "reply", REFUSED_AS_HTTPX_REFUSES.values(), ids=REFUSED_AS_HTTPX_REFUSES.keys()
)
@in_loop
async def test_reply_httpx_refuses_is_a_protocol_error_not_a_crash_or_payload(
    reply: bytes,
) -> None:
    assert await outcome("httpx", reply) is httpx.RemoteProtocolError
    assert await outcome("raw", reply) is httpx.RemoteProtocolError


@in_loop
async def test_informational_responses_split_at_every_byte_still_reach_the_stream() -> None:
    reply = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\nLink: </x>\n\n" + CHUNKED_OK
    assert await outcome("raw", reply, byte_by_byte=True) == (200, FRAME)


@in_loop
async def test_header_that_never_ends_times_out_instead_of_holding_intake() -> None:
    """A server trickling header bytes (each read in time) must not hold the connection attempt
    for hours: the frame watchdog only starts once the head is read."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        while True:
            writer.write(b"z")
            await writer.drain()
            await asyncio.sleep(0.05)

    async with serve(handler) as port:
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            async with asyncio.timeout(10):  # the old reader waited for 64 KiB: ~55 min here
                async with RawStreamOpener()(
                    f"http://127.0.0.1:{port}/t/json", {}, {}, httpx.Timeout(2.0, read=0.5)
                ):
                    pass
        assert time.monotonic() - started < 5


@in_loop
async def test_credentials_in_the_url_are_sent_as_httpx_sends_them() -> None:
    """ntfy.url may hold user:pass@ (the settings mask it): httpx sends Basic auth from it, and a
    reader that dropped it would be refused with 401 where httpx subscribes."""
    requests: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(await read_request(reader))
        writer.write(CHUNKED_OK)
        await writer.drain()

    async with serve(handler) as port:
        url = f"http://phil:p%40ss%20word@127.0.0.1:{port}/ntfy/alerts/json"
        for client in ("httpx", "raw"):
            assert await read_with(client, url) == (200, FRAME)
    token = base64.b64encode(b"phil:p@ss word").decode()
    for request in requests:
        assert f"\r\nAuthorization: Basic {token}\r\n".encode() in request.replace(
            b"authorization", b"Authorization"
        )
        assert request.startswith(b"GET /ntfy/alerts/json?since=all HTTP/1.1\r\n")
        assert b"phil" not in request.split(b"\r\n", 1)[0]


def test_internationalized_host_is_sent_in_its_idna_form() -> None:
    target = httpx.URL("https://bücher.example:8443/ntfy/alerts/json", params={"since": "1h"})
    request = get_request_bytes(target)
    assert b"\r\nHost: xn--bcher-kva.example:8443\r\n" in request
    assert request.startswith(b"GET /ntfy/alerts/json?since=1h HTTP/1.1\r\n")


def get_request_bytes(target: httpx.URL) -> bytes:
    return http_connection.request_bytes(h11.Connection(h11.CLIENT), "GET", target, {})


class Pieces:
    """A byte source that hands over one piece per read, then EOF."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = [piece for piece in pieces if piece]

    async def receive(self, read_timeout: float | None) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""


class NonAsciiHeaderNtfy(socketserver.ThreadingTCPServer):
    """A minimal ntfy behind a proxy that adds a latin-1 header to every reply: the stream opens
    and delivers one message, the poll returns it again."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _NonAsciiHandler)
        self.requests: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _NonAsciiHandler(socketserver.StreamRequestHandler):
    server: NonAsciiHeaderNtfy

    def handle(self) -> None:
        line = self.rfile.readline().decode()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass
        self.server.requests.append(line)
        now = int(time.time())
        message = {
            "id": "evtNonAscii1",
            "time": now,
            "expires": now + 3600,
            "event": "message",
            "topic": "alerts",
            "message": "disk full",
        }
        head = b"HTTP/1.1 200 OK\r\nVia: 1.1 proxy-caf\xe9\r\nTransfer-Encoding: chunked\r\n\r\n"
        frames = [json.dumps(message).encode() + b"\n"]
        if "poll=1" not in line:
            opened = {"id": "o1", "time": now, "event": "open", "topic": "alerts"}
            frames.insert(0, json.dumps(opened).encode() + b"\n")
        self.wfile.write(head + b"".join(chunk(f) for f in frames))
        if "poll=1" in line:
            self.wfile.write(b"0\r\n\r\n")
            return
        for _ in range(100):  # keepalives until the daemon hangs up
            time.sleep(0.2)
            keepalive = {"id": "k", "time": int(time.time()), "event": "keepalive"}
            try:
                self.wfile.write(chunk(json.dumps(keepalive).encode() + b"\n"))
            except OSError:
                return


@contextmanager
def non_ascii_ntfy() -> Iterator[NonAsciiHeaderNtfy]:
    server = NonAsciiHeaderNtfy()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.one_engine("the stream reader on a hostile wire; the store is only where events land")
def test_latin1_byte_in_a_proxy_header_does_not_stop_the_daemon(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with non_ascii_ntfy() as ntfy:
        daemon = DaemonThread(settings_for(ntfy.url, state, ntfy_cache_settle="100ms"))
        with daemon:
            wait_until(lambda: "evtNonAscii1" in event_ids(state), what="the event recorded")
            assert daemon.daemon is not None and not daemon.daemon.failed
        assert event_ids(state).count("evtNonAscii1") == 1


@in_loop
async def test_body_trickling_one_byte_at_a_time_still_trips_the_frame_watchdog() -> None:
    """Bytes that never finish a frame must not keep a dead stream alive (keepalive_timeout)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffff\r\n{")
        while True:
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(0.05)

    async with serve(handler) as port, intake_running(port, keepalive_timeout=0.4) as health:
        async with asyncio.timeout(10):
            while health.watchdog_drops < 1:
                await asyncio.sleep(0.05)
    assert health.failures.get("watchdog", 0) >= 1


@in_loop
async def test_poll_cut_off_mid_line_is_retried_not_recorded_as_junk_and_cleared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A poll whose body has no framing (HTTP/1.0, read until close) and is cut mid-frame looks
    complete: the torn last line became a quarantined junk record, the frames after it were
    never read, and what the backfill owed was cleared, losing them."""
    monkeypatch.setattr(intake, "POLL_RETRY_BASE", 0.01)
    now = int(time.time())
    frames = [
        json.dumps({"id": f"polled00000{n}", "time": now, "event": "message", "topic": "alerts"})
        .encode()
        .__add__(b"\n")
        for n in (1, 2)
    ]
    polls: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_request(reader)
        if b"poll=1" not in request:
            opened = {"id": "o", "time": now, "event": "open", "topic": "alerts"}
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            writer.write(chunk(json.dumps(opened).encode() + b"\n"))
            await writer.drain()
            await asyncio.sleep(30)
            return
        polls.append(request)
        body = b"".join(frames)
        writer.write(b"HTTP/1.0 200 OK\r\n\r\n" + (body[:-10] if len(polls) == 1 else body))
        await writer.drain()

    items: list[intake.Item] = []
    async with (
        serve(handler) as port,
        intake_running(port, sink=items.append, keepalive_timeout=10, cache_settle=0),
    ):
        async with asyncio.timeout(10):
            while not any(isinstance(item, intake.Backfilled) for item in items):
                await asyncio.sleep(0.02)
    [backfilled] = [item for item in items if isinstance(item, intake.Backfilled)]
    assert [getattr(e, "id", e) for e in backfilled.events] == ["polled000001", "polled000002"]
    assert len(polls) == 2


@in_loop
async def test_host_name_idna_refuses_is_a_connect_error_not_a_crash() -> None:
    url = f"http://{'a' * 64}.example/alerts/json"  # the settings take it; DNS never sees it
    for client in ("httpx", "raw"):
        with pytest.raises(httpx.ConnectError):
            await read_with(client, url)


STATUS_LINES = [b"HTTP/1.1 200 OK", b"HTTP/1.0 200", b"HTTP/1.1 100 Continue", b"HTTP/1.1 204 x"]
STATUS_LINES += [b"HTTP/1.1 \xb200 OK", b"HTTP/1.1 101 Up", b"ICY 200 OK", b""]
FIELDS = [b"Transfer-Encoding: chunked", b"Transfer-Encoding: gzip, chunked", b"Content-Length: 5"]
FIELDS += [b"Content-Length: \xb9", b"Content-Length: 5, 6", b"Server: caf\xe9", b" folded", b"X"]
BODIES = [b"0\r\n\r\n", b"5;x=y\r\nhello\r\n0\r\nT: 1\r\n\r\n", FRAME, b"ffffffff\r\n", b""]


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(STATUS_LINES) | st.binary(max_size=12),
    st.lists(st.sampled_from(FIELDS) | st.binary(max_size=12), max_size=5),
    st.sampled_from([b"\r\n", b"\n"]),
    st.lists(st.sampled_from(BODIES) | st.binary(max_size=12), max_size=4),
    st.lists(st.integers(1, 40), max_size=6),
)
def test_any_reply_is_read_or_a_transport_error_never_another_exception(
    status: bytes, fields: list[bytes], eol: bytes, body: list[bytes], cuts: list[int]
) -> None:
    """Whatever a server sends, however it is split: a body, or an httpx.TransportError that
    intake's run loop backs off from. Anything else stops the daemon."""
    wire = eol.join([status, *fields, b"", b"".join(body)])

    async def read() -> None:
        pieces, position = [], 0
        for cut in [*cuts, len(wire)]:
            pieces.append(wire[position : position + cut])
            position += cut
        conn = h11.Connection(h11.CLIENT)
        http_connection.request_bytes(conn, "GET", httpx.URL("http://x/t/json"), {})
        response = await read_response(Pieces(pieces), conn, 1.0)
        async for _ in response.aiter_raw():
            pass

    with contextlib.suppress(httpx.TransportError):
        asyncio.run(read())


@pytest.mark.one_engine("the stream reader on a hostile wire; the store is only where events land")
def test_daemon_on_the_lean_reader_records_each_event_once_through_repeated_disconnects(
    tmp_path: Path,
) -> None:
    """The daemon's own stream reader (no transport injected, no proxy) against a server that
    writes one flushed chunk per frame, as ntfy does, while its connections are cut (aborted and
    ended cleanly, mid-burst): every published id has exactly one event line, and no other."""
    state = tmp_path / "state"
    config = EmulatorConfig(keepalive_interval=1.0, request_limit=False, flush_each_frame=True)
    with NtfyEmulator(config).running() as emu:
        settings = settings_for(emu.url, state, ntfy_cache_settle="100ms")
        published: list[str] = []
        with DaemonThread(settings) as running:
            assert running.daemon is not None
            assert isinstance(running.daemon.stream_reader, RawStreamOpener)
            for round_ in range(6):
                emu.wait_for_subscribers(1)
                for n in range(40):
                    topic = "alerts" if n % 2 else "backups"
                    published.append(str(emu.publish(topic, f"r{round_} n{n}")["id"]))
                    if n == 20:
                        emu.faults.drop_connections(graceful=round_ % 2 == 1)
            wait_until(
                lambda: set(published) <= set(event_ids(state)), timeout=30, what="all recorded"
            )
            assert not running.daemon.failed
    counts = Counter(event_ids(state))
    assert counts == Counter(dict.fromkeys(published, 1))


@pytest.mark.parametrize("framing", [b"Transfer-Encoding: chunked\r\n", b""])
@in_loop
async def test_refusal_whose_body_never_ends_is_backed_off_from_not_waited_on(
    framing: bytes,
) -> None:
    """A proxy's 503 whose body trickles forever: intake read the whole body for its error text,
    each byte in time for the read timeout, and no frame watchdog runs before a 200. Intake sat
    in `connecting` for as long as the server liked."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\n" + framing + b"\r\n")
        if framing:
            writer.write(b"ffffff\r\n")
        writer.write(b"upstream is down")
        while True:
            writer.write(b".")
            await writer.drain()
            await asyncio.sleep(0.05)

    async with (
        serve(handler) as port,
        intake_running(port, opens=False, keepalive_timeout=0.4) as health,
    ):
        async with asyncio.timeout(10):
            while not health.failures.get("http_503"):
                await asyncio.sleep(0.05)
    assert health.last_error is not None and "upstream is down" in health.last_error


@in_loop
async def test_gap_probe_whose_reply_trickles_does_not_hold_the_subscription() -> None:
    """The cursor probe (poll=1&since=all&id=) goes through httpx with a per-read timeout: a
    reply that trickles a byte at a time held intake before it ever subscribed."""
    streams: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_request(reader)
        if b"poll=1" in request:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffff\r\n")
            while True:
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(0.05)
        streams.append(request)
        await asyncio.sleep(30)

    cursor = Cursor("id", "cursor000001", 1700000000)
    async with (
        serve(handler) as port,
        intake_running(port, cursor=cursor, keepalive_timeout=0.4, connect_timeout=0.5),
    ):
        async with asyncio.timeout(10):
            while not streams:
                await asyncio.sleep(0.05)
    assert b"since=cursor000001" in streams[0]


def test_ntfy_url_httpx_cannot_parse_stops_start_up_with_one_line_not_a_traceback(
    tmp_path: Path,
) -> None:
    """The settings took it (urlsplit does), and the daemon died at its first request with
    httpx.InvalidURL's traceback, which no `except httpx.HTTPError` catches; systemd restarted
    it forever."""
    env = {
        "NTFY_INTAKE_NTFY_URL": "http://999.999.999.999",
        "NTFY_INTAKE_NTFY_TOPICS": "alerts",
        "NTFY_INTAKE_STATE_DIR": str(tmp_path / "state"),
        "NTFY_INTAKE_HTTP_LISTEN": "127.0.0.1:0",
    }
    result = cli("run", env=env)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "ntfy.url" in line
