"""The ntfy subscription: one streaming connection for all topics, reconnected forever.

This module owns the connection rules of DESIGN.md section 3 and nothing else: it reads frames
off the socket and hands them, tagged with when they were read and on which connection, to a sink
(the daemon's queue). It never touches the database; the cursor comes from a callback.

- Only a 400 whose body has code 40008, to a request that carries a cursor, drops the cursor
  (`on_rejected_cursor`). Every other refusal (40009, 401/403, 429 with any code, 5xx, timeouts,
  resets) keeps it and backs off; 3 consecutive 401s back off at least 5 minutes (ntfy locks the
  IP out after 30 failed authentications). A refusal the owner can act on (credentials, ACL, rate
  limit, another 400) is reported once per episode (`Refused`), with ntfy's own error text.
- Keepalive watchdog: no complete frame within `keepalive_timeout` drops the connection, even if
  bytes trickle in (the deadline moves only when a whole line arrives).
- Overlap backfill: once `open` arrives, the backfill owed is persisted (`owe_backfill`), and
  after `cache_settle` a `poll=1&since=<T>` reads by server time what the id cursor cannot see
  (scheduled messages, lagging cache writes, long reorders). Its events reach the sink as one
  `Backfilled`, which the writer records before clearing what was owed. A failed poll is retried
  while the stream lasts; a lost stream leaves it owed for the next one.
- Gap probe: before resuming from a message id, `poll=1&since=all&id=<cursor>` asks whether the
  server still holds it. If not, the window between the last frame seen before the disconnect
  and the oldest message the backfill finds may have been lost: `Backfilled.gap` reports it.
- One forbidden topic never blinds the others (rules/topic_access.py): a multi-topic subscribe
  refused with 403 or 400 40009 is followed by one `poll=1&since=none` probe per topic; the
  refused ones leave the stream (one `topic_refused` notice each per episode), the rest stream,
  and each refused topic is probed again on its own backoff while they do. When one is readable
  again the stream reconnects with it, and the backfill reaches back to when it was dropped.
- A message without `expires` (published with `Cache: no`) can never be replayed: the first one
  per topic per UTC day rides its batch with an `unreplayable` notice (its key names topic and
  day, so the owner outbox drops a repeat after a restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import httpx
import structlog

from ntfy_intake.rules import backoff, notices, topic_access
from ntfy_intake.rules.notices import Notice
from ntfy_intake.rules.topic_access import Probe
from ntfy_intake.store.cursor import Cursor, Owed, Resume, backfill_since, gap_window
from ntfy_intake.wire import diagnose, frames, http_stream, refusals
from ntfy_intake.wire.frames import Event, Junk, Message
from ntfy_intake.wire.refusals import Refused, StatusFailure

log = structlog.get_logger("ntfy_intake.intake")


CURSOR_INVALID = 40008
POLL_RETRY_BASE = 5.0  # a failed backfill poll waits for ntfy's request bucket (1 per 5 s)
# A backfill's lines decoded per turn of the event loop: a poll of hundreds (a reconnect during a
# storm; 230 lines took 4 ms on this 2-core test box) held back the live frames read meanwhile.
DECODE_TURN = 32


class Received(NamedTuple):
    """A frame off the stream (a tuple: built once per event, cheaper than a frozen dataclass)."""

    frame: Event | Junk | Notice  # a notice rides the batch of the frames around it
    read_at: float  # monotonic
    generation: int


@dataclass(frozen=True, slots=True)
class GapFound:
    """The server no longer holds the cursor message: what lies in the window may be lost."""

    cursor: Cursor
    window_start: int
    window_end: int


@dataclass(frozen=True, slots=True)
class Backfilled:
    """One overlap backfill poll: record `events`, then clear what `owed` said was owed."""

    owed: Owed
    events: list[Event | Junk]
    polled: int  # lines the poll returned
    gap: GapFound | None = None


Item = Received | Backfilled | Refused


@dataclass(slots=True)
class IntakeHealth:
    """Shared, in-memory view of the connection for status, metrics and the systemd watchdog."""

    state: str = "starting"  # connecting | live | backoff | stopped
    last_frame_at: float | None = None  # monotonic
    last_server_time: int | None = None  # ntfy `time` of the last frame (keepalives count)
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
    overlap: float = 30.0
    cache_settle: float = 2.0
    cache_duration: float = 12 * 3600.0


class _WatchdogExpired(Exception):
    pass


class Intake:
    def __init__(
        self,
        config: IntakeConfig,
        client: httpx.AsyncClient,
        *,
        sink: Callable[[Item], None],
        current_resume: Callable[[], Awaitable[Resume]],
        on_rejected_cursor: Callable[[Cursor, str], Awaitable[None]],
        owe_backfill: Callable[[int, int | None], Awaitable[Owed]],
        new_generation: Callable[[], int],
        health: IntakeHealth,
        rng: Callable[[], float] = random.random,
        server_clock: Callable[[], float] = time.time,
        open_stream: http_stream.StreamOpener | None = None,
    ) -> None:
        self.config = config
        self.client = client
        # The stream and the backfill poll: httpx unless the daemon hands over the lean reader.
        self.open_stream = open_stream or http_stream.httpx_opener(client)
        self.sink = sink
        self.current_resume = current_resume
        self.on_rejected_cursor = on_rejected_cursor
        self.owe_backfill = owe_backfill
        self.new_generation = new_generation
        self.health = health
        self.rng = rng
        self.server_clock = server_clock  # only when ntfy sent an `open` without a time
        self.topics = frozenset(config.topics)
        self.access = topic_access.TopicAccess(
            config.topics, rng, base=topic_access.RETRY_FACTOR * config.backoff_base
        )
        self.topic_path = ""
        self.stream_url = ""
        self._set_stream()
        self.refusals = refusals.Episodes()
        self._owed_from: int | None = None  # a readmitted topic's backlog starts here
        self._uncached_day = ""  # the UTC day of `_uncached_told`
        self._uncached_told: set[str] = set()  # topics whose unreplayable notice went today

    def _set_stream(self) -> None:
        """The stream (and its polls) carry the topics not refused on their own."""
        self.topic_path = ",".join(self.access.streamed())
        self.stream_url = f"{self.config.base_url}/{self.topic_path}/json"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.config.token}"} if self.config.token else {}

    async def run(self, stop: asyncio.Event) -> None:
        failures = 0
        while not stop.is_set():
            resume = await self.current_resume()
            self.health.state = "connecting"
            self.health.attempts += 1
            self.health.last_attempt_at = time.monotonic()
            retry_after: float | None = None
            generation = self.new_generation()
            lasted = 0.0
            try:
                if not await _unless_stopped(self._attempt(resume, generation), stop):
                    break  # stopped mid-attempt (connecting, or waiting for headers)
                self._count("stream_ended")
            except (_RejectedCursor, _TopicsChanged):
                failures = 0
                continue
            except StatusFailure as exc:
                if await self._split(exc, resume, generation):
                    continue  # the readable topics stream at once; the others are retried
                retry_after, report = self.refusals.refused(exc)
                if report is not None:
                    self.sink(report.naming(self.topic_path))
                self._fail(
                    f"http_{exc.status}",
                    diagnose.http_failure(
                        self.stream_url, self.config.topics, exc.status, exc.body
                    ),
                )
            except _WatchdogExpired:
                self.health.watchdog_drops += 1
                self._fail("watchdog", f"no frame within {self.config.keepalive_timeout:g}s")
            except httpx.TimeoutException as exc:
                self._fail("timeout", diagnose.transport_failure(self.stream_url, exc))
            except httpx.TransportError as exc:
                self._fail("transport", diagnose.transport_failure(self.stream_url, exc))
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

    async def _attempt(self, resume: Resume, generation: int) -> None:
        cursor = resume.cursor
        evicted = await self._probe(cursor) if cursor.kind == "id" else False
        # The window of a possible gap starts at the last frame the previous connection saw
        # (this process's memory if it saw one, else what was persisted).
        last_seen = self.health.last_server_time or resume.last_frame_time
        gap_from = (last_seen or cursor.message_time or 0) if evicted else None
        await self._stream(cursor, gap_from, generation)

    def _count(self, kind: str) -> None:
        self.health.failures[kind] = self.health.failures.get(kind, 0) + 1

    def _fail(self, kind: str, detail: str) -> None:
        self._count(kind)
        self.health.last_error = detail
        log.warning("intake.connection_failed", kind=kind, detail=detail)

    async def _probe(self, cursor: Cursor) -> bool:
        """True when the server certainly no longer holds the cursor message."""
        try:
            # As a whole, not per read: a reply that trickles must not hold the subscription.
            async with asyncio.timeout(self.config.connect_timeout + self.config.keepalive_timeout):
                response = await self.client.get(
                    self.stream_url,
                    params={"poll": "1", "since": "all", "id": cursor.value},
                    headers=self._headers(),
                    timeout=self.config.connect_timeout,
                )
        except (httpx.HTTPError, TimeoutError) as exc:
            log.warning("intake.probe_failed", detail=type(exc).__name__)
            return False
        if response.status_code != 200:
            if refusals.category(response.status_code) is not None:
                # The stream would be refused too: one request, one authentication spent.
                raise refusals.status_failure(response.status_code, response.headers, response.text)
            return False
        for line in response.content.splitlines():
            frame = frames.decode_line(line, self.topics)
            # ntfy >= 2.16 caches deletes/clears too, and a cursor may be one of them.
            if isinstance(frame, Message | frames.DeviceAction) and frame.id == cursor.value:
                return False
        return True

    async def _stream(self, cursor: Cursor, gap_from: int | None, generation: int) -> None:
        # The read timeout also bounds the wait for response headers: a server that accepts the
        # connection and then says nothing must not hang us. It is set a little above the
        # keepalive timeout so that, once streaming, the frame watchdog below fires first.
        timeout = httpx.Timeout(
            self.config.connect_timeout, read=self.config.keepalive_timeout + 1.0
        )
        async with self.open_stream(
            self.stream_url, {"since": cursor.since}, self._headers(), timeout
        ) as response:
            if response.status_code != 200:
                body = await _error_text(response, self.config.keepalive_timeout)
                failure = refusals.status_failure(response.status_code, response.headers, body)
                if failure.code == refusals.CURSOR_INVALID and cursor.kind != "all":
                    log.error(
                        "intake.cursor_rejected", since=cursor.since, status=400, body=body.strip()
                    )
                    await self.on_rejected_cursor(cursor, body)
                    raise _RejectedCursor
                raise failure
            await self._read(response, cursor, gap_from, generation)

    async def _read(
        self,
        response: http_stream.StreamResponse,
        cursor: Cursor,
        gap_from: int | None,
        generation: int,
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
        backfill: asyncio.Task[None] | None = None
        changed = False
        reading = True  # not yet in `finally`: a cancel there would be swallowed by its awaits

        def readmitted(task: asyncio.Task[bool]) -> None:
            nonlocal changed
            if reading and not task.cancelled() and task.exception() is None and task.result():
                changed = True  # the next attempt carries the widened topic set either way
                reader.cancel()

        retry: asyncio.Task[bool] | None = None
        if self.access.refused:
            retry = asyncio.create_task(self._retry_refused(), name="topic-retry")
            retry.add_done_callback(readmitted)
        try:
            async for chunk in response.aiter_raw():
                lines = decoder.feed(chunk)
                if not lines:
                    continue
                now = loop.time()
                deadline = now + self.config.keepalive_timeout
                self.health.last_frame_at = now
                self.health.last_frame_wall = time.time()
                latest = self.health.last_server_time or 0
                for line in lines:
                    frame = (
                        line if isinstance(line, Junk) else frames.decode_line(line, self.topics)
                    )
                    if type(frame) is Message:  # most frames: nothing else to look at
                        latest = max(latest, frame.time)
                        self.sink(Received(frame, now, generation))
                        if frame.expires is None:
                            self._unreplayable(frame, now, generation)
                        continue
                    server_time = getattr(frame, "time", None)
                    if isinstance(server_time, int):
                        latest = max(latest, server_time)
                    if isinstance(frame, frames.Open):
                        self.health.last_server_time = latest
                        self.health.state = "live"
                        self.health.connected_at = now
                        self.health.connections += 1
                        self.refusals.connected()
                        self.access.connected()
                        log.info("intake.connected", since=cursor.since)
                        if backfill is None:
                            opened = frame.time or int(self.server_clock())
                            since = backfill_since(cursor, opened, self.config.overlap)
                            if self._owed_from is not None:
                                since = min(since, self._owed_from - int(self.config.overlap))
                            owed = await self.owe_backfill(since, gap_from)
                            self._owed_from = None  # persisted: a lost stream still owes it
                            backfill = asyncio.create_task(
                                self._backfill(cursor, owed, opened), name="backfill"
                            )
                        continue
                    if isinstance(frame, frames.Keepalive):
                        continue
                    self.sink(Received(frame, now, generation))
                if latest:
                    self.health.last_server_time = latest
        except asyncio.CancelledError:
            # Ours (the watchdog) unless someone else cancelled too (stop): then theirs wins.
            if expired and reader.uncancel() == 0:
                raise _WatchdogExpired from None
            if changed and reader.uncancel() == 0:
                raise _TopicsChanged from None
            raise
        finally:
            reading = False
            if timer is not None:
                timer.cancel()
            if retry is not None and not retry.done():
                retry.remove_done_callback(readmitted)
                retry.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await retry
            if backfill is not None and not backfill.done():
                # The poll dies with its stream: what it owed stays persisted for the next one.
                backfill.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await backfill

    # -- one forbidden topic, messages ntfy will not replay --------------------------------------

    async def _split(self, failure: StatusFailure, resume: Resume, generation: int) -> bool:
        """After a refused multi-topic subscribe: probe each streamed topic, drop the refused
        ones (a notice each) and keep the rest. False when nothing was split."""
        streamed = self.access.streamed()
        if len(streamed) < 2 or not topic_access.per_topic(failure.status, failure.code):
            return False
        if not self.access.probe_due(time.monotonic()):
            return False  # every topic was refused a moment ago: not on every reconnect
        probes: list[tuple[str, Probe]] = []
        answers: dict[str, StatusFailure] = {}
        for topic in streamed:
            probe, answer = await self._probe_topic(topic)
            probes.append((topic, probe))
            if answer is not None:
                answers[topic] = answer
            if probe is Probe.STOP:
                break
        dropped = self.access.split(probes)
        if not dropped:
            self.access.probed_nothing(time.monotonic())
            return False
        # Its backlog is owed from the last server time seen (this process's, else persisted).
        seen = self.health.last_server_time or resume.last_frame_time
        since = seen or resume.cursor.message_time or int(self.server_clock())
        now = time.monotonic()
        for topic in dropped:
            answer = answers[topic]
            refusal = self.access.refuse(
                topic,
                answer.status,
                answer.code,
                answer.error or f"HTTP {answer.status}",
                since=since,
                episode=str(int(self.server_clock())),
                now=now,
            )
            notice = notices.topic_refused(
                topic,
                refusal.status,
                refusal.code,
                refusal.error,
                ",".join(t for t in streamed if t not in dropped),
                refusal.episode,
            )
            self.sink(Received(notice, now, generation))
            log.warning("intake.topic_refused", topic=topic, status=answer.status, code=answer.code)
        self._set_stream()
        self._count("topic_refused")
        return True

    async def _probe_topic(self, topic: str) -> tuple[Probe, StatusFailure | None]:
        """One topic alone, `poll=1&since=none`: ntfy checks access and returns nothing."""
        try:
            async with asyncio.timeout(self.config.connect_timeout + self.config.keepalive_timeout):
                response = await self.client.get(
                    f"{self.config.base_url}/{topic}/json",
                    params={"poll": "1", "since": "none"},
                    headers=self._headers(),
                    timeout=self.config.connect_timeout,
                )
        except (httpx.HTTPError, TimeoutError) as exc:
            log.warning("intake.topic_probe_failed", topic=topic, detail=type(exc).__name__)
            return Probe.UNKNOWN, None
        if response.status_code == 200:
            return Probe.ALLOWED, None
        failure = refusals.status_failure(response.status_code, response.headers, response.text)
        return topic_access.classify(failure.status, failure.code), failure

    async def _retry_refused(self) -> bool:
        """While the stream lasts: probe each refused topic when its retry is due. True (and the
        stream set widened) once one is readable again."""
        while (due_at := self.access.next_due()) is not None:
            await asyncio.sleep(max(0.0, due_at - time.monotonic()))
            back = False
            for topic in self.access.due(time.monotonic()):
                probe, _ = await self._probe_topic(topic)
                if probe is Probe.ALLOWED:
                    refusal = self.access.readmit(topic)
                    owed = self._owed_from
                    self._owed_from = refusal.since if owed is None else min(owed, refusal.since)
                    log.info("intake.topic_readmitted", topic=topic, since=refusal.since)
                    back = True
                else:
                    self.access.still_refused(topic, time.monotonic())
            if back:
                self._set_stream()
                return True
        return False

    def _unreplayable(self, message: Message, now: float, generation: int) -> None:
        """The first message without `expires` per topic per UTC day: one owner notice."""
        day = notices.utc_day(message.time)
        if day != self._uncached_day:
            self._uncached_day, self._uncached_told = day, set()
        if message.topic in self._uncached_told:
            return
        self._uncached_told.add(message.topic)
        log.warning("intake.unreplayable", topic=message.topic, event_id=message.id)
        self.sink(Received(notices.unreplayable(message.topic, day), now, generation))

    async def _backfill(self, cursor: Cursor, owed: Owed, opened: int) -> None:
        """After `cache_settle`, poll since the owed T (retrying while the stream lasts), then
        hand the events and any gap to the writer in one `Backfilled`."""
        await asyncio.sleep(self.config.cache_settle)
        attempt = 0
        while True:
            try:
                lines = await self._poll(owed.since)
                break
            except (StatusFailure, httpx.HTTPError) as exc:
                wait = backoff.delay(attempt, base=POLL_RETRY_BASE, cap=60.0, rng=self.rng)
                attempt += 1
                log.warning(
                    "intake.backfill_failed",
                    since=owed.since,
                    detail=str(exc) or type(exc).__name__,
                    retry_in_s=round(wait, 3),
                )
                await asyncio.sleep(wait)
        events: list[Event | Junk] = []
        for number, line in enumerate(lines, 1):
            frame = line if isinstance(line, Junk) else frames.decode_line(line, self.topics)
            if not isinstance(frame, frames.Open | frames.Keepalive):
                events.append(frame)
            if number % DECODE_TURN == 0:
                await asyncio.sleep(0)  # the stream's frames meanwhile are read, not held back
        gap = None
        if owed.gap_from is not None:
            held = [(e.time, e.expires) for e in events if isinstance(e, Message)]
            window = gap_window(
                owed.gap_from, opened, held, self.config.cache_duration, cursor.message_time
            )
            if window is None:
                log.warning("intake.cursor_evicted_no_gap", cursor=cursor.value)
            else:
                log.error(
                    "intake.gap_detected",
                    cursor=cursor.value,
                    window_start=window[0],
                    window_end=window[1],
                )
                gap = GapFound(cursor, *window)
        log.info("intake.backfilled", since=owed.since, polled=len(lines))
        self.sink(Backfilled(owed, events, len(lines), gap))

    async def _poll(self, since: int) -> list[bytes | Junk]:
        async with self.open_stream(
            self.stream_url,
            {"poll": "1", "since": str(since)},
            self._headers(),
            httpx.Timeout(self.config.connect_timeout, read=60.0),
        ) as response:
            if response.status_code != 200:
                body = await _error_text(response, self.config.keepalive_timeout)
                raise refusals.status_failure(response.status_code, response.headers, body)
            decoder = frames.NdjsonDecoder()
            lines: list[bytes | Junk] = []
            async for chunk in response.aiter_raw():
                lines += decoder.feed(chunk)
            tail = decoder.feed(b"\n")  # a last line without its newline
            last = tail[0] if tail else None
            if isinstance(last, bytes) and isinstance(frames.decode_line(last, self.topics), Junk):
                # ntfy ends every line: a body without framing (read until close) was cut
                # off. Taken as complete, the torn frame would be junk, the ones after it
                # never read, and what the backfill owed cleared. Poll again instead.
                raise httpx.RemoteProtocolError("the poll's body ended mid-line")
            return lines + tail


class _RejectedCursor(Exception):
    pass


class _TopicsChanged(Exception):
    """A refused topic is readable again: reconnect with it, at once."""


ERROR_TEXT_BYTES = 512


async def _error_text(response: http_stream.StreamResponse, wait: float) -> str:
    """The start of a refusal's body, for its error text: at most ERROR_TEXT_BYTES, and what
    came within `wait` (no frame watchdog runs before a 200, and a proxy's error body may
    trickle without end)."""
    body = b""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(wait):
            async for chunk in response.aiter_raw():
                body += chunk
                if len(body) >= ERROR_TEXT_BYTES:
                    break
    return body[:ERROR_TEXT_BYTES].decode("utf-8", "replace")


async def _unless_stopped(work: Awaitable[None], stop: asyncio.Event) -> bool:
    """Run `work` until it ends (True) or `stop` is set first (False, work cancelled)."""
    task = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        # Cancelled from outside (a node whose lease is over abandons its tasks): the attempt
        # goes with it, or its stream would stay open, an orphan task still reading ntfy.
        task.cancel()
        raise
    finally:
        stopper.cancel()
    if task.done():
        task.result()  # re-raise what the attempt raised
        return True
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    return False
