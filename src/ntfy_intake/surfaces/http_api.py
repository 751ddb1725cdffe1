"""The loopback HTTP surface: agent feed, owner notify, health and Prometheus metrics.

Endpoints (DESIGN.md section 7; docs/http-api.md has the full contract):

- ``GET /v1/feed/<handle>``, ``POST /v1/feed/<handle>/ack``, ``GET /v1/feed/<handle>/wait``
- ``POST /v1/notify``
- ``GET /healthz``, ``GET /metrics`` (no token)

Invariants owned here:
- feed and notify need ``Authorization: Bearer <token>``: missing (or not Bearer) is 401, wrong is
  403, compared in constant time; with no token configured they are off (404). The token is never
  logged, echoed or included in any response;
- every token check (bearer and the console's login) goes through one `LoginGuard` per app
  (`app.state.login_guard`): 5 wrong tokens in a minute from an address hold it (429 with
  Retry-After, doubling up to 15 min), and the owner hears once per episode (`login_notice`);
- a request whose ``Host`` is not a name this daemon answers to (`host_allowed`) is refused with
  421 before any route sees it, so a DNS-rebinding page cannot reach the feed or the console;
  `/healthz` and `/metrics` carry no secret and answer any Host (monitoring scrapes them by
  whatever name it knows the box by);
- a handler error is a 500 ``{"error": "internal"}``: no stack trace, message or alert text leaves
  the process (debug mode is never on);
- blocking SQLite calls run in the thread pool; the long poll waits with `Doorbell.wait_async`
  (never a thread per waiter) and ends promptly, with 503, once `begin_shutdown` is called (`serve`
  calls it when its stop event is set) or when the client goes away;
- the feed is the same `FeedStore` the CLI uses, on the daemon's database file (WAL makes the
  concurrent writers safe), so HTTP, CLI and Python agents share one set of cursors.

`serve` runs uvicorn inside the caller's event loop with uvicorn's signal handling disabled: the
daemon owns SIGINT/SIGTERM and stops the server by setting an `asyncio.Event`.

The feed's three routes are `http_feed.py`; what every endpoint shares (JSON answers, refusals,
bounded bodies, the bearer check) is `http_requests.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import re
import threading
import urllib.parse
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Mapping,
    Sequence,
)
from typing import Any, Final, TypedDict

import structlog
import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ntfy_intake.errors import StoreError
from ntfy_intake.settings import Settings
from ntfy_intake.store import db
from ntfy_intake.surfaces import http_limits, metrics
from ntfy_intake.surfaces import serve as _serve
from ntfy_intake.surfaces.http_feed import DEFAULT_PAGE, DEFAULT_WAIT_S, MAX_WAIT_S, FeedRoutes
from ntfy_intake.surfaces.http_requests import (
    LoginGuard,
    NoticeSink,
    Reject,
    authorize,
    error,
    json_object,
    json_response,
)
from ntfy_intake.surfaces.http_server import QuietServer

# The feed's bounds (defined in http_feed) stay part of the surface's documented names.
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
    "from_settings",
    "host_allowed",
    "serve",
    "trusted_hosts",
]

NotifyCallback = Callable[[str, str], Awaitable[tuple[int, Mapping[str, Any]]]]
"""``await notify(text, idempotency_key)`` -> (HTTP status, JSON body), e.g. (202, {...})."""

HealthCallback = Callable[[], tuple[bool, Mapping[str, Any]]]
"""``health()`` -> (healthy, details); called on the event loop, so it must not block."""

MAX_NOTIFY_TEXT: Final = 4000
MAX_NOTIFY_BODY: Final = 64 * 1024

_KEY = re.compile(r"[\x21-\x7e]{1,200}")  # Idempotency-Key: printable ASCII, no spaces

log = structlog.get_logger("ntfy_intake.http_api")


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
    db_path: db.Target,
    token: str | None,
    notify: NotifyCallback | None,
    health: HealthCallback,
    metrics_snapshot: metrics.Snapshot,
    max_long_polls: int = http_limits.Limits().max_long_polls,
    extra_routes: Sequence[BaseRoute] = (),
    login_notice: NoticeSink | None = None,
    hosts: Collection[str] = (),
) -> Starlette:
    """The HTTP surface as an ASGI app (see the module docstring and docs/http-api.md).

    `health` and `metrics_snapshot` are called on the event loop, once per request: they must be
    cheap and non-blocking (read in-memory state). `notify` is awaited on the event loop. With
    `token` None (or empty) the feed and notify endpoints answer 404; with `notify` None the notify
    endpoint answers 404. `extra_routes` (the owner console's, surfaces/console) are served
    as they are: they do their own auth, through `app.state.login_guard`. `login_notice`
    records the owner's notice when failed logins start a hold (None: logged only, as on a
    standby, which cannot write). `hosts`: the names besides loopback's that requests may
    carry in `Host` (`trusted_hosts(settings)`); IP literals are always accepted.
    """
    bearer = token or None
    guard = LoginGuard(login_notice)
    stopping = threading.Event()
    feed = FeedRoutes(db_path, stopping, max_long_polls)
    registry = metrics.registry_for(metrics_snapshot)

    def endpoint(
        name: str, handler: Callable[[Request], Awaitable[Response]], *, protected: bool
    ) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            if protected:
                if bearer is None:
                    return error(404, "not_found")
                denied = authorize(request, bearer, guard)
                if denied is not None:
                    return denied
            try:
                return await handler(request)
            except Reject as reject:
                return error(reject.status, reject.code, reject.message)
            except StoreError:
                log.warning("http.store_unavailable", endpoint=name)
                return error(
                    503, "store_unavailable", "the database is busy; retry", Retry_After="1"
                )
            except Exception as exc:  # noqa: BLE001 - answered as a bare 500, type logged
                log.error("http.handler_failed", endpoint=name, error_type=type(exc).__name__)
                return json_response(500, {"error": "internal"})

        return wrapped

    # -- notify

    async def notify_owner(request: Request) -> Response:
        if notify is None:
            return error(404, "not_found")
        key = request.headers.get("idempotency-key", "").strip()
        if not key:
            raise Reject(400, "missing_idempotency_key", "send an Idempotency-Key header")
        if not _KEY.fullmatch(key):
            raise Reject(400, "bad_idempotency_key", "1-200 printable ASCII characters, no spaces")
        body = await json_object(request, MAX_NOTIFY_BODY)
        text = body.get("text")
        if not isinstance(text, str) or not text.strip():
            raise Reject(400, "bad_text", "text must be a non-empty string")
        if len(text) > MAX_NOTIFY_TEXT:
            raise Reject(400, "text_too_long", f"text is limited to {MAX_NOTIFY_TEXT} characters")
        status, answer = await notify(text, key)
        if not isinstance(status, int) or not 200 <= status <= 599:
            raise TypeError("notify callback returned an invalid status")
        return json_response(status, dict(answer))

    # -- health and metrics (no token)

    async def healthz(request: Request) -> Response:
        try:
            ok, details = health()
            body = {"status": "live" if ok else "unhealthy", **dict(details)}
        except Exception as exc:  # noqa: BLE001 - a failing check is an unhealthy answer
            log.error("http.health_failed", error_type=type(exc).__name__)
            ok, body = False, {"status": "unhealthy", "reason": "health check failed"}
        return json_response(200 if ok else 503, body)

    async def metrics_endpoint(request: Request) -> Response:
        return Response(metrics.render(registry), media_type=metrics.CONTENT_TYPE)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return json_response(exc.status_code, {"error": code}, exc.headers)

    async def internal_error(request: Request, exc: Exception) -> Response:
        return json_response(500, {"error": "internal"})

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
                endpoint("feed_read", feed.read, protected=True),
                methods=["GET"],
            ),
            Route(
                "/v1/feed/{handle}/ack",
                endpoint("feed_ack", feed.ack, protected=True),
                methods=["POST"],
            ),
            Route(
                "/v1/feed/{handle}/wait",
                endpoint("feed_wait", feed.wait, protected=True),
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
        middleware=[Middleware(_HostCheck, names=frozenset(n.lower() for n in hosts))],
    )
    app.state.stopping = stopping
    app.state.login_guard = guard
    return app


class FromSettings(TypedDict):
    db_path: db.Target
    token: str | None
    hosts: frozenset[str]


def from_settings(settings: Settings) -> FromSettings:
    """`create_app`'s arguments that the settings decide: `create_app(**from_settings(s), ...)`."""
    return {
        "db_path": settings.state.store,
        "token": settings.http.token,
        "hosts": trusted_hosts(settings),
    }


# -- the Host check (DNS rebinding) ---------------------------------------------------------------

_ANY_HOST = frozenset({"/healthz", "/metrics"})


def trusted_hosts(settings: Settings) -> frozenset[str]:
    """The names this node answers to besides loopback's: the listen host, `http.public_url`'s
    host and `cluster.url`'s (where a standby's console sends the owner)."""
    names = {settings.http.host}
    for url in (settings.http.public_url, settings.cluster.url):
        if url:
            names.add(urllib.parse.urlsplit(url).hostname or "")
    return frozenset(n.lower().rstrip(".") for n in names if n)


def host_allowed(host: str | None, names: Collection[str]) -> bool:
    """Whether a `Host` header names this daemon.

    Why IP literals pass: DNS rebinding needs a name the attacker's DNS answers; a browser that
    sends `Host: 192.168.1.5:8788` loaded its page from that address, which is this daemon, so
    the same-origin policy already keeps other sites' pages out. `localhost` and `*.localhost`
    are loopback by RFC 6761 and resolved so by browsers. A request without a Host header
    (HTTP/1.0, no browser sends it) passes. The port is not compared: behind a reverse proxy the
    public port differs, and a rebinding page's port never helps it (the name does)."""
    if host is None:
        return True
    host = host.strip().lower()
    if host.startswith("["):
        name, bracket, rest = host[1:].partition("]")
        port = rest.removeprefix(":")
        if not bracket or (rest and (not rest.startswith(":") or not port.isdigit())):
            return False
    else:
        name, _, port = host.rpartition(":") if host.count(":") == 1 else (host, "", "")
        if port and not port.isdigit():
            return False
    name = name.rstrip(".")
    if not name:
        return False
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(name)
        return True
    return name == "localhost" or name.endswith(".localhost") or name in names


class _HostCheck:
    """Pure ASGI: refuse (421) a request for a name this daemon is not, before any route."""

    def __init__(self, app: ASGIApp, names: frozenset[str]) -> None:
        self.app = app
        self.names = names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in _ANY_HOST:
            host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), None)
            if not host_allowed(host, self.names):
                log.warning("http.wrong_host", path=scope["path"][:100])
                answer = error(
                    421,
                    "wrong_host",
                    "this daemon does not answer to that host name; "
                    "set http.public_url to the address you use",
                )
                await answer(scope, receive, send)
                return
        await self.app(scope, receive, send)


# -- serving inside the daemon's event loop -------------------------------------------------------


# uvicorn without its signal handlers (the daemon owns SIGINT/SIGTERM), and no 100 ms tick.
_Server = QuietServer


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
