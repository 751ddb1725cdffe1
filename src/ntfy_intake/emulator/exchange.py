"""One request and its response, over HTTP or as a WebSocket handshake (raw ASGI).

Invariants owned here: every answer carries `Access-Control-Allow-Origin: *` and a
Content-Length (a Content-Type unless none is given, as ntfy's OPTIONS); an error is ntfy's JSON
body with its status, except on a WebSocket handshake, where ntfy writes the status only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from ntfy_intake.emulator import wire
from ntfy_intake.emulator.params import Params
from ntfy_intake.emulator.wire import NtfyError

if TYPE_CHECKING:
    from ntfy_intake.emulator.hub import Hub

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class Exchange:
    """One request and its response."""

    websocket = False

    def __init__(self, hub: Hub, scope: Scope, receive: Receive, send: Send) -> None:
        self.hub = hub
        self.method: str = scope.get("method", "GET")
        self.path: str = scope["path"]
        self.receive = receive
        self.send = send
        self.params = Params.from_asgi(scope["headers"], scope.get("query_string", b""))
        client = scope.get("client")
        self.visitor: str = client[0] if client else "0.0.0.0"  # noqa: S104 - a key, not a bind
        self.log_entry: dict[str, Any] | None = None
        self.started = False

    async def body(self) -> bytes:
        chunks: list[bytes] = []
        while True:
            message = await self.receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        if self.log_entry is not None:
            self.hub.update_log(self.log_entry, status=status)
        self.started = True
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def respond(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        content = [(b"content-type", content_type.encode())] if content_type else []
        await self.start(
            status,
            [
                *content,
                (b"access-control-allow-origin", b"*"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        )
        await self.send({"type": "http.response.body", "body": body})

    async def respond_json(self, value: Any, status: int = 200) -> None:
        await self.respond(status, (wire.go_json(value) + "\n").encode())

    async def fail(self, error: NtfyError, retry_after: int | None = None) -> None:
        if self.log_entry is not None:
            self.hub.update_log(self.log_entry, code=error.code)
        extra = () if retry_after is None else ((b"retry-after", str(retry_after).encode()),)
        await self.respond(error.http, error.body(), headers=extra)


class WebSocketExchange(Exchange):
    """A WebSocket handshake: until accepted, every answer is a bare status (ntfy writes no body
    for an error on a real handshake)."""

    websocket = True

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        if self.log_entry is not None:
            self.hub.update_log(self.log_entry, status=status)
        self.started = True
        await self.send({"type": "websocket.http.response.start", "status": status, "headers": []})

    async def respond(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        await self.start(status, [])
        await self.send({"type": "websocket.http.response.body", "body": b""})
