"""A loopback stand-in for signal-cli-rest-api (`POST /v2/send`, `GET /v1/about`).

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

Invariants owned here: every accepted send is recorded exactly once, thread-safely, in arrival
order, with only the recipients that actually got it in `recipients`; an injected failure or an
outage records nothing.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

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


def create_app(*, faults: SignalFaults | None = None, log: SentLog | None = None) -> Starlette:
    """The stand-in as an ASGI app; accepted sends go to `log` (also at `app.state.log`)."""
    faults = faults if faults is not None else SignalFaults()
    sent_log = log if log is not None else SentLog()
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
        sent_log.append(SentMessage(number, tuple(reached), message, now, tuple(failed)))
        stall = faults.take_stall()
        if stall is not None:
            await _serve.pause(stall, stopping)
        return JSONResponse({"timestamp": str(int(now * 1000)), **body}, 201)

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
            # Inspection, not part of the modelled API: it keeps answering while "down".
            Route("/_standin/messages", messages, methods=["GET"]),
        ]
    )

    app.state.log = sent_log
    app.state.faults = faults
    app.state.stopping = stopping
    return app


@dataclass(frozen=True)
class SignalHandle:
    url: str  # base URL: use as owner.signal_url (the daemon appends /v2/send)
    faults: SignalFaults
    log: SentLog

    def messages(self) -> list[SentMessage]:
        return self.log.snapshot()

    def reset(self) -> None:
        """Clear recorded sends and planned faults, so one running stand-in serves many tests."""
        self.faults.reset()
        self.log.clear()


@contextlib.contextmanager
def running(faults: SignalFaults | None = None) -> Iterator[SignalHandle]:
    """Run the stand-in on 127.0.0.1:<free port> in a background thread (tests, demo)."""
    faults = faults if faults is not None else SignalFaults()
    log = SentLog()
    app = create_app(faults=faults, log=log)
    with _serve.serving(app, on_stop=app.state.stopping.set) as base:
        yield SignalHandle(url=base, faults=faults, log=log)


def serve(host: str, port: int) -> None:
    """Run the stand-in in the foreground until SIGINT/SIGTERM."""
    app = create_app()

    def ready(base: str) -> None:
        print(
            f"signal stand-in: POST {base}/v2/send (sent: GET {base}/_standin/messages)", flush=True
        )

    _serve.serve_forever(app, host=host, port=port, on_ready=ready, on_stop=app.state.stopping.set)
