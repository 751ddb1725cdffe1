"""The loopback HTTP surface: agent feed, owner notify, health and Prometheus metrics.

Endpoints (DESIGN.md section 7; docs/http-api.md has the full contract):

- ``GET /v1/feed/<handle>``, ``POST /v1/feed/<handle>/ack``, ``GET /v1/feed/<handle>/wait``
- ``POST /v1/notify``
- ``GET /healthz``, ``GET /metrics`` (no token)

Invariants owned here:
- feed and notify need ``Authorization: Bearer <token>``: missing (or not Bearer) is 401, wrong is
  403, compared in constant time; with no token configured they are off (404). The token is never
  logged, echoed or included in any response;
- a handler error is a 500 ``{"error": "internal"}``: no stack trace, message or alert text leaves
  the process (debug mode is never on);
- blocking SQLite calls run in the thread pool; the long poll waits with `Doorbell.wait_async`
  (never a thread per waiter) and ends promptly, with 503, once `begin_shutdown` is called (`serve`
  calls it when its stop event is set) or when the client goes away;
- the feed is the same `FeedStore` the CLI uses, on the daemon's database file (WAL makes the
  concurrent writers safe), so HTTP, CLI and Python agents share one set of cursors.

`serve` runs uvicorn inside the caller's event loop with uvicorn's signal handling disabled: the
daemon owns SIGINT/SIGTERM and stops the server by setting an `asyncio.Event`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import math
import re
import threading
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Generator,
    Mapping,
    Sequence,
)
from pathlib import Path
from typing import Any, Final, TypeVar, cast

import structlog
import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp

from ntfy_intake.errors import FeedError, StoreError
from ntfy_intake.store.doorbell import Doorbell, WakeEvent
from ntfy_intake.store.feed import DEFAULT_CHANNEL, MAX_PAGE, Entry, FeedStore, JoinAt, check_name
from ntfy_intake.surfaces import http_limits, metrics
from ntfy_intake.surfaces import serve as _serve
from ntfy_intake.wire import jsonsafe

__all__ = [
    "DEFAULT_PAGE",
    "DEFAULT_WAIT_S",
    "MAX_NOTIFY_BODY",
    "MAX_NOTIFY_TEXT",
    "MAX_WAIT_S",
    "HealthCallback",
    "NotifyCallback",
    "begin_shutdown",
    "create_app",
    "serve",
]

NotifyCallback = Callable[[str, str], Awaitable[tuple[int, Mapping[str, Any]]]]
"""``await notify(text, idempotency_key)`` -> (HTTP status, JSON body), e.g. (202, {...})."""

HealthCallback = Callable[[], tuple[bool, Mapping[str, Any]]]
"""``health()`` -> (healthy, details); called on the event loop, so it must not block."""

MAX_WAIT_S: Final = 300.0
DEFAULT_WAIT_S: Final = 30.0
DEFAULT_PAGE: Final = 100
MAX_NOTIFY_TEXT: Final = 4000
MAX_NOTIFY_BODY: Final = 64 * 1024
MAX_ACK_BODY: Final = 4 * 1024

_KEY = re.compile(r"[\x21-\x7e]{1,200}")  # Idempotency-Key: printable ASCII, no spaces
_STOP_POLL_S = 0.05

log = structlog.get_logger("ntfy_intake.http_api")

T = TypeVar("T")


class _Reject(Exception):
    """Raised inside a handler to answer with a JSON error."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def _json(status: int, body: object, headers: Mapping[str, str] | None = None) -> Response:
    # ensure_ascii: untrusted alert text travels escaped, so no raw control or bidi character
    # reaches a client that prints the body.
    content = json.dumps(body, ensure_ascii=True, allow_nan=False)
    return Response(content, status, headers, media_type="application/json")


def _error(status: int, code: str, message: str | None = None, **headers: str) -> Response:
    body = {"error": code} if message is None else {"error": code, "message": message}
    return _json(status, body, {k.replace("_", "-"): v for k, v in headers.items()})


# -- the feed store, opened lazily on first use ---------------------------------------------------


class _Feed:
    """One `FeedStore` per app (its own lock serializes statements), used from the thread pool."""

    def __init__(self, db_path: Path) -> None:
        self._db_path = db_path
        self._store: FeedStore | None = None
        self._lock = threading.Lock()

    def _get(self) -> FeedStore:
        with self._lock:
            if self._store is None:
                self._store = FeedStore.open(self._db_path)
            return self._store

    async def run(self, call: Callable[[FeedStore], T]) -> T:
        return await run_in_threadpool(lambda: call(self._get()))

    def close(self) -> None:
        with self._lock:
            store, self._store = self._store, None
        if store is not None:
            store.close()


# -- request parsing ------------------------------------------------------------------------------


def _name(kind: str, value: str) -> str:
    try:
        return check_name(kind, value)
    except FeedError as exc:
        raise _Reject(400, f"bad_{kind}", str(exc)) from None


def _int_param(request: Request, name: str, *, lo: int, hi: int | None = None) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise _Reject(400, f"bad_{name}", f"{name} must be a non-negative integer")
    value = int(raw)
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise _Reject(400, f"bad_{name}", f"{name} must be {bound}")
    return value


def _join_at(request: Request) -> JoinAt:
    at = request.query_params.get("at", "head")
    if at not in ("head", "start"):
        raise _Reject(400, "bad_at", "at must be 'head' or 'start'")
    return cast(JoinAt, at)


def _channel_param(request: Request) -> str | None:
    channel = request.query_params.get("channel")
    return None if channel is None else _name("channel", channel)


def _timeout_param(request: Request) -> float:
    raw = request.query_params.get("timeout")
    if raw is None:
        return DEFAULT_WAIT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value >= 0 or math.isinf(value):
        raise _Reject(400, "bad_timeout", "timeout must be a number of seconds >= 0")
    return min(value, MAX_WAIT_S)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise _Reject(413, "body_too_large", f"at most {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _Reject(413, "body_too_large", f"at most {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _json_object(request: Request, limit: int) -> dict[str, Any]:
    raw = await _read_body(request, limit)
    try:
        # strict: a lone surrogate is refused (400) rather than stored as something the client
        # did not send; deep nesting, NaN and out-of-range numbers are 400s too, never 500s.
        body = jsonsafe.loads(raw, strict=True)
    except jsonsafe.BadJson as exc:
        raise _Reject(400, "bad_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _Reject(400, "bad_json", "the body must be a JSON object")
    return body


# -- auth -----------------------------------------------------------------------------------------


def _authorize(request: Request, token: str) -> Response | None:
    """None when the bearer token matches; else the 401/403 answer (never echoing anything)."""
    scheme, _, presented = request.headers.get("authorization", "").strip().partition(" ")
    presented = presented.strip()
    if scheme.lower() != "bearer" or not presented:
        return _error(
            401,
            "unauthorized",
            "send Authorization: Bearer <http.token>",
            WWW_Authenticate="Bearer",
        )
    if not hmac.compare_digest(presented.encode(), token.encode()):
        return _error(403, "forbidden", "the bearer token does not match")
    return None


# -- long-poll helpers ----------------------------------------------------------------------------


async def _race(
    wait: Coroutine[Any, Any, WakeEvent | None], stopping: threading.Event, request: Request
) -> WakeEvent | str | None:
    """The doorbell's outcome, or "stopping" / "gone" if the server stops or the client leaves.

    Cancelling the doorbell is always safe: it holds nothing and consumes nothing.
    """
    task = asyncio.ensure_future(wait)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_STOP_POLL_S)
            if done:
                return task.result()
            if stopping.is_set():
                return "stopping"
            if await request.is_disconnected():
                return "gone"
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


# -- the app --------------------------------------------------------------------------------------


def begin_shutdown(app: Starlette) -> None:
    """End the app's long polls now (they answer 503); `serve` calls this when asked to stop.

    Thread-safe, idempotent; a no-op for apps not made by `create_app`.
    """
    stopping = getattr(app.state, "stopping", None)
    if isinstance(stopping, threading.Event):
        stopping.set()


def create_app(
    *,
    db_path: Path,
    token: str | None,
    notify: NotifyCallback | None,
    health: HealthCallback,
    metrics_snapshot: metrics.Snapshot,
    max_long_polls: int = http_limits.Limits().max_long_polls,
    extra_routes: Sequence[BaseRoute] = (),
) -> Starlette:
    """The HTTP surface as an ASGI app (see the module docstring and docs/http-api.md).

    `health` and `metrics_snapshot` are called on the event loop, once per request: they must be
    cheap and non-blocking (read in-memory state). `notify` is awaited on the event loop. With
    `token` None (or empty) the feed and notify endpoints answer 404; with `notify` None the notify
    endpoint answers 404. `extra_routes` (the owner console's, surfaces/console) are served
    as they are: they do their own auth.
    """
    bearer = token or None
    feed = _Feed(Path(db_path))
    long_polls = [0]  # open waits, on the event loop only
    stopping = threading.Event()
    registry = metrics.registry_for(metrics_snapshot)

    def endpoint(
        name: str, handler: Callable[[Request], Awaitable[Response]], *, protected: bool
    ) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            if protected:
                if bearer is None:
                    return _error(404, "not_found")
                denied = _authorize(request, bearer)
                if denied is not None:
                    return denied
            try:
                return await handler(request)
            except _Reject as reject:
                return _error(reject.status, reject.code, reject.message)
            except StoreError:
                log.warning("http.store_unavailable", endpoint=name)
                return _error(
                    503, "store_unavailable", "the database is busy; retry", Retry_After="1"
                )
            except Exception as exc:  # noqa: BLE001 - answered as a bare 500, type logged
                log.error("http.handler_failed", endpoint=name, error_type=type(exc).__name__)
                return _json(500, {"error": "internal"})

        return wrapped

    # -- feed

    async def feed_read(request: Request) -> Response:
        handle = _name("handle", request.path_params["handle"])
        channel = _channel_param(request)
        at = _join_at(request)
        after = _int_param(request, "after", lo=0)
        limit = _int_param(request, "limit", lo=1, hi=MAX_PAGE)

        def read(store: FeedStore) -> list[Entry]:
            if after is None and limit is None:
                return store.catch_up(handle, channel=channel, at=at)
            name = channel or DEFAULT_CHANNEL
            store.subscribe(handle, name, at=at)
            return store.page(handle, name, after=after, limit=limit or DEFAULT_PAGE)

        entries = await feed.run(read)
        return _json(200, [entry.to_json() for entry in entries])

    async def feed_ack(request: Request) -> Response:
        handle = _name("handle", request.path_params["handle"])
        body = await _json_object(request, MAX_ACK_BODY)
        channel, seq = body.get("channel"), body.get("seq")
        if not isinstance(channel, str):
            raise _Reject(400, "bad_channel", "channel must be a string")
        _name("channel", channel)
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
            raise _Reject(400, "bad_seq", "seq must be a non-negative integer")
        try:
            cursor = await feed.run(lambda store: store.ack(handle, channel, seq))
        except FeedError as exc:
            text = str(exc)
            if "beyond head" in text:
                raise _Reject(409, "beyond_head", text) from None
            if "has not joined" in text:
                raise _Reject(409, "not_joined", text) from None
            raise _Reject(400, "bad_request", text) from None
        return _json(200, {"channel": channel, "cursor": cursor})

    async def feed_wait(request: Request) -> Response:
        handle = _name("handle", request.path_params["handle"])
        channel = _channel_param(request)
        at = _join_at(request)
        timeout = _timeout_param(request)

        def arm(store: FeedStore) -> Doorbell:
            # Join first, as every first feed call does: a ring for a handle without a cursor
            # would otherwise be lost when its catch-up then joins at the (later) head.
            if channel is not None:
                store.subscribe(handle, channel, at=at)
            elif not store.cursors(handle):
                store.subscribe(handle, DEFAULT_CHANNEL, at=at)
            return Doorbell(store, handle, channels=None if channel is None else [channel])

        if stopping.is_set():
            return _error(503, "shutting_down", "the server is stopping", Retry_After="1")
        if long_polls[0] >= max_long_polls:
            return _error(503, "busy", "too many open long polls; retry", Retry_After="1")
        long_polls[0] += 1
        try:
            bell = await feed.run(arm)
            outcome = await _race(bell.wait_async(timeout), stopping, request)
        finally:
            long_polls[0] -= 1
        if isinstance(outcome, WakeEvent):
            return _json(200, {"wake_line": outcome.wake_line})
        if outcome is None or outcome == "gone":
            return Response(status_code=204)
        return _error(503, "shutting_down", "the server is stopping", Retry_After="1")

    # -- notify

    async def notify_owner(request: Request) -> Response:
        if notify is None:
            return _error(404, "not_found")
        key = request.headers.get("idempotency-key", "").strip()
        if not key:
            raise _Reject(400, "missing_idempotency_key", "send an Idempotency-Key header")
        if not _KEY.fullmatch(key):
            raise _Reject(400, "bad_idempotency_key", "1-200 printable ASCII characters, no spaces")
        body = await _json_object(request, MAX_NOTIFY_BODY)
        text = body.get("text")
        if not isinstance(text, str) or not text.strip():
            raise _Reject(400, "bad_text", "text must be a non-empty string")
        if len(text) > MAX_NOTIFY_TEXT:
            raise _Reject(400, "text_too_long", f"text is limited to {MAX_NOTIFY_TEXT} characters")
        status, answer = await notify(text, key)
        if not isinstance(status, int) or not 200 <= status <= 599:
            raise TypeError("notify callback returned an invalid status")
        return _json(status, dict(answer))

    # -- health and metrics (no token)

    async def healthz(request: Request) -> Response:
        try:
            ok, details = health()
            body = {"status": "live" if ok else "unhealthy", **dict(details)}
        except Exception as exc:  # noqa: BLE001 - a failing check is an unhealthy answer
            log.error("http.health_failed", error_type=type(exc).__name__)
            ok, body = False, {"status": "unhealthy", "reason": "health check failed"}
        return _json(200 if ok else 503, body)

    async def metrics_endpoint(request: Request) -> Response:
        return Response(metrics.render(registry), media_type=metrics.CONTENT_TYPE)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _json(exc.status_code, {"error": code}, exc.headers)

    async def internal_error(request: Request, exc: Exception) -> Response:
        return _json(500, {"error": "internal"})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        stopping.clear()
        try:
            yield
        finally:
            stopping.set()
            await run_in_threadpool(feed.close)

    app = Starlette(
        debug=False,
        routes=[
            Route(
                "/v1/feed/{handle}",
                endpoint("feed_read", feed_read, protected=True),
                methods=["GET"],
            ),
            Route(
                "/v1/feed/{handle}/ack",
                endpoint("feed_ack", feed_ack, protected=True),
                methods=["POST"],
            ),
            Route(
                "/v1/feed/{handle}/wait",
                endpoint("feed_wait", feed_wait, protected=True),
                methods=["GET"],
            ),
            Route("/v1/notify", endpoint("notify", notify_owner, protected=True), methods=["POST"]),
            Route("/healthz", endpoint("healthz", healthz, protected=False), methods=["GET"]),
            Route(
                "/metrics", endpoint("metrics", metrics_endpoint, protected=False), methods=["GET"]
            ),
            *extra_routes,
        ],
        exception_handlers={HTTPException: http_error, Exception: internal_error},
        lifespan=lifespan,
    )
    app.state.stopping = stopping
    return app


# -- serving inside the daemon's event loop -------------------------------------------------------


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the daemon owns SIGINT/SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def serve(
    app: ASGIApp,
    host: str,
    port: int,
    stop: asyncio.Event,
    on_bound: Callable[[int], None] | None = None,
    *,
    graceful_timeout: int = 2,
    limits: http_limits.Limits | None = None,
) -> None:
    """Serve `app` on host:port in the running event loop until `stop` is set.

    The socket is bound before uvicorn starts (port 0 picks a free port); `on_bound(port)` runs
    once the server accepts connections. Connections are accepted by `http_limits.accept_loop`
    (uvicorn gets no listening socket of its own) and bounded by `limits`, shrunk to leave the
    daemon its descriptor reserve. When `stop` is set (or this coroutine is cancelled) the app's
    long polls end at once (`begin_shutdown`), in-flight requests get `graceful_timeout` seconds,
    and the rest are cancelled. A bind failure raises OSError before anything starts.
    """
    sock = _serve._bind(host, port)
    bound_port = int(sock.getsockname()[1])
    bounds = http_limits.current_limits(limits or http_limits.Limits())
    slots = asyncio.Semaphore(bounds.hard_cap)
    config = uvicorn.Config(
        app,
        log_config=None,
        log_level="warning",
        access_log=False,
        http=http_limits.protocol_class(bounds, slots.release),
        ws="none",
        lifespan="on",
        timeout_graceful_shutdown=graceful_timeout,
        server_header=False,
        backlog=bounds.backlog,
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[]), name=f"http-{bound_port}")
    stopper = asyncio.create_task(stop.wait(), name=f"http-{bound_port}-stop")
    acceptor: asyncio.Task[None] | None = None
    try:
        while not server.started and not task.done() and not stop.is_set():
            # uvicorn exposes startup only as a flag: poll it, waking early on exit or stop.
            await asyncio.wait({task, stopper}, timeout=0.005)
        if task.done():
            _raise_startup_failure(task)
        if server.started:
            sock.listen(bounds.backlog)
            loop = asyncio.get_running_loop()

            def make_protocol() -> asyncio.Protocol:
                return config.http_protocol_class(  # type: ignore[call-arg]
                    config=config,
                    server_state=server.server_state,
                    app_state=server.lifespan.state,
                    _loop=loop,
                )

            acceptor = asyncio.create_task(
                http_limits.accept_loop(sock, slots, make_protocol),
                name=f"http-{bound_port}-accept",
            )
            log.info(
                "http.listening",
                port=bound_port,
                max_connections=bounds.max_connections,
                max_long_polls=bounds.max_long_polls,
                header_timeout=bounds.header_timeout,
            )
            if on_bound is not None:
                on_bound(bound_port)
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        if acceptor is not None:
            acceptor.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await acceptor
        if isinstance(app, Starlette):
            begin_shutdown(app)
        server.should_exit = True
        if not task.done():
            done, _ = await asyncio.wait({task}, timeout=graceful_timeout + 3.0)
            if not done:
                server.force_exit = True
                await asyncio.wait({task}, timeout=3.0)
            if not task.done():
                task.cancel()
        try:
            await task
        except (asyncio.CancelledError, Exception, SystemExit) as exc:  # noqa: BLE001 - logged
            if not isinstance(exc, asyncio.CancelledError):
                log.error("http.server_failed", error_type=type(exc).__name__)
        finally:
            sock.close()


def _raise_startup_failure(task: asyncio.Task[None]) -> None:
    try:
        task.result()
    except SystemExit:  # uvicorn exits the process on a failed lifespan startup: not ours to do
        raise RuntimeError("the HTTP server failed to start") from None
    raise RuntimeError("the HTTP server stopped during startup")
