"""Intake behind a reverse proxy that re-chunks the stream with trailing whitespace after each
chunk size (`5 \\r\\n`), as some servers and proxies write it; h11 takes it on purpose."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from ntfy_intake.wire.http_stream import RawStreamOpener

from ..harness import DaemonThread, event_ids, settings_for, wait_until
from ..servers import KEEPALIVE, Server


@contextmanager
def rechunking_proxy(upstream: str) -> Iterator[str]:
    """A loopback reverse proxy for GETs: the upstream's body, re-chunked as it arrives, each
    chunk-size line followed by a space (and the last by a tab)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stop = asyncio.Event()
    port: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            target = head.split(b" ", 2)[1].decode()
            async with (
                httpx.AsyncClient(timeout=None) as client,
                client.stream("GET", upstream + target) as response,
            ):
                writer.write(
                    b"HTTP/1.1 %d Whatever\r\nContent-Type: %s\r\n"
                    b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                    % (response.status_code, response.headers.get("content-type", "").encode())
                )
                async for piece in response.aiter_raw():
                    writer.write(b"%x \r\n%s\r\n" % (len(piece), piece))
                    await writer.drain()
                writer.write(b"0\t\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, httpx.HTTPError):
            pass
        finally:
            writer.transport.abort()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port.append(server.sockets[0].getsockname()[1])
        ready.set()
        await stop.wait()
        server.close()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(5)
    try:
        yield f"http://127.0.0.1:{port[0]}"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(5)
        loop.close()


@pytest.mark.one_engine("the chunked reader behind a proxy; the store is only where events land")
def test_chunk_sizes_with_trailing_whitespace_from_a_proxy_are_read_not_refused(
    server: Server, tmp_path: Path
) -> None:
    """Failure mode: a proxy that writes `5 \\r\\n` (h11 takes it) fails every stream connection
    of the lean reader, and intake backs off for ever while alerts pile up in ntfy's cache."""
    state = tmp_path / "state"
    with rechunking_proxy(server.url) as proxy_url:
        settings = settings_for(
            proxy_url,
            state,
            ntfy_keepalive_interval=f"{KEEPALIVE}s",
            ntfy_cache_settle="100ms",
        )
        with DaemonThread(settings) as running:
            assert running.daemon is not None
            assert isinstance(running.daemon.stream_reader, RawStreamOpener)
            wait_until(
                lambda: (
                    running.daemon is not None
                    and running.daemon.health_snapshot()["state"] == "live"
                ),
                timeout=20,
                what="the stream open through the proxy",
            )
            published = [str(server.publish("alerts", f"disk {n} full")["id"]) for n in range(20)]
            wait_until(
                lambda: set(published) <= set(event_ids(state)), timeout=30, what="all recorded"
            )
    assert Counter(event_ids(state)) == Counter(dict.fromkeys(published, 1))
