"""The stream's read side alone: event-loop CPU per frame, the lean reader against httpx.

N events wait on the emulator writing one flushed chunk per frame (as ntfy does); this process
reads `GET /<topics>/json?poll=1&since=all` in a child process (so the emulator's threads do not
share its GIL, as ntfy does not share the daemon's) and splits it into lines with the daemon's own
`NdjsonDecoder`, once through httpx (`http_stream.httpx_opener`, what the daemon used before) and
once through `http_stream.RawStreamOpener` (what it uses now), alternating, best of 3 each.
CPU is this thread's `time.thread_time()` (the emulator runs in other threads), so the figure is
the reader's own cost per frame; decoding JSON and recording are not included.

Run alone: uv run python bench/bench_read.py [--events 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time

import httpx

from _common import Row, ratio, render
from bench_replay import publish_backlog
from ntfy_intake.frames import NdjsonDecoder
from ntfy_intake.http_stream import RawStreamOpener, StreamOpener, httpx_opener
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

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
        openers: dict[str, StreamOpener] = {"httpx": httpx_opener(client), "raw": RawStreamOpener()}
        for _ in range(ROUNDS):
            for name, opener in openers.items():
                lines, cpu = await read_once(opener, url)
                assert lines == n, f"{name} read {lines} lines, expected {n}"
                best[name] = min(best[name], cpu)
    return best


def rows(n: int) -> list[Row]:
    config = EmulatorConfig(keepalive_interval=1.0, manager_interval=None, flush_each_frame=True)
    with NtfyEmulator(config).running() as emu:
        publish_backlog(emu, n, random.Random(1))
        child = subprocess.run(
            [sys.executable, __file__, "--child", emu.url, "--events", str(n)],
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
    best = json.loads(child.stdout)
    raw_us, httpx_us = best["raw"] / n * 1e6, best["httpx"] / n * 1e6
    return [
        Row(
            f"read side: {n:,} frames, 1 flushed chunk/frame, lean reader (CPU/frame)",
            f"{raw_us:.1f} us",
            f"httpx aiter_raw, same run: {httpx_us:.1f} us",
            ratio(raw_us, httpx_us),
        )
    ]


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
