"""NtfyEmulator: start and stop the server (thread, current loop, or foreground), plus the
programmatic API tests use (publish without HTTP, inspect the cache, inject faults).

Invariants owned here:
- the listening socket is bound before the server starts, so `url` is known (port 0 allowed);
- stopping aborts every open stream first (as a dying server does), then lets uvicorn finish;
- uvicorn never installs signal handlers: `serve_forever` owns SIGINT/SIGTERM and exits cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import socket
import threading
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from time import monotonic, sleep
from typing import Any

import uvicorn

from ntfy_intake.testbed.emulator import wire
from ntfy_intake.testbed.emulator.app import EmulatorApp
from ntfy_intake.testbed.emulator.config import EmulatorConfig
from ntfy_intake.testbed.emulator.faults import Faults
from ntfy_intake.testbed.emulator.hub import Hub
from ntfy_intake.testbed.emulator.params import go_trim
from ntfy_intake.testbed.emulator.publish import DISALLOWED_TOPICS, TOPIC
from ntfy_intake.testbed.emulator.since import valid_message_id
from ntfy_intake.testbed.emulator.wire import Event

_STARTUP_TIMEOUT = 10.0
_STOP_TIMEOUT = 5.0


class NtfyEmulator:
    """A bundled ntfy-compatible server. See docs/emulator.md."""

    def __init__(self, config: EmulatorConfig | None = None) -> None:
        self.config = config or EmulatorConfig()
        self._hub = Hub(self.config)
        self.faults: Faults = self._hub.faults
        self._host = "127.0.0.1"
        self._port: int | None = None
        self._running = False

    # -- addresses ------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the emulator is not running")
        return self._port

    @property
    def url(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}"

    # -- the programmatic API -------------------------------------------------------------------
    def publish(
        self,
        topic: str,
        message: str = "",
        *,
        title: str = "",
        priority: int = 0,
        tags: Sequence[str] = (),
        cache: bool = True,
        time: int | None = None,
        message_id: str | None = None,
        click: str = "",
        icon: str = "",
        delay: float | None = None,
        sequence_id: str | None = None,
    ) -> dict[str, Any]:
        """Publish as `PUT /<topic>` would (thread-safe, no HTTP); returns the event object.

        `time` backdates or postdates the message (ntfy does this for slow uploads);
        `message_id` forces an id (the real server never repeats one; tests of a client's
        conflict handling may want it to). `delay` schedules it (any positive number of
        seconds, no 10 s minimum): it is cached unpublished with `time` = now + delay and
        delivered by the delayed sender. `sequence_id` (ntfy 2.16+) updates that sequence.
        """
        if TOPIC.fullmatch(topic) is None or topic in DISALLOWED_TOPICS:
            raise ValueError(f"invalid topic {topic!r}")
        if not 0 <= priority <= 5:
            raise ValueError(f"invalid priority {priority!r}")
        if message_id is not None and not valid_message_id(message_id):
            raise ValueError(f"invalid message id {message_id!r}")
        if delay is not None and (delay <= 0 or not cache):
            raise ValueError("a delay must be positive and needs the cache")
        if sequence_id is not None and TOPIC.fullmatch(sequence_id) is None:
            raise ValueError(f"invalid sequence id {sequence_id!r}")
        now = self._hub.now_s() if time is None else time
        if delay is not None:
            now = math.floor(self._hub.now() + delay)
        event_id = message_id or wire.new_id()
        event = Event(
            id=event_id,
            time=now,
            event=wire.MESSAGE,
            topic=topic,
            expires=int(now + self.config.cache_duration) if cache else 0,
            # A str may hold what no HTTP publish can: a lone surrogate is U+FFFD, as in Go.
            title=wire.go_string(title),
            message=wire.go_string(go_trim(message)) or wire.EMPTY_MESSAGE_BODY,
            priority=priority,
            tags=tuple(wire.go_string(tag) for tag in tags),
            click=wire.go_string(click),
            icon=wire.go_string(icon),
            sequence_id=(sequence_id or event_id) if self.config.sequences else "",
        )
        return self._hub.publish(event, cache=cache, delayed=delay is not None).to_dict()

    def send_delayed(self) -> list[str]:
        """Run ntfy's delayed sender now: deliver every scheduled message whose time has come
        (by the emulator's clock); returns their ids."""
        return self._hub.send_delayed()

    def messages(self, topic: str | None = None) -> list[dict[str, Any]]:
        """Cached messages in insertion order."""
        return self._hub.messages(topic)

    @property
    def subscribe_log(self) -> list[dict[str, Any]]:
        """One dict per subscribe request: time, path, query, params, auth, status, code, fault."""
        return self._hub.subscribe_log()

    def set_clock(self, clock: Callable[[], float]) -> None:
        self._hub.set_clock(clock)

    def advance(self, seconds: float) -> None:
        """Move the emulator's clock forward (on top of whatever clock it reads)."""
        self._hub.advance(seconds)

    def now(self) -> float:
        return self._hub.now()

    def prune(self) -> list[str]:
        """Run ntfy's pruning now; returns the ids deleted."""
        return self._hub.prune()

    def manage(self) -> list[str]:
        """One run of ntfy's manager now: prune, then sample the counter /v1/stats reads."""
        pruned = self._hub.prune()
        self._hub.sample_stats()
        return pruned

    def subscriber_count(self, topic: str | None = None) -> int:
        return self._hub.subscriber_count(topic)

    def wait_for_subscribers(
        self, n: int = 1, *, topic: str | None = None, timeout: float = 30.0
    ) -> None:
        """Block until at least n streams are open (not from the server's own loop)."""
        with self._hub.changed:
            if not self._hub.changed.wait_for(
                lambda: self._hub.subscriber_count(topic) >= n, timeout
            ):
                raise TimeoutError(f"fewer than {n} subscriber(s) after {timeout} s")

    async def wait_for_subscribers_async(self, n: int = 1, *, topic: str | None = None) -> None:
        """Wait until at least n streams are open; bound it with asyncio.timeout()."""
        # Polling, not an asyncio.Event: streams open and close on the server's loop, which may
        # be another thread's.
        while self._hub.subscriber_count(topic) < n:  # noqa: ASYNC110
            await asyncio.sleep(0.01)

    # -- lifecycle ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def running(self, host: str = "127.0.0.1", port: int = 0) -> Iterator[NtfyEmulator]:
        """Serve from a background thread with its own event loop."""
        server, sock = self._prepare(host, port)
        errors: list[BaseException] = []

        def target() -> None:
            try:
                asyncio.run(server.serve(sockets=[sock]))
            except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
                errors.append(exc)

        thread = threading.Thread(target=target, name=f"ntfy-emulator-{self._port}", daemon=True)
        thread.start()
        try:
            deadline = monotonic() + _STARTUP_TIMEOUT
            while not server.started:
                if errors or not thread.is_alive() or monotonic() > deadline:
                    raise RuntimeError("the emulator failed to start") from (
                        errors[0] if errors else None
                    )
                sleep(0.005)
            yield self
        finally:
            self._hub.abort_streams()
            server.should_exit = True
            thread.join(_STOP_TIMEOUT)
            if thread.is_alive():
                server.force_exit = True
                thread.join(_STOP_TIMEOUT)
            sock.close()
            self._running = False

    @contextlib.asynccontextmanager
    async def serving(self, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[NtfyEmulator]:
        """Serve on the running event loop (for tests that are coroutines)."""
        server, sock = self._prepare(host, port)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            async with asyncio.timeout(_STARTUP_TIMEOUT):
                while not server.started:
                    if task.done():
                        task.result()
                        raise RuntimeError("the emulator stopped while starting")
                    await asyncio.sleep(0.005)
            yield self
        finally:
            self._hub.abort_streams()
            server.should_exit = True
            await task
            sock.close()
            self._running = False

    async def serve_until_signal(self, host: str, port: int) -> None:
        """Serve until SIGINT or SIGTERM; prints one line with the URL once listening."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        signals = (signal.SIGINT, signal.SIGTERM)
        for sig in signals:
            loop.add_signal_handler(sig, stop.set)
        try:
            async with self.serving(host, port):
                print(f"ntfy-intake emulator listening on {self.url}", flush=True)
                await stop.wait()
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)

    def _prepare(self, host: str, port: int) -> tuple[_Server, socket.socket]:
        if self._running:
            raise RuntimeError("this emulator is already running")
        sock = _bind(host, port)
        self._running = True
        self._host, self._port = host, sock.getsockname()[1]
        config = uvicorn.Config(
            EmulatorApp(self._hub),
            http="h11",
            # ntfy pings every keepalive interval and drops a client that has not answered
            # within keepalive + 15 s; uvicorn's ping timeout counts from the ping.
            ws="websockets-sansio",
            ws_ping_interval=self.config.keepalive_interval,
            ws_ping_timeout=15.0,
            ws_max_size=64,  # ntfy reads at most 64 bytes per client frame (wsReadLimit)
            lifespan="on",
            loop="asyncio",
            log_config=None,
            server_header=False,
            timeout_graceful_shutdown=1,
        )
        return _Server(config), sock


class _Server(uvicorn.Server):
    """uvicorn that leaves signals to its caller and notices a stop request within 10 ms."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def main_loop(self) -> None:
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864_000
            await asyncio.sleep(0.01)


def serve_forever(host: str, port: int, config: EmulatorConfig) -> None:
    """Run the emulator in the foreground until SIGINT/SIGTERM (the `emulator` command).

    Prints one line with the URL once it is listening; returns normally on either signal.
    """
    asyncio.run(NtfyEmulator(config).serve_until_signal(host, port))


def _bind(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket. IPPROTO_TCP matters: only then does asyncio set TCP_NODELAY
    on accepted connections (without it a response written in two parts waits ~40 ms for the
    client's delayed ACK)."""
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock
