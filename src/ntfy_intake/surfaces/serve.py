"""Run an ASGI app under uvicorn on a real socket: in a background thread, or until a signal.

Used by the loopback stand-ins (triage receiver, Signal stand-in, ...) in tests, the demo and the
CLI. Invariants owned here:
- the listening socket is bound *before* the server starts, so port 0 yields a known port and the
  yielded URL is connectable as soon as the context manager yields;
- leaving `serving()` always stops the server and joins its thread (forcing exit after
  `stop_timeout`), so a test never leaks a listener;
- uvicorn never installs signal handlers or logging configuration of its own: `serve_forever`
  owns SIGINT/SIGTERM and returns normally on either, so a CLI command can exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

import uvicorn
from starlette.types import ASGIApp

LOOPBACK = "127.0.0.1"


def base_url(host: str, port: int) -> str:
    """The http:// base URL for a bound address (IPv6 literals bracketed)."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets it knows are TCP, and
    # without it a response written in two parts waits ~40 ms for the peer's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


@contextlib.contextmanager
def serving(
    app: ASGIApp,
    *,
    host: str = LOOPBACK,
    port: int = 0,
    graceful_timeout: int = 1,
    startup_timeout: float = 10.0,
    stop_timeout: float = 5.0,
    on_stop: Callable[[], None] | None = None,
) -> Iterator[str]:
    """Serve `app` in a background thread; yield its base URL (``http://127.0.0.1:PORT``).

    On exit `on_stop` runs first (wake anything the app is deliberately stalling in), then the
    server stops accepting, gives in-flight requests `graceful_timeout` seconds and cancels the
    rest; the thread is joined before this returns.
    """
    sock = _bind(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    config = uvicorn.Config(
        app,
        log_config=None,
        log_level="warning",
        access_log=False,
        http="h11",
        loop="asyncio",
        lifespan="auto",
        timeout_graceful_shutdown=graceful_timeout,
    )
    server = uvicorn.Server(config)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # noqa: BLE001 - reported to the caller's thread below
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"serve-{bound_port}", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + startup_timeout
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(
                    f"server on {base_url(bound_host, bound_port)} failed to start"
                ) from (failure[0] if failure else None)
            time.sleep(0.005)
        yield base_url(bound_host, bound_port)
    finally:
        if on_stop is not None:
            on_stop()
        server.should_exit = True
        thread.join(stop_timeout)
        if thread.is_alive():
            server.force_exit = True
            thread.join(stop_timeout)
        sock.close()


def serve_forever(
    app: ASGIApp,
    *,
    host: str,
    port: int,
    on_ready: Callable[[str], None] | None = None,
    graceful_timeout: int = 1,
    on_stop: Callable[[], None] | None = None,
) -> None:
    """Serve `app` until SIGINT or SIGTERM, then stop cleanly and return.

    Must be called from the main thread. `on_ready` receives the base URL once it is connectable
    (print your one-line banner there).
    """
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with serving(
            app, host=host, port=port, graceful_timeout=graceful_timeout, on_stop=on_stop
        ) as url:
            if on_ready is not None:
                on_ready(url)
            while not stop.wait(0.5):
                pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# -- small helpers for fault-injecting stand-ins --------------------------------------------------


def retry_after_value(seconds: float) -> str:
    """A Retry-After value. RFC 9110 wants whole seconds; fractions are a test convenience."""
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:g}"


async def pause(seconds: float, until: threading.Event) -> None:
    """Sleep `seconds` without blocking the loop, ending early once `until` is set (server stop)."""
    deadline = time.monotonic() + seconds
    while not until.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        await asyncio.sleep(min(remaining, 0.02))
