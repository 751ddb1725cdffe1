"""The lean stream reader over real loopback sockets: framing, errors, TLS, proxies."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
import socket
import socketserver
import ssl
import subprocess
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from ntfy_intake.runtime.daemon import Daemon
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator
from ntfy_intake.wire import diagnose
from ntfy_intake.wire.http_stream import RawStreamOpener, proxied

from ..harness import DaemonThread, event_ids, settings_for, wait_until

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
TIMEOUTS = httpx.Timeout(2.0, read=2.0)


def in_loop(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """The project runs its async tests with asyncio.run (no async plugin)."""

    @functools.wraps(test)
    def run(*args: object, **kwargs: object) -> None:
        asyncio.run(test(*args, **kwargs))  # type: ignore[arg-type]

    return run


@asynccontextmanager
async def serve(handler: Handler, ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[int]:
    connections: set[asyncio.Task[None]] = set()

    async def tracked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        connections.add(task)
        try:
            await handler(reader, writer)
        finally:
            writer.transport.abort()  # the server side never outlives the test

    server = await asyncio.start_server(tracked, "127.0.0.1", 0, ssl=ssl_context)
    port = server.sockets[0].getsockname()[1]
    try:
        yield port
    finally:
        server.close()
        for task in connections:
            task.cancel()
        await asyncio.gather(*connections, return_exceptions=True)
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def collect(opener: RawStreamOpener, url: str, **params: str) -> tuple[int, bytes]:
    async with opener(url, params, {}, TIMEOUTS) as response:
        return response.status_code, b"".join([c async for c in response.aiter_raw()])


@in_loop
async def test_chunked_stream_is_read_frame_by_frame_and_whole() -> None:
    seen: list[bytes] = []
    frames = [b'{"event":"open"}\n', b'{"id":"a","event":"message"}\n', b'{"id":"b"}\n']

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(
            b"HTTP/1.1 200 OK\r\nDate: Mon, 30 Nov 2026 10:00:00 GMT\r\n"
            b"Content-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        for frame in frames:  # one flushed chunk per frame, as ntfy writes
            writer.write(chunk(frame))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    dates: list[str | None] = []
    opener = RawStreamOpener(on_response=lambda headers: dates.append(headers.get("date")))
    async with (
        serve(handler) as port,
        opener(
            f"http://127.0.0.1:{port}/alerts,backups/json",
            {"since": "all", "poll": "1"},
            {"Authorization": "Bearer tk_secret"},
            TIMEOUTS,
        ) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/x-ndjson"
        pieces = [piece async for piece in response.aiter_raw()]
    assert b"".join(pieces) == b"".join(frames)
    assert dates == ["Mon, 30 Nov 2026 10:00:00 GMT"]
    request = seen[0].decode()
    assert request.startswith("GET /alerts,backups/json?since=all&poll=1 HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{port}\r\n" in request
    assert "Authorization: Bearer tk_secret\r\n" in request
    assert "Accept-Encoding: identity\r\n" in request


@in_loop
async def test_error_body_with_content_length_is_read_exactly() -> None:
    body = b'{"code":40008,"http":400,"error":"invalid request: since parameter"}\n'

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n" % len(body))
        writer.write(body + b"bytes the server should not have sent")
        await writer.drain()
        await asyncio.sleep(0.2)  # keeps the connection open: the length ends the body
        writer.close()

    async with (
        serve(handler) as port,
        RawStreamOpener()(
            f"http://127.0.0.1:{port}/t/json", {"since": "x"}, {}, TIMEOUTS
        ) as response,
    ):
        assert response.status_code == 400
        assert await response.aread() == body


@in_loop
async def test_body_without_length_is_read_until_the_server_closes() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nline one\nline two\n")
        await writer.drain()
        writer.close()

    async with serve(handler) as port:
        status, body = await collect(RawStreamOpener(), f"http://127.0.0.1:{port}/t/json")
    assert (status, body) == (200, b"line one\nline two\n")


@in_loop
async def test_server_dying_mid_stream_is_a_transport_error_not_an_end() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(chunk(b'{"event":"open"}\n') + b"40\r\npartial")
        await writer.drain()
        writer.close()

    async with serve(handler) as port:
        with pytest.raises(httpx.RemoteProtocolError):
            await collect(RawStreamOpener(), f"http://127.0.0.1:{port}/t/json")


@in_loop
async def test_silent_server_times_out_waiting_for_headers() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    async with serve(handler) as port:
        with pytest.raises(httpx.ReadTimeout):
            async with RawStreamOpener()(
                f"http://127.0.0.1:{port}/t/json", {}, {}, httpx.Timeout(2.0, read=0.2)
            ):
                pass


@pytest.mark.parametrize(
    "reply",
    [
        b"SSH-2.0-OpenSSH_9.2\r\n\r\n",  # not HTTP
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70_000 + b"\r\n\r\n",
    ],
)
@in_loop
async def test_garbage_instead_of_a_response_is_a_protocol_error(reply: bytes) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply)
        await writer.drain()
        await asyncio.sleep(0.5)
        writer.close()

    async with serve(handler) as port:
        with pytest.raises(httpx.RemoteProtocolError):
            await collect(RawStreamOpener(), f"http://127.0.0.1:{port}/t/json")


@in_loop
async def test_connection_refused_reads_as_refused_in_the_diagnosis() -> None:
    async with serve(read_request) as port:  # a port that was just free
        pass
    url = f"http://127.0.0.1:{port}/t/json"
    with pytest.raises(httpx.ConnectError) as caught:
        await collect(RawStreamOpener(), url)
    assert diagnose.transport_failure(url, caught.value).startswith(
        f"connection refused by 127.0.0.1:{port}"
    )


@in_loop
async def test_header_with_a_line_break_is_refused_before_connecting() -> None:
    with pytest.raises(httpx.LocalProtocolError):
        async with RawStreamOpener()(
            "http://127.0.0.1:9/t/json", {}, {"Authorization": "Bearer x\r\nX-Evil: 1"}, TIMEOUTS
        ):
            pass


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def tls_stream_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        await read_request(reader)
    except (asyncio.IncompleteReadError, ConnectionError):
        return  # the client refused our certificate
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    writer.write(chunk(b'{"event":"open"}\n') + b"0\r\n\r\n")
    await writer.drain()
    writer.close()


@in_loop
async def test_https_trusts_what_httpx_trusts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    async with serve(tls_stream_handler, server_ctx) as port:
        url = f"https://127.0.0.1:{port}/t/json"
        # Not trusted (certifi's store, like httpx): a TLS failure the diagnosis names.
        with pytest.raises(httpx.ConnectError) as caught:
            await collect(RawStreamOpener(), url)
        assert diagnose.transport_failure(url, caught.value).startswith("TLS failed")
        # Trusted through SSL_CERT_FILE, which httpx honours too.
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        assert await collect(RawStreamOpener(), url) == (200, b'{"event":"open"}\n')


def test_proxy_in_the_environment_is_noticed(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    assert not proxied("http://ntfy.lan/alerts")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.lan:3128")
    assert proxied("https://ntfy.example/alerts")
    assert not proxied("http://ntfy.lan/alerts")
    monkeypatch.setenv("ALL_PROXY", "http://proxy.lan:3128")
    assert proxied("http://ntfy.lan/alerts")
    monkeypatch.setenv("NO_PROXY", "ntfy.lan,localhost")
    assert not proxied("http://ntfy.lan/alerts")
    assert proxied("https://ntfy.example/alerts")


PROXY_ENVIRONMENTS = [
    {},
    {"HTTP_PROXY": "http://proxy.lan:3128"},
    {"HTTPS_PROXY": "http://proxy.lan:3128"},
    {"ALL_PROXY": "http://proxy.lan:3128"},
    {"ALL_PROXY": "http://proxy.lan:3128", "NO_PROXY": "ntfy.lan"},
    {"ALL_PROXY": "http://proxy.lan:3128", "NO_PROXY": ".ntfy.lan"},  # urllib bypasses ntfy.lan
    {"ALL_PROXY": "http://proxy.lan:3128", "NO_PROXY": "localhost,127.0.0.1,::1"},
    {"ALL_PROXY": "http://proxy.lan:3128", "NO_PROXY": "*"},
    {"HTTP_PROXY": "http://proxy.lan:3128", "NO_PROXY": "http://ntfy.lan"},
    {"HTTPS_PROXY": "http://proxy.lan:3128", "NO_PROXY": "192.168.1.5"},
]
PROXY_URLS = [
    "http://ntfy.lan/alerts",
    "https://ntfy.lan/alerts",
    "http://sub.ntfy.lan:8080/alerts",
    "http://127.0.0.1:8786",
    "http://[::1]:8786",
    "http://localhost/x",
    "https://192.168.1.5/ntfy",
]


@pytest.mark.parametrize("environment", PROXY_ENVIRONMENTS, ids=str)
def test_proxy_decision_is_the_one_httpx_makes(
    environment: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Failure mode: the lean reader connects directly where httpx (the probe, the relay) would
    go through the proxy, or the other way round (urllib's NO_PROXY rules differ from httpx's)."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    client = httpx.AsyncClient()
    for url in PROXY_URLS:
        via_proxy = client._transport_for_url(httpx.URL(url)) is not client._transport
        assert proxied(url) == via_proxy, url


class ForwardingProxy(socketserver.ThreadingTCPServer):
    """An HTTP proxy for plain http:// URLs: records each request line and relays the bytes."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.request_lines: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ProxyHandler(socketserver.StreamRequestHandler):
    server: ForwardingProxy

    def handle(self) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            data = self.request.recv(65536)
            if not data:
                return
            head += data
        line, rest = head.split(b"\r\n", 1)
        method, target, version = line.decode().split(" ")
        self.server.request_lines.append(f"{method} {target}")
        url = httpx.URL(target)
        upstream = socket.create_connection((url.host, url.port or 80))
        upstream.sendall(f"{method} {url.raw_path.decode()} {version}\r\n".encode() + rest)
        pump = threading.Thread(target=_pump, args=(upstream, self.request), daemon=True)
        pump.start()
        _pump(self.request, upstream)
        pump.join(5)
        upstream.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


@pytest.mark.one_engine("the stream reader's proxy; the store is only where events land")
def test_stream_goes_through_the_proxy_the_environment_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Failure mode: the lean reader connects directly and ignores the proxy a site requires."""
    for name in ("no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    config = EmulatorConfig(keepalive_interval=1.0, request_limit=False)
    with NtfyEmulator(config).running() as emu, ForwardingProxy() as proxy:
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        try:
            state = tmp_path / "state"
            assert isinstance(Daemon(settings_for(emu.url, state)).stream_reader, RawStreamOpener)
            monkeypatch.setenv("HTTP_PROXY", proxy.url)
            with DaemonThread(settings_for(emu.url, state, ntfy_cache_settle="200ms")):
                emu.wait_for_subscribers(1)
                ids = [str(emu.publish("alerts", f"via proxy {i}")["id"]) for i in range(3)]
                wait_until(lambda: set(ids) <= set(event_ids(state)), what="events via the proxy")
        finally:
            proxy.shutdown()
    streams = [line for line in proxy.request_lines if "/alerts,backups/json?" in line]
    assert streams and streams[0].startswith(f"GET {emu.url}/alerts,backups/json?since=")
