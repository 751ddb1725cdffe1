"""One subscribe response on the wire: open, replay, live, keepalive; or a poll's replay.

Invariants owned here (ntfy-spec.md sections 1.5, 1.6, 4.1):
- a stream writes `open` first, then the replay, then live messages; `open`, the injected duplicate
  and the replay are queued in the same loop step as the registration, so nothing live can come
  between them;
- a keepalive is queued every `keepalive_interval` seconds after the replay, whatever else is sent
  (the timer is not reset by traffic); a poll gets neither `open` nor keepalives;
- every frame is one chunk, flushed at once (`flush_each_frame`: and never coalesced with the next
  one in the server's buffer, as ntfy's blocking per-message write); a poll that has nothing to send is a 200 with an
  empty body;
- a zombie (silenced) stream writes nothing at all until it is closed;
- a dropped stream's connection is closed under the response, so the client sees the chunked
  body end without its terminating chunk, as when a real server or proxy dies.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from ntfy_intake.testbed.emulator import wire
from ntfy_intake.testbed.emulator.hub import Hub
from ntfy_intake.testbed.emulator.since import Since
from ntfy_intake.testbed.emulator.stream import Signal, Stream
from ntfy_intake.testbed.emulator.wire import Event

if TYPE_CHECKING:
    from ntfy_intake.testbed.emulator.exchange import Exchange

CONTENT_TYPES = {
    "json": "application/x-ndjson; charset=utf-8",
    "sse": "text/event-stream; charset=utf-8",
    "raw": "text/plain; charset=utf-8",
}


def encoder(kind: str) -> Callable[[Event], bytes | str]:
    """The frame format of /json, /sse, /raw or /ws (a text frame)."""
    if kind == "ws":
        return Event.ws_frame
    if kind == "sse":
        return _sse
    if kind == "raw":
        return _raw
    return Event.line


def _sse(event: Event) -> bytes:
    if event.event in wire.MESSAGE_EVENTS:
        return b"data: " + event.line() + b"\n"
    return b"event: " + event.event.encode() + b"\ndata: " + event.line() + b"\n"


def _raw(event: Event) -> bytes:
    if event.event == wire.MESSAGE:
        return (event.message.replace("\n", " ") + "\n").encode("utf-8")
    return b"\n"


class StreamSession:
    """Runs one subscribe response from registration to close."""

    def __init__(self, exchange: Exchange, hub: Hub, stream: Stream, kind: str) -> None:
        self._exchange = exchange
        self._hub = hub
        self._stream = stream
        self._content_type = CONTENT_TYPES.get(kind, "")
        self._started = False

    async def run(self, since: Since) -> None:
        stream = self._stream
        watcher = asyncio.create_task(self._watch_disconnect())
        background: list[asyncio.Task[None]] = [watcher]
        try:
            replay, duplicate, defer = self._hub.open_stream(stream, since)
            if stream.poll:
                for event in replay:
                    stream.deliver(event)
                stream.signal(Signal.END)
            else:
                stream.queue.put_nowait(stream.encode(self._control(wire.OPEN)))
                if duplicate is not None:
                    stream.deliver(duplicate)  # as if published between registration and replay
                if defer is None:
                    for event in replay:
                        stream.deliver(event)
                else:
                    background.append(asyncio.create_task(self._replay_after_live(since, defer)))
                if self.sends_keepalive_events:
                    background.append(asyncio.create_task(self._keepalive()))
            await self._pump(watcher)
        finally:
            self._hub.close_stream(stream)
            for task in background:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    sends_keepalive_events = True

    async def _replay_after_live(self, since: Since, wait: float) -> None:
        """The `replay_after_live` fault: ntfy queries the cache only after writing `open`, so a
        message published meanwhile is sent live first (and is in the replay too)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stream.live_seen.wait(), wait)
        for row in self._hub.take_replay(self._stream, since):
            self._stream.deliver(row.event)

    def _control(self, kind: str) -> Event:
        return wire.control_event(kind, self._stream.topics_str, self._hub.now_s())

    async def _keepalive(self) -> None:
        interval = self._hub.config.keepalive_interval
        while True:
            await asyncio.sleep(interval)
            self._stream.queue.put_nowait(self._stream.encode(self._control(wire.KEEPALIVE)))

    async def _watch_disconnect(self) -> None:
        while True:
            message = await self._exchange.receive()
            if message["type"] == "http.disconnect":
                self._stream.signal(Signal.DISCONNECTED)
                return

    async def _pump(self, watcher: asyncio.Task[None]) -> None:
        stream = self._stream
        while True:
            item = await stream.queue.get()
            if item is Signal.DISCONNECTED:
                return
            if item is Signal.DROP or (item is Signal.CLOSE and stream.zombie):
                await self._abort(watcher)
                return
            if item is Signal.END or item is Signal.CLOSE:
                if stream.zombie:
                    continue  # a silenced poll never answers
                await self._finish()
                return
            if stream.zombie:
                continue
            await self._write(item)

    async def _write(self, item: bytes | str) -> None:
        assert isinstance(item, bytes)
        await self._start()
        await self._exchange.send({"type": "http.response.body", "body": item, "more_body": True})
        if self._hub.config.flush_each_frame:
            await asyncio.sleep(0)  # one frame per loop turn, as ntfy's per-message write+flush

    async def _start(self) -> None:
        if not self._started:
            self._started = True
            await self._exchange.start(
                200,
                [
                    (b"content-type", self._content_type.encode()),
                    (b"access-control-allow-origin", b"*"),
                ],
            )
            transport = self._transport()
            if self._hub.config.flush_each_frame and transport is not None:
                # Pause (uvicorn awaits the drain) as soon as one byte is left unsent: the next
                # frame is written only once the kernel took this one, never coalesced with it.
                transport.set_write_buffer_limits(high=0)

    def _transport(self) -> asyncio.WriteTransport | None:
        transport = getattr(getattr(self._exchange.send, "__self__", None), "transport", None)
        return transport if isinstance(transport, asyncio.WriteTransport) else None

    async def _finish(self) -> None:
        if not self._started:
            await self._exchange.respond(200, b"", self._content_type)
            return
        await self._exchange.send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _abort(self, watcher: asyncio.Task[None]) -> None:
        """Close the TCP connection under the response (uvicorn's transport, when reachable)."""
        transport = getattr(getattr(self._exchange.send, "__self__", None), "transport", None)
        if not isinstance(transport, asyncio.BaseTransport):
            raise ConnectionAbortedError("subscriber connection dropped by fault injection")
        transport.close()
        # Wait until the server has seen the connection go, so it does not report the response
        # as abandoned.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(watcher), timeout=2.0)
