"""The stream's read side alone: event-loop CPU per frame, the lean reader against httpx and h11.

N events are read with `GET /<topics>/json?poll=1&since=all` in a child process (so the server's
threads do not share its GIL, as ntfy does not share the daemon's) and split into lines with the
daemon's own `NdjsonDecoder`, once through httpx (`http_stream.httpx_opener`, what the daemon used
before), once through `http_stream.RawStreamOpener` (what it uses now: h11 reads the head, the
body is de-chunked in whole socket reads) and once with the same connection's body read by h11
event by event (`Connection.read_body`, what the reader would do without its fast path: the
reason the fast path stays), alternating, best of 3 each. Two servers: a backlog already waiting (the emulator's frames, one HTTP chunk each, as ntfy
frames them, sent at once: what a replay reads, ntfy serving 10,000 in ~0.1 s), and the emulator
writing one flushed chunk per frame and the next only once the kernel took it (reads then hold a
few frames each, so the per-read cost of the event loop weighs more).
CPU is this thread's `time.thread_time()` (the emulator runs in other threads), so the figure is
the reader's own cost per frame; decoding JSON and recording are not included.

Run alone: uv run python bench/bench_read.py [--events 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator

import httpx

from _common import Row, ratio, render
from bench_replay import publish_backlog
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator
from ntfy_intake.wire import http_connection
from ntfy_intake.wire.frames import NdjsonDecoder
from ntfy_intake.wire.http_stream import RawStreamOpener, StreamOpener, StreamResponse, httpx_opener

TOPICS = "alerts,backups"
ROUNDS = 3


class H11Body:
    """A response whose body h11 hands over one event (one chunk) at a time."""

    def __init__(self, conn: http_connection.Connection, head: object, read_timeout: float) -> None:
        self.conn = conn
        self.status_code = 200
        self.headers = httpx.Headers()
        self.read_timeout = read_timeout

    async def aiter_raw(self) -> AsyncGenerator[bytes, None]:
        while (part := await self.conn.read_body(self.read_timeout)) is not None:
            yield part

    async def aread(self) -> bytes:
        return b"".join([part async for part in self.aiter_raw()])


@contextlib.asynccontextmanager
async def h11_body_opener(
    url: str, params: dict[str, str], headers: dict[str, str], timeouts: httpx.Timeout
) -> AsyncIterator[StreamResponse]:
    target = httpx.URL(url, params=params)
    state = http_connection.client_state()
    request = http_connection.request_bytes(state, "GET", target, headers)
    conn = await http_connection.Connector().connect(target, timeouts.connect, state)
    try:
        await conn.send(request, timeouts.write)
        head = await conn.read_head(timeouts.read)
        yield H11Body(conn, head, timeouts.read or 10.0)
    finally:
        conn.abort()


async def read_once(opener: StreamOpener, url: str) -> tuple[int, float]:
    decoder = NdjsonDecoder()
    lines = 0
    start = time.thread_time()
    async with opener(
        f"{url}/{TOPICS}/json", {"poll": "1", "since": "all"}, {}, httpx.Timeout(10.0)
    ) as response:
        async for chunk in response.aiter_raw():
            lines += len(decoder.feed(chunk))
    return lines, time.thread_time() - start


async def measure(url: str, n: int) -> dict[str, float]:
    best = {"httpx": float("inf"), "raw": float("inf"), "h11": float("inf")}
    async with httpx.AsyncClient() as client:
        openers: dict[str, StreamOpener] = {
            "httpx": httpx_opener(client),
            "raw": RawStreamOpener(),
            "h11": h11_body_opener,
        }
        for _ in range(ROUNDS):
            for name, opener in openers.items():
                lines, cpu = await read_once(opener, url)
                assert lines == n, f"{name} read {lines} lines, expected {n}"
                best[name] = min(best[name], cpu)
    return best


def read_in_child(url: str, n: int) -> dict[str, float]:
    child = subprocess.run(
        [sys.executable, __file__, "--child", url, "--events", str(n)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    best: dict[str, float] = json.loads(child.stdout)
    return best


class WaitingBacklog(socketserver.ThreadingTCPServer):
    """Answers any request with the whole chunked response at once, one chunk per frame."""

    daemon_threads = True

    def __init__(self, frames: list[bytes]) -> None:
        super().__init__(("127.0.0.1", 0), _SendAll)
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
        head += b"Transfer-Encoding: chunked\r\n\r\n"
        body = b"".join(b"%x\r\n%s\r\n" % (len(f), f) for f in frames)
        self.response = head + body + b"0\r\n\r\n"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _SendAll(socketserver.StreamRequestHandler):
    server: WaitingBacklog

    def handle(self) -> None:
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass
        self.wfile.write(self.server.response)


def rows(n: int) -> list[Row]:
    config = EmulatorConfig(keepalive_interval=1.0, manager_interval=None, flush_each_frame=True)
    with NtfyEmulator(config).running() as emu:
        publish_backlog(emu, n, random.Random(1))
        frames = [json.dumps(m, separators=(",", ":")).encode() + b"\n" for m in emu.messages()]
        paced = read_in_child(emu.url, n)
    with WaitingBacklog(frames) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            waiting = read_in_child(server.url, n)
        finally:
            server.shutdown()
    out = []
    for what, best in (("backlog waiting", waiting), ("1 flushed chunk/frame, paced", paced)):
        raw_us, httpx_us = best["raw"] / n * 1e6, best["httpx"] / n * 1e6
        h11_us = best["h11"] / n * 1e6
        out.append(
            Row(
                f"read side: {n:,} frames, {what}, lean reader (CPU/frame)",
                f"{raw_us:.1f} us",
                f"httpx aiter_raw, same run: {httpx_us:.1f} us",
                ratio(raw_us, httpx_us),
            )
        )
        out.append(
            Row(
                f"read side: {n:,} frames, {what}, lean reader against h11's own body reader",
                f"{raw_us:.1f} us",
                f"h11 event by event, same connection code: {h11_us:.1f} us",
                ratio(raw_us, h11_us),
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(measure(args.child, args.events))))
        return
    print(render(rows(args.events)))


if __name__ == "__main__":
    main()
