"""`GET /<topics>/ws` with `Upgrade: websocket`: ntfy's WebSocket subscription.

Invariants owned here (ntfy-spec.md sections 1.6 and 4.1, checked against a real v2.13 server):
- every event is one text frame, its JSON plus a newline (gorilla's WriteJSON), `open` first, then
  the replay, then live messages; no keepalive events: the server sends ping frames every
  `keepalive_interval` (uvicorn's websockets protocol, configured by the runner);
- `poll=1` sends the replay and closes the connection (no close frame, as ntfy); frames the
  client sends are read and ignored, and one over 64 bytes closes the connection (1009, ntfy's
  wsReadLimit; the runner sets it);
- errors before the upgrade are a bare status (see app.WebSocketExchange).
"""

from __future__ import annotations

import asyncio

from ntfy_intake.emulator.session import StreamSession
from ntfy_intake.emulator.stream import Signal


class WebSocketSession(StreamSession):
    """A StreamSession whose frames go over an accepted WebSocket."""

    sends_keepalive_events = False
    _accepted = False

    async def _start(self) -> None:
        if not self._accepted:
            self._accepted = True
            self._exchange.started = True
            if self._exchange.log_entry is not None:
                self._hub.update_log(self._exchange.log_entry, status=101)
            await self._exchange.send({"type": "websocket.accept"})

    async def _write(self, item: bytes | str) -> None:
        await self._start()
        text = item if isinstance(item, str) else item.decode("utf-8", "replace")
        await self._exchange.send({"type": "websocket.send", "text": text})

    async def _finish(self) -> None:
        """ntfy ends a WebSocket (a poll's replay written, or a cancelled subscription) by
        closing the connection, without a close frame."""
        await self._start()
        transport = getattr(getattr(self._exchange.send, "__self__", None), "transport", None)
        if isinstance(transport, asyncio.BaseTransport):
            transport.close()  # flushes what is buffered first
            return
        await self._exchange.send({"type": "websocket.close", "code": 1000})

    async def _abort(self, watcher: asyncio.Task[None]) -> None:
        await self._finish()

    async def _watch_disconnect(self) -> None:
        while True:
            message = await self._exchange.receive()
            if message["type"] == "websocket.disconnect":
                self._stream.signal(Signal.DISCONNECTED)
                return
