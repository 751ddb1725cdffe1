"""The stream's read side alone: event-loop CPU per frame, the lean reader against httpx.

N events are read with `GET /<topics>/json?poll=1&since=all` in a child process (so the server's
threads do not share its GIL, as ntfy does not share the daemon's) and split into lines with the
daemon's own `NdjsonDecoder`, once through httpx (`http_stream.httpx_opener`, what the daemon used
before) and once through `http_stream.RawStreamOpener` (what it uses now: h11 reads the head and
the body, what it holds after each socket read handed over as one part), alternating, best of 3
each: what the lean reader saves against the library (docs/performance.md, "Fast paths: kept
or returned to the library"). Two servers: a backlog already waiting (the emulator's frames, one HTTP chunk each, as ntfy
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
import json
import random
import socketserver
import subprocess
import sys
import threading
import time

import httpx

from _common import Row, ratio, render
from bench_replay import publish_backlog
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator
from ntfy_intake.wire.frames import NdjsonDecoder
from ntfy_intake.wire.http_stream import RawStreamOpener, StreamOpener, httpx_opener

TOPICS = "alerts,backups"
ROUNDS = 3


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
    best = {"httpx": float("inf"), "raw": float("inf")}
    async with httpx.AsyncClient() as client:
        openers: dict[str, StreamOpener] = {
            "httpx": httpx_opener(client),
            "raw": RawStreamOpener(),
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
        out.append(
            Row(
                f"read side: {n:,} frames, {what}, lean reader (CPU/frame)",
                f"{raw_us:.1f} us",
                f"httpx aiter_raw, same run: {httpx_us:.1f} us",
                ratio(raw_us, httpx_us),
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
