"""A loopback stand-in for signal-cli-rest-api (`POST /v2/send`, `GET /v1/about`, and the
receive API, `GET /v1/receive/<number>` over HTTP and over a WebSocket).

It models the parts of the real API the owner channel must survive:
- success is 201 `{"timestamp": "<ms>"}`; most failures are 400 `{"error": ...}`; 429 when rate
  limited;
- a partial failure is still 201, with the failed recipients listed under `errors`
  (`[{"recipient": ..., "error": ...}]`). Real versions differ here: some list failures in another
  shape, some (json-rpc mode, bbernhard/signal-cli-rest-api#871) drop them and answer a bare
  timestamp. So a client treats any listed recipient as failed, and `listed=False` models the
  silent kind;
- there is no idempotency key: a request that stalls past the client's timeout was still sent, and
  a retry sends it again (both are recorded).

The receive side (bbernhard/signal-cli-rest-api, src/api/api.go `Receive`; envelope fields from
AsamK/signal-cli src/main/java/org/asamk/signal/json/: JsonMessageEnvelope.java,
JsonDataMessage.java, JsonQuote.java):
- normal/native mode: `GET /v1/receive/<number>` answers 200 with a JSON array of
  `{"envelope": {...}, "account": "<number>"}` and the messages it returns are gone (signal-cli
  `receive` acknowledges them to the Signal server): nothing is kept for a second call;
- json-rpc mode: the same path is a WebSocket that pushes one such object per text frame while a
  client is connected; what arrives with no client connected is lost in the real API. The
  stand-in keeps it queued until some reader takes it (a test injects before it connects), and
  serves both modes at once (the real one serves one per mode);
- an envelope: `source`, `sourceNumber`, `sourceUuid`, `sourceName`, `sourceDevice`,
  `timestamp` (ms, the sender's), `serverReceivedTimestamp`, and `dataMessage` {`timestamp`,
  `message`, `expiresInSeconds`, `viewOnce`, `quote` {`id` (the quoted message's timestamp),
  `author`, `authorNumber`, `authorUuid`, `text`, `attachments`}}.
Tests put the owner's (or a stranger's) replies in with `ReceiveQueue.inject` (or
`POST /_standin/inject/<number>`); the send's 201 timestamp is what a reply quotes.

Invariants owned here: every accepted send is recorded exactly once, thread-safely, in arrival
order, with only the recipients that actually got it in `recipients`; an injected failure or an
outage records nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from ntfy_intake.surfaces import serve as _serve

Endpoint = Callable[[Request], Awaitable[Response]]

ABOUT = {
    "versions": ["v1", "v2"],
    "build": 2,
    "mode": "normal",
    "version": "0.0-standin",
    "capabilities": {"v2/send": ["quotes", "mentions"]},
}


@dataclass(frozen=True)
class SentMessage:
    number: str
    recipients: tuple[str, ...]  # the recipients it reached
    message: str
    at: float
    failed: tuple[str, ...] = ()  # recipients the request named that did not get it
    timestamp: int = 0  # the ms timestamp the 201 answered: what a reply's quote.id names


class SentLog:
    """Thread-safe, append-only record of accepted sends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sent: list[SentMessage] = []

    def append(self, sent: SentMessage) -> None:
        with self._lock:
            self._sent.append(sent)

    def snapshot(self) -> list[SentMessage]:
        with self._lock:
            return list(self._sent)

    def clear(self) -> None:
        with self._lock:
            self._sent.clear()


class Clock:
    """Signal timestamps in ms, strictly increasing: two sends in one millisecond would
    otherwise share the id a quoting reply names."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = 0

    def next_ms(self) -> int:
        with self._lock:
            self._last = max(self._last + 1, int(time.time() * 1000))
            return self._last


class ReceiveQueue:
    """What `GET /v1/receive/<number>` (and the WebSocket) will hand out, per account number.
    A read removes what it returns, as the real receive does."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._lock = threading.Lock()
        self._queues: dict[str, deque[dict[str, Any]]] = {}
        self.clock = clock if clock is not None else Clock()
        self.taken = 0  # envelopes handed out so far (HTTP and WebSocket)

    def inject(
        self,
        number: str,
        source: str,
        message: str,
        *,
        quote: int | None = None,
        quote_author: str | None = None,
        source_uuid: str | None = None,
        timestamp: int | None = None,
    ) -> dict[str, Any]:
        """Queue a data message from `source` to account `number`; `quote` is the timestamp of
        the message it replies to. Returns the item as the API will serve it."""
        ts = timestamp if timestamp is not None else self.clock.next_ms()
        data: dict[str, Any] = {
            "timestamp": ts,
            "message": message,
            "expiresInSeconds": 0,
            "viewOnce": False,
        }
        if quote is not None:
            author = quote_author or number
            data["quote"] = {
                "id": quote,
                "author": author,
                "authorNumber": author,
                "authorUuid": str(uuid.uuid5(uuid.NAMESPACE_URL, author)),
                "text": "",
                "attachments": [],
            }
        envelope = {
            "source": source,
            "sourceNumber": source,
            "sourceUuid": source_uuid or str(uuid.uuid5(uuid.NAMESPACE_URL, source)),
            "sourceName": "",
            "sourceDevice": 1,
            "timestamp": ts,
            "serverReceivedTimestamp": ts + 5,
            "serverDeliveredTimestamp": ts + 6,
            "dataMessage": data,
        }
        item = {"envelope": envelope, "account": number}
        self.put(number, item)
        return item

    def put(self, number: str, item: dict[str, Any]) -> None:
        """Queue an item as given (a replay of one already served, a malformed one)."""
        with self._lock:
            self._queues.setdefault(number, deque()).append(item)

    def take(self, number: str, limit: int | None = None) -> list[dict[str, Any]]:
        with self._lock:
            queue = self._queues.get(number)
            out: list[dict[str, Any]] = []
            while queue and (limit is None or len(out) < limit):
                out.append(queue.popleft())
            self.taken += len(out)
            return out

    def pending(self, number: str) -> int:
        with self._lock:
            return len(self._queues.get(number, ()))

    def clear(self) -> None:
        with self._lock:
            self._queues.clear()
            self.taken = 0


@dataclass
class _Partial:
    recipients: tuple[str, ...]
    listed: bool


@dataclass
class SignalFaults:
    """Thread-safe fault plan for `/v2/send`, consumed one request at a time."""

    _lock: threading.Lock = field(init=False, default_factory=threading.Lock, repr=False)
    _failures: deque[tuple[int, float | None]] = field(init=False, default_factory=deque)
    _partials: deque[_Partial] = field(init=False, default_factory=deque)
    _stalls: deque[float] = field(init=False, default_factory=deque)
    _down: bool = field(init=False, default=False)

    def fail_next(self, n: int = 1, status: int = 400, retry_after: float | None = None) -> None:
        """Answer the next `n` sends with `status` (400, 429, 500, ...); nothing is sent."""
        with self._lock:
            self._failures.extend([(status, retry_after)] * n)

    def partial_failure_next(
        self, n: int = 1, recipients: Sequence[str] = (), *, listed: bool = True
    ) -> None:
        """The next `n` sends fail for `recipients` (default: each request's last recipient) and
        still answer 201; `listed=False` leaves them out of the body, as some versions do."""
        with self._lock:
            self._partials.extend([_Partial(tuple(recipients), listed)] * n)

    def stall_next(self, n: int, seconds: float) -> None:
        """Accept and record the next `n` sends, then wait `seconds` before answering 201."""
        with self._lock:
            self._stalls.extend([seconds] * n)

    def down(self, is_down: bool = True) -> None:
        """While down, every signal-cli-rest-api request is answered 503 (outage drills)."""
        with self._lock:
            self._down = is_down

    def reset(self) -> None:
        """Forget every planned fault and come back up."""
        with self._lock:
            self._failures.clear()
            self._partials.clear()
            self._stalls.clear()
            self._down = False

    def is_down(self) -> bool:
        with self._lock:
            return self._down

    def take_failure(self) -> tuple[int, float | None] | None:
        with self._lock:
            return self._failures.popleft() if self._failures else None

    def take_partial(self) -> _Partial | None:
        with self._lock:
            return self._partials.popleft() if self._partials else None

    def take_stall(self) -> float | None:
        with self._lock:
            return self._stalls.popleft() if self._stalls else None


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"error": message}, status, headers)


def _parse_send(raw: bytes) -> tuple[str, list[str], str] | str:
    """(number, recipients, message) from a send body, or why it is a 400."""
    try:
        body = json.loads(raw)
    except ValueError:
        return "Couldn't process request - invalid request"
    if not isinstance(body, dict):
        return "Couldn't process request - invalid request"
    number, recipients, message = body.get("number"), body.get("recipients"), body.get("message")
    if not isinstance(number, str) or not number:
        return "Couldn't process request - number missing"
    if (
        not isinstance(recipients, list)
        or not recipients
        or not all(isinstance(r, str) and r for r in recipients)
    ):
        return "Couldn't process request - please provide at least one recipient"
    if not isinstance(message, str):
        return "Couldn't process request - message missing"
    if body.get("text_mode", "normal") not in ("normal", "styled"):
        return "Couldn't process request - invalid text mode"
    return number, recipients, message


def create_app(
    *,
    faults: SignalFaults | None = None,
    log: SentLog | None = None,
    inbox: ReceiveQueue | None = None,
) -> Starlette:
    """The stand-in as an ASGI app; accepted sends go to `log` (also at `app.state.log`), what
    the receive API serves comes from `inbox` (`app.state.inbox`)."""
    faults = faults if faults is not None else SignalFaults()
    sent_log = log if log is not None else SentLog()
    inbox = inbox if inbox is not None else ReceiveQueue()
    stopping = threading.Event()

    async def send(request: Request) -> Response:
        failure = faults.take_failure()
        if failure is not None:
            status, retry_after = failure
            headers = None
            if retry_after is not None:
                headers = {"Retry-After": _serve.retry_after_value(retry_after)}
            reason = "rate limit exceeded" if status == 429 else "injected failure"
            return _error(status, f"Failed to send message: {reason}", headers)
        parsed = _parse_send(await request.body())
        if isinstance(parsed, str):
            return _error(400, parsed)
        number, recipients, message = parsed
        body: dict[str, object] = {}
        partial = faults.take_partial()
        failed: list[str] = []
        if partial is not None:
            wanted = set(partial.recipients) if partial.recipients else {recipients[-1]}
            failed = [r for r in recipients if r in wanted]
        reached = [r for r in recipients if r not in failed]
        if not reached:  # nobody got it: the real API reports this as an error
            return _error(400, f"Failed to send message: untrusted identity for {failed[0]}")
        if failed and partial is not None and partial.listed:
            body["errors"] = [{"recipient": r, "error": "UntrustedIdentity"} for r in failed]
        now = time.time()
        ts = inbox.clock.next_ms()
        sent_log.append(SentMessage(number, tuple(reached), message, now, tuple(failed), ts))
        stall = faults.take_stall()
        if stall is not None:
            await _serve.pause(stall, stopping)
        # The real API answers the timestamp as a string (api.go: SendMessageResponse).
        return JSONResponse({"timestamp": str(ts), **body}, 201)

    async def receive(request: Request) -> Response:
        # ASCII with escapes, as a JSON server may send them: a lone surrogate escape in an
        # injected reply reaches the daemon as the hostile input it is (JSONResponse's UTF-8
        # cannot encode one and would answer 500).
        body = json.dumps(inbox.take(request.path_params["number"]), ensure_ascii=True)
        return Response(body, media_type="application/json")

    async def receive_ws(websocket: WebSocket) -> None:
        # json-rpc mode: one object per text frame, pushed as it arrives.
        if faults.is_down():
            await websocket.close(code=1011)
            return
        number = websocket.path_params["number"]
        await websocket.accept()
        try:
            while not stopping.is_set() and not faults.is_down():
                for item in inbox.take(number, limit=1):
                    await websocket.send_text(json.dumps(item))
                    break
                else:
                    await asyncio.sleep(0.02)
            await websocket.close(code=1011 if faults.is_down() else 1001)
        except (WebSocketDisconnect, RuntimeError):
            return

    async def inject(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
            item = inbox.inject(
                request.path_params["number"],
                str(body["source"]),
                str(body["message"]),
                quote=None if body.get("quote") is None else int(body["quote"]),
                source_uuid=body.get("source_uuid"),
            )
        except (ValueError, KeyError, TypeError) as exc:
            return _error(400, f"bad injection: {exc}")
        return JSONResponse(item, 201)

    async def about(request: Request) -> Response:
        return JSONResponse(ABOUT)

    async def messages(request: Request) -> Response:
        return JSONResponse([asdict(m) for m in sent_log.snapshot()])

    def unless_down(endpoint: Endpoint) -> Endpoint:
        async def guarded(request: Request) -> Response:
            if faults.is_down():
                return _error(503, "Service Unavailable (stand-in is down)")
            return await endpoint(request)

        return guarded

    app = Starlette(
        routes=[
            Route("/v2/send", unless_down(send), methods=["POST"]),
            Route("/v1/about", unless_down(about), methods=["GET"]),
            Route("/v1/receive/{number}", unless_down(receive), methods=["GET"]),
            WebSocketRoute("/v1/receive/{number}", receive_ws),
            # Inspection and injection, not part of the modelled API: they answer while "down".
            Route("/_standin/messages", messages, methods=["GET"]),
            Route("/_standin/inject/{number}", inject, methods=["POST"]),
        ]
    )

    app.state.log = sent_log
    app.state.inbox = inbox
    app.state.faults = faults
    app.state.stopping = stopping
    return app


@dataclass(frozen=True)
class SignalHandle:
    url: str  # base URL: use as owner.signal_url (the daemon appends /v2/send)
    faults: SignalFaults
    log: SentLog
    inbox: ReceiveQueue

    def messages(self) -> list[SentMessage]:
        return self.log.snapshot()

    def reset(self) -> None:
        """Clear recorded sends, queued replies and planned faults, so one running stand-in
        serves many tests."""
        self.faults.reset()
        self.log.clear()
        self.inbox.clear()


@contextlib.contextmanager
def running(faults: SignalFaults | None = None) -> Iterator[SignalHandle]:
    """Run the stand-in on 127.0.0.1:<free port> in a background thread (tests, demo)."""
    faults = faults if faults is not None else SignalFaults()
    log = SentLog()
    inbox = ReceiveQueue()
    app = create_app(faults=faults, log=log, inbox=inbox)
    with _serve.serving(app, on_stop=app.state.stopping.set) as base:
        yield SignalHandle(url=base, faults=faults, log=log, inbox=inbox)


def serve(host: str, port: int) -> None:
    """Run the stand-in in the foreground until SIGINT/SIGTERM."""
    app = create_app()

    def ready(base: str) -> None:
        print(
            f"signal stand-in: POST {base}/v2/send (sent: GET {base}/_standin/messages)", flush=True
        )

    _serve.serve_forever(app, host=host, port=port, on_ready=ready, on_stop=app.state.stopping.set)
