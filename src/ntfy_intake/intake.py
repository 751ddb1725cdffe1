"""The ntfy subscription: one streaming connection for all topics, reconnected forever.

This module owns the connection rules of DESIGN.md section 3 and nothing else: it reads frames
off the socket and hands them, tagged with when they were read and on which connection, to a sink
(the daemon's queue). It never touches the database; the cursor comes from a callback.

- Only a 400 to a request that carries a cursor drops the cursor (`on_rejected_cursor`).
  401/403, 429 (Retry-After honoured), 5xx, timeouts and resets keep it and back off.
- Keepalive watchdog: no complete frame within `keepalive_timeout` drops the connection, even if
  bytes trickle in (the deadline moves only when a whole line arrives).
- Gap probe: before resuming from a message id, `poll=1&since=all&id=<cursor>` asks whether the
  server still holds it. If not, the stream replays the whole cache, and the window between the
  cursor's time and the oldest message still held may have been lost: it is reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx
import structlog

from ntfy_intake import backoff, frames
from ntfy_intake.cursor import Cursor
from ntfy_intake.frames import Junk, Message

log = structlog.get_logger("ntfy_intake.intake")


@dataclass(frozen=True, slots=True)
class Received:
    frame: Message | Junk
    read_at: float  # monotonic
    generation: int


@dataclass(frozen=True, slots=True)
class GapFound:
    """The server no longer holds the cursor message: what lies in the window may be lost."""

    cursor: Cursor
    window_start: int
    window_end: int


@dataclass(slots=True)
class IntakeHealth:
    """Shared, in-memory view of the connection for status, metrics and the systemd watchdog."""

    state: str = "starting"  # connecting | live | backoff | stopped
    last_frame_at: float | None = None  # monotonic
    last_frame_wall: float | None = None
    connected_at: float | None = None
    last_attempt_at: float | None = None
    next_attempt_due: float | None = None
    attempts: int = 0
    connections: int = 0
    watchdog_drops: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    last_error: str | None = None


@dataclass(frozen=True, slots=True)
class IntakeConfig:
    base_url: str
    topics: tuple[str, ...]
    token: str | None
    keepalive_timeout: float
    backoff_base: float = 1.0
    backoff_cap: float = 60.0
    connect_timeout: float = 10.0


class _StatusFailure(Exception):
    def __init__(self, status: int, retry_after: float | None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.retry_after = retry_after


class _WatchdogExpired(Exception):
    pass


class Intake:
    def __init__(
        self,
        config: IntakeConfig,
        client: httpx.AsyncClient,
        *,
        sink: Callable[[Received | GapFound], None],
        current_cursor: Callable[[], Awaitable[Cursor]],
        on_rejected_cursor: Callable[[Cursor, str], Awaitable[None]],
        new_generation: Callable[[], int],
        health: IntakeHealth,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.config = config
        self.client = client
        self.sink = sink
        self.current_cursor = current_cursor
        self.on_rejected_cursor = on_rejected_cursor
        self.new_generation = new_generation
        self.health = health
        self.rng = rng
        self.topics = frozenset(config.topics)
        self.stream_url = f"{config.base_url}/{','.join(config.topics)}/json"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.config.token}"} if self.config.token else {}

    async def run(self, stop: asyncio.Event) -> None:
        failures = 0
        while not stop.is_set():
            cursor = await self.current_cursor()
            self.health.state = "connecting"
            self.health.attempts += 1
            self.health.last_attempt_at = time.monotonic()
            retry_after: float | None = None
            generation = self.new_generation()
            lasted = 0.0
            try:
                if not await _unless_stopped(self._attempt(cursor, generation, stop), stop):
                    break  # stopped mid-attempt (connecting, or waiting for headers)
                self._count("stream_ended")
            except _RejectedCursor:
                failures = 0
                continue
            except _StatusFailure as exc:
                retry_after = exc.retry_after
                self._fail(f"http_{exc.status}", str(exc))
            except _WatchdogExpired:
                self.health.watchdog_drops += 1
                self._fail("watchdog", f"no frame within {self.config.keepalive_timeout:g}s")
            except httpx.TimeoutException as exc:
                self._fail("timeout", type(exc).__name__)
            except httpx.TransportError as exc:
                self._fail("transport", f"{type(exc).__name__}: {exc}")
            finally:
                if self.health.connected_at is not None:
                    lasted = time.monotonic() - self.health.connected_at
                self.health.connected_at = None
                self.new_generation()
            if stop.is_set():
                break
            if lasted >= self.config.keepalive_timeout:
                # The connection worked for a while: start the backoff schedule over. A server
                # that answers and then drops us at once keeps backing off instead.
                failures = 0
            wait = backoff.delay(
                failures,
                base=self.config.backoff_base,
                cap=self.config.backoff_cap,
                rng=self.rng,
                retry_after=retry_after,
            )
            failures += 1
            self.health.state = "backoff"
            self.health.next_attempt_due = time.monotonic() + wait
            log.info("intake.reconnect_scheduled", delay_s=round(wait, 3), failures=failures)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=wait)
        self.health.state = "stopped"

    async def _attempt(self, cursor: Cursor, generation: int, stop: asyncio.Event) -> None:
        evicted = await self._probe(cursor) if cursor.kind == "id" else False
        await self._stream(cursor, evicted, generation, stop)

    def _count(self, kind: str) -> None:
        self.health.failures[kind] = self.health.failures.get(kind, 0) + 1

    def _fail(self, kind: str, detail: str) -> None:
        self._count(kind)
        self.health.last_error = detail
        log.warning("intake.connection_failed", kind=kind, detail=detail)

    async def _probe(self, cursor: Cursor) -> bool:
        """True when the server certainly no longer holds the cursor message."""
        try:
            response = await self.client.get(
                self.stream_url,
                params={"poll": "1", "since": "all", "id": cursor.value},
                headers=self._headers(),
                timeout=self.config.connect_timeout,
            )
        except httpx.HTTPError as exc:
            log.warning("intake.probe_failed", detail=type(exc).__name__)
            return False
        if response.status_code != 200:
            return False
        for line in response.content.splitlines():
            frame = frames.decode_line(line, self.topics)
            if isinstance(frame, Message) and frame.id == cursor.value:
                return False
        return True

    async def _stream(
        self, cursor: Cursor, evicted: bool, generation: int, stop: asyncio.Event
    ) -> None:
        # The read timeout also bounds the wait for response headers: a server that accepts the
        # connection and then says nothing must not hang us. It is set a little above the
        # keepalive timeout so that, once streaming, the frame watchdog below fires first.
        timeout = httpx.Timeout(
            self.config.connect_timeout, read=self.config.keepalive_timeout + 1.0
        )
        async with self.client.stream(
            "GET",
            self.stream_url,
            params={"since": cursor.since},
            headers=self._headers(),
            timeout=timeout,
        ) as response:
            if response.status_code != 200:
                body = (await response.aread())[:512].decode("utf-8", "replace")
                if response.status_code == 400 and cursor.kind != "all":
                    log.error(
                        "intake.cursor_rejected", since=cursor.since, status=400, body=body.strip()
                    )
                    await self.on_rejected_cursor(cursor, body)
                    raise _RejectedCursor
                retry_after = backoff.parse_retry_after(
                    response.headers.get("Retry-After"), time.time()
                )
                raise _StatusFailure(response.status_code, retry_after)
            await self._read(response, cursor, evicted, generation)

    async def _read(
        self, response: httpx.Response, cursor: Cursor, evicted: bool, generation: int
    ) -> None:
        """Read frames until the stream ends; the frame watchdog raises `_WatchdogExpired`.

        Stopping is the caller's business: `run` cancels the whole attempt when asked to stop."""
        loop = asyncio.get_running_loop()
        decoder = frames.NdjsonDecoder()
        # The frame watchdog: one lazy timer instead of a timeout per read (a busy stream
        # delivers thousands of frames a second). Each complete frame only moves `deadline`;
        # the timer re-arms itself until the deadline really passes, then cancels the read.
        # Bytes that trickle in without finishing a line do not move it.
        deadline = loop.time() + self.config.keepalive_timeout
        reader = asyncio.current_task()
        assert reader is not None
        expired = False
        timer: asyncio.TimerHandle | None = None

        def watchdog() -> None:
            nonlocal timer, expired
            if loop.time() >= deadline:
                expired = True
                reader.cancel()
            else:
                timer = loop.call_at(deadline, watchdog)

        timer = loop.call_at(deadline, watchdog)
        # With an evicted cursor the replay is the whole cache, oldest first, right after `open`:
        # the first frame after `open` dates the gap (a message: its time; anything else: the
        # cache was empty, so the open itself).
        gap_open_at: int | None = None
        try:
            async for chunk in response.aiter_raw():
                lines = decoder.feed(chunk)
                if not lines:
                    continue
                now = loop.time()
                deadline = now + self.config.keepalive_timeout
                self.health.last_frame_at = now
                self.health.last_frame_wall = time.time()
                for line in lines:
                    frame = (
                        line if isinstance(line, Junk) else frames.decode_line(line, self.topics)
                    )
                    if isinstance(frame, frames.Open):
                        self.health.state = "live"
                        self.health.connected_at = now
                        self.health.connections += 1
                        log.info("intake.connected", since=cursor.since)
                        if evicted:
                            evicted, gap_open_at = False, int(self.health.last_frame_wall)
                        continue
                    if gap_open_at is not None:
                        held = frame.time if isinstance(frame, Message) else gap_open_at
                        self._report_gap(cursor, held)
                        gap_open_at = None
                    if isinstance(frame, frames.Keepalive):
                        continue
                    self.sink(Received(frame, now, generation))
        except asyncio.CancelledError:
            # Ours (the watchdog) unless someone else cancelled too (stop): then theirs wins.
            if expired and reader.uncancel() == 0:
                raise _WatchdogExpired from None
            raise
        finally:
            if timer is not None:
                timer.cancel()
            if gap_open_at is not None:
                self._report_gap(cursor, gap_open_at)

    def _report_gap(self, cursor: Cursor, oldest_held: int) -> None:
        start = cursor.message_time or 0
        if oldest_held <= start:
            log.warning("intake.cursor_evicted_no_gap", cursor=cursor.value)
            return
        log.error(
            "intake.gap_detected", cursor=cursor.value, window_start=start, window_end=oldest_held
        )
        self.sink(GapFound(cursor, start, oldest_held))


class _RejectedCursor(Exception):
    pass


async def _unless_stopped(work: Awaitable[None], stop: asyncio.Event) -> bool:
    """Run `work` until it ends (True) or `stop` is set first (False, work cancelled)."""
    task = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if task.done():
        task.result()  # re-raise what the attempt raised
        return True
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    return False


def describe_error_body(body: str) -> str:
    """ntfy's error JSON, reduced to `code: error` for logs and notices."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return body.strip()[:200]
    if isinstance(parsed, dict):
        return f"{parsed.get('code')}: {parsed.get('error')}"
    return body.strip()[:200]
